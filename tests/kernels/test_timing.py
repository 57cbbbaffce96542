"""The timing harness's arithmetic, on MLX's CPU backend with a fake clock (no GPU timing here)."""

from __future__ import annotations

import itertools

import pytest

mx = pytest.importorskip("mlx.core")

from zmlx_pipeline.kernels.timing import summarize, time_launches  # noqa: E402


def fake_clock(step: float):
    ticks = itertools.count()
    return lambda: next(ticks) * step


def recorder():
    calls = []

    def launch(i):
        calls.append(i)
        return mx.array([i])

    return calls, launch


def test_chain_is_a_whole_number_of_input_set_rotations():
    calls, launch = recorder()
    # every chain "takes" one clock step (1e-4 s); probe of 8 gives 12.5 us per launch -> 80 per 1 ms
    t = time_launches(launch, warmup=1, samples=3, target_sample_s=1e-3, period=3, clock=fake_clock(1e-4))
    assert t.chain % 3 == 0 and t.chain >= 80
    sampled = calls[-3 * t.chain:]
    # each sample starts on the first input set
    assert [sampled[k * t.chain] % 3 for k in range(3)] == [0, 0, 0]


def test_warmup_runs_until_the_time_has_passed():
    def warmup_launches(warmup_s):
        calls, launch = recorder()
        time_launches(launch, warmup=2, samples=1, warmup_s=warmup_s, clock=fake_clock(1e-3))
        return calls.index(0, 1)  # the calibration chain starts again at launch 0

    # each warm-up launch costs three clock reads (3 ms): 20 ms takes 7 of them, no time 2 (`warmup`)
    assert warmup_launches(0.02) == 7
    assert warmup_launches(0.0) == 2


def test_a_launch_over_the_timeout_is_an_error():
    _, launch = recorder()
    with pytest.raises(TimeoutError):
        time_launches(launch, warmup=1, timeout_s=0.5, clock=fake_clock(1.0))


def test_summary_is_per_launch_microseconds():
    t = summarize([1e-3, 2e-3, 3e-3], chain=4)
    assert (t.median_us, t.samples, t.chain) == (2000.0, 3, 4)
    assert t.p10_us == pytest.approx(1200.0) and t.p90_us == pytest.approx(2800.0)
