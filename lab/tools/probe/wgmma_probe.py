"""wgmma probe (GPU, Hopper): a warpgroup-MMA matmul body in mx.fast.cuda_kernel, checked and timed next to mx.matmul.

    python lab/tools/probe/wgmma_probe.py [--dtypes float16,bfloat16] [--shape M,N,K] [--variants all|quick]
                                      [--mode speed|edges|all] [--json OUT]

Not part of the package: a kernel-development tool for the matmul target (at least half of
mx.matmul). C[M, N] = A[M, K] @ B[K, N] with both row-major, so A is K-major and B is N-major
(wgmma's transposed-B mode, which 16-bit types allow). A threadgroup of BM / 64 warpgroups
computes a BM x BN block; K is walked in 64-deep slabs copied by cp.async into a ring of ST
stages, each slab in the 128-byte-swizzled layout wgmma's shared-memory descriptors describe.
WAITN = 1 keeps one warpgroup MMA batch in flight while the next slab is issued. BSWAP says
which of the descriptor's two byte offsets strides across 64-column atoms of B (the probe tries
both, and keeps what the reference check accepts). EDGES = 1 zero-fills the copies of chunks past
M, N or K and skips stores past M and N, so any M works, with N and K multiples of 8 (16-byte
rows); EDGES = 0 needs M, N and K multiples of BM, BN and 64. BM = 64 is one warpgroup, for decode.

Recorded runs: lab/results/wgmma_probe-{h200,h100}.json and benchmarks/results/wgmma_probe-h100-run2.json
(the aligned body, 70-78% of mx.matmul at 2048 x 14336 x 4096) and benchmarks/results/wgmma_probe-all-h200.json (--mode all: the edge path passes
every check, and BM = 64 runs decode shapes at 0.97-1.5x mx.matmul).

The collected kernel's copy of this body is the prelude's "wgmma" vocabulary
(zmlx_pipeline/kernels/prelude.py, matmul's WG = 1 path), with BSWAP, WAITN and EDGES settled
(0, 1, and edges checked only in edge tiles). This probe keeps those knobs for experiments, so the
two copies overlap by design: change the prelude's one for the product.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

HEADER = r"""
__device__ __forceinline__ unsigned int wg_smem_u32(const void* p) {
  return (unsigned int)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void wg_cp16(unsigned int dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src));
}
__device__ __forceinline__ void wg_cp16z(unsigned int dst, const void* src, int bytes) {
  // copies `bytes` (0 or 16) and zero-fills the rest of the 16: an edge chunk outside A or B
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void wg_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void wg_cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }
__device__ __forceinline__ unsigned long long wg_desc(unsigned int addr, unsigned int lbo, unsigned int sbo) {
  unsigned long long d = 0;
  d |= (unsigned long long)((addr & 0x3FFFF) >> 4);
  d |= (unsigned long long)((lbo & 0x3FFFF) >> 4) << 16;
  d |= (unsigned long long)((sbo & 0x3FFFF) >> 4) << 32;
  d |= (unsigned long long)1 << 62;  // 128-byte swizzle
  return d;
}
__device__ __forceinline__ void wg_store2(__half* p, float x, float y) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}
__device__ __forceinline__ void wg_store2(__nv_bfloat16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
extern __shared__ __align__(1024) unsigned char wg_smem[];
"""


def mma_asm(bn: int, ab: str) -> str:
    """One m64n{bn}k16 warpgroup MMA, f32 accumulators acc[0 .. bn/2), B transposed (N-major)."""
    n = bn // 2
    regs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(acc[{i}])' for i in range(n))
    return (
        f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n + 2}, 0;\\n'
        f'wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{ab}.{ab} {{{regs}}}, %{n}, %{n + 1}, p, 1, 1, 0, 1;\\n}}\\n"'
        f' : {outs} : "l"(da), "l"(db), "r"(1));'
    )


def body(bn: int, ab: str) -> str:
    return r"""
  constexpr int BK = 64;
  constexpr int NT = BM / 64 * 128;
  constexpr int A_BYTES = BM * BK * 2;
  constexpr int B_BYTES = BK * BN * 2;
  constexpr int STAGE = A_BYTES + B_BYTES;
  const int M = a_shape[0];
  const int K = a_shape[1];
  const int N = b_shape[1];
  const unsigned int base = (wg_smem_u32(wg_smem) + 1023u) & ~1023u;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int m0 = blockIdx.x * BM;
  const int n0 = blockIdx.y * BN;
  const int KT = (K + BK - 1) / BK;
  constexpr int D = ST - 1 - WAITN;  // slabs in flight ahead of the one multiplied
  float acc[BN / 2];
  #pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  const T* a_blk = a + (size_t)m0 * K;
  const T* b_blk = b + n0;
  auto load = [&](int kt) {
    const unsigned int sa = base + (kt % ST) * STAGE;
    const unsigned int sb = sa + A_BYTES;
    const int k0 = kt * BK;
    #pragma unroll
    for (int c = 0; c < BM * 8 / NT; ++c) {
      const int e = tid + c * NT;
      const int r = e >> 3, ch = e & 7;
      const unsigned int dst = sa + r * 128 + ((ch ^ (r & 7)) << 4);
      if (EDGES) {  // rows past M and columns past K are zeros (K % 8 == 0: a chunk is all in or all out)
        const bool in = m0 + r < M && k0 + ch * 8 < K;
        wg_cp16z(dst, in ? a_blk + (size_t)r * K + k0 + ch * 8 : a, in ? 16 : 0);
      } else {
        wg_cp16(dst, a_blk + (size_t)r * K + k0 + ch * 8);
      }
    }
    #pragma unroll
    for (int c = 0; c < BK * (BN / 8) / NT; ++c) {
      const int e = tid + c * NT;
      const int k = e / (BN / 8), nc = e % (BN / 8);
      const int n2 = nc >> 3, ch = nc & 7;
      const unsigned int dst = sb + n2 * (BK * 128) + k * 128 + ((ch ^ (k & 7)) << 4);
      if (EDGES) {  // N % 8 == 0, likewise
        const bool in = k0 + k < K && n0 + nc * 8 < N;
        wg_cp16z(dst, in ? b_blk + (size_t)(k0 + k) * N + nc * 8 : b, in ? 16 : 0);
      } else {
        wg_cp16(dst, b_blk + (size_t)(k0 + k) * N + nc * 8);
      }
    }
  };
  for (int s = 0; s < D; ++s) {
    if (s < KT) load(s);
    wg_commit();
  }
  const unsigned int lbo_b = BSWAP ? 1024u : (unsigned int)(BK * 128);
  const unsigned int sbo_b = BSWAP ? (unsigned int)(BK * 128) : 1024u;
  for (int kt = 0; kt < KT; ++kt) {
    wg_cp_wait<D - 1>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (kt + D < KT) load(kt + D);
    wg_commit();
    const unsigned int sa = base + (kt % ST) * STAGE;
    const unsigned int sb = sa + A_BYTES;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    #pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      const unsigned long long da = wg_desc(sa + wg * 64 * 128 + kk * 32, 16u, 1024u);
      const unsigned long long db = wg_desc(sb + kk * 2048, lbo_b, sbo_b);
      MMA_ASM
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(WAITN) : "memory");
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const int row = m0 + wg * 64 + warp * 16 + (lane >> 2);
  #pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int col = n0 + j * 8 + (lane & 3) * 2;
    if (!EDGES || (row < M && col < N)) wg_store2(c + (size_t)row * N + col, acc[4 * j], acc[4 * j + 1]);
    if (!EDGES || (row + 8 < M && col < N)) wg_store2(c + (size_t)(row + 8) * N + col, acc[4 * j + 2], acc[4 * j + 3]);
  }
""".replace("MMA_ASM", mma_asm(bn, ab))


def smem_bytes(bm: int, bn: int, st: int) -> int:
    return st * (bm * 64 + 64 * bn) * 2 + 1024


def time_us(fn, mx, reps: int = 20) -> float:
    """Median of reps host-timed batches of 10 launches (GPU-bound at these sizes)."""
    for _ in range(3):
        mx.eval(fn())
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(*[fn() for _ in range(10)])
        out.append((time.perf_counter() - t0) / 10 * 1e6)
    out.sort()
    return out[len(out) // 2]


class Runner:
    """The probe's kernels for one dtype (one compiled kernel per BN, descriptor reading and ring size)."""

    def __init__(self, mx, dt: str) -> None:
        self.mx = mx
        self.dtype = getattr(mx, dt)
        self.ab = "f16" if dt == "float16" else "bf16"
        self.kernels: dict = {}

    def kernel(self, v: dict, bswap: int):
        smem = smem_bytes(v["BM"], v["BN"], v["ST"])
        key = (v["BN"], bswap, smem)
        if key not in self.kernels:
            self.kernels[key] = self.mx.fast.cuda_kernel(
                name=f"wgmma_mm_{self.ab}_{v['BN']}_{bswap}", input_names=["a", "b"], output_names=["c"],
                source=body(v["BN"], self.ab), header=HEADER, shared_memory=smem)
        return self.kernels[key]

    def run(self, v: dict, bswap: int, a, b):
        mm, kk, nn = a.shape[0], a.shape[1], b.shape[1]
        edges = v.get("EDGES", 0)
        if edges and (kk % 8 or nn % 8):
            raise ValueError("the edge path needs K and N multiples of 8 (16-byte rows)")
        if not edges and (mm % v["BM"] or nn % v["BN"] or kk % 64):
            raise ValueError("without EDGES, M, N and K must be multiples of BM, BN and 64")
        nt = v["BM"] // 64 * 128
        return self.kernel(v, bswap)(
            inputs=[a, b], grid=(-(-mm // v["BM"]) * nt, -(-nn // v["BN"]), 1), threadgroup=(nt, 1, 1),
            output_shapes=[(mm, nn)], output_dtypes=[self.dtype],
            template=[("T", self.dtype), ("BM", v["BM"]), ("BN", v["BN"]), ("ST", v["ST"]),
                      ("WAITN", v["WAITN"]), ("BSWAP", bswap), ("EDGES", edges)])[0]


def _operands(mx, dtype, m: int, n: int, k: int, seed: int):
    ka, kb = mx.random.split(mx.random.key(seed))
    a = mx.random.normal((m, k), key=ka).astype(dtype)
    b = (mx.random.normal((k, n), key=kb) * k ** -0.5).astype(dtype)
    ref = mx.matmul(a.astype(mx.float32), b.astype(mx.float32))
    mx.eval(a, b, ref)
    return a, b, ref


def check_reading(mx, runner: Runner, v: dict, dt: str) -> int | None:
    """Which descriptor reading of B is right: a small product under both; the first that matches."""
    sa, sb, ref = _operands(mx, runner.dtype, 256, 512, 512, seed=3)
    good = None
    for bswap in (0, 1):
        try:
            out = runner.run(v, bswap, sa, sb).astype(mx.float32)
            err = float(mx.max(mx.abs(out - ref)))
        except Exception as exc:  # noqa: BLE001
            err = f"failed: {str(exc)[:800]}"
        print(json.dumps({"dtype": dt, "check_bswap": bswap, "max_abs_err": err}), flush=True)
        if isinstance(err, float) and err < 0.05 and good is None:
            good = bswap
    return good


def time_variants(mx, runner: Runner, good: int, dt: str, variants: list[dict], shape: tuple[int, int, int],
                  seed: int = 5) -> list[dict]:
    """Check and time each variant at one M x N x K, mx.matmul timed before and after each."""
    m, n, k = shape
    a, b, ref = _operands(mx, runner.dtype, m, n, k, seed)
    base_us = time_us(lambda: mx.matmul(a, b), mx)
    flops = 2.0 * m * n * k
    rows = []
    for v in variants:
        row = {"dtype": dt, "M": m, "N": n, "K": k, **v, "BSWAP": good}
        try:
            out = runner.run(v, good, a, b)
            err = float(mx.max(mx.abs(out.astype(mx.float32) - ref)))
            us = time_us(lambda v=v: runner.run(v, good, a, b), mx)
            base2 = time_us(lambda: mx.matmul(a, b), mx)
            row.update(max_abs_err=err, us=us, tflops=flops / us / 1e6, mx_us=(base_us + base2) / 2,
                       pct_mx=100 * (base_us + base2) / 2 / us)
        except Exception as exc:  # noqa: BLE001
            row["error"] = str(exc)[:800]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


#: shapes off the tile grid (M, N, K; K and N multiples of 8) for the edge path's check
EDGE_SHAPES = ((1, 4096, 4096), (16, 14336, 4096), (255, 4000, 4104), (300, 1032, 520), (64, 4096, 14336))
#: decode shapes timed with the one-warpgroup (BM = 64) variants
DECODE_SHAPES = ((1, 14336, 4096), (16, 14336, 4096), (16, 4096, 14336))
EDGE_VARIANTS = [{"BM": bm, "BN": bn, "ST": st, "WAITN": 1, "EDGES": 1}
                 for bm, bn, st in ((128, 128, 4), (128, 256, 4), (64, 128, 4), (64, 256, 3))]


def check_edges(mx, runner: Runner, good: int, dt: str) -> list[dict]:
    """The edge path against the float32 reference on shapes off the tile grid (max abs error; outputs are O(1))."""
    rows = []
    for m, n, k in EDGE_SHAPES:
        a, b, ref = _operands(mx, runner.dtype, m, n, k, seed=7)
        for v in EDGE_VARIANTS:
            row = {"dtype": dt, "check": "edges", "M": m, "N": n, "K": k, **v}
            try:
                out = runner.run(v, good, a, b)
                row["max_abs_err"] = float(mx.max(mx.abs(out.astype(mx.float32) - ref)))
                row["ok"] = row["max_abs_err"] < 0.05
            except Exception as exc:  # noqa: BLE001
                row["error"] = str(exc)[:800]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def probe_dtype(mx, dt: str, variants: list[dict], shape: tuple[int, int, int], mode: str) -> list[dict]:
    """Everything the probe does for one dtype: the descriptor check, then the speed and/or edge passes."""
    runner = Runner(mx, dt)
    good = check_reading(mx, runner, variants[0], dt)
    if good is None:
        return [{"dtype": dt, "error": "no descriptor reading passed the check"}]
    rows = []
    if mode in ("speed", "all"):
        # the tile-aligned body next to the edge-checked one, at the large shape
        both = variants + [{**v, "EDGES": 1} for v in variants]
        rows += time_variants(mx, runner, good, dt, both, shape)
    if mode in ("edges", "all"):
        rows += check_edges(mx, runner, good, dt)
        for dshape in DECODE_SHAPES:
            rows += time_variants(mx, runner, good, dt, [v for v in EDGE_VARIANTS if v["BM"] == 64], dshape)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--shape", default="2048,14336,4096")
    ap.add_argument("--variants", default="all")
    ap.add_argument("--mode", default="all", choices=("speed", "edges", "all"),
                    help="speed: every variant at --shape, tile-aligned and edge-checked; edges: the edge "
                         "path on shapes off the tile grid and the decode shapes; all: both")
    ap.add_argument("--json")
    args = ap.parse_args()
    import mlx.core as mx

    m, n, k = (int(v) for v in args.shape.split(","))
    variants = [{"BM": bm, "BN": bn, "ST": st, "WAITN": w} for bm in (128,) for bn in (128, 256)
                for st in (3, 4) for w in (0, 1) if smem_bytes(bm, bn, st) <= 227 * 1024 and st - 1 - w >= 1]
    if args.variants == "quick":
        variants = variants[:2]
    rows = []
    for dt in args.dtypes.split(","):
        rows += probe_dtype(mx, dt, variants, (m, n, k), args.mode)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"shape": {"M": m, "N": n, "K": k}, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
