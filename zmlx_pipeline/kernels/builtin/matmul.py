"""Tensor-core matmul: C[M, N] = A[M, K] @ B[K, N], float32 accumulation, K slabs staged through threadgroup memory.

A threadgroup of WM x WN warps (SIMD groups) computes a BM x BN block of C. Each warp owns a
(BM/WM) x (BN/WN) part of it as 16x16 accumulator tiles and multiplies with the prelude's "mma"
vocabulary: CUDA's mma.sync tensor-core instructions fed by ldmatrix (float32 as three TF32
products, which keeps float32 accuracy), Metal's simdgroup 8x8 matrices. K is walked in BK-deep
slabs held in a ring of STAGES buffers: while the warps multiply one slab, the copies of the next
STAGES - 1 are in flight (asynchronous 16-byte copies on CUDA; on Metal the copies are plain and
the ring only costs memory). On CUDA the ring is dynamic shared memory (`ring_bytes`), so it may
pass the 48 KiB of static memory. Slab rows are padded (A by 16 bytes, B by 8 elements) so the
fragment loads hit distinct banks. A threadgroup inside C with 16-byte aligned rows copies whole
slabs with no per-copy checks (measured on the H100: the checked copies had cost 1.3-1.4x at
2048 x 14336 x 4096); edges in M, N and K are zero-filled, so no dimension needs to be a multiple
of its tile, and rows that are not 16-byte aligned are copied element by element. Each lane
stores its accumulator elements in pairs of row neighbours (one 4-byte store in float16).

The grid's x axis counts row blocks and its y axis column blocks: consecutive threadgroups share
a column block of B, which keeps the weight streaming through L2 once per wave.
TG is determined by the warp layout (`TG == 32 * WM * WN`); BM = 16 serves the decode shapes
(M = 1..16), where a tile is mostly padding but the kernel is bound by reading B anyway.

WG = 1 is a second path, for Hopper (sm_90) and 16-bit types only: the prelude's "wgmma"
vocabulary computes the whole tile with warpgroup MMAs reading 128-byte-swizzled slabs straight
from shared memory (no fragment loads through registers), BM / 64 warpgroups (WM = BM / 64, WN = 4
warps each), BK = 64 and a ring of 3 or 4 stages. Measured in lab/tools/probe/wgmma_probe.py at
2048 x 14336 x 4096: 70-78% of mx.matmul, where the warp-MMA path reaches 40-44%.
"""

from __future__ import annotations

from zmlx_pipeline.kernels.spec import KernelSpec, Launch, TileAxes, load_grid

BODY = r"""
  constexpr int V = 16 / (int)sizeof(T);   // elements in one 16-byte copy
  constexpr int LDA = BK + V;              // padded row strides of the A and B slabs
  constexpr int LDB = BN + 8;
  constexpr int WTM = BM / (16 * WM);      // 16x16 tiles of one warp along M and N
  constexpr int WTN = BN / (16 * WN);
  // the ring: STAGES slabs of A (BM x BK), then STAGES of B (BK x BN); dynamic on CUDA (SPEC.shared_memory)
  KSHARED_DYN(T, k_as, STAGES * BM * LDA, 0);
  KSHARED_DYN(T, k_bs, STAGES * BK * LDB, STAGES * BM * LDA);
  const int M = a_shape[0];
  const int K = a_shape[1];
  const int N = b_shape[1];
  if (WG) {  // the warpgroup-MMA path computes the whole tile (a no-op wherever WG == 0)
    k_wg_matmul<T, BM, BN, STAGES, WG>(a, b, c, M, N, K, (int)k_block_x * BM, (int)k_block_y * BN, (int)k_tid);
    return;
  }
  const int tid = (int)k_tid;
  const int m0 = (int)k_block_x * BM;
  const int n0 = (int)k_block_y * BN;
  const int wr = ((int)k_warp / WN) * (BM / WM);
  const int wc = ((int)k_warp % WN) * (BN / WN);
  k_mma_acc acc[WTM * WTN];
  KUNROLL
  for (int i = 0; i < WTM * WTN; ++i) k_mma_zero(&acc[i]);
  const int KT = (K + BK - 1) / BK;
  // a threadgroup inside C whose rows are 16-byte aligned copies whole slabs with no per-copy checks
  const bool whole = m0 + BM <= M && n0 + BN <= N && K % V == 0 && N % V == 0;
  KCDEV_PTR(T) a_tile = a + (size_t)m0 * (size_t)K;
  KCDEV_PTR(T) b_tile = b + n0;
  // iteration kt multiplies slab kt; slabs 0 .. STAGES - 2 are requested before the first one
  for (int kt = 1 - STAGES; kt < KT; ++kt) {
    if (kt >= 0) {
      k_async_wait<STAGES - 2>();  // slab kt has landed (later slabs may still be in flight)
      KBARRIER();                  // ... for every thread, and slab kt - 1's buffer is free
    }
    const int lt = kt + STAGES - 1;
    if (lt < KT && whole && lt * BK + BK <= K) {
      const int s = lt % STAGES;
      const int k0 = lt * BK;
      constexpr int CA = BM * (BK / V);  // 16-byte copies of one A slab, and of one B slab
      constexpr int CB = BK * (BN / V);
      KUNROLL
      for (int c = 0; c < (CA + TG - 1) / TG; ++c) {
        const int e = tid + c * TG;
        if (CA % TG == 0 || e < CA) {
          const int r = e / (BK / V);
          const int q = (e % (BK / V)) * V;
          k_copy_async16(k_as + (s * BM + r) * LDA + q, a_tile + (size_t)r * (size_t)K + k0 + q);
        }
      }
      KUNROLL
      for (int c = 0; c < (CB + TG - 1) / TG; ++c) {
        const int e = tid + c * TG;
        if (CB % TG == 0 || e < CB) {
          const int q = e / (BN / V);
          const int cc = (e % (BN / V)) * V;
          k_copy_async16(k_bs + (s * BK + q) * LDB + cc, b_tile + (size_t)(k0 + q) * (size_t)N + cc);
        }
      }
    } else if (lt < KT) {  // edges: zero-filled, element by element where a row is not aligned
      const int s = lt % STAGES;
      const int k0 = lt * BK;
      for (int e = tid; e < BM * (BK / V); e += TG) {
        const int r = e / (BK / V);
        const int q = (e % (BK / V)) * V;
        const int gm = m0 + r;
        const int gk = k0 + q;
        const int n = gm < M ? (K - gk < V ? (K - gk > 0 ? K - gk : 0) : V) : 0;
        k_copy_async<V>(k_as + (s * BM + r) * LDA + q, a + (n > 0 ? (size_t)gm * (size_t)K + gk : 0), n);
      }
      for (int e = tid; e < BK * (BN / V); e += TG) {
        const int q = e / (BN / V);
        const int cc = (e % (BN / V)) * V;
        const int gk = k0 + q;
        const int gn = n0 + cc;
        const int n = gk < K ? (N - gn < V ? (N - gn > 0 ? N - gn : 0) : V) : 0;
        k_copy_async<V>(k_bs + (s * BK + q) * LDB + cc, b + (n > 0 ? (size_t)gk * (size_t)N + gn : 0), n);
      }
    }
    k_async_commit();
    if (kt >= 0) {
      const int s = kt % STAGES;
      KUNROLL
      for (int kk = 0; kk < BK; kk += 16) {
        k_mma_a<T> fa[WTM];
        k_mma_b<T> fb[WTN];
        KUNROLL
        for (int i = 0; i < WTM; ++i) k_mma_load_a(&fa[i], k_as + (s * BM + wr + i * 16) * LDA + kk, LDA, k_lane);
        KUNROLL
        for (int j = 0; j < WTN; ++j) k_mma_load_b(&fb[j], k_bs + (s * BK + kk) * LDB + wc + j * 16, LDB, k_lane);
        KUNROLL
        for (int i = 0; i < WTM; ++i) {
          KUNROLL
          for (int j = 0; j < WTN; ++j) k_mma(&acc[i * WTN + j], &fa[i], &fb[j]);
        }
      }
    }
  }
  KUNROLL
  for (int i = 0; i < WTM; ++i) {
    KUNROLL
    for (int j = 0; j < WTN; ++j) {
      KUNROLL
      for (int e = 0; e < 8; e += 2) {  // elements e and e + 1 are neighbours in one row, e's column even
        const int gm = m0 + wr + i * 16 + k_mma_row(e, k_lane);
        const int gn = n0 + wc + j * 16 + k_mma_col(e, k_lane);
        if (gm < M) {
          const float pair[2] = {k_mma_get(&acc[i * WTN + j], e), k_mma_get(&acc[i * WTN + j], e + 1)};
          if (gn + 1 < N && N % 2 == 0) {
            k_store<2>(c + (size_t)gm * (size_t)N + gn, pair);  // one 2-element store, aligned as N and gn are even
          } else {
            if (gn < N) c[(size_t)gm * (size_t)N + gn] = static_cast<T>(pair[0]);
            if (gn + 1 < N) c[(size_t)gm * (size_t)N + gn + 1] = static_cast<T>(pair[1]);
          }
        }
      }
    }
  }
"""

PARAMS = {
    "TG": (32, 64, 128, 256),
    "BM": (16, 32, 64, 128),
    "BN": (32, 64, 128, 256),
    "BK": (32, 64),
    "WM": (1, 2, 4),
    "WN": (1, 2, 4),
    "STAGES": (2, 3, 4),
    "WG": (0, 1),
}

CONSTRAINTS = (
    "TG == 32 * WM * WN",
    "TG <= max_threads",
    # the warp-level matrix ops assume 32-lane SIMD groups
    "simd_width == 32",
    # on CUDA the body's cp.async copies and m16n8k16 MMAs (bf16 among them) exist from sm_80 (Ampere) on, its
    # ldmatrix loads from sm_75: an older NVIDIA GPU (Turing, Volta, Pascal) cannot compile it
    "cuda_arch == 0 or cuda_arch >= 80",
    # -- the warp-MMA path (WG == 0), on every device --
    "WG == 1 or (BM % (16 * WM) == 0 and BN % (16 * WN) == 0)",
    # accumulator registers: at most 16 tiles of 16x16 a warp (8 for float32, whose operands
    # also carry their TF32 halves)
    "WG == 1 or (BM // (16 * WM)) * (BN // (16 * WN)) <= 16 // (dtype_bytes // 2)",
    # and at least two, so a fragment load feeds more than one multiply
    "WG == 1 or (BM // (16 * WM)) * (BN // (16 * WN)) >= 2",
    # what kept the space to a collectable size (about 1.7 s a config to compile, check and time in one
    # process, mostly NVRTC): no one-warp threadgroups, at least two B tiles a warp, and a 64-deep
    # slab only in a 2-deep ring (a deeper one measured no faster on the H100)
    "WM * WN >= 2",
    "WG == 1 or BN // (16 * WN) >= 2",
    "WG == 1 or BK == 32 or STAGES == 2",
    # and a 32-deep slab only in a 4-deep ring where memory allows one: 32-deep in a 2-deep ring keeps
    # the least in flight and measured slowest (H100, 2048 x 14336 x 4096 fp16: 903 us against 806-831
    # for the other two), and dropping it brings a CUDA collect's compiles per dtype from 152 to 100,
    # which one process (every config of a case is timed in one) compiles within a call's 10 minutes
    "WG == 1 or STAGES == 4 or BK == 64 or tg_mem_bytes < 49152",
    "WG == 1 or STAGES != 3",
    # the ring of slabs, padded rows included (ring_bytes). It is dynamic shared memory on CUDA, where
    # every device that runs this kernel (sm_80 on: cp.async, m16n8k16) lets a kernel opt in to at
    # least 99 KiB, beyond the 48 KiB of static memory the catalog lists; Metal keeps its own limit
    "WG == 1 or STAGES * (BM * (BK + 16 // dtype_bytes) + BK * (BN + 8)) * dtype_bytes"
    " <= (101376 if tg_mem_bytes >= 49152 else tg_mem_bytes)",
    # decode shapes get BM = 16 (a row block mostly padding is pointless), prefill shapes the
    # larger ones (a row block of 16 rows re-reads B for every 16 rows)
    "WG == 1 or min(M, 16) <= BM <= max(16, 4 * M)",
    # Metal's metal_kernel passes an input of under 8 elements in the constant address space, which the
    # body's device pointers (KCDEV_PTR, k_copy_async) cannot hold; so such shapes run on CUDA only
    "cuda_arch > 0 or (M * K >= 8 and K * N >= 8)",
    # -- the warpgroup-MMA path (WG == 1): wgmma exists on sm_90 only, for 16-bit inputs here
    # (float32 would need TF32 with a K-major B) --
    "WG == 0 or (cuda_arch == 90 and dtype_bytes == 2)",
    # BM / 64 warpgroups of 4 warps, 64-deep slabs (one 128-byte swizzle row of A), N tiles of 128 or 256
    # (BN / 2 accumulators a thread), and 3 or 4 stages (one slab in flight or two, beside the MMA batch)
    "WG == 0 or (WM * 64 == BM and WN == 4 and BK == 64 and BN >= 128 and STAGES >= 3)",
    # its copies are 16-byte chunks, zero-filled past the edges: rows of 8 elements
    "WG == 0 or (N % 8 == 0 and K % 8 == 0)",
    # two warpgroups only where M fills them (BM = 64 serves decode: 0.97-1.5x mx.matmul in the probe)
    "WG == 0 or BM == 64 or M > 64",
    # its ring (ring_bytes): within the 227 KiB of shared memory a Hopper kernel may opt in to
    "WG == 0 or STAGES * (BM + BN) * 128 + 1024 <= 232448",
)


def ring_bytes(config, dtype_bytes):
    """Threadgroup memory of the slab ring (the ring constraints' left sides): the launch's dynamic shared memory on CUDA."""
    if config.get("WG"):  # 64-deep swizzled slabs of A and B, and 1 KiB to align the ring to 1024 bytes
        return config["STAGES"] * (config["BM"] + config["BN"]) * 128 + 1024
    v = 16 // dtype_bytes
    return config["STAGES"] * (config["BM"] * (config["BK"] + v) + config["BK"] * (config["BN"] + 8)) * dtype_bytes


def launch(config, shape):
    """x: row blocks of BM (in threads: whole threadgroups); y: column blocks of BN."""
    rows = -(-shape["M"] // config["BM"])
    cols = -(-shape["N"] // config["BN"])
    return Launch(grid=(rows * config["TG"], cols, 1), threadgroup=(config["TG"], 1, 1),
                  output_shapes=((shape["M"], shape["N"]),))


def make_inputs(shape, dtype, key):
    """A ~ N(0, 1) activations, B ~ N(0, 1/K) weights, so every C entry is of order 1."""
    import mlx.core as mx

    k1, k2 = mx.random.split(key)
    a = mx.random.normal((shape["M"], shape["K"]), key=k1).astype(dtype)
    b = (mx.random.normal((shape["K"], shape["N"]), key=k2) * shape["K"] ** -0.5).astype(dtype)
    return [a, b]


def _tf32_split(x):
    """x = hi + lo with hi exact in TF32 (10 mantissa bits) and lo its small remainder."""
    import mlx.core as mx

    bits = mx.bitwise_and(mx.view(x, mx.uint32), mx.array(0xFFFFE000, dtype=mx.uint32))
    hi = mx.view(bits, mx.float32)
    return hi, x - hi


def reference(inputs, shape):
    """float32 C, exact to float32 rounding even where float32 matmuls run in TF32.

    MLX's CUDA backend multiplies float32 in TF32 by default (MLX_ENABLE_TF32), which keeps 10
    mantissa bits of each input; so the reference splits each input into a TF32-exact high
    part and a remainder and adds the three products that matter (lo @ lo is below float32
    rounding). For float16 and bfloat16 inputs the remainders are zero.
    """
    import mlx.core as mx

    a, b = (t.astype(mx.float32) for t in inputs)
    ah, al = _tf32_split(a)
    bh, bl = _tf32_split(b)
    return [mx.matmul(ah, bh) + (mx.matmul(ah, bl) + mx.matmul(al, bh))]


def mlx_op(inputs, shape):
    import mlx.core as mx

    a, b = inputs
    return [mx.matmul(a, b)]


SPEC = KernelSpec(
    name="matmul",
    description="Tensor-core matmul C = A @ B (warp MMA, or Hopper warpgroup MMA, on staged K slabs, float32 accumulation)",
    kernel_class="matmul",
    inputs=("a", "b"),
    outputs=("c",),
    body=BODY,
    params=PARAMS,
    constraints=CONSTRAINTS,
    shape_grid=load_grid("matmul"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, b: (s["M"] * s["K"] + s["K"] * s["N"] + s["M"] * s["N"]) * b,
    flops=lambda s: 2.0 * s["M"] * s["N"] * s["K"],
    # float32 sums over K up to 14336 in a different order than the reference's
    tolerance={"float32": (1e-3, 2e-4)},
    mlx_op=mlx_op,
    # a threadgroup computes a BM x BN tile of C with TG threads, stepping over K by BK
    tiles=TileAxes(grid={"M": ("BM",), "N": ("BN",)}, threads=("TG",), steps={"K": ("BK",)}),
    extensions=("mma", "wgmma"),
    shared_memory=ring_bytes,
)
