"""harness.measure times the decoy kernel once per process before its first real timing (no GPU needed here)."""

from __future__ import annotations

import pytest

from zmlx_pipeline.kernels import decoy, harness
from zmlx_pipeline.kernels.harness import Prepared
from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.spec import Limits
from zmlx_pipeline.kernels.timing import Timing


class FakeLauncher:
    """Binds configs to launches that say which kernel ran."""

    def __init__(self, spec, backend="cuda"):
        self.spec, self.backend, self.kernel_name_part = spec, backend, spec.name

    def bind(self, config, shape, dtype):
        return lambda inputs: self.spec.name


@pytest.fixture
def timed(monkeypatch):
    """Every timing the harness makes, as the name of the kernel it launched; the decoy reads 1.2 us, others 1.6."""
    names = []

    def fake_timer(launch, *args, **kwargs):
        names.append(launch(0))
        us = 1.2 if names[-1] == decoy.SPEC.name else 1.6
        return Timing(median_us=us, p10_us=us, p90_us=us, samples=5, chain=1)

    monkeypatch.setattr(harness, "_settled", False)
    monkeypatch.setattr(harness, "_DECOYS", {})
    monkeypatch.setattr(harness, "Launcher", FakeLauncher)
    monkeypatch.setattr(harness, "check", lambda *a, **k: None)
    monkeypatch.setattr(harness, "time_launches", fake_timer)
    monkeypatch.setattr(harness, "time_gpu", fake_timer)
    monkeypatch.setattr(harness, "input_sets", lambda *a, **k: [["x"]])
    return names


PREPARED = Prepared(check_inputs=[], refs=[], sets=[["x"]])
SHAPE = {"rows": 1, "cols": 11008}


@pytest.mark.parametrize("timer", ["chain", "gpu"], ids=["chain-timer", "cupti-timer"])
def test_the_decoy_is_timed_once_before_the_first_config(timed, timer):
    swiglu = FakeLauncher(get_kernel("swiglu"))
    first = harness.measure(swiglu, {"TG": 64, "VEC": 1, "EPT": 1}, SHAPE, "float16", prepared=PREPARED, timer=timer)
    second = harness.measure(swiglu, {"TG": 64, "VEC": 2, "EPT": 1}, SHAPE, "float16", prepared=PREPARED, timer=timer)
    assert timed == ["zmlx_decoy", "swiglu", "swiglu"]
    assert first.status == second.status == "ok"
    assert first.timing.median_us == pytest.approx(1.6)  # the config's own timing, not the decoy's


def test_a_failing_decoy_is_not_retried_and_does_not_stop_the_measurement(timed, monkeypatch):
    real = harness.time_launches

    def decoy_fails(launch, *args, **kwargs):
        if launch(0) == decoy.SPEC.name:
            timed.append("decoy failed")
            raise RuntimeError("out of resources")
        return real(launch, *args, **kwargs)

    monkeypatch.setattr(harness, "time_launches", decoy_fails)
    monkeypatch.setattr(harness, "gpu_healthy", lambda: True)
    swiglu = FakeLauncher(get_kernel("swiglu"))
    for vec in (1, 2):
        out = harness.measure(swiglu, {"TG": 64, "VEC": vec, "EPT": 1}, SHAPE, "float16", prepared=PREPARED)
        assert out.status == "ok" and out.timing.median_us == pytest.approx(1.6)
    assert timed == ["decoy failed", "swiglu", "swiglu"]


def test_a_compiled_decoy_is_the_one_settle_times(timed, monkeypatch):
    launched = []
    monkeypatch.setattr(harness, "check", lambda launcher, *a, **k: launched.append(launcher))
    harness.compile_decoy("cuda")
    harness.measure(FakeLauncher(get_kernel("swiglu")), {"TG": 64, "VEC": 1, "EPT": 1}, SHAPE, "float16",
                    prepared=PREPARED)
    assert launched[0] is launched[1] is harness.decoy_launcher("cuda")  # compiled once, then timed
    assert timed == ["zmlx_decoy", "swiglu"]


def test_the_decoy_is_one_legal_config_and_its_reference_is_what_the_body_computes():
    mx = pytest.importorskip("mlx.core")
    assert decoy.SPEC.legal_configs(decoy.SHAPE, decoy.DTYPE, Limits()) == [decoy.CONFIG]
    (x,) = decoy.SPEC.make_inputs(decoy.SHAPE, mx.float32, mx.random.key(0))
    (y,) = decoy.SPEC.reference([x], decoy.SHAPE)
    assert x.shape == y.shape == (decoy.SHAPE["n"],)
    assert mx.allclose(y, x * 0.5 + 1.0).item() and not mx.allclose(y, x).item()
    launch = decoy.SPEC.launch(decoy.CONFIG, decoy.SHAPE)
    assert launch.grid[0] >= decoy.SHAPE["n"] and launch.grid[0] % decoy.CONFIG["TG"] == 0
    assert "y[i]" not in decoy.SPEC.body  # writes go through k_store, as every kernel's must
