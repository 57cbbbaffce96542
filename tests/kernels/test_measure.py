"""kernels/measure.py: the measuring types collect, its workers and the Ray actors share."""

import pytest

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.kernels.harness import NoGpuBackend
from zmlx_pipeline.kernels.measure import GpuMeasurer, MeasureError, TimingSettings


def test_asking_for_the_gpu_timer_on_metal_is_a_measure_error_naming_the_chain_timer():
    settings = TimingSettings(timer="gpu")
    with pytest.raises(MeasureError, match="--timer chain") as caught:
        GpuMeasurer("metal", settings)
    assert isinstance(caught.value, ZmlxPipelineError)


def test_a_measurer_needs_a_gpu_backend():
    with pytest.raises(NoGpuBackend):
        GpuMeasurer("cpu", TimingSettings(timer="chain"))


def test_collect_measures_with_the_same_types():
    from zmlx_pipeline.pipeline import collect

    assert collect.Task is __import__("zmlx_pipeline.kernels.measure", fromlist=["Task"]).Task
    assert collect.GpuMeasurer is GpuMeasurer and collect.TimingSettings is TimingSettings
