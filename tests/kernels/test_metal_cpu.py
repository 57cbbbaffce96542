"""The generated Metal sources, compiled as C++ against the stand-in <metal_stdlib> and run on the CPU
(tests/kernels/metal_cpu/README.md): every built-in kernel and the README's example, in each dtype,
on a sample of configs covering every parameter value an Apple GPU can run, against the kernel's
reference."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from zmlx_pipeline.kernels.builtin import BUILTIN
from zmlx_pipeline.kernels.registry import get_kernel

from metal_cpu import build, execute, sample
from metal_cpu.workers import run_all, workers  # noqa: F401 - the fixture

REPO = Path(__file__).resolve().parents[2]
DTYPES = ("float32", "float16", "bfloat16")

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU runtime uses Linux ucontext and glibc"),
    pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler: pip install -e '.[test]' brings ziglang"),
]


def load_spec(name: str):
    """A built-in kernel, or `row_scale` from examples/row_scale.py."""
    if name != "row_scale":
        return get_kernel(name)
    found = importlib.util.spec_from_file_location("row_scale_example", REPO / "examples" / "row_scale.py")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module.SPEC


KERNELS = (*BUILTIN, "row_scale")

#: parameter values no config an Apple GPU may run has (its constraints exclude them on every shape):
#: matmul's one-warp threadgroups (TG 32: WM * WN >= 2 everywhere), a 256-wide tile (its slab ring
#: needs more than 32 KiB), and the warpgroup-MMA path (WG 1 and its 3-stage ring: sm_90 only)
NOT_ON_METAL = {"matmul": {"TG": {32}, "BN": {256}, "STAGES": {3}, "WG": {1}}}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", KERNELS)
def test_metal_source_runs_and_matches_the_reference(workers, name, dtype):
    spec = load_spec(name)
    cases = sample.covering_sample(spec, name, dtype)
    assert cases
    bad = [f"{c} {s}: {r.status} {r.detail}" for c, s, r in run_all(workers, spec, cases, dtype) if r.status != "ok"]
    assert not bad, f"{len(bad)} of {len(cases)} {name} {dtype} cases failed:\n" + "\n".join(bad)


@pytest.mark.parametrize("name", KERNELS)
def test_the_sample_covers_every_value_metal_can_run(name):
    """Every value of every parameter is in some dtype's sample, except the values no Apple-legal config
    has on any shape of the kernel's smoke grid (checked here, so the exclusions cannot grow unseen)."""
    spec = load_spec(name)
    covered: dict[str, set] = {k: set() for k in spec.params}
    for dtype in DTYPES:
        for config, _ in sample.covering_sample(spec, name, dtype):
            for k, v in config.items():
                covered[k].add(v)
    missing = {k: set(v) - covered[k] for k, v in spec.params.items() if set(v) - covered[k]}
    assert missing == NOT_ON_METAL.get(name, {})
    with_missing = [c for c in spec.configs() if any(c[k] in vs for k, vs in missing.items())]
    for shape in spec.shape_grid.shapes("smoke"):
        for dtype in DTYPES:
            legal = [c for c in with_missing if not spec.violations(c, shape, dtype, sample.APPLE)]
            assert not legal, (shape, dtype, legal[:3])


def test_the_warpgroup_path_compiles_on_metal_but_does_not_fit_it(workers):
    """matmul's WG = 1 (sm_90 only) compiles on Metal; its slab ring needs more threadgroup memory than an
    Apple GPU has, and where that memory is there, k_wg_matmul does nothing: the output keeps its poison."""
    spec = get_kernel("matmul")
    config = {"TG": 256, "BM": 64, "BN": 128, "BK": 64, "WM": 1, "WN": 4, "STAGES": 4, "WG": 1}
    shape = {"M": 64, "N": 128, "K": 64}
    case, refs, out_dtypes, launch = execute.prepare(spec, config, shape, "float16")
    on_apple = execute.judge(spec, "float16", refs, out_dtypes, launch, workers.submit(execute.run_library, case).result())
    assert on_apple.status == "launch_error" and "threadgroup memory" in on_apple.detail
    roomy = dataclasses.replace(case, tg_mem_bytes=256 * 1024)
    no_op = execute.judge(spec, "float16", refs, out_dtypes, launch, workers.submit(execute.run_library, roomy).result())
    assert no_op.status == "wrong_result" and "unwritten" in no_op.detail


def test_matmul_with_an_input_under_8_elements_is_legal_on_cuda_only():
    # metal_kernel passes such an input in the constant address space, which matmul's device pointers
    # (KCDEV_PTR, k_copy_async) cannot hold: the launch would not compile on Metal, so no config is legal there
    spec = get_kernel("matmul")
    config = {"TG": 64, "BM": 16, "BN": 64, "BK": 32, "WM": 1, "WN": 2, "STAGES": 4, "WG": 0}
    for shape in ({"M": 1, "N": 64, "K": 4}, {"M": 64, "N": 1, "K": 4}):
        assert any("M * K >= 8" in v for v in spec.violations(config, shape, "float16", sample.APPLE))
        assert not spec.legal_configs(shape, "float16", sample.APPLE)
    hopper = dataclasses.replace(sample.APPLE, cuda_arch=90, tg_mem_bytes=49152)
    assert not spec.violations(config, {"M": 1, "N": 64, "K": 4}, "float16", hopper)
    assert not spec.violations(config, {"M": 1, "N": 64, "K": 64}, "float16", sample.APPLE)
