// ---- header ----

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

// ---- source ----

  const uint k_tid = thread_position_in_threadgroup.x;
  const uint k_block_x = threadgroup_position_in_grid.x;
  const uint k_block_y = threadgroup_position_in_grid.y;
  const uint k_lane = thread_index_in_simdgroup;
  const uint k_warp = simdgroup_index_in_threadgroup;

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
