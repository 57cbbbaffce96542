"""Measuring one task on this process's GPU: what a task is, how carefully it is timed, and the real
measurer (a compiled Launcher per kernel, the harness's check-then-time). Collect, its worker
processes and the Ray actors all measure through these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.core.keys import mapping_key
from zmlx_pipeline.kernels.harness import Launcher, NoGpuBackend, Outcome, Prepared, measure, prepare
from zmlx_pipeline.kernels.spec import KernelSpec
from zmlx_pipeline.kernels.timing import resolve_timer


class MeasureError(ZmlxPipelineError, RuntimeError):
    """Measuring cannot start as configured (a timer this machine cannot read)"""


@dataclass(frozen=True)
class Task:
    """One measurement to make."""

    spec: KernelSpec
    dtype: str
    shape: Mapping[str, int]
    config: Mapping[str, int]


class Measurer(Protocol):
    """Measures one task; the real one launches on the GPU, tests substitute a double."""

    def __call__(self, task: Task) -> Outcome: ...


@dataclass
class TimingSettings:
    """How carefully each config is timed."""

    warmup: int = 3
    samples: int = 5  # difference samples: each times 3n launches (see kernels/timing.py)
    target_sample_s: float = 1e-3
    timeout_s: float = 2.0
    rotate_bytes: int = 0  # enough input sets to exceed this many bytes (a device's L2, doubled)
    seed: int = 0
    warmup_s: float = 0.0  # keep warming up until this long has passed (clocks of an idle GPU)
    # Launches per chain at most: only kernels under ~8 us (below MLX's dispatch floor) reach it;
    # their chains are shorter than target_sample_s, which keeps a collect's time on larger kernels.
    max_chain: int = 128
    # "gpu" (CUPTI kernel durations: no dispatch in them, so configs under ~10 us are told apart),
    # "chain" (host-timed chains, every backend) or "auto" (gpu where CUPTI can be read)
    timer: str = "auto"
    gpu_launches: int = 20  # launches a config is timed over with the gpu timer (their p90/p10 is about 1.02)


def _resolve(settings: TimingSettings, backend: str) -> None:
    """Fix "auto" to the timer this backend has, before anything is recorded or sent to a worker."""
    from zmlx_pipeline.kernels.cupti import CuptiUnavailable

    try:
        settings.timer = resolve_timer(settings.timer, backend)
    except (CuptiUnavailable, ValueError) as exc:
        raise MeasureError(f"{exc}; use --timer chain (or install torch with CUDA for --timer gpu)") from exc


class GpuMeasurer:
    """The real measurer: one compiled Launcher per kernel, the harness's check-then-time per task."""

    def __init__(self, backend: str, settings: TimingSettings):
        if backend not in ("cuda", "metal"):
            raise NoGpuBackend(backend)
        _resolve(settings, backend)
        self.backend = backend
        self.settings = settings
        self._launchers: dict[str, Launcher] = {}
        self._prepared_for: tuple | None = None
        self._prepared: Prepared | None = None

    def _inputs(self, task: Task) -> Prepared:
        """The shared inputs of the task's (kernel, dtype, shape); tasks come shape-major, so one is kept."""
        key = (task.spec.name, task.spec.version, task.dtype, mapping_key(task.shape))
        if key != self._prepared_for:
            import mlx.core as mx

            self._prepared = None
            mx.clear_cache()
            seed = self.settings.seed + int(mapping_key({**task.shape, "dtype": task.dtype})[7:15], 16) % 1_000_000
            self._prepared = prepare(task.spec, task.shape, task.dtype, seed, self.settings.rotate_bytes)
            self._prepared_for = key
        return self._prepared

    def __call__(self, task: Task) -> Outcome:
        spec = task.spec
        launcher = self._launchers.get(spec.name)
        if launcher is None or launcher.spec is not spec:
            launcher = self._launchers[spec.name] = Launcher(spec, self.backend)
        s = self.settings
        return measure(
            launcher, task.config, task.shape, task.dtype, prepared=self._inputs(task),
            warmup=s.warmup, samples=s.samples, target_sample_s=s.target_sample_s, timeout_s=s.timeout_s,
            warmup_s=s.warmup_s, max_chain=s.max_chain, timer=s.timer, gpu_launches=s.gpu_launches,
        )
