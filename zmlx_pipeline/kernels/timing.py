"""The timing harness: two timers behind one Timing.

- `time_launches` (the "chain" timer, every backend): warm up, then samples that each difference two
  chains of launches. MLX is lazy, so a chain is built first, then evaluated with one `mx.eval` and
  waited for with `mx.synchronize`; a sample is the time of a chain of 2n launches minus that of n,
  over n. Below MLX's dispatch cost (about 5 us a launch) it times the dispatch, not the kernel.
- `time_gpu` (the "gpu" timer, CUDA with torch installed): each launch evaluated alone, and its
  duration read from the GPU's own clock through CUPTI (kernels/cupti.py).
The runtime autotuner times candidates with these same functions.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

#: what `--timer` accepts: "auto" is "gpu" where CUPTI can be read (CUDA with torch), else "chain"
TIMERS = ("auto", "gpu", "chain")
#: how each timer is named in a run's settings (the `timing` key), so data says how it was timed
TIMER_LABELS = {"gpu": "gpu-cupti", "chain": "chain-difference"}


@dataclass(frozen=True)
class Timing:
    """Per-launch time in microseconds: median and the 10th/90th percentiles over `samples`."""

    median_us: float
    p10_us: float
    p90_us: float
    samples: int
    chain: int  # launches per sample


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of an already sorted list."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(per_launch_s: Sequence[float], chain: int) -> Timing:
    """A Timing from per-launch seconds, one value per sample."""
    values = sorted(v * 1e6 for v in per_launch_s)
    return Timing(
        median_us=statistics.median(values),
        p10_us=_percentile(values, 0.10),
        p90_us=_percentile(values, 0.90),
        samples=len(values),
        chain=chain,
    )


def _warm_up(run_one: Callable[[int], float], *, warmup: int, warmup_s: float, timeout_s: float | None,
             clock: Callable[[], float]) -> tuple[int, float]:
    """Run launches 0, 1, ... one at a time (`run_one(i)` returns its seconds) until `warmup` of them
    and `warmup_s` have passed: (launches run, the last one's seconds). Raises TimeoutError when a
    launch exceeds `timeout_s`."""
    began = clock()
    done = 0
    while True:
        single = run_one(done)
        done += 1
        if timeout_s is not None and single > timeout_s:
            raise TimeoutError(f"one launch took {single:.3f} s, over the {timeout_s:g} s limit")
        if done >= max(1, warmup) and (clock() - began >= warmup_s or done >= 10_000):
            return done, single


def time_launches(
    launch: Callable[[int], Any],
    *,
    warmup: int = 3,
    samples: int = 10,
    target_sample_s: float = 1e-3,
    max_chain: int = 1024,
    timeout_s: float | None = None,
    warmup_s: float = 0.0,
    period: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> Timing:
    """Time `launch(i)` (which returns lazy arrays for the i-th launch of a chain).

    Each sample is a difference: a chain of 2n launches minus a chain of n, over n. Evaluating a
    chain has a fixed cost (MLX builds and instantiates its CUDA graph, then synchronizes; about
    0.1-0.2 ms on an H100) that a plain chain-over-length charges to the kernel: up to 2x for short
    chains, and it varies from process to process. The difference cancels it (benchmarks/
    noise_probe.py). n is chosen so the n-launch chain lasts about `target_sample_s`; a launch
    cheaper than MLX's dispatch (about 5 us per launch on an H100 host) times the dispatch.

    Warm-up runs at least `warmup` launches and, with `warmup_s`, until that long has passed, so an
    idle GPU's clocks are up before the first sample. With `period` input sets rotated by i, every
    chain is a whole number of rotations, so each sample sees the same cache state.
    Raises TimeoutError when one warmed launch alone exceeds `timeout_s`.
    """
    import mlx.core as mx

    def run_chain(n: int, start: int = 0) -> float:
        outs = [launch(start + i) for i in range(n)]
        t0 = clock()
        mx.eval(outs)
        mx.synchronize()
        return clock() - t0

    _warm_up(lambda i: run_chain(1, i), warmup=warmup, warmup_s=warmup_s, timeout_s=timeout_s, clock=clock)
    period = max(1, int(period))
    cap = max(period, max_chain // period * period)

    def whole(n: float) -> int:
        """n rounded up to whole rotations of the input sets, within [period, cap]."""
        return min(cap, max(period, -(-int(n) // period) * period))

    def pair(n: int) -> tuple[float, bool]:
        """One sample at chain length n (a chain of n, then one of 2n): (seconds per launch, usable).

        Usable is the difference over n. When that difference is under half the 2n chain's time per
        launch, the fixed cost jittered by more than the launches took: the sample is not usable,
        and the value is that time per launch instead, an upper bound (it holds half the fixed cost).
        """
        short = run_chain(n)
        double = run_chain(2 * n)
        diff, bound = (double - short) / n, double / (2 * n)
        return (diff, True) if diff >= 0.5 * bound else (bound, False)

    # Calibrate from a difference too: a single launch is mostly the fixed cost (~50 us for any
    # kernel), and a warm-up launch can be slow for reasons that do not last. Start with one
    # rotation (cheap for long kernels); re-probe with a longer chain while it is short of the target.
    n = period
    per_launch = max(pair(n)[0], 1e-7)
    while n < cap and 4 * n * per_launch < target_sample_s:
        n = whole(min(8 * n, target_sample_s / per_launch / 2))
        per_launch = max(pair(n)[0], 1e-7)
    chain = whole(math.ceil(target_sample_s / per_launch))
    pair(chain)  # the first chains of a new length build new CUDA graphs: not a sample

    def sample_set(chain: int) -> list[float]:
        values: list[float] = []
        for _ in range(3 * samples):  # a sample that is not usable is retried, within reason
            value, usable = pair(chain)
            if usable:
                values.append(value)
            if len(values) == samples:
                return values
        return values + [value] * (samples - len(values))  # the last upper bound fills the rest

    per_launch_s = sample_set(chain)
    # A chain much shorter than the target (the calibration was misled) is measured again at the
    # length its own samples call for.
    for _ in range(3):
        better = whole(math.ceil(target_sample_s / max(statistics.median(per_launch_s), 1e-7)))
        if better < 2 * chain:
            break
        pair(better)
        chain, per_launch_s = better, sample_set(better)
    return summarize(per_launch_s, chain)


def resolve_timer(requested: str, backend: str) -> str:
    """The timer a collect on this backend uses: "gpu" or "chain". Asking for "gpu" where CUPTI
    cannot be read raises CuptiUnavailable (never a silent switch: one device's data, one timer)."""
    from zmlx_pipeline.kernels import cupti

    if requested not in TIMERS:
        raise ValueError(f"unknown timer {requested!r}: use one of {', '.join(TIMERS)}")
    if requested == "chain":
        return "chain"
    if backend != "cuda":
        if requested == "gpu":
            raise cupti.CuptiUnavailable(f"the gpu timer reads CUPTI, which only CUDA has (this is {backend})")
        return "chain"
    if requested == "gpu":
        cupti.require()
        return "gpu"
    return "gpu" if cupti.available() else "chain"


def time_gpu(
    launch: Callable[[int], Any],
    kernel_name: str,
    *,
    warmup: int = 3,
    launches: int = 30,
    min_launches: int = 10,
    target_total_s: float = 0.05,
    timeout_s: float | None = None,
    warmup_s: float = 0.0,
    period: int = 1,
    durations: Callable[[Callable[[], None], str], list[float]] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Timing:
    """Time `launch(i)` by the GPU's clock: every launch is evaluated and waited for alone, so no two
    kernels overlap and no dispatch is counted, and CUPTI gives each one's duration.

    `kernel_name` is a part of the compiled kernel's name (other kernels MLX runs are ignored).
    Warm-up as in `time_launches`; then `launches` launches (fewer for a long kernel, so the
    profile lasts about `target_total_s`, but never under `min_launches`), rotated through `period`
    input sets. Raises TimeoutError when one warmed launch exceeds `timeout_s`, and CuptiUnavailable
    when CUPTI recorded none of the launches.
    """
    import mlx.core as mx

    from zmlx_pipeline.kernels import cupti

    durations = durations or cupti.profile_kernels

    def run_one(i: int) -> float:
        out = launch(i)
        t0 = clock()
        mx.eval(out)
        mx.synchronize()
        return clock() - t0

    done, single = _warm_up(run_one, warmup=warmup, warmup_s=warmup_s, timeout_s=timeout_s, clock=clock)
    n = max(min_launches, min(launches, int(target_total_s / max(single, 1e-6))))
    n = max(1, -(-n // max(1, period)) * max(1, period))  # whole rotations of the input sets
    start = done

    def run() -> None:
        for i in range(start, start + n):
            mx.eval(launch(i))
            mx.synchronize()

    got = durations(run, kernel_name)
    if not got:
        raise cupti.CuptiUnavailable(f"CUPTI recorded no kernel named like {kernel_name!r} in {n} launches")
    return summarize([d * 1e-6 for d in got], 1)
