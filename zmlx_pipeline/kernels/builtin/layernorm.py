"""LayerNorm over the last axis: y = (x - mean) * rsqrt(var + eps) * w + b."""

from __future__ import annotations

from zmlx_pipeline.kernels.builtin.rmsnorm import ROW_CONSTRAINTS, ROW_PARAMS, ROW_TILES, row_launch
from zmlx_pipeline.kernels.spec import Feature, KernelSpec, load_grid

EPS = 1e-5

# ROWS rows per threadgroup, S = TG / ROWS threads per row, VEC contiguous elements per access.
# One statistics pass: sum and sum of squares of d = x - x[row, 0] (the shift keeps the one-pass
# variance accurate when the mean is large next to the spread), reduced together, two floats per
# SIMD group in threadgroup memory. Then one pass that normalises and writes.
BODY = r"""
  constexpr int S = TG / ROWS;
  constexpr int NW = S / 32;
  constexpr int NWT = TG / 32;
  KSHARED float k_red[2 * NWT];
  const int rows = x_shape[0];
  const int cols = x_shape[1];
  const int sub = k_tid / S;
  const int st = k_tid % S;
  const int row = k_block_x * ROWS + sub;
  const bool active = row < rows;
  const size_t base = (size_t)(active ? row : 0) * (size_t)cols;
  const float shift = active ? static_cast<float>(x[base]) : 0.0f;
  float s1 = 0.0f;
  float s2 = 0.0f;
  if (active) {
    for (int c = st * VEC; c < cols; c += S * VEC) {
      float v[VEC];
      k_load<VEC>(x + base + c, v);
      for (int i = 0; i < VEC; ++i) {
        const float d = v[i] - shift;
        s1 += d;
        s2 += d * d;
      }
    }
  }
  s1 = KSIMD_SUM(s1);
  s2 = KSIMD_SUM(s2);
  if (k_lane == 0) {
    k_red[k_warp] = s1;
    k_red[NWT + k_warp] = s2;
  }
  KBARRIER();
  float t1 = 0.0f;
  float t2 = 0.0f;
  for (int i = 0; i < NW; ++i) {
    t1 += k_red[sub * NW + i];
    t2 += k_red[NWT + sub * NW + i];
  }
  if (!active) return;
  const float dm = t1 / (float)cols;
  const float mean = shift + dm;
  const float var = KFMAX(t2 / (float)cols - dm * dm, 0.0f);
  const float inv = KRSQRT(var + 1e-5f);
  for (int c = st * VEC; c < cols; c += S * VEC) {
    float v[VEC];
    float g[VEC];
    float o[VEC];
    k_load<VEC>(x + base + c, v);
    k_load<VEC>(w + c, g);
    k_load<VEC>(b + c, o);
    for (int i = 0; i < VEC; ++i) v[i] = (v[i] - mean) * inv * g[i] + o[i];
    k_store<VEC>(y + base + c, v);
  }
"""


def make_inputs(shape, dtype, key):
    import mlx.core as mx

    k1, k2, k3 = mx.random.split(key, 3)
    # a non-zero mean, so a kernel that gets the mean wrong cannot pass
    x = (1.0 + mx.random.normal((shape["rows"], shape["cols"]), key=k1)).astype(dtype)
    w = (1.0 + 0.1 * mx.random.normal((shape["cols"],), key=k2)).astype(dtype)
    b = (0.1 * mx.random.normal((shape["cols"],), key=k3)).astype(dtype)
    return [x, w, b]


def reference(inputs, shape):
    import mlx.core as mx

    x, w, b = (a.astype(mx.float32) for a in inputs)
    mean = mx.mean(x, axis=-1, keepdims=True)
    var = mx.mean(mx.square(x - mean), axis=-1, keepdims=True)
    return [(x - mean) * mx.rsqrt(var + EPS) * w + b]


def mlx_op(inputs, shape):
    import mlx.core as mx

    x, w, b = inputs
    return [mx.fast.layer_norm(x, w, b, EPS)]


SPEC = KernelSpec(
    name="layernorm",
    description="LayerNorm over the last axis, one statistics pass (encoders, vision towers)",
    kernel_class="row_reduction",
    inputs=("x", "w", "b"),
    outputs=("y",),
    body=BODY,
    params=ROW_PARAMS,
    constraints=ROW_CONSTRAINTS,
    shape_grid=load_grid("layernorm"),
    launch=row_launch,
    tiles=ROW_TILES,
    make_inputs=make_inputs,
    reference=reference,
    # read x, w, b; write y
    bytes_moved=lambda s, b: (2 * s["rows"] * s["cols"] + 2 * s["cols"]) * b,
    flops=lambda s: 8.0 * s["rows"] * s["cols"],
    mlx_op=mlx_op,
    # the iterations each thread makes along its row (768 and 1536 columns leave a partial last
    # one). Kept out of the per-device models: there it made the ranking on a left-out device worse
    # (notes/learning.md)
    features={"trips": Feature("cols / ((TG // ROWS) * VEC)", per_device=False)},
)
