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
"""

from __future__ import annotations

BACKENDS = ("metal", "cuda")

#: bumped whenever a prelude changes, so kernel versions (hashes) change with it
PRELUDE_VERSION = 1

METAL_HEADER = r"""
// zmlx-pipeline prelude (metal) v1
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
    "uint4", "uint2", "#pragma unroll", "if constexpr",
)
METAL_ONLY_TOKENS = (
    "threadgroup_barrier", "mem_flags", "thread_position_in", "threadgroup_position_in",
    "thread_index_in", "simdgroup_index_in", "simd_sum", "simd_max", "metal::", "device T*",
    "threadgroup float", "threadgroup T", "bfloat16_t", "[[",
)

_HEADERS = {"metal": METAL_HEADER, "cuda": CUDA_HEADER}
_SOURCES = {"metal": METAL_SOURCE, "cuda": CUDA_SOURCE}


def header(backend: str) -> str:
    """The helper definitions that go before the kernel function on `backend`."""
    return _HEADERS[backend]


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
