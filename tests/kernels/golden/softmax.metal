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
  constexpr int NW = S / 32;
  constexpr int FB = (CACHE == 2) ? 32768 : 16384;
  constexpr int FM = (CACHE == 2) ? 64 : 32;
  constexpr int F = (CACHE == 0) ? 0 : ((FB / TG < FM) ? FB / TG : FM);
  constexpr int NC = (CACHE == 0) ? 0 : ((F / VEC > 0) ? F / VEC : 1);
  KSHARED float k_max[TG / 32];
  KSHARED float k_sum[TG / 32];
  const int rows = x_shape[0];
  const int cols = x_shape[1];
  const int sub = k_tid / S;
  const int st = k_tid % S;
  const int row = k_block_x * ROWS + sub;
  const bool active = row < rows;
  const size_t base = (size_t)(active ? row : 0) * (size_t)cols;
  float r[NC > 0 ? NC : 1][VEC];
  float m = KLOWEST;
  float s = 0.0f;
  if (active) {
    float mc = KLOWEST;
    for (int j = 0; j < NC; ++j) {
      const int c = (st + j * S) * VEC;
      if (c < cols) {
        k_load<VEC>(x + base + c, r[j]);
        for (int i = 0; i < VEC; ++i) mc = KFMAX(mc, r[j][i]);
      }
    }
    for (int c = (st + NC * S) * VEC; c < cols; c += S * VEC) {
      float v[VEC];
      k_load<VEC>(x + base + c, v);
      float cm = v[0];
      for (int i = 1; i < VEC; ++i) cm = KFMAX(cm, v[i]);
      if (cm > m) {
        s = s * KEXP(m - cm);
        m = cm;
      }
      for (int i = 0; i < VEC; ++i) s += KEXP(v[i] - m);
    }
    const float mt = KFMAX(mc, m);
    s = s * KEXP(m - mt);
    m = mt;
    for (int j = 0; j < NC; ++j) {
      const int c = (st + j * S) * VEC;
      if (c < cols) {
        for (int i = 0; i < VEC; ++i) {
          r[j][i] = KEXP(r[j][i] - m);
          s += r[j][i];
        }
      }
    }
  }
  const float wm = KSIMD_MAX(m);
  const float ws = KSIMD_SUM(s * KEXP(m - wm));
  if (k_lane == 0) {
    k_max[k_warp] = wm;
    k_sum[k_warp] = ws;
  }
  KBARRIER();
  float rm = KLOWEST;
  for (int i = 0; i < NW; ++i) rm = KFMAX(rm, k_max[sub * NW + i]);
  float rs = 0.0f;
  for (int i = 0; i < NW; ++i) rs += k_sum[sub * NW + i] * KEXP(k_max[sub * NW + i] - rm);
  if (!active) return;
  const float inv = 1.0f / rs;
  const float scale = KEXP(m - rm) * inv;
  for (int j = 0; j < NC; ++j) {
    const int c = (st + j * S) * VEC;
    if (c < cols) {
      float v[VEC];
      for (int i = 0; i < VEC; ++i) v[i] = r[j][i] * scale;
      k_store<VEC>(y + base + c, v);
    }
  }
  for (int c = (st + NC * S) * VEC; c < cols; c += S * VEC) {
    float v[VEC];
    k_load<VEC>(x + base + c, v);
    for (int i = 0; i < VEC; ++i) v[i] = KEXP(v[i] - rm) * inv;
    k_store<VEC>(y + base + c, v);
  }
