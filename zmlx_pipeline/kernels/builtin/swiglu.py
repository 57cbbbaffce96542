"""SwiGLU activation: y = silu(g) * u, elementwise over [rows, cols] gate and up projections."""

from __future__ import annotations

from zmlx_pipeline.kernels.spec import KernelSpec, Launch, load_grid

# The [rows, cols] arrays are treated as one flat run of n = rows * cols elements. A thread
# handles EPT accesses of VEC contiguous elements; access e of thread t in threadgroup k starts
# at (k * EPT + e) * TG * VEC + t * VEC, so each access step of a threadgroup is one contiguous,
# coalesced TG * VEC run. All loads are issued before any compute or store, so EPT is the
# number of independent loads in flight per thread.
BODY = r"""
  constexpr int TILE = TG * VEC;
  const size_t n = (size_t)g_shape[0] * (size_t)g_shape[1];
  const size_t start = (size_t)k_block_x * (size_t)(TILE * EPT) + (size_t)k_tid * (size_t)VEC;
  float va[EPT * VEC];
  float vb[EPT * VEC];
  for (int e = 0; e < EPT; ++e) {
    const size_t i0 = start + (size_t)e * (size_t)TILE;
    if (i0 < n) {
      k_load<VEC>(g + i0, va + e * VEC);
      k_load<VEC>(u + i0, vb + e * VEC);
    }
  }
  for (int e = 0; e < EPT; ++e) {
    const size_t i0 = start + (size_t)e * (size_t)TILE;
    if (i0 < n) {
      for (int i = 0; i < VEC; ++i) {
        const float gv = va[e * VEC + i];
        va[e * VEC + i] = gv / (1.0f + KEXP(-gv)) * vb[e * VEC + i];
      }
      k_store<VEC>(y + i0, va + e * VEC);
    }
  }
"""

PARAMS = {"TG": (64, 128, 256, 512, 1024), "VEC": (1, 2, 4, 8), "EPT": (1, 2, 4)}

CONSTRAINTS = (
    "TG <= max_threads",
    # every access is whole (n is a multiple of VEC) and aligned
    "cols % VEC == 0",
    "VEC * dtype_bytes <= 16",
    # at most 32 elements of each input held in registers per thread, and at most 16384 per
    # threadgroup: VEC * EPT = 32 takes 82-96 registers on sm_90, more than the 64 a thread of a
    # 1024-thread block may have (the launch would fail), while 16 takes about 50
    "VEC * EPT <= 32",
    "TG * VEC * EPT <= 16384",
    # one threadgroup's tile is no bigger than the whole problem
    "TG * VEC * EPT <= rows * cols",
)


def launch(config, shape):
    """Enough whole threadgroups of TG threads to cover rows * cols at TG * VEC * EPT elements each."""
    n = shape["rows"] * shape["cols"]
    per_group = config["TG"] * config["VEC"] * config["EPT"]
    groups = -(-n // per_group)
    return Launch(grid=(groups * config["TG"], 1, 1), threadgroup=(config["TG"], 1, 1),
                  output_shapes=((shape["rows"], shape["cols"]),))


def make_inputs(shape, dtype, key):
    import mlx.core as mx

    k1, k2 = mx.random.split(key)
    g = (2.0 * mx.random.normal((shape["rows"], shape["cols"]), key=k1)).astype(dtype)
    u = mx.random.normal((shape["rows"], shape["cols"]), key=k2).astype(dtype)
    return [g, u]


def reference(inputs, shape):
    import mlx.core as mx

    g, u = (a.astype(mx.float32) for a in inputs)
    return [g / (1.0 + mx.exp(-g)) * u]


def mlx_op(inputs, shape):
    import mlx.core as mx

    g, u = inputs
    return [g * mx.sigmoid(g) * u]


SPEC = KernelSpec(
    name="swiglu",
    description="SwiGLU activation silu(g) * u of the MLP gate and up projections",
    kernel_class="elementwise",
    inputs=("g", "u"),
    outputs=("y",),
    body=BODY,
    params=PARAMS,
    constraints=CONSTRAINTS,
    shape_grid=load_grid("swiglu"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    # read g, u; write y
    bytes_moved=lambda s, b: 3.0 * s["rows"] * s["cols"] * b,
    # negate, exp, add, divide, multiply
    flops=lambda s: 5.0 * s["rows"] * s["cols"],
    mlx_op=mlx_op,
)
