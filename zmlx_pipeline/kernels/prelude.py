"""Per-backend preludes: the vocabulary a kernel body is written in, defined once for Metal and once for CUDA.

A kernel body uses only the C++ subset that MSL and CUDA share plus these names:

  index variables (declared in the source prelude, so Metal's attribute search sees them)
    k_tid      thread index in the threadgroup (1-D threadgroups)
    k_block_x  threadgroup index along x,  k_block_y along y
    k_lane     lane in the SIMD group / warp,  k_warp  SIMD group / warp index in the threadgroup
  qualifiers and statements
    KSHARED                 threadgroup-memory declaration (`KSHARED float buf[64];`)
    KBARRIER()              threadgroup barrier over threadgroup memory
    KINLINE                 helper-function qualifier
    KDEV_PTR(T), KCDEV_PTR(T), KTG_PTR(T), KTH_PTR(T)
                            pointer types for helper parameters: device, const device,
                            threadgroup and thread (private) memory
  math (float in, float out)
    KRSQRT KSQRT KEXP KLOG KTANH KFMAX KFMIN KFABS, KLOWEST (most negative finite float)
  reductions
    KSIMD_SUM(v), KSIMD_MAX(v)   over the 32 lanes of a SIMD group / warp
    k_load<V>(ptr, vals), k_store<V>(ptr, vals)
                            V contiguous elements to/from a thread-local float array
                            (one 4-, 8- or 16-byte access on CUDA when V * sizeof(T) allows)

Metal dispatches exactly `grid` threads while CUDA launches whole blocks, so every launch
mapping in this package makes the grid a multiple of the threadgroup and bodies still
bounds-check their indices.

Why one long module: most of it is the Metal and the CUDA source text of the preludes, kept side by
side so that every name of the vocabulary is defined for both backends in one place.
"""

from __future__ import annotations

BACKENDS = ("metal", "cuda")

#: bumped whenever a prelude changes, so kernel versions (hashes) change with it
PRELUDE_VERSION = 2

METAL_HEADER = r"""
// zmlx-pipeline prelude (metal) v2
#define KSHARED threadgroup
#define KBARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)
#define KINLINE inline
#define KDEV_PTR(T) device T*
#define KCDEV_PTR(T) const device T*
#define KTG_PTR(T) threadgroup T*
#define KTH_PTR(T) thread T*
#define KRSQRT(x) metal::precise::rsqrt(x)
#define KSQRT(x) metal::precise::sqrt(x)
#define KEXP(x) metal::precise::exp(x)
#define KLOG(x) metal::precise::log(x)
#define KTANH(x) metal::precise::tanh(x)
#define KFMAX(a, b) metal::fmax(a, b)
#define KFMIN(a, b) metal::fmin(a, b)
#define KFABS(x) metal::fabs(x)
#define KLOWEST (-3.402823466e+38f)
#define KSIMD_SUM(v) metal::simd_sum(v)
#define KSIMD_MAX(v) metal::simd_max(v)

template <int V, typename T>
inline void k_load(const device T* p, thread float* vals) {
  for (int i = 0; i < V; ++i) {
    vals[i] = static_cast<float>(p[i]);
  }
}

// metal_kernel passes an input of fewer than 8 elements in the constant address space
template <int V, typename T>
inline void k_load(const constant T* p, thread float* vals) {
  for (int i = 0; i < V; ++i) {
    vals[i] = static_cast<float>(p[i]);
  }
}

template <int V, typename T>
inline void k_store(device T* p, const thread float* vals) {
  for (int i = 0; i < V; ++i) {
    p[i] = static_cast<T>(vals[i]);
  }
}
"""

METAL_SOURCE = r"""
  const uint k_tid = thread_position_in_threadgroup.x;
  const uint k_block_x = threadgroup_position_in_grid.x;
  const uint k_block_y = threadgroup_position_in_grid.y;
  const uint k_lane = thread_index_in_simdgroup;
  const uint k_warp = simdgroup_index_in_threadgroup;
"""

CUDA_HEADER = r"""
// zmlx-pipeline prelude (cuda) v1
#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef unsigned int uint;
#define KSHARED __shared__
#define KBARRIER() __syncthreads()
#define KINLINE __device__ __forceinline__
#define KDEV_PTR(T) T*
#define KCDEV_PTR(T) const T*
#define KTG_PTR(T) T*
#define KTH_PTR(T) T*
#define KRSQRT(x) rsqrtf(x)
#define KSQRT(x) sqrtf(x)
#define KEXP(x) expf(x)
#define KLOG(x) logf(x)
#define KTANH(x) tanhf(x)
#define KFMAX(a, b) fmaxf(a, b)
#define KFMIN(a, b) fminf(a, b)
#define KFABS(x) fabsf(x)
#define KLOWEST (-3.402823466e+38f)
#define KSIMD_SUM(v) k_warp_sum(v)
#define KSIMD_MAX(v) k_warp_max(v)

__device__ __forceinline__ float k_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float k_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <int BYTES> struct k_word;
template <> struct k_word<2> { typedef unsigned short type; };
template <> struct k_word<4> { typedef unsigned int type; };
template <> struct k_word<8> { typedef uint2 type; };
template <> struct k_word<16> { typedef uint4 type; };

// V contiguous elements in one access when the bytes fit a native word, else element by element.
template <int V, typename T>
__device__ __forceinline__ void k_load(const T* p, float* vals) {
  constexpr int B = V * (int)sizeof(T);
  if constexpr (B == 2 || B == 4 || B == 8 || B == 16) {
    typename k_word<B>::type w = *reinterpret_cast<const typename k_word<B>::type*>(p);
    const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
    for (int i = 0; i < V; ++i) vals[i] = static_cast<float>(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) vals[i] = static_cast<float>(p[i]);
  }
}

template <int V, typename T>
__device__ __forceinline__ void k_store(T* p, const float* vals) {
  constexpr int B = V * (int)sizeof(T);
  if constexpr (B == 2 || B == 4 || B == 8 || B == 16) {
    typename k_word<B>::type w;
    T* e = reinterpret_cast<T*>(&w);
#pragma unroll
    for (int i = 0; i < V; ++i) e[i] = static_cast<T>(vals[i]);
    *reinterpret_cast<typename k_word<B>::type*>(p) = w;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = static_cast<T>(vals[i]);
  }
}
"""

# -- optional vocabularies -----------------------------------------------------------------------
# A kernel opts into one with `KernelSpec.extensions`; it is appended to the base header only for
# that kernel, so adding an extension changes no other kernel's source, and no other version.
#
# "mma": warp / SIMD-group matrix multiply-accumulate on 16x16 tiles, and asynchronous copies
#   k_mma_acc                16x16 float accumulator tile held by one warp / SIMD group
#   k_mma_a<T>, k_mma_b<T>   16x16 A and B operand tiles of element type T
#   k_mma_zero(&acc)
#   k_mma_load_a(&fa, p, ld, k_lane)   A[16 x 16] from threadgroup memory, row-major, row stride ld
#   k_mma_load_b(&fb, p, ld, k_lane)   B[16 x 16] likewise (k rows, n columns)
#   k_mma(&acc, &fa, &fb)              acc += A @ B (every lane of the warp calls it)
#   k_mma_get(&acc, e), k_mma_row(e, k_lane), k_mma_col(e, k_lane)
#                            e = 0..7: this lane's 8 elements of the tile and their (row, column)
#   k_copy_async<V>(dst, src, n)       V elements device -> threadgroup memory, the first n of them
#                                      read and the rest zero (one asynchronous 16-byte copy on CUDA
#                                      when n == V and both ends are aligned; a plain copy on Metal)
#   k_async_commit(), k_async_wait<N>()  close a group of copies; wait until at most N groups are
#                                      in flight (no-ops on Metal, whose copies are synchronous)
#   k_copy_async16(dst, src)           one 16-byte copy device -> threadgroup memory with no checks:
#                                      both ends aligned and in bounds (interior tiles)
#   KSHARED_DYN(T, name, count, offset)  a threadgroup array `name` of `count` T: a static array on
#                                      Metal; on CUDA `offset` elements into the launch's dynamic
#                                      shared memory (KernelSpec.shared_memory sizes it), so a ring
#                                      of slabs may pass CUDA's 48 KiB of static shared memory
#   KUNROLL                  unroll the next loop;  KALIGN16  16-byte alignment of a shared array
# Rows handed to k_mma_load_* must start 16-byte aligned (CUDA's ldmatrix); float32 operands are
# multiplied on CUDA as three TF32 products (hi*hi + hi*lo + lo*hi), which keeps float32 accuracy.

METAL_MMA = r"""
// zmlx-pipeline prelude extension (metal): mma v2
#include <metal_simdgroup_matrix>
#define KUNROLL _Pragma("unroll")
#define KALIGN16

struct k_mma_acc { simdgroup_float8x8 m[2][2]; };
template <typename T> struct k_mma_a { simdgroup_float8x8 m[2][2]; };
template <typename T> struct k_mma_b { simdgroup_float8x8 m[2][2]; };

inline void k_mma_zero(thread k_mma_acc* acc) {
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) acc->m[i][j] = simdgroup_float8x8(0);
  }
}

// the element pair an 8x8 simdgroup matrix keeps in this lane: (row, col) and (row, col + 1)
inline int k_mma_lane_row(uint lane) { return (int)(((lane / 4) & 4) + (lane / 2) % 4); }
inline int k_mma_lane_col(uint lane) { return (int)(((lane / 4) & 2) * 2 + (lane % 2) * 2); }

template <typename T, typename F>
inline void k_mma_fill(thread F* f, const threadgroup T* p, int ld, uint lane) {
  const int r = k_mma_lane_row(lane);
  const int c = k_mma_lane_col(lane);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      const threadgroup T* q = p + (i * 8 + r) * ld + j * 8 + c;
      f->m[i][j].thread_elements()[0] = static_cast<float>(q[0]);
      f->m[i][j].thread_elements()[1] = static_cast<float>(q[1]);
    }
  }
}

template <typename T>
inline void k_mma_load_a(thread k_mma_a<T>* f, const threadgroup T* p, int ld, uint lane) { k_mma_fill(f, p, ld, lane); }

template <typename T>
inline void k_mma_load_b(thread k_mma_b<T>* f, const threadgroup T* p, int ld, uint lane) { k_mma_fill(f, p, ld, lane); }

template <typename T>
inline void k_mma(thread k_mma_acc* acc, thread const k_mma_a<T>* a, thread const k_mma_b<T>* b) {
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      for (int k = 0; k < 2; ++k) simdgroup_multiply_accumulate(acc->m[i][j], a->m[i][k], b->m[k][j], acc->m[i][j]);
    }
  }
}

inline float k_mma_get(thread const k_mma_acc* acc, int e) { return acc->m[e >> 2][(e >> 1) & 1].thread_elements()[e & 1]; }
inline int k_mma_row(int e, uint lane) { return (e >> 2) * 8 + k_mma_lane_row(lane); }
inline int k_mma_col(int e, uint lane) { return ((e >> 1) & 1) * 8 + k_mma_lane_col(lane) + (e & 1); }

template <int V, typename T>
inline void k_copy_async(threadgroup T* dst, const device T* src, int n) {
  for (int i = 0; i < V; ++i) dst[i] = i < n ? src[i] : static_cast<T>(0.0f);
}
template <typename T>
inline void k_copy_async16(threadgroup T* dst, const device T* src) {
  for (int i = 0; i < 16 / (int)sizeof(T); ++i) dst[i] = src[i];
}
#define KSHARED_DYN(T, name, count, offset) threadgroup T name[count]
inline void k_async_commit() {}
template <int N> inline void k_async_wait() {}
"""

CUDA_MMA = r"""
// zmlx-pipeline prelude extension (cuda): mma v2
#define KUNROLL _Pragma("unroll")
#define KALIGN16 __align__(16)

// the two m16n8 halves of a 16x16 tile: d[h] holds (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
// of columns 8h.., with g = lane / 4 and t = lane % 4 (the PTX mma fragment layout)
struct k_mma_acc { float d[2][4]; };
template <typename T> struct k_mma_a { unsigned int r[4]; };   // ldmatrix.x4 of a 16x16 tile
template <typename T> struct k_mma_b { unsigned int r[4]; };   // ldmatrix.x4.trans: n 0-7, then 8-15
template <> struct k_mma_a<float> { float v[8]; };              // two 16x8 tf32 tiles (k 0-7, 8-15)
template <> struct k_mma_b<float> { float v[8]; };              // [k half][n half][2]

__device__ __forceinline__ unsigned int k_smem(const void* p) {
  return (unsigned int)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void k_mma_zero(k_mma_acc* acc) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc->d[h][i] = 0.0f;
  }
}

template <typename T>
__device__ __forceinline__ void k_mma_load_a(k_mma_a<T>* f, const T* p, int ld, uint lane) {
  const T* q = p + (int)(lane & 15u) * ld + (int)(lane >> 4) * 8;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(f->r[0]), "=r"(f->r[1]), "=r"(f->r[2]), "=r"(f->r[3]) : "r"(k_smem(q)));
}

template <typename T>
__device__ __forceinline__ void k_mma_load_b(k_mma_b<T>* f, const T* p, int ld, uint lane) {
  const T* q = p + (int)(lane & 15u) * ld + (int)(lane >> 4) * 8;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(f->r[0]), "=r"(f->r[1]), "=r"(f->r[2]), "=r"(f->r[3]) : "r"(k_smem(q)));
}

__device__ __forceinline__ void k_mma_load_a(k_mma_a<float>* f, const float* p, int ld, uint lane) {
  const int g = (int)(lane >> 2), t = (int)(lane & 3u);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    f->v[h * 4 + 0] = p[g * ld + h * 8 + t];
    f->v[h * 4 + 1] = p[(g + 8) * ld + h * 8 + t];
    f->v[h * 4 + 2] = p[g * ld + h * 8 + t + 4];
    f->v[h * 4 + 3] = p[(g + 8) * ld + h * 8 + t + 4];
  }
}

__device__ __forceinline__ void k_mma_load_b(k_mma_b<float>* f, const float* p, int ld, uint lane) {
  const int g = (int)(lane >> 2), t = (int)(lane & 3u);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      f->v[(h * 2 + n) * 2 + 0] = p[(h * 8 + t) * ld + n * 8 + g];
      f->v[(h * 2 + n) * 2 + 1] = p[(h * 8 + t + 4) * ld + n * 8 + g];
    }
  }
}

__device__ __forceinline__ void k_mma_m16n8k16(float* d, const unsigned int* a, unsigned int b0, unsigned int b1, __half) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void k_mma_m16n8k16(float* d, const unsigned int* a, unsigned int b0, unsigned int b1, __nv_bfloat16) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <typename T>
__device__ __forceinline__ void k_mma(k_mma_acc* acc, const k_mma_a<T>* a, const k_mma_b<T>* b) {
  k_mma_m16n8k16(acc->d[0], a->r, b->r[0], b->r[1], T());
  k_mma_m16n8k16(acc->d[1], a->r, b->r[2], b->r[3], T());
}

__device__ __forceinline__ void k_tf32_split(float x, unsigned int* hi, unsigned int* lo) {
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(*hi) : "f"(x));
  const float rest = x - __uint_as_float(*hi);
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(*lo) : "f"(rest));
}

__device__ __forceinline__ void k_mma_m16n8k8(float* d, const unsigned int* a, unsigned int b0, unsigned int b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void k_mma(k_mma_acc* acc, const k_mma_a<float>* a, const k_mma_b<float>* b) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    unsigned int ah[4], al[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) k_tf32_split(a->v[h * 4 + i], &ah[i], &al[i]);
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      unsigned int bh0, bl0, bh1, bl1;
      k_tf32_split(b->v[(h * 2 + n) * 2 + 0], &bh0, &bl0);
      k_tf32_split(b->v[(h * 2 + n) * 2 + 1], &bh1, &bl1);
      // the small products first, so they are not lost against the large one
      k_mma_m16n8k8(acc->d[n], al, bh0, bh1);
      k_mma_m16n8k8(acc->d[n], ah, bl0, bl1);
      k_mma_m16n8k8(acc->d[n], ah, bh0, bh1);
    }
  }
}

__device__ __forceinline__ float k_mma_get(const k_mma_acc* acc, int e) { return acc->d[e >> 2][e & 3]; }
__device__ __forceinline__ int k_mma_row(int e, uint lane) { return (int)(lane >> 2) + ((e >> 1) & 1) * 8; }
__device__ __forceinline__ int k_mma_col(int e, uint lane) { return (e >> 2) * 8 + (int)(lane & 3u) * 2 + (e & 1); }

template <int V, typename T>
__device__ __forceinline__ void k_copy_async(T* dst, const T* src, int n) {
  if (V * (int)sizeof(T) == 16 && n == V && ((reinterpret_cast<size_t>(src) | reinterpret_cast<size_t>(dst)) & 15u) == 0) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(k_smem(dst)), "l"(src));
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) dst[i] = i < n ? src[i] : static_cast<T>(0.0f);
  }
}

template <typename T>
__device__ __forceinline__ void k_copy_async16(T* dst, const T* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(k_smem(dst)), "l"(src));
}

// the launch's dynamic shared memory (the `shared_memory` of mx.fast.cuda_kernel; over 48 KiB,
// MLX raises the kernel's limit); KSHARED_DYN arrays are carved out of it
extern __shared__ __align__(16) unsigned char k_dyn_smem[];
#define KSHARED_DYN(T, name, count, offset) T* name = reinterpret_cast<T*>(k_dyn_smem) + (offset)

__device__ __forceinline__ void k_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void k_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }
"""

# "wgmma": Hopper's warpgroup MMA (CUDA sm_90a), a whole C tile in one call
#   k_wg_matmul<T, BM, BN, ST, ON>(a, b, c, M, N, K, m0, n0, tid)
#       C[m0 : m0 + BM, n0 : n0 + BN] = A @ B for row-major A[M, K] and B[K, N] of a 16-bit T,
#       float32 accumulation, by BM / 64 warpgroups (TG = BM * 2 threads). K is walked in 64-deep
#       slabs copied by cp.async into a ring of ST stages of 128-byte-swizzled tiles (the launch's
#       dynamic shared memory: ST * (BM + BN) * 128 + 1024 bytes), one MMA batch kept in flight.
#       Tiles past M, N or K are zero-filled and their stores skipped: N and K must be multiples
#       of 8. A no-op unless ON and (T, BM, BN) is one it implements (16-bit T, BM 64 or 128,
#       BN 128 or 256), so a body may call it under a runtime-constant branch for every config;
#       on Metal it is always a no-op, and the kernel's constraints keep such configs off Metal.

METAL_WGMMA = r"""
// zmlx-pipeline prelude extension (metal): wgmma v1 (no warpgroup MMA on Metal: never selected)
template <typename T, int BM, int BN, int ST, int ON>
inline void k_wg_matmul(const device T* a, const device T* b, device T* c, int M, int N, int K,
                        int m0, int n0, int tid) {}
"""


def _wgmma_instruction(bn: int, ab: str) -> str:
    """One m64n{bn}k16 wgmma: f32 accumulators acc[0 .. bn/2) (scale-d 1: accumulate), A K-major, B N-major (transposed)."""
    n = bn // 2
    regs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(acc[{i}])' for i in range(n))
    t = "__half" if ab == "f16" else "__nv_bfloat16"
    return (
        f"template <> struct k_wg_mma<{bn}, {t}> {{\n"
        f"  static __device__ __forceinline__ void run(float* acc, unsigned long long da, unsigned long long db) {{\n"
        f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n + 2}, 0;\\n"\n'
        f'                 "wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{ab}.{ab} {{{regs}}}, %{n}, %{n + 1}, p, 1, 1, 0, 1;\\n}}\\n"\n'
        f'                 : {outs} : "l"(da), "l"(db), "r"(1));\n'
        f"  }}\n}};\n"
    )


CUDA_WGMMA = r"""
// zmlx-pipeline prelude extension (cuda): wgmma v1
extern __shared__ __align__(1024) unsigned char k_wg_smem[];

__device__ __forceinline__ unsigned int k_wg_u32(const void* p) { return (unsigned int)__cvta_generic_to_shared(p); }

// one 16-byte cp.async of `bytes` (16, or 0: the 16 bytes are zeros)
__device__ __forceinline__ void k_wg_cp16(unsigned int dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(bytes));
}

// a shared-memory matrix descriptor: start address, leading and stride byte offsets, 128-byte swizzle
__device__ __forceinline__ unsigned long long k_wg_desc(unsigned int addr, unsigned int lbo, unsigned int sbo) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16)
       | ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32) | ((unsigned long long)1 << 62);
}

__device__ __forceinline__ void k_wg_store2(__half* p, float x, float y) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}
__device__ __forceinline__ void k_wg_store2(__nv_bfloat16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}

template <int BN, typename T> struct k_wg_mma;
WGMMA_INSTRUCTIONS
template <typename T> struct k_wg_type { static constexpr bool ok = false; };
template <> struct k_wg_type<__half> { static constexpr bool ok = true; };
template <> struct k_wg_type<__nv_bfloat16> { static constexpr bool ok = true; };

template <typename T, int BM, int BN, int ST, bool OK>
struct k_wg_tile {
  static __device__ __forceinline__ void run(const T*, const T*, T*, int, int, int, int, int, int) {}
};

template <typename T, int BM, int BN, int ST>
struct k_wg_tile<T, BM, BN, ST, true> {
  static __device__ __forceinline__ void run(const T* a, const T* b, T* c, int M, int N, int K, int m0, int n0, int tid) {
    constexpr int BK = 64;                       // one slab row of A is 128 bytes: one swizzle atom
    constexpr int NT = BM / 64 * 128;            // threads: one warpgroup per 64 rows
    constexpr int A_BYTES = BM * BK * 2;
    constexpr int STAGE = A_BYTES + BK * BN * 2;
    constexpr int D = ST - 2;                    // slabs requested ahead of the one multiplied
    const unsigned int base = (k_wg_u32(k_wg_smem) + 1023u) & ~1023u;
    const int wg = tid / 128;
    const int KT = (K + BK - 1) / BK;
    // a tile inside C and K whole slabs: no per-copy checks (the checked copies cost 4-10% on the H200)
    const bool whole = m0 + BM <= M && n0 + BN <= N && K % BK == 0;
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
      for (int i = 0; i < BM * 8 / NT; ++i) {    // A: BM rows of 8 16-byte chunks, swizzled by row
        const int e = tid + i * NT;
        const int r = e >> 3, ch = e & 7;
        const bool in = whole || (m0 + r < M && k0 + ch * 8 < K);
        k_wg_cp16(sa + r * 128 + ((ch ^ (r & 7)) << 4), in ? a_blk + (size_t)r * K + k0 + ch * 8 : a, in ? 16 : 0);
      }
#pragma unroll
      for (int i = 0; i < BK * (BN / 8) / NT; ++i) {  // B: 64-column atoms of BK rows, swizzled by row
        const int e = tid + i * NT;
        const int k = e / (BN / 8), nc = e % (BN / 8);
        const int atom = nc >> 3, ch = nc & 7;
        const bool in = whole || (k0 + k < K && n0 + nc * 8 < N);
        k_wg_cp16(sb + atom * (BK * 128) + k * 128 + ((ch ^ (k & 7)) << 4),
                  in ? b_blk + (size_t)(k0 + k) * N + nc * 8 : b, in ? 16 : 0);
      }
    };
    for (int s = 0; s < D; ++s) {
      if (s < KT) load(s);
      asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int kt = 0; kt < KT; ++kt) {
      asm volatile("cp.async.wait_group %0;\n" :: "n"(D - 1));  // slab kt has landed
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // ... and is visible to wgmma
      __syncthreads();
      if (kt + D < KT) load(kt + D);  // into the buffer of slab kt - 2, whose MMAs have completed
      asm volatile("cp.async.commit_group;\n" ::);
      const unsigned int sa = base + (kt % ST) * STAGE;
      const unsigned int sb = sa + A_BYTES;
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        // A: 8-row groups 1024 bytes apart; B: 64-column atoms BK * 128 apart, 8-row groups 1024
        k_wg_mma<BN, T>::run(acc, k_wg_desc(sa + wg * 64 * 128 + kk * 32, 16u, 1024u),
                             k_wg_desc(sb + kk * 2048, (unsigned int)(BK * 128), 1024u));
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // one batch stays in flight
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    const int warp = (tid % 128) / 32, lane = tid % 32;
    const int row = m0 + wg * 64 + warp * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int col = n0 + j * 8 + (lane & 3) * 2;
      if (whole || (row < M && col < N)) k_wg_store2(c + (size_t)row * N + col, acc[4 * j], acc[4 * j + 1]);
      if (whole || (row + 8 < M && col < N)) k_wg_store2(c + (size_t)(row + 8) * N + col, acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
};

template <typename T, int BM, int BN, int ST, int ON>
__device__ __forceinline__ void k_wg_matmul(const T* a, const T* b, T* c, int M, int N, int K, int m0, int n0, int tid) {
  k_wg_tile<T, BM, BN, ST, ON != 0 && k_wg_type<T>::ok && (BM == 64 || BM == 128) && (BN == 128 || BN == 256)
            && ST >= 3>::run(a, b, c, M, N, K, m0, n0, tid);
}
""".replace("WGMMA_INSTRUCTIONS", "".join(_wgmma_instruction(bn, ab) for ab in ("f16", "bf16") for bn in (128, 256)))

EXTENSIONS = {"mma": {"metal": METAL_MMA, "cuda": CUDA_MMA}, "wgmma": {"metal": METAL_WGMMA, "cuda": CUDA_WGMMA}}

CUDA_SOURCE = r"""
  const uint k_tid = threadIdx.x;
  const uint k_block_x = blockIdx.x;
  const uint k_block_y = blockIdx.y;
  const uint k_lane = threadIdx.x & 31u;
  const uint k_warp = threadIdx.x >> 5;
"""

#: tokens that belong to one backend only; none may appear in a body or in the other backend's source
CUDA_ONLY_TOKENS = (
    "__syncthreads", "__shared__", "__device__", "__global__", "__forceinline__", "__shfl",
    "threadIdx", "blockIdx", "blockDim", "gridDim", "__half", "__nv_bfloat16", "cuda_fp16",
    "cuda_bf16", "rsqrtf", "expf", "sqrtf", "fmaxf", "fminf", "fabsf", "tanhf", "logf",
    "uint4", "uint2", "#pragma unroll", "if constexpr", "asm volatile", "mma.sync", "ldmatrix",
    "cp.async", "__align__", "__cvta", "wgmma.",
)
METAL_ONLY_TOKENS = (
    "threadgroup_barrier", "mem_flags", "thread_position_in", "threadgroup_position_in",
    "thread_index_in", "simdgroup_index_in", "simd_sum", "simd_max", "metal::", "device T*",
    "threadgroup float", "threadgroup T", "bfloat16_t", "[[", "simdgroup_float8x8",
    "simdgroup_multiply", "thread_elements", "metal_simdgroup",
)

_HEADERS = {"metal": METAL_HEADER, "cuda": CUDA_HEADER}
_SOURCES = {"metal": METAL_SOURCE, "cuda": CUDA_SOURCE}


def header(backend: str, extensions: tuple[str, ...] = ()) -> str:
    """The helper definitions that go before the kernel function on `backend`, with the named
    optional vocabularies (`EXTENSIONS`) after the base one."""
    return _HEADERS[backend] + "".join(EXTENSIONS[name][backend] for name in extensions)


def index_prelude(backend: str) -> str:
    """The index declarations that open the kernel body on `backend` (inside `source`)."""
    return _SOURCES[backend]


def foreign_tokens(text: str, backend: str) -> list[str]:
    """Tokens of the other backend (or of either, for backend=None) found in `text`."""
    banned = {
        "metal": CUDA_ONLY_TOKENS,
        "cuda": METAL_ONLY_TOKENS,
        None: CUDA_ONLY_TOKENS + METAL_ONLY_TOKENS,
    }[backend]
    return [t for t in banned if t in text]
