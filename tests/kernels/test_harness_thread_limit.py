"""A launch a Metal pipeline refuses for its thread limit is recorded as launch_error with the limit in its text.

MLX compiles a custom kernel's pipeline when the launch is evaluated and refuses a threadgroup over the
pipeline's maxTotalThreadsPerThreadgroup (which can be under the device's 1024 for a kernel using many
registers) with a ValueError; a launcher double raises that same message here (no GPU needed).
"""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")

from zmlx_pipeline.kernels import harness  # noqa: E402
from zmlx_pipeline.kernels.registry import get_kernel  # noqa: E402
from zmlx_pipeline.core.constraints import APPLE_LIMITS, limit_values, pipeline_thread_limit  # noqa: E402

#: mlx/backend/metal/custom_kernel.cpp, word for word (two spaces before "the")
MLX_REFUSAL = "Thread group size (1024) is greater than  the maximum allowed threads per threadgroup (832)."


class RefusingLauncher:
    """Launches every config with a threadgroup over 832 threads the way MLX's Metal backend refuses it."""

    def __init__(self, spec):
        self.spec, self.backend, self.kernel_name_part = spec, "metal", spec.name
        self.launched = []

    def __call__(self, inputs, config, shape, dtype, init_value=None):
        self.launched.append(dict(config))
        tg = self.spec.launch(config, shape).threadgroup
        if tg[0] * tg[1] * tg[2] > 832:
            raise ValueError(MLX_REFUSAL)
        return self.spec.reference(inputs, shape)

    def bind(self, config, shape, dtype):
        return lambda inputs: self.spec.reference(inputs, shape)


@pytest.fixture
def launcher(monkeypatch):
    monkeypatch.setattr(harness, "_settled", True)  # no decoy timing: nothing here runs on a GPU
    return RefusingLauncher(get_kernel("rmsnorm"))


def test_a_threadgroup_over_the_pipelines_limit_is_a_launch_error_naming_the_limit(launcher):
    shape = {"rows": 8, "cols": 4096}
    outcome = harness.measure(launcher, {"TG": 1024, "VEC": 4, "ROWS": 1}, shape, "float32", samples=2)
    assert outcome.status == "launch_error" and outcome.timing is None
    assert outcome.error.startswith("threadgroup of 1024 threads over this pipeline's limit of 832")
    assert "ValueError: Thread group size (1024)" in outcome.error  # MLX's own words are kept after it
    assert launcher.launched == [{"TG": 1024, "VEC": 4, "ROWS": 1}]


def test_the_same_config_under_the_limit_is_checked_and_timed(launcher, monkeypatch):
    from zmlx_pipeline.kernels.timing import Timing

    monkeypatch.setattr(harness, "time_launches", lambda *a, **k: Timing(2.0, 1.9, 2.1, 2, 1))
    outcome = harness.measure(launcher, {"TG": 512, "VEC": 4, "ROWS": 1}, {"rows": 8, "cols": 4096}, "float32",
                              samples=2)
    assert outcome.status == "ok" and outcome.timing.median_us == 2.0


def test_the_refusal_is_a_launch_error_even_beside_compiler_words():
    wrapped = RuntimeError(f"[metal_kernel] error: {MLX_REFUSAL}")  # "error: " alone would read as a compile error
    assert harness.classify_error(wrapped) == "launch_error"
    assert harness.classify_error(RuntimeError("program_source:3:5: error: use of undeclared identifier")) == \
        "compile_error"
    assert pipeline_thread_limit(MLX_REFUSAL) == (1024, 832)
    assert pipeline_thread_limit("Thread group size (1024) is greater than the maximum") is None


@pytest.mark.parametrize("device", ["apple-m1-max-32c", "apple-m2-ultra-76c", "apple-m4-10c"])
def test_apple_chips_have_apples_limits(device):
    from zmlx_pipeline.data.catalog import get_device

    limits = limit_values(get_device(device).as_row())
    assert {k: limits[k] for k in APPLE_LIMITS} == APPLE_LIMITS == {"max_threads": 1024, "simd_width": 32,
                                                                      "tg_mem_bytes": 32768}
    # a device row that says nothing gets the same limits
    assert {k: limit_values({})[k] for k in APPLE_LIMITS} == APPLE_LIMITS
