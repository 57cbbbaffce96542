"""MoE router: per token, the top-k experts of the logits and the softmax over the selected logits.

Outputs `weights` [tokens, k] (float32) and `indices` [tokens, k] (int32), sorted by descending
logit, ties broken by the lower expert index (the order `argsort(-logits)` gives for distinct
values).

How the kernel gets k. k is a shape dimension, but the per-thread candidate lists live in
registers, so their length must be a compile-time constant, and the template is the config.
So the list length is the config parameter KMAX (1, 2, 4 or 8) with the constraint
`k <= KMAX`: every thread keeps its KMAX best candidates, the merge keeps the token's KMAX best,
and the first k of them are the answer. The runtime k comes from a tiny extra int32 input `kk`
of shape [k] whose contents are never read: the kernel reads `kk_shape[0]` (output shapes are
not passed to a kernel, so `indices` cannot tell it). KMAX = 8 is legal for every k; a smaller
KMAX is cheaper (shorter lists, less threadgroup memory), and the tuner sees which one pays.

Layout: a threadgroup holds TOKENS tokens, S = TG / TOKENS threads per token; a thread reads
EPT contiguous logits at a time (one vector load), striding by S * EPT over the experts, and
keeps its best KMAX in registers. The S lists of a token are then merged pairwise in
threadgroup memory (log2(S) rounds, one barrier each); the merged list's first k entries give
the weights and indices, written by the token's first k threads. TG and TOKENS are powers of
two, so S is too.

Inputs come from `make_inputs` as a random permutation of evenly spaced values per token
(scaled by a random power of two per token): exact in every dtype and free of ties, so the
integer indices can be compared exactly with the reference even in bfloat16, where random
normal logits would tie often.
"""

from __future__ import annotations

import math

from zmlx_pipeline.kernels.spec import Feature, KernelSpec, Launch, TileAxes, load_grid

# The comparator everywhere: (va, ia) before (vb, ib) when va > vb, or equal values and ia < ib.
BODY = r"""
  constexpr int S = TG / TOKENS;
  KSHARED float k_sv[TG * KMAX];
  KSHARED int k_si[TG * KMAX];
  const int tokens = logits_shape[0];
  const int experts = logits_shape[1];
  const int k = kk_shape[0];
  const int tid = (int)k_tid;
  const int sub = tid / S;
  const int st = tid % S;
  const int tok = (int)k_block_x * TOKENS + sub;
  const bool active = tok < tokens;
  float lv[KMAX];
  int li[KMAX];
  for (int j = 0; j < KMAX; ++j) {
    lv[j] = KLOWEST;
    li[j] = 0x7fffffff;
  }
  if (active) {
    const size_t base = (size_t)tok * (size_t)experts;
    for (int e0 = st * EPT; e0 < experts; e0 += S * EPT) {
      float v[EPT];
      k_load<EPT>(logits + base + e0, v);
      for (int q = 0; q < EPT; ++q) {
        const float x = v[q];
        const int e = e0 + q;
        // insert (x, e) into the sorted list; j walks from the tail so every index is a constant
        for (int j = KMAX - 1; j >= 0; --j) {
          bool above_prev = false;
          if (j > 0) above_prev = x > lv[j - 1] || (x == lv[j - 1] && e < li[j - 1]);
          if (above_prev) {
            lv[j] = lv[j - 1];
            li[j] = li[j - 1];
          } else if (x > lv[j] || (x == lv[j] && e < li[j])) {
            lv[j] = x;
            li[j] = e;
          }
        }
      }
    }
  }
  for (int j = 0; j < KMAX; ++j) {
    k_sv[tid * KMAX + j] = lv[j];
    k_si[tid * KMAX + j] = li[j];
  }
  KBARRIER();
  // pairwise merge: in the round with stride d, thread st (st % 2d == 0) merges slot st+d into
  // its own slot; the slots read from (st + d) are never written in the same round
  for (int d = 1; d < S; d *= 2) {
    if (st % (2 * d) == 0) {
      const int a0 = tid * KMAX;
      const int b0 = (tid + d) * KMAX;
      int ia = 0;
      int ib = 0;
      for (int j = 0; j < KMAX; ++j) {
        const float va = k_sv[a0 + ia];
        const float vb = k_sv[b0 + ib];
        const int xa = k_si[a0 + ia];
        const int xb = k_si[b0 + ib];
        const bool take_a = va > vb || (va == vb && xa < xb);
        lv[j] = take_a ? va : vb;
        li[j] = take_a ? xa : xb;
        ia += take_a ? 1 : 0;
        ib += take_a ? 0 : 1;
      }
      for (int j = 0; j < KMAX; ++j) {
        k_sv[a0 + j] = lv[j];
        k_si[a0 + j] = li[j];
      }
    }
    KBARRIER();
  }
  if (!active) return;
  // the token's merged list is in the slot of its first thread
  const int r0 = sub * S * KMAX;
  const float vmax = k_sv[r0];
  float denom = 0.0f;
  for (int j = 0; j < k; ++j) denom += KEXP(k_sv[r0 + j] - vmax);
  const size_t obase = (size_t)tok * (size_t)k;
  for (int j = st; j < k; j += S) {
    weights[obase + j] = KEXP(k_sv[r0 + j] - vmax) / denom;
    indices[obase + j] = k_si[r0 + j];
  }
"""

PARAMS = {
    "TG": (32, 64, 128, 256),
    "TOKENS": (1, 2, 4, 8, 16),
    "EPT": (1, 2, 4, 8),
    "KMAX": (2, 4, 8),
}

CONSTRAINTS = (
    "TG <= max_threads",
    "TG % TOKENS == 0",
    # the pairwise merge needs a power-of-two number of threads per token
    "((TG // TOKENS) & (TG // TOKENS - 1)) == 0",
    "k <= KMAX",
    "k <= experts",
    "experts % EPT == 0",
    "EPT * dtype_bytes <= 16",
    # no thread of a token without logits to read
    "(TG // TOKENS) * EPT <= experts",
    # no more token slots than tokens, unless fewer cannot fill the threadgroup
    "TOKENS <= max(tokens, TG // experts)",
    # the candidate lists in threadgroup memory: a float and an int per entry
    "TG * KMAX * 8 <= tg_mem_bytes",
)


def launch(config, shape):
    """One threadgroup per TOKENS tokens; weights in float32, indices in int32."""
    groups = -(-shape["tokens"] // config["TOKENS"])
    out = (shape["tokens"], shape["k"])
    return Launch(grid=(groups * config["TG"], 1, 1), threadgroup=(config["TG"], 1, 1),
                  output_shapes=(out, out), output_dtypes=("float32", "int32"))


def make_inputs(shape, dtype, key):
    """Logits without ties: a random permutation of evenly spaced values, scaled by 2^r per token."""
    import mlx.core as mx

    tokens, experts = shape["tokens"], shape["experts"]
    k1, k2 = mx.random.split(key)
    ranks = mx.argsort(mx.random.uniform(shape=(tokens, experts), key=k1), axis=-1).astype(mx.float32)
    # (rank - experts/2) is an integer of magnitude <= 128 for experts <= 256: exact in bfloat16
    step = 2.0 ** (2 - math.ceil(math.log2(max(2, experts))))
    scale = mx.power(2.0, mx.random.randint(-2, 2, (tokens, 1), key=k2).astype(mx.float32))
    logits = (ranks - float(experts // 2)) * step * scale
    kk = mx.zeros((shape["k"],), dtype=mx.int32)
    return [logits.astype(dtype), kk]


def reference(inputs, shape):
    import mlx.core as mx

    x = inputs[0].astype(mx.float32)
    k = shape["k"]
    idx = mx.argsort(-x, axis=-1)[:, :k]
    vals = mx.take_along_axis(x, idx, axis=-1)
    return [mx.softmax(vals, axis=-1), idx.astype(mx.int32)]


def mlx_op(inputs, shape):
    """What an MLX MoE block does: argpartition for the top k, then a softmax over the selected logits."""
    import mlx.core as mx

    x = inputs[0]
    k = shape["k"]
    idx = mx.argpartition(-x, kth=k - 1, axis=-1)[:, :k]
    vals = mx.take_along_axis(x, idx, axis=-1)
    return [mx.softmax(vals.astype(mx.float32), axis=-1), idx.astype(mx.int32)]


SPEC = KernelSpec(
    name="topk_gating",
    description="MoE router: top-k experts per token and the softmax of their logits",
    kernel_class="row_topk",
    inputs=("logits", "kk"),
    outputs=("weights", "indices"),
    body=BODY,
    params=PARAMS,
    constraints=CONSTRAINTS,
    shape_grid=load_grid("topk_gating"),
    launch=launch,
    # one threadgroup per TOKENS tokens: the geometry for new devices only, as the row kernels'
    tiles=TileAxes(grid={"tokens": ("TOKENS",)}, threads=("TG",), seen=False),
    make_inputs=make_inputs,
    reference=reference,
    # logits read once; float32 weights and int32 indices written
    bytes_moved=lambda s, b: s["tokens"] * s["experts"] * b + s["tokens"] * s["k"] * 8,
    # one comparison per logit, and per selected logit a subtract, exp, add and divide
    flops=lambda s: float(s["tokens"] * (s["experts"] + 4 * s["k"])),
    mlx_op=mlx_op,
    # the passes each thread makes over a token's experts, and the threadgroups launched; kept out of
    # the per-device models, where they did not help a left-out device (notes/learning.md)
    features={"trips": Feature("experts / ((TG // TOKENS) * EPT)", per_device=False),
              "threadgroups": Feature("tokens / TOKENS", per_device=False)},
)
