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
  constexpr int NWT = TG / 32;
  KSHARED float k_red[2 * NWT];
  const int rows = x_shape[0];
  const int cols = x_shape[1];
  const int sub = k_tid / S;
  const int st = k_tid % S;
  const int row = k_block_x * ROWS + sub;
  const bool active = row < rows;
  const size_t base = (size_t)(active ? row : 0) * (size_t)cols;
  const float shift = active ? static_cast<float>(x[base]) : 0.0f;
  float s1 = 0.0f;
  float s2 = 0.0f;
  if (active) {
    for (int c = st * VEC; c < cols; c += S * VEC) {
      float v[VEC];
      k_load<VEC>(x + base + c, v);
      for (int i = 0; i < VEC; ++i) {
        const float d = v[i] - shift;
        s1 += d;
        s2 += d * d;
      }
    }
  }
  s1 = KSIMD_SUM(s1);
  s2 = KSIMD_SUM(s2);
  if (k_lane == 0) {
    k_red[k_warp] = s1;
    k_red[NWT + k_warp] = s2;
  }
  KBARRIER();
  float t1 = 0.0f;
  float t2 = 0.0f;
  for (int i = 0; i < NW; ++i) {
    t1 += k_red[sub * NW + i];
    t2 += k_red[NWT + sub * NW + i];
  }
  if (!active) return;
  const float dm = t1 / (float)cols;
  const float mean = shift + dm;
  const float var = KFMAX(t2 / (float)cols - dm * dm, 0.0f);
  const float inv = KRSQRT(var + 1e-5f);
  for (int c = st * VEC; c < cols; c += S * VEC) {
    float v[VEC];
    float g[VEC];
    float o[VEC];
    k_load<VEC>(x + base + c, v);
    k_load<VEC>(w + c, g);
    k_load<VEC>(b + c, o);
    for (int i = 0; i < VEC; ++i) v[i] = (v[i] - mean) * inv * g[i] + o[i];
    k_store<VEC>(y + base + c, v);
  }
