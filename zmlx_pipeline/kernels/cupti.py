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


def profile_kernels(run: Callable[[], None], name_part: str) -> list[float]:
    """Run `run()` under CUPTI and return the durations (us) of the matching kernels it launched."""
    profile, activity = _torch_profiler()
    with profile(activities=[activity.CUDA]) as prof:
        run()
    return kernel_durations(prof.events(), name_part)
