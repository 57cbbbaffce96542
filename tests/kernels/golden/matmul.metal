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

// zmlx-pipeline prelude extension (metal): wgmma v1 (no warpgroup MMA on Metal: never selected)
template <typename T, int BM, int BN, int ST, int ON>
inline void k_wg_matmul(const device T* a, const device T* b, device T* c, int M, int N, int K,
                        int m0, int n0, int tid) {}

// ---- source ----

  const uint k_tid = thread_position_in_threadgroup.x;
  const uint k_block_x = threadgroup_position_in_grid.x;
  const uint k_block_y = threadgroup_position_in_grid.y;
  const uint k_lane = thread_index_in_simdgroup;
  const uint k_warp = simdgroup_index_in_threadgroup;

  constexpr int V = 16 / (int)sizeof(T);   // elements in one 16-byte copy
  constexpr int LDA = BK + V;              // padded row strides of the A and B slabs
  constexpr int LDB = BN + 8;
  constexpr int WTM = BM / (16 * WM);      // 16x16 tiles of one warp along M and N
  constexpr int WTN = BN / (16 * WN);
  // the ring: STAGES slabs of A (BM x BK), then STAGES of B (BK x BN); dynamic on CUDA (SPEC.shared_memory)
  KSHARED_DYN(T, k_as, STAGES * BM * LDA, 0);
  KSHARED_DYN(T, k_bs, STAGES * BK * LDB, STAGES * BM * LDA);
  const int M = a_shape[0];
  const int K = a_shape[1];
  const int N = b_shape[1];
  if (WG) {  // the warpgroup-MMA path computes the whole tile (a no-op wherever WG == 0)
    k_wg_matmul<T, BM, BN, STAGES, WG>(a, b, c, M, N, K, (int)k_block_x * BM, (int)k_block_y * BN, (int)k_tid);
    return;
  }
  const int tid = (int)k_tid;
  const int m0 = (int)k_block_x * BM;
  const int n0 = (int)k_block_y * BN;
  const int wr = ((int)k_warp / WN) * (BM / WM);
  const int wc = ((int)k_warp % WN) * (BN / WN);
  k_mma_acc acc[WTM * WTN];
  KUNROLL
  for (int i = 0; i < WTM * WTN; ++i) k_mma_zero(&acc[i]);
  const int KT = (K + BK - 1) / BK;
  // a threadgroup inside C whose rows are 16-byte aligned copies whole slabs with no per-copy checks
  const bool whole = m0 + BM <= M && n0 + BN <= N && K % V == 0 && N % V == 0;
  KCDEV_PTR(T) a_tile = a + (size_t)m0 * (size_t)K;
  KCDEV_PTR(T) b_tile = b + n0;
  // iteration kt multiplies slab kt; slabs 0 .. STAGES - 2 are requested before the first one
  for (int kt = 1 - STAGES; kt < KT; ++kt) {
    if (kt >= 0) {
      k_async_wait<STAGES - 2>();  // slab kt has landed (later slabs may still be in flight)
      KBARRIER();                  // ... for every thread, and slab kt - 1's buffer is free
    }
    const int lt = kt + STAGES - 1;
    if (lt < KT && whole && lt * BK + BK <= K) {
      const int s = lt % STAGES;
      const int k0 = lt * BK;
      constexpr int CA = BM * (BK / V);  // 16-byte copies of one A slab, and of one B slab
      constexpr int CB = BK * (BN / V);
      KUNROLL
      for (int c = 0; c < (CA + TG - 1) / TG; ++c) {
        const int e = tid + c * TG;
        if (CA % TG == 0 || e < CA) {
          const int r = e / (BK / V);
          const int q = (e % (BK / V)) * V;
          k_copy_async16(k_as + (s * BM + r) * LDA + q, a_tile + (size_t)r * (size_t)K + k0 + q);
        }
      }
      KUNROLL
      for (int c = 0; c < (CB + TG - 1) / TG; ++c) {
        const int e = tid + c * TG;
        if (CB % TG == 0 || e < CB) {
          const int q = e / (BN / V);
          const int cc = (e % (BN / V)) * V;
          k_copy_async16(k_bs + (s * BK + q) * LDB + cc, b_tile + (size_t)(k0 + q) * (size_t)N + cc);
        }
      }
    } else if (lt < KT) {  // edges: zero-filled, element by element where a row is not aligned
      const int s = lt % STAGES;
      const int k0 = lt * BK;
      for (int e = tid; e < BM * (BK / V); e += TG) {
        const int r = e / (BK / V);
        const int q = (e % (BK / V)) * V;
        const int gm = m0 + r;
        const int gk = k0 + q;
        const int n = gm < M ? (K - gk < V ? (K - gk > 0 ? K - gk : 0) : V) : 0;
        k_copy_async<V>(k_as + (s * BM + r) * LDA + q, a + (n > 0 ? (size_t)gm * (size_t)K + gk : 0), n);
      }
      for (int e = tid; e < BK * (BN / V); e += TG) {
        const int q = e / (BN / V);
        const int cc = (e % (BN / V)) * V;
        const int gk = k0 + q;
        const int gn = n0 + cc;
        const int n = gk < K ? (N - gn < V ? (N - gn > 0 ? N - gn : 0) : V) : 0;
        k_copy_async<V>(k_bs + (s * BK + q) * LDB + cc, b + (n > 0 ? (size_t)gk * (size_t)N + gn : 0), n);
      }
    }
    k_async_commit();
    if (kt >= 0) {
      const int s = kt % STAGES;
      KUNROLL
      for (int kk = 0; kk < BK; kk += 16) {
        k_mma_a<T> fa[WTM];
        k_mma_b<T> fb[WTN];
        KUNROLL
        for (int i = 0; i < WTM; ++i) k_mma_load_a(&fa[i], k_as + (s * BM + wr + i * 16) * LDA + kk, LDA, k_lane);
        KUNROLL
        for (int j = 0; j < WTN; ++j) k_mma_load_b(&fb[j], k_bs + (s * BK + kk) * LDB + wc + j * 16, LDB, k_lane);
        KUNROLL
        for (int i = 0; i < WTM; ++i) {
          KUNROLL
          for (int j = 0; j < WTN; ++j) k_mma(&acc[i * WTN + j], &fa[i], &fb[j]);
        }
      }
    }
  }
  KUNROLL
  for (int i = 0; i < WTM; ++i) {
    KUNROLL
    for (int j = 0; j < WTN; ++j) {
      KUNROLL
      for (int e = 0; e < 8; e += 2) {  // elements e and e + 1 are neighbours in one row, e's column even
        const int gm = m0 + wr + i * 16 + k_mma_row(e, k_lane);
        const int gn = n0 + wc + j * 16 + k_mma_col(e, k_lane);
        if (gm < M) {
          const float pair[2] = {k_mma_get(&acc[i * WTN + j], e), k_mma_get(&acc[i * WTN + j], e + 1)};
          if (gn + 1 < N && N % 2 == 0) {
            k_store<2>(c + (size_t)gm * (size_t)N + gn, pair);  // one 2-element store, aligned as N and gn are even
          } else {
            if (gn < N) c[(size_t)gm * (size_t)N + gn] = static_cast<T>(pair[0]);
            if (gn + 1 < N) c[(size_t)gm * (size_t)N + gn + 1] = static_cast<T>(pair[1]);
          }
        }
      }
    }
  }
