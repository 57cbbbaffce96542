"""The timing harness: warm up, then samples that each chain enough launches to last about a millisecond.

MLX is lazy, so a sample builds a chain of launches, then evaluates them with one `mx.eval` and
waits with `mx.synchronize`; the per-launch time is the sample's time over the chain length.
The runtime autotuner times candidates with this same function.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence


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


def time_launches(
    launch: Callable[[int], Any],
    *,
    warmup: int = 3,
    samples: int = 10,
    target_sample_s: float = 1e-3,
    max_chain: int = 256,
    timeout_s: float | None = None,
    warmup_s: float = 0.0,
    period: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> Timing:
    """Time `launch(i)` (which returns lazy arrays for the i-th launch of a chain).

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

    began = clock()
    done = 0
    while True:
        single = run_chain(1, done)
        done += 1
        if timeout_s is not None and single > timeout_s:
            raise TimeoutError(f"one launch took {single:.3f} s, over the {timeout_s:g} s limit")
        if done >= max(1, warmup) and (clock() - began >= warmup_s or done >= 10_000):
            break
    # Calibrate on a short chain: a single launch's time is dominated by dispatch overhead.
    period = max(1, int(period))
    probe = min(max_chain, max(8, period))
    per_launch = max(run_chain(probe) / probe, 1e-7)
    chain = int(min(max_chain, max(1, math.ceil(target_sample_s / per_launch))))
    chain = max(period, -(-chain // period) * period) if chain > 1 or period > 1 else chain
    per_launch_s = [run_chain(chain, s * chain) / chain for s in range(samples)]
    return summarize(per_launch_s, chain)
