"""On a CUDA GPU: every built-in kernel matches its reference through cuda_kernel and through cached PTX
(precompiled_cuda_kernel), and a warm cache launches without compiling."""

from __future__ import annotations

import pytest

from zmlx_pipeline.kernels.builtin import BUILTIN
from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.spec import Limits, spread

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]

DTYPES = ("float16", "bfloat16", "float32")


def _compiled_launcher(spec, root):
    from zmlx_pipeline.kernels import compiled
    from zmlx_pipeline.kernels.harness import Launcher
    from zmlx_pipeline.kernels.ptx_cache import PtxCache

    launcher = Launcher(spec, "cuda")
    assert launcher.compiler is not None, f"the precompiled path is unavailable: {compiled.unavailable_reason()}"
    launcher.compiler = compiled.Compiler(PtxCache(root))
    return launcher


def _cases(spec, dtype):
    from zmlx_pipeline.kernels import nvrtc

    cc = nvrtc.compute_capability() or (0, 0)
    limits = Limits(1024, 32, 49152, cuda_arch=cc[0] * 10 + cc[1])
    shape = spec.shape_grid.shapes("smoke")[0]
    return shape, spread(spec.legal_configs(shape, dtype, limits), 2)


@pytest.mark.parametrize("name", BUILTIN)
def test_both_launch_paths_match_the_reference(name, tmp_path):
    from zmlx_pipeline.kernels.harness import Launcher, check

    spec = get_kernel(name)
    plain = Launcher(spec, "cuda", precompiled=False)
    fast = _compiled_launcher(spec, tmp_path)
    failures = []
    for dtype in DTYPES:
        shape, configs = _cases(spec, dtype)
        for config in configs:
            for label, launcher in (("cuda_kernel", plain), ("precompiled", fast)):
                wrong = check(launcher, config, shape, dtype, seed=5)
                if wrong:
                    failures.append((label, dtype, config, wrong))
    assert not failures, failures[:4]
    used = [v for v in fast._programs.values() if v is not None]
    assert used, "no config launched through precompiled_cuda_kernel"
    assert fast.compiler.cache.built == len(used)


def test_a_warm_cache_launches_without_compiling_and_the_gpu_timer_sees_the_kernel(tmp_path):
    import mlx.core as mx

    from zmlx_pipeline.kernels.harness import check, make_inputs

    spec = get_kernel("rmsnorm")
    shape, configs = _cases(spec, "float16")
    inputs = make_inputs(spec, shape, "float16", mx.random.key(0))
    cold = _compiled_launcher(spec, tmp_path)
    assert cold.precompile([(c, shape, "float16", inputs) for c in configs]) == len(configs)
    assert cold.compiler.cache.built == len(configs)
    warm = _compiled_launcher(spec, tmp_path)
    for config in configs:
        assert check(warm, config, shape, "float16", seed=3) is None
    assert warm.compiler.cache.built == 0
    name = next(v for v in warm._programs.values() if v is not None)[0]
    assert warm.kernel_name_part in name  # what the gpu timer matches in CUPTI's kernel names
