"""The collect stage: every legal (kernel, dtype, shape, config) not yet in the store is checked, timed and recorded.

Each result is committed on its own, keyed by (device, kernel, version, dtype, shape, config), so a
run stopped at any point (budget, Ctrl-C, kill -9) resumes where it stopped and never leaves half a row.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from zmlx_pipeline import __version__
from zmlx_pipeline.data.keys import mapping_key
from zmlx_pipeline.data.records import DTYPES, Measurement
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.kernels.harness import GpuUnhealthy, Launcher, NoGpuBackend, Outcome, measure
from zmlx_pipeline.kernels.spec import KernelSpec, Limits, spread


class CollectError(RuntimeError):
    """Collect cannot start or had to stop (no GPU backend, bad selection, broken GPU)"""


@dataclass(frozen=True)
class Task:
    """One measurement to make."""

    spec: KernelSpec
    dtype: str
    shape: Mapping[str, int]
    config: Mapping[str, int]


@dataclass
class CollectResult:
    """What a collect run did: counts by status, what is left, and why it stopped."""

    run_id: str | None
    device_id: str
    planned: int
    already: int
    done: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    by_kernel: dict[str, dict[str, int]] = field(default_factory=dict)
    stopped: str = "finished"  # finished | budget | interrupted
    elapsed_s: float = 0.0

    @property
    def remaining(self) -> int:
        return self.planned - self.done

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "device": self.device_id, "planned": self.planned,
            "already_measured": self.already, "measured": self.done, "remaining": self.remaining,
            "by_status": self.by_status, "by_kernel": self.by_kernel, "stopped": self.stopped,
            "elapsed_s": round(self.elapsed_s, 2),
        }


class Measurer(Protocol):
    """Measures one task; the real one launches on the GPU, tests substitute a double."""

    def __call__(self, task: Task) -> Outcome: ...


@dataclass
class TimingSettings:
    """How carefully each config is timed."""

    warmup: int = 3
    samples: int = 10
    target_sample_s: float = 1e-3
    timeout_s: float = 2.0
    rotate_bytes: int = 0  # enough input sets to exceed this many bytes (a device's L2, doubled)
    seed: int = 0


class GpuMeasurer:
    """The real measurer: one compiled Launcher per kernel, the harness's check-then-time per task."""

    def __init__(self, backend: str, settings: TimingSettings):
        if backend not in ("cuda", "metal"):
            raise NoGpuBackend(backend)
        self.backend = backend
        self.settings = settings
        self._launchers: dict[str, Launcher] = {}

    def __call__(self, task: Task) -> Outcome:
        spec = task.spec
        launcher = self._launchers.get(spec.name)
        if launcher is None or launcher.spec is not spec:
            launcher = self._launchers[spec.name] = Launcher(spec, self.backend)
        s = self.settings
        seed = s.seed + int(mapping_key({**task.shape, **task.config, "dtype": task.dtype})[7:15], 16) % 1_000_000
        return measure(
            launcher, task.config, task.shape, task.dtype, seed=seed, rotate_bytes=s.rotate_bytes,
            warmup=s.warmup, samples=s.samples, target_sample_s=s.target_sample_s, timeout_s=s.timeout_s,
        )


def plan(
    store: Store, device_id: str, specs: Sequence[KernelSpec], dtypes: Sequence[str], preset: str, limits: Limits,
    shapes_limit: int | None = None, configs_limit: int | None = None,
) -> tuple[list[Task], int]:
    """The tasks still missing for this device, shape-major within each kernel and dtype, and how many exist."""
    for d in dtypes:
        if d not in DTYPES:
            raise CollectError(f"unknown dtype {d!r}; choose from {', '.join(DTYPES)}")
    tasks: list[Task] = []
    already = 0
    for spec in specs:
        done = store.measured_keys(device_id, spec.name, spec.version)
        shapes = spec.shape_grid.shapes(preset)
        if shapes_limit:
            shapes = shapes[:shapes_limit]
        for dtype in dtypes:
            for shape in shapes:
                skey = mapping_key(shape)
                for config in spread(spec.legal_configs(shape, dtype, limits), configs_limit):
                    if (dtype, skey, mapping_key(config)) in done:
                        already += 1
                    else:
                        tasks.append(Task(spec, dtype, shape, config))
    return tasks, already


def warm_jit_cache(tasks: Sequence[Task], kernel_refs: Mapping[str, str], jobs: int, timeout_s: float = 900) -> int:
    """Compile each distinct (kernel, dtype, config) once in `jobs` parallel processes (CUDA's JIT cache is on disk).

    Compiling dominates a first collect on CUDA (about a second a config in NVRTC); worker processes
    fill MLX's PTX cache so the measuring process only loads. Failures are left for the measuring
    pass to record. Returns the number of distinct kernels compiled.
    """
    seen: dict[tuple, dict] = {}
    for t in tasks:
        key = (t.spec.name, t.dtype, tuple(sorted(t.config.items())))
        size = _size(t.shape)
        if key not in seen or size < _size(seen[key]["shape"]):
            # the smallest shape the config is legal on: compiling does not depend on the shape
            seen[key] = {"ref": kernel_refs[t.spec.name], "dtype": t.dtype, "shape": dict(t.shape), "config": dict(t.config)}
    items = list(seen.values())
    if jobs <= 1 or len(items) < 2:
        return 0
    chunks = [items[i::jobs] for i in range(jobs)]
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, chunk in enumerate(chunks):
            if not chunk:
                continue
            path = os.path.join(tmp, f"chunk{i}.json")
            with open(path, "w") as fh:
                json.dump(chunk, fh)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "zmlx_pipeline.kernels.precompile", path],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
        deadline = time.monotonic() + timeout_s
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
    return len(items)


def _size(shape: Mapping[str, int]) -> int:
    n = 1
    for v in shape.values():
        n *= int(v)
    return n


def collect(
    store: Store,
    device: Any,  # a DetectedDevice: device_id, backend, row, reported_name
    specs: Sequence[KernelSpec],
    *,
    dtypes: Sequence[str] = DTYPES,
    preset: str = "smoke",
    budget_s: float | None = None,
    settings: TimingSettings | None = None,
    jobs: int = 1,
    kernel_refs: Mapping[str, str] | None = None,
    shapes_limit: int | None = None,
    configs_limit: int | None = None,
    measurer: Measurer | None = None,
    on_plan: Callable[[int, int], None] | None = None,
    on_result: Callable[[Task, Outcome], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> CollectResult:
    """Measure what is missing for `device` within `budget_s`; returns what was done and what is left."""
    settings = settings or TimingSettings()
    row = dict(device.row)
    limits = Limits.from_device_row(row)
    if measurer is None:
        if device.backend not in ("cuda", "metal"):
            raise CollectError(
                "no Metal or CUDA backend in this MLX (custom kernels cannot run on the CPU backend): "
                "collect on Apple silicon, or on an NVIDIA GPU with `pip install 'mlx[cuda13]'`"
            )
        if not settings.rotate_bytes and row.get("l2_bytes"):
            settings.rotate_bytes = 2 * int(row["l2_bytes"])
        measurer = GpuMeasurer(device.backend, settings)
    store.upsert_device(row)
    tasks, already = plan(store, device.device_id, specs, dtypes, preset, limits, shapes_limit, configs_limit)
    result = CollectResult(run_id=None, device_id=device.device_id, planned=len(tasks), already=already)
    if on_plan:
        on_plan(len(tasks), already)
    if not tasks:
        return result
    run_id = store.start_run(
        device.device_id, host=platform.node(), backend=device.backend, mlx_version=_mlx_version(),
        pipeline_version=__version__,
        settings={"kernels": [s.name for s in specs], "dtypes": list(dtypes), "preset": preset,
                  "budget_s": budget_s, "warmup": settings.warmup, "samples": settings.samples,
                  "target_sample_s": settings.target_sample_s, "reported_name": getattr(device, "reported_name", None)},
    )
    result.run_id = run_id
    start = clock()
    if jobs > 1 and device.backend == "cuda" and kernel_refs:
        warm_jit_cache(tasks, kernel_refs, jobs)
    status = "finished"
    try:
        for task in tasks:
            if budget_s is not None and clock() - start > budget_s:
                result.stopped = status = "budget"
                break
            outcome = measurer(task)
            m = _measurement(run_id, device.device_id, task, outcome)
            store.record([m])
            result.done += 1
            result.by_status[outcome.status] = result.by_status.get(outcome.status, 0) + 1
            per = result.by_kernel.setdefault(task.spec.name, {})
            per[outcome.status] = per.get(outcome.status, 0) + 1
            if on_result:
                on_result(task, outcome)
    except KeyboardInterrupt:
        result.stopped = status = "interrupted"
    except GpuUnhealthy as exc:
        store.finish_run(run_id, "failed")
        raise CollectError(f"the GPU stopped working after a failed launch ({exc}); "
                           f"{result.done} results were saved, run collect again to resume") from exc
    finally:
        result.elapsed_s = clock() - start
    store.finish_run(run_id, "finished" if status == "finished" else "interrupted")
    return result


def _measurement(run_id: str, device_id: str, task: Task, outcome: Outcome) -> Measurement:
    t = outcome.timing
    return Measurement(
        run_id=run_id, device_id=device_id, kernel=task.spec.name, kernel_version=task.spec.version,
        dtype=task.dtype, shape=dict(task.shape), config=dict(task.config), status=outcome.status,
        median_us=t.median_us if t else None, p10_us=t.p10_us if t else None, p90_us=t.p90_us if t else None,
        samples=t.samples if t else 0, error=outcome.error,
        extra={"chain": t.chain} if t else {},
    )


def _mlx_version() -> str | None:
    try:
        import mlx.core as mx

        return mx.__version__
    except ImportError:
        return None


def parse_duration(text: str) -> float:
    """Seconds from '90', '90s', '10m', '1.5h'; ValueError with the accepted forms otherwise."""
    t = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if t and t[-1] in units:
            value = float(t[:-1]) * units[t[-1]]
        else:
            value = float(t)
    except ValueError:
        raise ValueError(f"cannot read duration {text!r}: use e.g. 90s, 10m or 1.5h") from None
    if value <= 0:
        raise ValueError(f"duration {text!r} must be positive")
    return value
