"""The CPU check of the Metal sources catches a broken prelude: each case breaks one central Metal
definition by a text substitution on the generated source and expects the check to fail (wrong
output, a failed launch, or a source that does not compile)."""

from __future__ import annotations

import sys

import pytest

from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.spec import Limits

from metal_cpu import build
from metal_cpu.workers import run_all, workers  # noqa: F401 - the fixture

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU runtime uses Linux ucontext and glibc"),
    pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler: pip install -e '.[test]' brings ziglang"),
]

# rmsnorm with four SIMD groups a row, so its sum crosses SIMD groups through threadgroup memory
ROW = ("rmsnorm", {"TG": 128, "VEC": 2, "ROWS": 1}, {"rows": 5, "cols": 264}, "float16")
SOFTMAX = ("softmax", {"TG": 128, "VEC": 2, "ROWS": 1, "CACHE": 1}, {"rows": 5, "cols": 264}, "float32")
# matmul with K = 72: a partial last slab, zero-filled
MATMUL = ("matmul", {"TG": 64, "BM": 32, "BN": 64, "BK": 32, "WM": 2, "WN": 1, "STAGES": 4, "WG": 0},
          {"M": 20, "N": 100, "K": 72}, "float16")

# (what breaks, kernel case, text in the generated source, its replacement, the status expected)
MUTATIONS = [
    ("threadgroup barrier dropped", ROW,
     "#define KBARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)", "#define KBARRIER()", "wrong_result"),
    ("threadgroup barrier made a SIMD-group barrier", ROW,
     "#define KBARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)",
     "#define KBARRIER() simdgroup_barrier(mem_flags::mem_threadgroup)", "wrong_result"),
    ("barrier dropped from the matmul slab ring", MATMUL,
     "#define KBARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)", "#define KBARRIER()", "wrong_result"),
    ("SIMD sum reduced to the lane's own value", ROW,
     "#define KSIMD_SUM(v) metal::simd_sum(v)", "#define KSIMD_SUM(v) (v)", "wrong_result"),
    # (a SIMD min in its place keeps softmax exact: every partial sum is rescaled to the value taken)
    ("SIMD max reduced to the lane's own value", SOFTMAX,
     "#define KSIMD_MAX(v) metal::simd_max(v)", "#define KSIMD_MAX(v) (v)", "wrong_result"),
    ("SIMD-group index halved", ROW,
     "const uint k_warp = simdgroup_index_in_threadgroup;", "const uint k_warp = simdgroup_index_in_threadgroup / 2;",
     "wrong_result"),
    ("rsqrt made sqrt", ROW,
     "#define KRSQRT(x) metal::precise::rsqrt(x)", "#define KRSQRT(x) metal::precise::sqrt(x)", "wrong_result"),
    ("exp halved", SOFTMAX,
     "#define KEXP(x) metal::precise::exp(x)", "#define KEXP(x) metal::precise::exp(0.5f * (x))", "wrong_result"),
    ("vector load reads one element", ROW,
     "k_load(const device T* p, thread float* vals) {\n  for (int i = 0; i < V; ++i) {\n    vals[i] = static_cast<float>(p[i]);",
     "k_load(const device T* p, thread float* vals) {\n  for (int i = 0; i < V; ++i) {\n    vals[i] = static_cast<float>(p[0]);",
     "wrong_result"),
    ("vector store writes one value", ROW,
     "p[i] = static_cast<T>(vals[i]);", "p[i] = static_cast<T>(vals[0]);", "wrong_result"),
    ("simdgroup matrix lane layout: column pairs overlap", MATMUL,
     "inline int k_mma_lane_col(uint lane) { return (int)(((lane / 4) & 2) * 2 + (lane % 2) * 2); }",
     "inline int k_mma_lane_col(uint lane) { return (int)(((lane / 4) & 2) * 2 + (lane % 2)); }", "wrong_result"),
    ("accumulator read from the wrong element (the tile's store)", MATMUL,
     "thread_elements()[e & 1]; }", "thread_elements()[0]; }", "wrong_result"),
    ("simdgroup multiply with its operands swapped", MATMUL,
     "simdgroup_multiply_accumulate(acc->m[i][j], a->m[i][k], b->m[k][j], acc->m[i][j])",
     "simdgroup_multiply_accumulate(acc->m[i][j], b->m[k][j], a->m[i][k], acc->m[i][j])", "wrong_result"),
    ("slab edges padded with ones", MATMUL,
     "dst[i] = i < n ? src[i] : static_cast<T>(0.0f);", "dst[i] = i < n ? src[i] : static_cast<T>(1.0f);",
     "wrong_result"),
    ("fragment load from the device address space", MATMUL,
     "inline void k_mma_fill(thread F* f, const threadgroup T* p, int ld, uint lane)",
     "inline void k_mma_fill(thread F* f, const device T* p, int ld, uint lane)", "compile_error"),
    ("vector store into the threadgroup address space", ROW,
     "inline void k_store(device T* p, const thread float* vals)",
     "inline void k_store(threadgroup T* p, const thread float* vals)", "compile_error"),
]


@pytest.mark.parametrize("what, case, old, new, expected", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_the_check_catches_a_broken_metal_prelude(workers, what, case, old, new, expected):
    name, config, shape, dtype = case
    spec = get_kernel(name)
    assert not spec.violations(config, shape, dtype, Limits())

    def mutate(text: str) -> str:
        assert text.count(old) == 1, f"{old!r} is not once in the generated source"
        return text.replace(old, new)

    (_, _, intact), = run_all(workers, spec, [(config, shape)], dtype)
    (_, _, broken), = run_all(workers, spec, [(config, shape)], dtype, transform=mutate)
    assert intact.status == "ok", intact.detail
    assert broken.status == expected, f"{what}: {broken.status} {broken.detail}"
