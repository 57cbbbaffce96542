"""The stand-in Metal library and CPU runtime on their own, on hand-written kernels: SIMD-group
functions exchange the right lanes' values, threadgroup memory is shared and poisoned, and what Metal
forbids or this runtime does not model fails the launch or the build."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from metal_cpu import build, execute, mlx_source

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU runtime uses Linux ucontext and glibc"),
    pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler: pip install -e '.[test]' brings ziglang"),
]


def launch(source: str, x: np.ndarray, outputs: int, grid: int, threadgroup: int, header: str = ""):
    """Run a hand-written kernel body over float32 x into `outputs` floats: (status, detail, out)."""
    text, params = mlx_source.metal_source("probe", ["x"], [("float32", x.shape)], ["out"], ["float32"],
                                           source, header, [])
    case = execute.Case(build.translation_unit(text, mlx_source.kernel_name("probe", []), params),
                        (x.astype(np.float32).tobytes(), np.full(outputs, np.nan, np.float32).tobytes()), (1,),
                        (grid, 1, 1), (threadgroup, 1, 1), execute.APPLE_TG_MEM_BYTES)
    status, detail, raw = execute.run_library(case)
    return status, detail, (np.frombuffer(raw[0], dtype=np.float32) if raw else None)


def test_simd_group_functions_exchange_the_lanes_values():
    source = r"""
  const uint t = thread_position_in_grid.x;
  const uint l = thread_index_in_simdgroup;
  const float v = x[t];
  out[t * 8 + 0] = simd_shuffle_down(v, 1);
  out[t * 8 + 1] = simd_shuffle_up(v, 2);
  out[t * 8 + 2] = simd_shuffle_xor(v, 5);
  out[t * 8 + 3] = simd_broadcast(v, 7);
  out[t * 8 + 4] = simd_shuffle(v, (ushort)(31 - l));
  out[t * 8 + 5] = simd_sum(v);
  out[t * 8 + 6] = simd_max(v);
  out[t * 8 + 7] = simd_min(v);
"""
    x = np.random.default_rng(0).permutation(64).astype(np.float32)
    status, detail, out = launch(source, x, 64 * 8, 64, 64)
    assert status == "ok", detail
    out = out.reshape(64, 8)
    for t in range(64):
        g, lane = x[t // 32 * 32: t // 32 * 32 + 32], t % 32
        assert out[t, 0] == (g[lane + 1] if lane + 1 < 32 else g[lane])
        assert out[t, 1] == (g[lane - 2] if lane >= 2 else g[lane])
        assert out[t, 2] == g[lane ^ 5]
        assert out[t, 3] == g[7]
        assert out[t, 4] == g[31 - lane]
        assert out[t, 5] == g.sum() and out[t, 6] == g.max() and out[t, 7] == g.min()


def test_a_reduction_counts_only_the_lanes_still_running():
    source = r"""
  const uint t = thread_position_in_grid.x;
  if (t % 2 == 1) return;
  out[t / 2] = simd_sum(x[t]);
"""
    status, detail, out = launch(source, np.arange(32, dtype=np.float32), 16, 32, 32)
    assert status == "ok", detail
    assert np.all(out == sum(range(0, 32, 2)))


def test_threadgroup_memory_is_shared_by_the_threadgroup_and_starts_poisoned():
    source = r"""
  threadgroup float buf[64];
  const uint t = thread_position_in_threadgroup.x;
  out[threadgroup_position_in_grid.x * 64 + t] = buf[t];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  buf[t] = x[thread_position_in_grid.x];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[128 + thread_position_in_grid.x] = buf[63 - t];
"""
    x = np.arange(128, dtype=np.float32)
    status, detail, out = launch(source, x, 256, 128, 64)
    assert status == "ok", detail
    assert np.all(np.isnan(out[:128]))  # the second threadgroup does not see the first one's values
    assert np.array_equal(out[128:], np.concatenate([x[63::-1], x[:63:-1]]))


@pytest.mark.parametrize("source, error", [
    ("if (thread_position_in_grid.x < 16) return;\n  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
     "  out[0] = 1.0f;", "threadgroup_barrier reached by 48 of the threadgroup's 64 threads"),
    ("float v = x[thread_position_in_grid.x];\n  if (thread_index_in_simdgroup < 8) v = simd_sum(v); "
     "else v = simd_max(v);\n  out[thread_position_in_grid.x] = v;", "different SIMD-group functions (simd_sum and simd_max)"),
    ("threadgroup float big[8193];\n  big[0] = 1.0f;\n  out[0] = big[0];", "threadgroup memory of 32772 bytes"),
])
def test_what_the_runtime_refuses_fails_the_launch(source, error):
    """A barrier some threads returned before (MSL §6.9.1 requires every thread), more threadgroup memory
    than an Apple GPU has, and lanes of one SIMD group at different SIMD-group functions: Metal runs
    those on the active lanes of each branch, which this runtime does not model, so it refuses them."""
    status, detail, _ = launch(source, np.zeros(64, dtype=np.float32), 64, 64, 64)
    assert status == "launch_error" and error in detail, detail


@pytest.mark.parametrize("n, header, source", [
    # a device pointer is no threadgroup pointer (MSL §4)
    (64, "inline float first(const threadgroup float* p) { return p[0]; }\n", "out[0] = first(x);"),
    # an input under 8 elements is `constant`: no conversion to `device`
    (4, "", "const device float* p = x;\n  out[0] = p[0];"),
    # no double in MSL's math functions: the float and half overloads are ambiguous for it
    (64, "", "out[0] = metal::precise::exp(1.0);"),
])
def test_what_metal_does_not_compile_does_not_build(n, header, source):
    status, detail, _ = launch(source, np.zeros(n, dtype=np.float32), 4, 32, 32, header)
    assert status == "compile_error", detail


def test_only_threadgroup_variables_become_shared_storage():
    """Declarations of threadgroup arrays and scalars are rewritten; pointers into threadgroup memory,
    parameters and a declaration with an initialiser (which MSL refuses) are left as written."""
    tg = "__attribute__((address_space(3)))"
    text = (
        "namespace zp_kernel_source_begins {}\n"
        f"void f(const {tg} float* p) {{\n"
        f"  {tg} float buf[4 * 8][2];\n"
        f"  {tg} int count;\n"
        f"  const {tg} float* q = p;\n"
        f"  {tg} float bad = 0;\n"
        "}\n"
    )
    out = build.share_threadgroup_declarations(text)
    assert f"{tg} float (&buf)[4*8][2] = *zp::tg_alloc<float[4*8][2]>(0);" in out
    assert f"{tg} int (&count) = *zp::tg_alloc<int>(1);" in out
    assert f"void f(const {tg} float* p)" in out and f"const {tg} float* q = p;" in out
    assert f"{tg} float bad = 0;" in out
