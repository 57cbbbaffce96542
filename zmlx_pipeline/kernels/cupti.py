"""GPU kernel durations from CUPTI, read through PyTorch's profiler when torch is installed.

MLX exposes no GPU timestamps, and a chain of launches timed on the host measures MLX's dispatch
(about 5 us a launch) as soon as a kernel is shorter than that: most configs of a small case then
tie, and their order does not repeat between processes. CUPTI records each kernel's start and end
on the GPU, whoever launched it, so MLX's kernels show up in a torch profile of the same process.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

from zmlx_pipeline.core.errors import ZmlxPipelineError


class CuptiUnavailable(ZmlxPipelineError, RuntimeError):
    """No CUPTI here: torch is not installed, was built without CUDA, or sees no GPU."""


@functools.lru_cache(maxsize=1)
def _torch_profiler():
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except Exception as exc:  # noqa: BLE001 - any import failure means no CUPTI
        raise CuptiUnavailable(f"torch is not importable ({type(exc).__name__}: {exc})") from exc
    if not torch.cuda.is_available():
        raise CuptiUnavailable("torch sees no CUDA GPU")
    torch.cuda.init()  # kineto attaches CUPTI to an initialised CUDA runtime
    return profile, ProfilerActivity


def require() -> None:
    """Raise CuptiUnavailable, with the reason, unless kernel durations can be read here."""
    _torch_profiler()


def available() -> bool:
    """Whether kernel durations can be read here (torch with CUDA and a GPU)."""
    try:
        _torch_profiler()
        return True
    except CuptiUnavailable:
        return False


def _duration_us(event: Any) -> float:
    for attr in ("device_time", "cuda_time"):  # torch >= 2.4 says device_time
        value = getattr(event, attr, None)
        if value:
            return float(value)
    return 0.0


def kernel_durations(events: Iterable[Any], name_part: str) -> list[float]:
    """Durations (us, in launch order) of the GPU kernels whose name contains `name_part`."""
    return [_duration_us(e) for e in events if name_part in getattr(e, "name", "") and _duration_us(e) > 0]


def raw_kernel_durations(events: Iterable[Any], name_part: str) -> list[float]:
    """Durations (us) of the GPU kernels named like `name_part` among the profiler's raw kineto events.

    Reading the raw events skips torch's FunctionEvent tree (names demangled and nested for every
    event, a few ms a profile): the autotuner profiles each candidate, so that was most of its
    per-candidate overhead."""
    out = []
    for e in events:
        if name_part not in e.name():
            continue
        if hasattr(e, "duration_ns"):
            d = e.duration_ns() / 1000.0
        else:  # older torch
            d = float(e.duration_us())
        if d > 0 and str(e.device_type()).rsplit(".", 1)[-1] == "CUDA":
            out.append(d)
    return out


def profile_kernels(run: Callable[[], None], name_part: str) -> list[float]:
    """Run `run()` under CUPTI and return the durations (us) of the matching kernels it launched."""
    profile, activity = _torch_profiler()
    with profile(activities=[activity.CUDA]) as prof:
        run()
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is not None:
        try:
            return raw_kernel_durations(results.events(), name_part)
        except (AttributeError, TypeError):  # a torch whose raw events differ: its parsed events below
            pass
    return kernel_durations(prof.events(), name_part)
