// ---- header ----

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

// ---- source ----

  const uint k_tid = thread_position_in_threadgroup.x;
  const uint k_block_x = threadgroup_position_in_grid.x;
  const uint k_block_y = threadgroup_position_in_grid.y;
  const uint k_lane = thread_index_in_simdgroup;
  const uint k_warp = simdgroup_index_in_threadgroup;

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
