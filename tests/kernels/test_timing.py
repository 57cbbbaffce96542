"""The timing harness's arithmetic, on MLX's CPU backend with a fake clock (no GPU timing here)."""

from __future__ import annotations

import itertools

import pytest

mx = pytest.importorskip("mlx.core")

from zmlx_pipeline.kernels.timing import resolve_timer, summarize, time_gpu, time_launches  # noqa: E402


def fake_clock(step: float):
    ticks = itertools.count()
    return lambda: next(ticks) * step


def recorder():
    calls = []

    def launch(i):
        calls.append(i)
        return mx.array([i])

    return calls, launch


class FakeGpu:
    """Launches that each take `per` seconds (or `slow` for the first `slow_launches` of them), and a
    fixed cost per evaluated chain, on a fake clock."""

    def __init__(self, per: float, fixed: float, slow: float = 0.0, slow_launches: int = 0):
        self.per, self.fixed, self.slow, self.slow_launches = per, fixed, slow, slow_launches
        self.calls: list[int] = []
        self._cost = 0.0    # summed cost of every launch built
        self._seen = 0      # launches built by the previous clock read
        self._done = 0.0    # their summed cost
        self._chains = 0    # chains built by the previous clock read

    def launch(self, i):
        self._cost += self.slow if len(self.calls) < self.slow_launches else self.per
        self.calls.append(i)
        return mx.array([i])

    def clock(self) -> float:
        # A chain's launches are built before its first read and "run" before its second.
        value = self._done + self._chains * self.fixed
        if len(self.calls) != self._seen:
            self._seen, self._done, self._chains = len(self.calls), self._cost, self._chains + 1
        return value


def test_the_fixed_cost_of_evaluating_a_chain_is_cancelled():
    gpu = FakeGpu(per=10e-6, fixed=200e-6)
    t = time_launches(gpu.launch, warmup=1, samples=3, target_sample_s=1e-3, clock=gpu.clock)
    # a plain chain-over-length would say (100 * 10 + 200) / 100 = 12 us
    assert t.median_us == pytest.approx(10.0) and t.p90_us == pytest.approx(10.0)
    assert t.chain == 100 and t.samples == 3


def test_chain_is_a_whole_number_of_input_set_rotations():
    gpu = FakeGpu(per=10e-6, fixed=200e-6)
    t = time_launches(gpu.launch, warmup=1, samples=2, target_sample_s=1e-3, period=3, clock=gpu.clock)
    n = t.chain
    assert n == 102  # 100 launches rounded up to whole rotations of 3 input sets
    # every timed chain starts on the first input set: the last sample is a chain of n, then 2n
    assert gpu.calls[-3 * n:] == list(range(n)) + list(range(2 * n))


def test_the_chain_is_capped():
    gpu = FakeGpu(per=1e-9, fixed=200e-6)
    t = time_launches(gpu.launch, warmup=1, samples=1, max_chain=64, period=3, clock=gpu.clock)
    # the launches are too cheap for the fixed cost to cancel at 63 of them: what is left is the
    # upper bound, the double chain's time per launch
    assert t.chain == 63 and t.median_us == pytest.approx((126 * 1e-9 + 200e-6) / 126 * 1e6)


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


def test_a_launch_longer_than_the_target_is_timed_one_rotation_at_a_time():
    gpu = FakeGpu(per=3e-3, fixed=200e-6)
    t = time_launches(gpu.launch, warmup=2, samples=2, target_sample_s=1e-3, period=2, clock=gpu.clock)
    assert t.chain == 2 and t.median_us == pytest.approx(3000.0)
    # warm-up, then pairs of (2, 4) launches: calibration, the warm pair and two samples
    assert len(gpu.calls) == 2 + 4 * 3 * 2


def test_a_misled_calibration_is_measured_again_at_the_right_length():
    # the warm-up and calibration launches run 20x slow (say the clocks were still low): the
    # calibration asks for a chain of 5, whose samples then show a 10 us launch wanting 100
    gpu = FakeGpu(per=10e-6, fixed=200e-6, slow=200e-6, slow_launches=13)
    t = time_launches(gpu.launch, warmup=1, samples=3, target_sample_s=1e-3, clock=gpu.clock)
    assert t.chain in (100, 101) and t.median_us == pytest.approx(10.0)


# The gpu timer: CUPTI is replaced by a fake `durations` (the real one needs torch and a GPU; the
# GPU tests time real kernels with it).


def fake_profile(per_launch_us: float, record: list | None = None):
    """A stand-in for cupti.profile_kernels: runs the launches, reports per_launch_us for each."""

    def durations(run, name_part):
        before = len(launched)
        run()
        got = [per_launch_us + 0.1 * (i % 3) for i in range(len(launched) - before)]
        if record is not None:
            record.append(name_part)
        return got

    launched: list[int] = []
    return launched, durations


def test_gpu_timer_summarises_the_kernels_durations():
    names: list = []
    launched, durations = fake_profile(7.0, names)

    def launch(i):
        launched.append(i)
        return mx.array([i])

    t = time_gpu(launch, "custom_kernel_zp_x_", warmup=2, launches=30, durations=durations, clock=fake_clock(1e-5))
    assert names == ["custom_kernel_zp_x_"]
    # 2 warm-ups, then 30 timed launches; durations 7.0, 7.1, 7.2 repeating
    assert len(launched) == 32 and launched[2:] == list(range(2, 32))
    assert (t.samples, t.chain) == (30, 1) and t.median_us == pytest.approx(7.1)
    assert t.p10_us == pytest.approx(7.0) and t.p90_us == pytest.approx(7.2)


def test_gpu_timer_times_a_long_kernel_fewer_times_in_whole_rotations():
    launched, durations = fake_profile(5000.0)

    def launch(i):
        launched.append(i)
        return mx.array([i])

    # each clock read moves 5 ms on, so a warmed launch seems to take 5 ms
    t = time_gpu(launch, "k", warmup=1, launches=30, min_launches=4, target_total_s=0.02, period=3,
                 durations=durations, clock=fake_clock(5e-3))
    # 0.02 s / 5 ms = 4 launches, rounded up to whole rotations of 3 input sets
    assert t.samples == 6


def test_gpu_timer_that_records_nothing_is_an_error():
    from zmlx_pipeline.kernels.cupti import CuptiUnavailable

    _, launch = recorder()
    with pytest.raises(CuptiUnavailable, match="recorded no kernel"):
        time_gpu(launch, "k", warmup=1, durations=lambda run, name: (run(), [])[1], clock=fake_clock(1e-5))


def test_gpu_timer_keeps_the_timeout():
    _, launch = recorder()
    with pytest.raises(TimeoutError):
        time_gpu(launch, "k", warmup=1, timeout_s=0.5, durations=lambda run, name: [1.0], clock=fake_clock(1.0))


def test_kernel_durations_keep_only_the_named_kernels():
    from types import SimpleNamespace as E

    from zmlx_pipeline.kernels.cupti import kernel_durations

    events = [E(name="custom_kernel_zp_rmsnorm_ab_float16_t_1(x)", device_time=7.5),
              E(name="cudaLaunchKernel", device_time=0.0),
              E(name="mlx::core::cu::copy_kernel", device_time=3.0),
              E(name="custom_kernel_zp_rmsnorm_ab_float16_t_2(x)", cuda_time=8.5)]  # older torch
    assert kernel_durations(events, "custom_kernel_zp_rmsnorm_ab_") == [7.5, 8.5]


def test_resolve_timer(monkeypatch):
    from zmlx_pipeline.kernels import cupti

    assert resolve_timer("chain", "cuda") == "chain"
    assert resolve_timer("auto", "metal") == "chain"
    with pytest.raises(cupti.CuptiUnavailable, match="only CUDA"):
        resolve_timer("gpu", "metal")
    with pytest.raises(ValueError, match="unknown timer"):
        resolve_timer("wall", "cuda")
    monkeypatch.setattr(cupti, "available", lambda: False)
    assert resolve_timer("auto", "cuda") == "chain"
    monkeypatch.setattr(cupti, "available", lambda: True)
    assert resolve_timer("auto", "cuda") == "gpu"

    def no_torch():
        raise cupti.CuptiUnavailable("torch is not importable")

    monkeypatch.setattr(cupti, "require", no_torch)  # asked for by name, it is not silently "chain"
    with pytest.raises(cupti.CuptiUnavailable, match="torch"):
        resolve_timer("gpu", "cuda")


def test_raw_kineto_events_keep_only_the_named_gpu_kernels():
    from zmlx_pipeline.kernels.cupti import raw_kernel_durations

    class Raw:  # the methods torch's _KinetoEvent has
        def __init__(self, name, device, ns):
            self._n, self._d, self._ns = name, device, ns

        def name(self):
            return self._n

        def device_type(self):
            return f"DeviceType.{self._d}"

        def duration_ns(self):
            return self._ns

    events = [Raw("custom_kernel_zp_rmsnorm_ab_float16_t_1", "CUDA", 7500),
              Raw("custom_kernel_zp_rmsnorm_ab_float16_t_1", "CPU", 900),  # a host-side record of the same name
              Raw("cudaLaunchKernel", "CPU", 4000),
              Raw("mlx::core::cu::copy_kernel", "CUDA", 3000),
              Raw("custom_kernel_zp_rmsnorm_ab_float16_t_2", "CUDA", 0),
              Raw("custom_kernel_zp_rmsnorm_ab_float16_t_2", "CUDA", 8250)]
    assert raw_kernel_durations(events, "custom_kernel_zp_rmsnorm_ab_") == [7.5, 8.25]
