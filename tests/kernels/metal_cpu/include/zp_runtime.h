// The CPU side of the stand-in: runs one dispatch of a kernel, threadgroup after threadgroup, each
// lane of a threadgroup as a coroutine (ucontext) on one OS thread. A lane runs until it reaches a
// threadgroup barrier or a SIMD-group function, or returns; when no lane can run, the scheduler
// completes the SIMD-group functions whose SIMD group has every live lane waiting at them (one
// exchange across the lanes), one SIMD group at a time, and the barrier once every lane of the threadgroup waits at it.
// Anything else is an error the launch reports: lanes of one SIMD group waiting at different SIMD-group
// functions, a barrier some lanes returned without reaching (§6.9.1 requires every thread), a
// SIMD-group matrix operation without all 32 lanes, threadgroup memory past the device's limit.
#pragma once

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

// float -> bfloat conversions clang emits as library calls: round to nearest even, NaN kept quiet
extern "C" __attribute__((weak)) __bf16 __truncsfbf2(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint16_t h;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    h = (uint16_t)((u >> 16) | 0x40u);
  } else {
    h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  __bf16 r;
  memcpy(&r, &h, 2);
  return r;
}
extern "C" __attribute__((weak)) __bf16 __truncdfbf2(double x) { return __truncsfbf2((float)x); }

namespace zp {

enum lane_state { READY, AT_BARRIER, AT_SIMD, DONE };

struct lane {
  ucontext_t ctx;
  lane_state state;
  const simd_op* op;
  const void* in;
  void* out;
  uint arg;
  bool full;  // the operation needs all 32 lanes of the SIMD group
  uint3 pos;  // thread_position_in_threadgroup
  uint index; // thread_index_in_threadgroup
};

constexpr int MAX_LANES = 1024;
constexpr size_t STACK_BYTES = 128 * 1024;
constexpr int MAX_SITES = 64;

struct dispatch_state {
  lane lanes[MAX_LANES];
  int n = 0;
  int cur = 0;
  ucontext_t main;
  char* stacks = nullptr;
  void (*body)() = nullptr;
  // threadgroup memory of the running threadgroup: declaration site -> offset
  unsigned char* tg_mem = nullptr;
  size_t tg_used = 0;
  size_t tg_limit = 0;
  long site_off[MAX_SITES];
  bool failed = false;
  char err[1024];
  // the dispatch's geometry (MLX: dispatch_threads(grid, min(threadgroup, grid)))
  uint3 grid, tg_dims, tg_pos, tg_count, this_tg;
};

static dispatch_state S;

inline void fail(const char* fmt, ...) {
  if (!S.failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(S.err, sizeof(S.err), fmt, ap);
    va_end(ap);
    S.failed = true;
  }
}

// from a lane: stop the dispatch (the lane is never resumed)
inline void abort_lane(const char* fmt, const char* what, long a, long b) {
  fail(fmt, what, a, b);
  swapcontext(&S.lanes[S.cur].ctx, &S.main);
}

inline uint current_lane() { return S.lanes[S.cur].index % 32; }

void threadgroup_barrier_wait() {
  lane& l = S.lanes[S.cur];
  l.state = AT_BARRIER;
  swapcontext(&l.ctx, &S.main);
}

inline void rendezvous(const simd_op* op, const void* in, void* out, uint arg, bool full) {
  lane& l = S.lanes[S.cur];
  l.state = AT_SIMD;
  l.op = op;
  l.in = in;
  l.out = out;
  l.arg = arg;
  l.full = full;
  swapcontext(&l.ctx, &S.main);
}

void simd_rendezvous(const simd_op* op, const void* in, void* out, uint arg) { rendezvous(op, in, out, arg, false); }
void simd_rendezvous_full(const simd_op* op, const void* in, void* out, uint arg) { rendezvous(op, in, out, arg, true); }

// the storage of a `threadgroup` variable declared at `site`, shared by the threadgroup's lanes
template <typename A>
threadgroup A* tg_alloc(int site) {
  if (site >= MAX_SITES) abort_lane("%s: more than %ld threadgroup declarations%ld", "threadgroup", MAX_SITES, 0);
  if (S.site_off[site] < 0) {
    const size_t align = alignof(A) > 16 ? alignof(A) : 16;
    const size_t off = (S.tg_used + align - 1) / align * align;
    if (off + sizeof(A) > S.tg_limit) {
      abort_lane("%s memory of %ld bytes exceeds the device's %ld bytes", "threadgroup", (long)(off + sizeof(A)), (long)S.tg_limit);
    }
    S.site_off[site] = (long)off;
    S.tg_used = off + sizeof(A);
  }
  return (threadgroup A*)(S.tg_mem + S.site_off[site]);
}

namespace attr {
inline uint3 thread_position_in_threadgroup() { return S.lanes[S.cur].pos; }
inline uint thread_index_in_threadgroup() { return S.lanes[S.cur].index; }
inline uint thread_index_in_simdgroup() { return S.lanes[S.cur].index % 32; }
inline uint simdgroup_index_in_threadgroup() { return S.lanes[S.cur].index / 32; }
inline uint thread_index_in_quadgroup() { return S.lanes[S.cur].index % 4; }
inline uint quadgroup_index_in_threadgroup() { return S.lanes[S.cur].index / 4; }
inline uint3 threadgroup_position_in_grid() { return S.tg_pos; }
inline uint3 threads_per_threadgroup() { return S.this_tg; }
inline uint3 dispatch_threads_per_threadgroup() { return S.tg_dims; }
inline uint3 threadgroups_per_grid() { return S.tg_count; }
inline uint3 thread_position_in_grid() { return S.tg_pos * S.tg_dims + S.lanes[S.cur].pos; }
inline uint3 threads_per_grid() { return S.grid; }
inline uint3 grid_size() { return S.grid; }
inline uint3 grid_origin() { return uint3{0, 0, 0}; }
inline uint threads_per_simdgroup() { return 32; }
inline uint thread_execution_width() { return 32; }
inline uint simdgroups_per_threadgroup() { return (S.n + 31) / 32; }
inline uint dispatch_simdgroups_per_threadgroup() { return (S.tg_dims.x * S.tg_dims.y * S.tg_dims.z + 31) / 32; }
inline uint quadgroups_per_threadgroup() { return (S.n + 3) / 4; }
inline uint dispatch_quadgroups_per_threadgroup() { return (S.tg_dims.x * S.tg_dims.y * S.tg_dims.z + 3) / 4; }
}  // namespace attr

static void lane_entry() {
  S.body();
  S.lanes[S.cur].state = DONE;  // returning resumes S.main (uc_link)
}

// complete what the waiting lanes wait for (one SIMD group's SIMD-group function, else the barrier);
// false when nothing can complete
inline bool resolve() {
  for (int g = 0; g * 32 < S.n; ++g) {
    const int lo = g * 32, hi = (lo + 32 < S.n) ? lo + 32 : S.n;
    uint live = 0;
    bool all_simd = true;
    const lane* first = nullptr;
    for (int i = lo; i < hi; ++i) {
      if (S.lanes[i].state == DONE) continue;
      live |= 1u << (i - lo);
      if (S.lanes[i].state != AT_SIMD) all_simd = false;
      else if (!first) first = &S.lanes[i];
    }
    if (!live || !all_simd) continue;
    const void* in[32] = {};
    void* out[32] = {};
    uint arg[32] = {};
    for (int i = lo; i < hi; ++i) {
      lane& l = S.lanes[i];
      if (l.state == DONE) continue;
      if (l.op != first->op) {
        fail("lanes of SIMD group %d wait at different SIMD-group functions (%s and %s)", g, first->op->name, l.op->name);
        return false;
      }
      in[i - lo] = l.in;
      out[i - lo] = l.out;
      arg[i - lo] = l.arg;
    }
    if (first->full && live != 0xffffffffu) {
      fail("%s needs all 32 lanes of SIMD group %d; %d take part", first->op->name, g, __builtin_popcount(live));
      return false;
    }
    first->op->combine(in, out, arg, live);
    for (int i = lo; i < hi; ++i) {
      if (S.lanes[i].state == AT_SIMD) S.lanes[i].state = READY;
    }
    // this SIMD group runs on alone, as far as it can get before the others move: what a missing
    // barrier would let a GPU do, so a read of threadgroup memory another SIMD group has not yet
    // written reads the poison instead of passing by luck
    return true;
  }
  int waiting = 0, done = 0;
  for (int i = 0; i < S.n; ++i) {
    waiting += S.lanes[i].state == AT_BARRIER;
    done += S.lanes[i].state == DONE;
  }
  if (waiting > 0 && waiting + done == S.n) {
    if (done) {
      fail("threadgroup_barrier reached by %d of the threadgroup's %d threads; the others returned", waiting, S.n);
      return false;
    }
    for (int i = 0; i < S.n; ++i) S.lanes[i].state = READY;
    return true;
  }
  fail("threads of the threadgroup wait at a barrier while others of their SIMD group wait at a SIMD-group function");
  return false;
}

inline bool run_threadgroup() {
  S.tg_used = 0;
  for (int i = 0; i < MAX_SITES; ++i) S.site_off[i] = -1;
  memset(S.tg_mem, 0xff, S.tg_limit);  // uninitialised threadgroup memory reads as NaN / -1
  int k = 0;
  for (uint z = 0; z < S.this_tg.z; ++z) {
    for (uint y = 0; y < S.this_tg.y; ++y) {
      for (uint x = 0; x < S.this_tg.x; ++x, ++k) {
        lane& l = S.lanes[k];
        l.state = READY;
        l.pos = uint3{x, y, z};
        l.index = (uint)k;
        getcontext(&l.ctx);
        l.ctx.uc_stack.ss_sp = S.stacks + (size_t)k * STACK_BYTES;
        l.ctx.uc_stack.ss_size = STACK_BYTES;
        l.ctx.uc_link = &S.main;
        makecontext(&l.ctx, lane_entry, 0);
      }
    }
  }
  for (;;) {
    bool all_done = true;
    for (int i = 0; i < S.n; ++i) {
      if (S.lanes[i].state == READY) {
        S.cur = i;
        swapcontext(&S.main, &S.lanes[i].ctx);
        if (S.failed) return false;
      }
      all_done = all_done && S.lanes[i].state == DONE;
    }
    if (all_done) return true;
    if (!resolve()) return false;
  }
}

// one dispatch: every threadgroup of the grid in turn; 0 when it ran, else 1 with the reason in err
inline int dispatch(void (*body)(), const long* grid, const long* tg, long tg_limit, char* err, int errlen) {
  S.failed = false;
  S.err[0] = 0;
  S.body = body;
  S.grid = uint3{(uint)grid[0], (uint)grid[1], (uint)grid[2]};
  S.tg_dims = uint3{(uint)(tg[0] < grid[0] ? tg[0] : grid[0]), (uint)(tg[1] < grid[1] ? tg[1] : grid[1]),
                    (uint)(tg[2] < grid[2] ? tg[2] : grid[2])};
  S.tg_count = (S.grid + S.tg_dims - 1) / S.tg_dims;
  const long total = (long)S.tg_dims.x * S.tg_dims.y * S.tg_dims.z;
  int rc = 0;
  if (total > MAX_LANES) {
    fail("threadgroup of %ld threads exceeds %d", total, MAX_LANES);
  } else {
    S.stacks = (char*)mmap(nullptr, STACK_BYTES * total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    S.tg_limit = (size_t)tg_limit;
    S.tg_mem = (unsigned char*)mmap(nullptr, S.tg_limit + 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (uint gz = 0; gz < S.tg_count.z && !S.failed; ++gz) {
      for (uint gy = 0; gy < S.tg_count.y && !S.failed; ++gy) {
        for (uint gx = 0; gx < S.tg_count.x && !S.failed; ++gx) {
          S.tg_pos = uint3{gx, gy, gz};
          // dispatch_threads: a threadgroup at the grid's edge keeps only the threads inside the grid
          const uint3 left = S.grid - S.tg_pos * S.tg_dims;
          S.this_tg = uint3{left.x < S.tg_dims.x ? left.x : S.tg_dims.x, left.y < S.tg_dims.y ? left.y : S.tg_dims.y,
                            left.z < S.tg_dims.z ? left.z : S.tg_dims.z};
          S.n = (int)(S.this_tg.x * S.this_tg.y * S.this_tg.z);
          run_threadgroup();
        }
      }
    }
    munmap(S.stacks, STACK_BYTES * total);
    munmap(S.tg_mem, S.tg_limit + 16);
  }
  if (S.failed) {
    snprintf(err, (size_t)errlen, "%s", S.err);
    rc = 1;
  }
  return rc;
}

}  // namespace zp

namespace metal {
void threadgroup_barrier(mem_flags) { zp::threadgroup_barrier_wait(); }
void simdgroup_barrier(mem_flags) {
  static constexpr zp::simd_op op{[](const void* const*, void* const*, const uint*, uint) {}, "simdgroup_barrier"};
  zp::simd_rendezvous(&op, nullptr, nullptr, 0);
}
}  // namespace metal
