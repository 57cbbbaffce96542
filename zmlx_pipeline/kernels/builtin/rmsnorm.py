"""RMSNorm over the last axis: y = x * rsqrt(mean(x^2) + eps) * w."""

from __future__ import annotations

from zmlx_pipeline.kernels.spec import KernelSpec, Launch, TileAxes, load_grid

EPS = 1e-5

# ROWS rows per threadgroup, S = TG / ROWS threads per row, VEC contiguous elements per access.
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
      float v[VEC];
      k_load<VEC>(x + base + c, v);
      for (int i = 0; i < VEC; ++i) acc += v[i] * v[i];
    }
  }
  acc = KSIMD_SUM(acc);
  if (k_lane == 0) k_red[k_warp] = acc;
  KBARRIER();
  float total = 0.0f;
  for (int i = 0; i < NW; ++i) total += k_red[sub * NW + i];
  if (!active) return;
  const float inv = KRSQRT(total / (float)cols + 1e-5f);
  for (int c = st * VEC; c < cols; c += S * VEC) {
    float v[VEC];
    float g[VEC];
    k_load<VEC>(x + base + c, v);
    k_load<VEC>(w + c, g);
    for (int i = 0; i < VEC; ++i) v[i] = v[i] * inv * g[i];
    k_store<VEC>(y + base + c, v);
  }
"""

# Shared by every row-wise kernel of this package: legal threadgroups, whole SIMD groups per row,
# aligned vector accesses of at most 16 bytes, and no thread of a row left without elements.
ROW_CONSTRAINTS = (
    "TG <= max_threads",
    "TG % ROWS == 0 and (TG // ROWS) % simd_width == 0",
    "cols % VEC == 0",
    "VEC * dtype_bytes <= 16",
    "(TG // ROWS) * VEC <= cols",
    "ROWS <= rows",
)

ROW_PARAMS = {"TG": (32, 64, 128, 256, 512, 1024), "VEC": (1, 2, 4, 8), "ROWS": (1, 2, 4)}


# One threadgroup of TG threads per ROWS rows: the launch geometry relative to the device's cores (blocks per
# core, waves), read by the models of new devices only; for a device measured in training it did not help
# (notes/learning.md, "Launch geometry of the row kernels").
ROW_TILES = TileAxes(grid={"rows": ("ROWS",)}, threads=("TG",), seen=False)


def row_launch(config, shape, n_outputs=1):
    """One threadgroup per ROWS rows; the grid counts threads and is a whole number of threadgroups."""
    groups = -(-shape["rows"] // config["ROWS"])
    out = (shape["rows"], shape["cols"])
    return Launch(grid=(groups * config["TG"], 1, 1), threadgroup=(config["TG"], 1, 1),
                  output_shapes=(out,) * n_outputs)


def make_inputs(shape, dtype, key):
    import mlx.core as mx

    k1, k2 = mx.random.split(key)
    x = mx.random.normal((shape["rows"], shape["cols"]), key=k1).astype(dtype)
    w = (1.0 + 0.1 * mx.random.normal((shape["cols"],), key=k2)).astype(dtype)
    return [x, w]


def reference(inputs, shape):
    import mlx.core as mx

    x, w = (a.astype(mx.float32) for a in inputs)
    return [x * mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + EPS) * w]


def mlx_op(inputs, shape):
    import mlx.core as mx

    x, w = inputs
    return [mx.fast.rms_norm(x, w, EPS)]


SPEC = KernelSpec(
    name="rmsnorm",
    description="RMSNorm over the last axis (LLM pre-norm)",
    kernel_class="row_reduction",
    inputs=("x", "w"),
    outputs=("y",),
    body=BODY,
    params=ROW_PARAMS,
    constraints=ROW_CONSTRAINTS,
    shape_grid=load_grid("rmsnorm"),
    launch=row_launch,
    tiles=ROW_TILES,
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, b: (2 * s["rows"] * s["cols"] + s["cols"]) * b,
    flops=lambda s: 4.0 * s["rows"] * s["cols"],
    mlx_op=mlx_op,
)
