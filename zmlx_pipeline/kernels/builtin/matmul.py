"""Tiled matmul: C[M, N] = A[M, K] @ B[K, N], tiles in threadgroup memory, float32 accumulation.

A threadgroup computes a BM x BN block of C, stepping over K in BK-deep slabs: the threads load
the BM x BK slab of A and the BK x BN slab of B into threadgroup memory (as float, guarded at
the M, N and K edges, so no dimension needs to be a multiple of its tile), then each thread
accumulates a TM x TN sub-tile in registers. A thread's rows and columns are strided by the
number of threads along each axis (row ty + i * BM/TM, column tx + j * BN/TN), so the B-slab
reads of a SIMD group hit consecutive banks and the C stores are coalesced. The A slab is
stored transposed with a rotation of its rows by the k index, which keeps both its store and
its reads free of bank conflicts without padding; that needs BM to be a power of two (every
candidate is).

TG is a parameter like every kernel's threadgroup size, but it is determined by the tile:
the constraint `TG == (BM // TM) * (BN // TN)` removes every other combination before launch.
BM = 1 and 4 give the decode shapes (M = 1..16) tiles that are not mostly padding.
The grid's x axis counts column blocks (N / BN, up to thousands), its y axis row blocks.
"""

from __future__ import annotations

from zmlx_pipeline.kernels.spec import KernelSpec, Launch, TileAxes, load_grid

BODY = r"""
  constexpr int NT = BN / TN;
  constexpr int MT = BM / TM;
  KSHARED float k_as[BK * BM];
  KSHARED float k_bs[BK * BN];
  const int M = a_shape[0];
  const int K = a_shape[1];
  const int N = b_shape[1];
  const int tid = (int)k_tid;
  const int tx = tid % NT;
  const int ty = tid / NT;
  const int m0 = (int)k_block_y * BM;
  const int n0 = (int)k_block_x * BN;
  float acc[TM * TN];
  for (int i = 0; i < TM * TN; ++i) acc[i] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += BK) {
    // A slab, element (r, q) = A[m0 + r, k0 + q], stored at k_as[q * BM + ((r + q) & (BM - 1))]
    for (int e = tid; e < BM * BK; e += TG) {
      const int r = e / BK;
      const int q = e % BK;
      const int gm = m0 + r;
      const int gk = k0 + q;
      float v = 0.0f;
      if (gm < M && gk < K) v = static_cast<float>(a[(size_t)gm * (size_t)K + gk]);
      k_as[q * BM + ((r + q) & (BM - 1))] = v;
    }
    // B slab, element (q, cc) = B[k0 + q, n0 + cc], stored at k_bs[q * BN + cc]
    for (int e = tid; e < BK * BN; e += TG) {
      const int q = e / BN;
      const int cc = e % BN;
      const int gk = k0 + q;
      const int gn = n0 + cc;
      float v = 0.0f;
      if (gk < K && gn < N) v = static_cast<float>(b[(size_t)gk * (size_t)N + gn]);
      k_bs[e] = v;
    }
    KBARRIER();
    for (int q = 0; q < BK; ++q) {
      float av[TM];
      float bv[TN];
      for (int i = 0; i < TM; ++i) av[i] = k_as[q * BM + ((ty + i * MT + q) & (BM - 1))];
      for (int j = 0; j < TN; ++j) bv[j] = k_bs[q * BN + tx + j * NT];
      for (int i = 0; i < TM; ++i) {
        for (int j = 0; j < TN; ++j) acc[i * TN + j] += av[i] * bv[j];
      }
    }
    KBARRIER();
  }
  for (int i = 0; i < TM; ++i) {
    const int gm = m0 + ty + i * MT;
    if (gm >= M) continue;
    for (int j = 0; j < TN; ++j) {
      const int gn = n0 + tx + j * NT;
      if (gn < N) c[(size_t)gm * (size_t)N + gn] = static_cast<T>(acc[i * TN + j]);
    }
  }
"""

PARAMS = {
    "TG": (32, 64, 128, 256, 512, 1024),
    "BM": (1, 4, 16, 64, 128),
    "BN": (64, 128),
    "BK": (16, 32),
    "TM": (1, 4, 8),
    "TN": (4, 8),
}

CONSTRAINTS = (
    "BM % TM == 0 and BN % TN == 0",
    # the A slab's rotation masks with BM - 1
    "(BM & (BM - 1)) == 0",
    "TG == (BM // TM) * (BN // TN)",
    "TG <= max_threads",
    # float slabs of A and B
    "(BM * BK + BK * BN) * 4 <= tg_mem_bytes",
    # the B slab splits evenly over the threads (the A slab is guarded: decode tiles are tiny)
    "(BK * BN) % TG == 0",
    # decode shapes get the small BM values (a row block mostly padding is pointless), prefill
    # shapes the large ones (a row block of 1 or 4 rows re-reads B for every few rows)
    "min(M, 16) <= BM <= max(16, 4 * M)",
)


def launch(config, shape):
    """x: column blocks of BN (in threads: whole threadgroups); y: row blocks of BM."""
    cols = -(-shape["N"] // config["BN"])
    rows = -(-shape["M"] // config["BM"])
    return Launch(grid=(cols * config["TG"], rows, 1), threadgroup=(config["TG"], 1, 1),
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
    description="Tiled matmul C = A @ B (threadgroup-memory tiles, float32 accumulation)",
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
)
