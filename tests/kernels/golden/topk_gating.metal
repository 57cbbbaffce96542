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
