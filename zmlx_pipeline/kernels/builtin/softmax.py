"""Softmax over the last axis, max-subtracted, float32 accumulation (attention and vocab rows)."""

from __future__ import annotations

from zmlx_pipeline.kernels.builtin.rmsnorm import ROW_CONSTRAINTS, ROW_PARAMS, ROW_TILES, row_launch
from zmlx_pipeline.kernels.spec import KernelSpec, load_grid

# ROWS rows per threadgroup, S = TG / ROWS threads per row, VEC contiguous elements per access.
# CACHE sets how much of its row a thread keeps in registers: up to F values, F chosen so that a
# threadgroup's cache is about 0, 64 KB or 128 KB of registers (CACHE 0, 1, 2). A row up to S * F
# long is read from memory once and exponentiated once: the first pass loads the cached chunks and
# takes their max, then turns them into exp(v - thread max) in place. Columns past the cache keep
# an online (max, sum) and are read again in the second pass, as MLX's looped softmax does: a
# small cache leaves room for more threadgroups per SM, whose loads overlap one another's reduce
# and store, and the second read of a recent row mostly hits L2. The (max, sum) pairs are merged
# across the SIMD group, then across the row's SIMD groups through threadgroup memory.
BODY = r"""
  constexpr int S = TG / ROWS;
  constexpr int NW = S / 32;
  constexpr int FB = (CACHE == 2) ? 32768 : 16384;
  constexpr int FM = (CACHE == 2) ? 64 : 32;
  constexpr int F = (CACHE == 0) ? 0 : ((FB / TG < FM) ? FB / TG : FM);
  constexpr int NC = (CACHE == 0) ? 0 : ((F / VEC > 0) ? F / VEC : 1);
  KSHARED float k_max[TG / 32];
  KSHARED float k_sum[TG / 32];
  const int rows = x_shape[0];
  const int cols = x_shape[1];
  const int sub = k_tid / S;
  const int st = k_tid % S;
  const int row = k_block_x * ROWS + sub;
  const bool active = row < rows;
  const size_t base = (size_t)(active ? row : 0) * (size_t)cols;
  float r[NC > 0 ? NC : 1][VEC];
  float m = KLOWEST;
  float s = 0.0f;
  if (active) {
    float mc = KLOWEST;
    for (int j = 0; j < NC; ++j) {
      const int c = (st + j * S) * VEC;
      if (c < cols) {
        k_load<VEC>(x + base + c, r[j]);
        for (int i = 0; i < VEC; ++i) mc = KFMAX(mc, r[j][i]);
      }
    }
    for (int c = (st + NC * S) * VEC; c < cols; c += S * VEC) {
      float v[VEC];
      k_load<VEC>(x + base + c, v);
      float cm = v[0];
      for (int i = 1; i < VEC; ++i) cm = KFMAX(cm, v[i]);
      if (cm > m) {
        s = s * KEXP(m - cm);
        m = cm;
      }
      for (int i = 0; i < VEC; ++i) s += KEXP(v[i] - m);
    }
    const float mt = KFMAX(mc, m);
    s = s * KEXP(m - mt);
    m = mt;
    for (int j = 0; j < NC; ++j) {
      const int c = (st + j * S) * VEC;
      if (c < cols) {
        for (int i = 0; i < VEC; ++i) {
          r[j][i] = KEXP(r[j][i] - m);
          s += r[j][i];
        }
      }
    }
  }
  const float wm = KSIMD_MAX(m);
  const float ws = KSIMD_SUM(s * KEXP(m - wm));
  if (k_lane == 0) {
    k_max[k_warp] = wm;
    k_sum[k_warp] = ws;
  }
  KBARRIER();
  float rm = KLOWEST;
  for (int i = 0; i < NW; ++i) rm = KFMAX(rm, k_max[sub * NW + i]);
  float rs = 0.0f;
  for (int i = 0; i < NW; ++i) rs += k_sum[sub * NW + i] * KEXP(k_max[sub * NW + i] - rm);
  if (!active) return;
  const float inv = 1.0f / rs;
  const float scale = KEXP(m - rm) * inv;
  for (int j = 0; j < NC; ++j) {
    const int c = (st + j * S) * VEC;
    if (c < cols) {
      float v[VEC];
      for (int i = 0; i < VEC; ++i) v[i] = r[j][i] * scale;
      k_store<VEC>(y + base + c, v);
    }
  }
  for (int c = (st + NC * S) * VEC; c < cols; c += S * VEC) {
    float v[VEC];
    k_load<VEC>(x + base + c, v);
    for (int i = 0; i < VEC; ++i) v[i] = KEXP(v[i] - rm) * inv;
    k_store<VEC>(y + base + c, v);
  }
"""


def make_inputs(shape, dtype, key):
    import mlx.core as mx

    # logits with a spread of a few units, so rows have a few large probabilities
    return [(2.0 * mx.random.normal((shape["rows"], shape["cols"]), key=key)).astype(dtype)]


def reference(inputs, shape):
    import mlx.core as mx

    x = inputs[0].astype(mx.float32)
    e = mx.exp(x - mx.max(x, axis=-1, keepdims=True))
    return [e / mx.sum(e, axis=-1, keepdims=True)]


def mlx_op(inputs, shape):
    import mlx.core as mx

    return [mx.softmax(inputs[0], axis=-1)]


SPEC = KernelSpec(
    name="softmax",
    description="softmax over the last axis, row held in registers or read twice (attention, vocab)",
    kernel_class="row_reduction",
    inputs=("x",),
    outputs=("y",),
    body=BODY,
    params={**ROW_PARAMS, "CACHE": (0, 1, 2)},
    constraints=ROW_CONSTRAINTS,
    shape_grid=load_grid("softmax"),
    launch=row_launch,
    tiles=ROW_TILES,
    make_inputs=make_inputs,
    reference=reference,
    # read x once, write y (a row longer than the register cache is read twice, mostly from L2;
    # not counted)
    bytes_moved=lambda s, b: 2.0 * s["rows"] * s["cols"] * b,
    flops=lambda s: 7.0 * s["rows"] * s["cols"],
    # outputs are probabilities down to ~1/cols: an absolute tolerance of 1e-3 would pass a
    # kernel that is off by a factor on long rows, so it is tightened below the defaults
    tolerance={"float32": (1e-4, 1e-6), "float16": (1e-2, 1e-5), "bfloat16": (5e-2, 1e-5)},
    mlx_op=mlx_op,
    # what CACHE means for a row (the body's F, in floats a thread keeps): the share of the row
    # read only once, and the registers that cost (fewer threadgroups fit on a core)
    features={
        "reg_floats": "CACHE * min(16384 // TG, 32)",
        "row_cached": "min(1, (TG // ROWS) * CACHE * min(16384 // TG, 32) / cols)",
    },
)
