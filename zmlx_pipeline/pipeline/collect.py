"""The collect stage: every legal (kernel, dtype, shape, config) not yet in the store is checked, timed and recorded.

What one measurement is and how it is made (Task, TimingSettings, GpuMeasurer) lives in
kernels/measure.py, shared with the worker processes; this module plans, records and resumes.

Each result is committed on its own, keyed by (device, kernel, version, dtype, shape, config), so a
run stopped at any point (budget, Ctrl-C, kill -9) resumes where it stopped and never leaves half a row.
"""

from __future__ import annotations

import math
import re

import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from zmlx_pipeline import __version__
from zmlx_pipeline.core.errors import ZmlxPipelineError, shown
from zmlx_pipeline.core.keys import canonical_json, mapping_key
from zmlx_pipeline.data.noise_buckets import NOISE_BUCKETS_US, bucket_label
from zmlx_pipeline.data.records import DTYPES, Measurement
from zmlx_pipeline.data.registered import as_registered
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.kernels.harness import GpuUnhealthy, Outcome, rotate_bytes_for
from zmlx_pipeline.kernels.measure import GpuMeasurer, Measurer, Task, TimingSettings
from zmlx_pipeline.kernels.spec import KernelSpec, Limits, spread
from zmlx_pipeline.kernels.timing import TIMER_LABELS
from zmlx_pipeline.pipeline.parallel import case_key, measure_in_workers

__all__ = ["CollectError", "CollectResult", "GpuMeasurer", "Measurer", "Task", "TimingSettings", "collect",
           "mixed_timer_cases", "noise_summary", "parse_duration", "plan", "plan_repeats", "repeat"]


class CollectError(ZmlxPipelineError, RuntimeError):
    """Collect cannot start or had to stop (no GPU backend, bad selection, broken GPU)"""


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
    gpu_runs: dict[str, str] = field(default_factory=dict)  # with --gpus: GPU -> its run id

    @property
    def remaining(self) -> int:
        return self.planned - self.done

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "device": self.device_id, "planned": self.planned,
            "already_measured": self.already, "measured": self.done, "remaining": self.remaining,
            "by_status": self.by_status, "by_kernel": self.by_kernel, "stopped": self.stopped,
            "elapsed_s": round(self.elapsed_s, 2),
            **({"gpu_runs": self.gpu_runs} if self.gpu_runs else {}),
        }


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


def _run_timers(store: Store, device_id: str) -> dict[str, str]:
    """run_id -> the timer label its rows were measured with (runs before the gpu timer were chain-timed)."""
    return {r["run_id"]: (r.get("settings") or {}).get("timing", TIMER_LABELS["chain"])
            for r in store.runs(device=device_id)}


def mixed_timer_cases(store: Store, device_id: str, tasks: Sequence[Task], timing: str) -> list[tuple[Task, str]]:
    """The planned cases whose stored configs another timer measured: (a task of the case, that timer).

    A case's configs are ranked against each other, so they must share a timer; different cases
    (another dtype or shape) may differ, since every score is relative to the case's best.
    """
    run_timer = _run_timers(store, device_id) if tasks else {}
    timers: dict[str, dict[tuple[str, str], set[str]]] = {}  # kernel -> (dtype, shape_key) -> timers
    found: dict[tuple, tuple[Task, str]] = {}
    for t in tasks:
        if t.spec.name not in timers:
            by_case = timers[t.spec.name] = {}
            for r in store.measurements(device=device_id, kernel=t.spec.name, kernel_version=t.spec.version):
                by_case.setdefault((r["dtype"], r["shape_key"]), set()).add(
                    run_timer.get(r["run_id"], TIMER_LABELS["chain"]))
        case = (t.dtype, mapping_key(t.shape))
        other = sorted(timers[t.spec.name].get(case, set()) - {timing})
        if other:
            found.setdefault((t.spec.name, *case), (t, other[0]))
    return list(found.values())


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
    gpus: Sequence[str] | None = None,
    worker: Sequence[str] | None = None,
) -> CollectResult:
    """Measure what is missing for `device` within `budget_s`; returns what was done and what is left.

    `gpus` (CUDA_VISIBLE_DEVICES values, CUDA with `kernel_refs`): one measuring process per GPU, all at
    once (pipeline/gpus.py); every GPU records into this device with a run of its own. `worker`: the
    worker command after the interpreter (default: the real one, kernels/worker.py).
    """
    settings = settings or TimingSettings()
    device = as_registered(device, store)  # a GPU the catalog lacks that `devices add` registered in this store
    row = dict(device.row)
    limits = Limits.from_device_row(row)
    on_gpus = measurer is None and bool(gpus) and device.backend == "cuda"
    if on_gpus and not kernel_refs:
        raise CollectError("collecting on several GPUs needs the kernels' import references (kernel_refs)")
    in_workers = measurer is None and not on_gpus and jobs > 1 and device.backend == "cuda" and bool(kernel_refs)
    if measurer is None:
        if device.backend not in ("cuda", "metal"):
            raise CollectError(
                "no Metal or CUDA backend in this MLX (custom kernels cannot run on the CPU backend): "
                "collect on Apple silicon, or on an NVIDIA GPU with `pip install 'mlx[cuda13]'`"
            )
        settings.rotate_bytes = settings.rotate_bytes or rotate_bytes_for(row)
        measurer = GpuMeasurer(device.backend, settings)
    store.upsert_device(row)
    tasks, already = plan(store, device.device_id, specs, dtypes, preset, limits, shapes_limit, configs_limit)
    timing = TIMER_LABELS.get(settings.timer, settings.timer)
    mixed = mixed_timer_cases(store, device.device_id, tasks, timing)
    if mixed:
        task, other = mixed[0]
        flag = {v: k for k, v in TIMER_LABELS.items()}.get(other)
        fix = f"collect with --timer {flag}, or " if flag else ""
        raise CollectError(
            f"{len(mixed)} case(s) of {device.device_id} were partly measured with the {other} timer "
            f"(first: {task.spec.name} {task.dtype} {canonical_json(task.shape)}) and this collect would time "
            f"the rest with {timing}; a case's configs must share a timer: {fix}collect into a new --db "
            f"and `zmlx-pipeline ingest` its shard, which replaces the older timings")
    result = CollectResult(run_id=None, device_id=device.device_id, planned=len(tasks), already=already)
    if on_plan:
        on_plan(len(tasks), already)
    if not tasks:
        return result
    run_settings = {
        "kernels": [s.name for s in specs], "dtypes": list(dtypes), "preset": preset,
        "budget_s": budget_s, "warmup": settings.warmup, "samples": settings.samples,
        "max_chain": settings.max_chain, "timing": TIMER_LABELS.get(settings.timer, settings.timer),
        "gpu_launches": settings.gpu_launches,
        "target_sample_s": settings.target_sample_s, "reported_name": getattr(device, "reported_name", None)}

    def new_run(**more) -> str:
        return store.start_run(device.device_id, host=platform.node(), backend=device.backend,
                               mlx_version=_mlx_version(), pipeline_version=__version__,
                               settings={**run_settings, **more})

    if on_gpus:
        from zmlx_pipeline.pipeline.gpus import measure_on_gpus

        result.gpu_runs = {g: new_run(gpu=g, gpus=list(gpus)) for g in gpus}
        run_id = result.run_id = result.gpu_runs[gpus[0]]
    else:
        run_id = result.run_id = new_run()
    start = clock()
    deadline = None if budget_s is None else start + budget_s
    if on_gpus:
        batches = measure_on_gpus(tasks, kernel_refs, device.backend, settings, list(gpus), deadline, clock,
                                  **({"worker": tuple(worker)} if worker else {}))
    else:  # batches of (gpu, task, outcome) as measure_on_gpus yields them; None: this run's one GPU
        one = (measure_in_workers(tasks, kernel_refs, device.backend, settings, jobs, deadline, clock,
                                  **({"worker": tuple(worker)} if worker else {}))
               if in_workers else _measure_serially(tasks, measurer, deadline, clock))
        batches = ([(None, t, o)] for t, o in one)
    status = "finished"
    try:
        for batch in batches:  # one transaction per batch: one per row falls behind several GPUs
            store.record([_measurement(result.gpu_runs.get(gpu, run_id), device.device_id, task, outcome)
                          for gpu, task, outcome in batch])
            for _gpu, task, outcome in batch:
                result.done += 1
                result.by_status[outcome.status] = result.by_status.get(outcome.status, 0) + 1
                per = result.by_kernel.setdefault(task.spec.name, {})
                per[outcome.status] = per.get(outcome.status, 0) + 1
                if on_result:
                    on_result(task, outcome)
        if result.done < len(tasks):
            result.stopped = status = "budget"
    except KeyboardInterrupt:
        result.stopped = status = "interrupted"
    except GpuUnhealthy as exc:
        for rid in result.gpu_runs.values() or [run_id]:
            store.finish_run(rid, "failed")
        raise CollectError(f"the GPU stopped working after a failed launch ({exc}); "
                           f"{result.done} results were saved, run collect again to resume") from exc
    finally:
        result.elapsed_s = clock() - start
    for rid in result.gpu_runs.values() or [run_id]:
        store.finish_run(rid, "finished" if status == "finished" else "interrupted")
    return result


def plan_repeats(store: Store, device_id: str, specs: Sequence[KernelSpec], fraction: float,
                 timing: str | None = None) -> list[Task]:
    """A deterministic sample (by key hash) of the device's ok measurements not yet repeated, shape-major.

    With `timing` (a TIMER_LABELS value), only measurements taken with that timer: a repeat by
    another timer would measure the timers' difference, not noise. Runs that predate the gpu timer
    recorded no `timing` and were chain-timed.
    """
    tasks = []
    threshold = int(fraction * 10_000)
    done = {(r["kernel"], r["dtype"], r["shape_key"], r["config_key"]) for r in store.repeats(device=device_id)}
    run_timing = _run_timers(store, device_id)
    for spec in specs:
        rows = store.measurements(device=device_id, kernel=spec.name, kernel_version=spec.version, status="ok")
        for r in rows:
            if timing is not None and run_timing.get(r["run_id"], TIMER_LABELS["chain"]) != timing:
                continue
            if int(r["config_key"][7:15], 16) % 10_000 >= threshold:
                continue
            if (spec.name, r["dtype"], r["shape_key"], r["config_key"]) in done:
                continue
            tasks.append((r["dtype"], r["shape_key"], Task(spec, r["dtype"], r["shape"], r["config"])))
    tasks.sort(key=lambda t: (t[2].spec.name, t[0], t[1]))
    return [t for _, _, t in tasks]


def repeat(
    store: Store, device: Any, specs: Sequence[KernelSpec], *, fraction: float = 0.05, budget_s: float | None = None,
    settings: TimingSettings | None = None, jobs: int = 1, kernel_refs: Mapping[str, str] | None = None,
    measurer: Measurer | None = None, clock: Callable[[], float] = time.monotonic,
) -> CollectResult:
    """Time a sample of already-measured configs again in this (separate) process, into the repeats table.

    Two timings of one key from two processes show how far a difference can be noise.
    """
    settings = settings or TimingSettings()
    if not 0 < fraction <= 1:
        raise CollectError(f"fraction {fraction} must be in (0, 1]")
    in_workers = measurer is None and jobs > 1 and device.backend == "cuda" and bool(kernel_refs)
    if measurer is None:
        if device.backend not in ("cuda", "metal"):
            raise CollectError("no Metal or CUDA backend in this MLX: repeats need the GPU the data came from")
        settings.rotate_bytes = settings.rotate_bytes or rotate_bytes_for(device.row)
        measurer = GpuMeasurer(device.backend, settings)
    tasks = plan_repeats(store, device.device_id, specs, fraction, timing=TIMER_LABELS.get(settings.timer))
    result = CollectResult(run_id=None, device_id=device.device_id, planned=len(tasks), already=0)
    if not tasks:  # a store with nothing of this GPU (or of these kernels) says so; a sample that missed is 0 of 0
        names = {s.name for s in specs}
        rows = store.summary()
        mine = sorted({r["kernel"] for r in rows if r["device"] == device.device_id and r["by_status"].get("ok")})
        if not mine:
            stored = sorted({r["device"] for r in rows})
            raise CollectError(f"no ok measurements of {device.device_id} to repeat in {store.path} (it has "
                               f"{', '.join(stored) or 'none'}): run `zmlx-pipeline collect` on this GPU first")
        if not names & set(mine):
            raise CollectError(f"no ok measurements of {', '.join(sorted(names))} on {device.device_id} to repeat in "
                               f"{store.path} (it has {', '.join(mine)}): collect those kernels first")
        return result
    run_id = result.run_id = store.start_run(
        device.device_id, host=platform.node(), backend=device.backend, mlx_version=_mlx_version(),
        pipeline_version=__version__, settings={"repeat": True, "fraction": fraction, "kernels": [s.name for s in specs],
                                                "timing": TIMER_LABELS.get(settings.timer, settings.timer)},
    )
    start = clock()
    deadline = None if budget_s is None else start + budget_s
    results = (measure_in_workers(tasks, kernel_refs, device.backend, settings, jobs, deadline, clock) if in_workers
               else _measure_serially(tasks, measurer, deadline, clock))
    try:
        for task, outcome in results:
            m = _measurement(run_id, device.device_id, task, outcome)
            if outcome.status == "ok":
                store.record_repeat([m])
            result.done += 1
            result.by_status[outcome.status] = result.by_status.get(outcome.status, 0) + 1
        result.stopped = "finished" if result.done == len(tasks) else "budget"
    except KeyboardInterrupt:
        result.stopped = "interrupted"
    finally:
        result.elapsed_s = clock() - start
    store.finish_run(run_id, "finished" if result.stopped == "finished" else "interrupted")
    return result


def noise_summary(store: Store, device: str | None = None) -> list[dict]:
    """Spread of repeated timings by size: per bucket of the first median, |repeat / first - 1| (median,
    p95, max) and the share within 5%; the bucket "> 50 us" pools the kernel times the noise target covers."""
    pairs = store.repeat_pairs(device=device)
    edges = (0.0,) + NOISE_BUCKETS_US + (float("inf"),)
    buckets = [(bucket_label(i), lo, hi) for i, (lo, hi) in enumerate(zip(edges, edges[1:]))]
    buckets.append(("> 50 us", 50.0, float("inf")))
    rows = []
    for name, lo, hi in buckets:
        diffs = sorted(abs(p["repeat_us"] / p["median_us"] - 1.0) for p in pairs if lo <= p["median_us"] < hi)
        if not diffs:
            continue
        rows.append({
            "bucket": name, "pairs": len(diffs), "median_diff": diffs[len(diffs) // 2],
            "p95_diff": diffs[min(len(diffs) - 1, int(0.95 * len(diffs)))], "max_diff": diffs[-1],
            "within_5pct": sum(d <= 0.05 for d in diffs) / len(diffs),
        })
    return rows


def _measure_serially(tasks, measurer, deadline, clock):
    """(task, outcome) for each task in this process, until the deadline; the case in progress
    (kernel, dtype, shape) is finished first, so its configs are timed in one process."""
    current = None
    for task in tasks:
        case = case_key(task)
        if deadline is not None and case != current and clock() > deadline:
            return
        current = case
        yield task, measurer(task)


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


#: a duration: a number in digits 0-9 (a decimal point allowed), then right after it s, m or h in lower case (none:
#: seconds); ordinary spaces around it allowed, none inside (`10 m`), as in every option that reads a number
_DURATION = re.compile(r" *([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([smh]?) *", re.ASCII)
DURATION_FORMS = ("e.g. 90s, 10m or 1.5h: a number in digits 0-9 and right after it s, m or h in lower case (no unit: "
                  "seconds)")


def parse_duration(text: str) -> float:
    """Seconds from '90', '90s', '10m', '1.5h' (spaces around it, none inside); ValueError naming the forms otherwise:
    '10M' (months? mega?), '10 m', '３０m', a newline, '1_0m' and '1e3' (which float() takes); a long text cut short."""
    match = _DURATION.fullmatch(text)
    if match is None:
        joined = text.strip(" ").replace(" ", "")
        hint = f" (write {shown(joined)}, with no space inside)" if " " in text.strip(" ") and \
            _DURATION.fullmatch(joined) else ""
        raise ValueError(f"cannot read duration {shown(text)}: use {DURATION_FORMS}{hint}")
    value = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"duration {shown(text)} must be a positive, finite number of seconds, minutes or hours "
                         "(e.g. 90s, 10m or 1.5h)")
    return value
