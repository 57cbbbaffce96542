"""Roofline-style time ratios: how a kernel's time moves with its work (bytes, flops) and a chip's bandwidth and TFLOPs.

A kernel's work is published as terms of a polynomial over its shape dims (`{"dims": [...], "coef": c}`,
exact for the built-in kernels: publish/build.py probes each spec's `bytes_moved` and `flops`). A
time is bound by memory or by compute, whichever takes longer: max(bytes / bandwidth, flops /
fp32 TFLOPs). Moving an answer to another shape or chip multiplies its time by the ratio of
those bounds; the side that binds (`bandwidth` or `compute`) is named in the answer's note.
Standard library only.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

Terms = Sequence[Mapping[str, Any]]


def work(terms: Terms | None, shape: Mapping[str, int]) -> float | None:
    """The sum of each term's coefficient times the product of its dims (None without terms or a dim)."""
    if not terms:
        return None
    total = 0.0
    for term in terms:
        value = float(term["coef"])
        for d in term["dims"]:
            if d not in shape:
                return None
            value *= shape[d]
        total += value
    return total


def bound_s(bytes_moved: float | None, flops: float | None, row: Mapping[str, Any] | None) -> tuple[float, str] | None:
    """(seconds, `bandwidth` or `compute`) of the roofline bound on one chip; None without its bandwidth or bytes."""
    row = row or {}
    bw = row.get("memory_bandwidth_gbps")
    tflops = row.get("fp32_tflops")
    if not bytes_moved or not bw:
        return None
    mem = bytes_moved / (float(bw) * 1e9)
    comp = (flops or 0.0) / (float(tflops) * 1e12) if tflops else 0.0
    return (mem, "bandwidth") if mem >= comp else (comp, "compute")


def scale(time_us: float | None, src: tuple[float, str] | None, dst: tuple[float, str] | None) -> float | None:
    """`time_us` moved from the source bound to the destination bound (None when either is unknown)."""
    if time_us is None or src is None or dst is None or src[0] <= 0:
        return None
    return time_us * dst[0] / src[0]
