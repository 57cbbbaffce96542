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

  constexpr int S = TG / ROWS;
  const int tokens = expert_out_shape[0];
  const int k = expert_out_shape[1];
  const int hidden = expert_out_shape[2];
  const int tid = (int)k_tid;
  const int tok = (int)k_block_x * ROWS + tid / S;
  const int col = ((int)k_block_y * S + tid % S) * VEC;
  if (tok >= tokens || col >= hidden) return;
  float acc[VEC];
  for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;
  const size_t wbase = (size_t)tok * (size_t)k;
  for (int j = 0; j < k; ++j) {
    const float wj = static_cast<float>(w[wbase + j]);
    float v[VEC];
    k_load<VEC>(expert_out + ((wbase + j) * (size_t)hidden + col), v);
    for (int i = 0; i < VEC; ++i) acc[i] += wj * v[i];
  }
  k_store<VEC>(y + ((size_t)tok * (size_t)hidden + col), acc);
