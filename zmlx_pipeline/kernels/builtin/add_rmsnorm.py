"""Fused residual add + RMSNorm over the last axis: h = x + r; y = h * rsqrt(mean(h^2) + eps) * w.

h is stored in the input dtype and the norm is taken of that rounded h (what the unfused
`h = x + r; rms_norm(h)` computes), so kernel, reference and MLX's op agree in every dtype.
"""

from __future__ import annotations

from zmlx_pipeline.kernels.builtin.rmsnorm import EPS, ROW_CONSTRAINTS, ROW_PARAMS, ROW_TILES, row_launch
from zmlx_pipeline.kernels.spec import KernelSpec, load_grid

# ROWS rows per threadgroup, S = TG / ROWS threads per row, VEC contiguous elements per access.
# Pass 1 reads x and r, stores the T-rounded h and sums its squares; pass 2 reads back the h
# elements the same thread stored (no other thread touches them, so no barrier is needed).
BODY = r"""
  constexpr int S = TG / ROWS;
  constexpr int NW = S / 32;
  KSHARED float k_red[TG / 32];
  const int rows = x_shape[0];
  const int cols = x_shape[1];
  const int sub = k_tid / S;
  const int st = k_tid % S;
  const int row = k_block_x * ROWS + sub;
  const bool active = row < rows;
  const size_t base = (size_t)(active ? row : 0) * (size_t)cols;
  float acc = 0.0f;
  if (active) {
    for (int c = st * VEC; c < cols; c += S * VEC) {
      float va[VEC];
      float vb[VEC];
      k_load<VEC>(x + base + c, va);
      k_load<VEC>(r + base + c, vb);
      for (int i = 0; i < VEC; ++i) {
        va[i] = static_cast<float>(static_cast<T>(va[i] + vb[i]));
        acc += va[i] * va[i];
      }
      k_store<VEC>(h + base + c, va);
    }
  }
  acc = KSIMD_SUM(acc);
  if (k_lane == 0) k_red[k_warp] = acc;
  KBARRIER();
  float total = 0.0f;
  for (int i = 0; i < NW; ++i) total += k_red[sub * NW + i];
  if (!active) return;
  const float inv = KRSQRT(total / (float)cols + 1e-5f);
  KCDEV_PTR(T) hc = h;
  for (int c = st * VEC; c < cols; c += S * VEC) {
    float v[VEC];
    float g[VEC];
    k_load<VEC>(hc + base + c, v);
    k_load<VEC>(w + c, g);
    for (int i = 0; i < VEC; ++i) v[i] = v[i] * inv * g[i];
    k_store<VEC>(y + base + c, v);
  }
"""


def launch(config, shape):
    return row_launch(config, shape, n_outputs=2)


def make_inputs(shape, dtype, key):
    import mlx.core as mx

    k1, k2, k3 = mx.random.split(key, 3)
    x = mx.random.normal((shape["rows"], shape["cols"]), key=k1).astype(dtype)
    r = mx.random.normal((shape["rows"], shape["cols"]), key=k2).astype(dtype)
    w = (1.0 + 0.1 * mx.random.normal((shape["cols"],), key=k3)).astype(dtype)
    return [x, r, w]


def reference(inputs, shape):
    import mlx.core as mx

    x, r, w = inputs
    h = (x.astype(mx.float32) + r.astype(mx.float32)).astype(x.dtype)
    hf = h.astype(mx.float32)
    y = hf * mx.rsqrt(mx.mean(hf * hf, axis=-1, keepdims=True) + EPS) * w.astype(mx.float32)
    return [h, y]


def mlx_op(inputs, shape):
    import mlx.core as mx

    x, r, w = inputs
    h = x + r
    return [h, mx.fast.rms_norm(h, w, EPS)]


SPEC = KernelSpec(
    name="add_rmsnorm",
    description="fused residual add + RMSNorm over the last axis (transformer block boundary)",
    kernel_class="row_reduction",
    inputs=("x", "r", "w"),
    outputs=("h", "y"),
    body=BODY,
    params=ROW_PARAMS,
    constraints=ROW_CONSTRAINTS,
    shape_grid=load_grid("add_rmsnorm"),
    launch=launch,
    tiles=ROW_TILES,
    make_inputs=make_inputs,
    reference=reference,
    # read x, r, w; write h, y
    bytes_moved=lambda s, b: (4 * s["rows"] * s["cols"] + s["cols"]) * b,
    flops=lambda s: 5.0 * s["rows"] * s["cols"],
    mlx_op=mlx_op,
)
