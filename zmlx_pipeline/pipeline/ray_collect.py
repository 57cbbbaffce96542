"""Collect on a Ray cluster: one actor per GPU, each writing its own shard, merged into the store by ingest.

The parent asks every actor which device it has (GPUs of a cluster may differ), plans what each
device still lacks in the store, splits each device's cases over its actors (pipeline/gpus.py's
split: whole cases, none twice) and lets all actors measure at once. An actor keeps its results in
a store of its own and rewrites its Parquet shard in the shared --shards folder every few results
(atomically), so an actor that is killed leaves the shard of what it measured; the parent ingests
every shard there, and the next run plans only what is still missing. Needs `pip install
'zmlx-pipeline[ray]'`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from zmlx_pipeline import __version__
from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.data.shards import ingest_shards, shard_paths
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.kernels.measure import GpuMeasurer, Task, TimingSettings
from zmlx_pipeline.kernels.spec import KernelSpec, Limits
from zmlx_pipeline.pipeline.collect import _measurement, _mlx_version, plan
from zmlx_pipeline.pipeline.gpus import partition_cases

#: the real device detection and measurer, named as importable paths so an actor can load them remotely
DETECT = "zmlx_pipeline.data.detect:detect_device"
MEASURER = "zmlx_pipeline.pipeline.ray_collect:gpu_measurer"
FLUSH_EVERY = 50  # results between shard rewrites (a killed actor loses at most these)


class RayUnavailable(ZmlxPipelineError, RuntimeError):
    """Ray is not installed, or no cluster could be joined"""


def default_shard_dir(db: str | os.PathLike | None) -> str:
    from zmlx_pipeline.data.store import default_db_path

    return str(Path(db or default_db_path()).parent / "shards")


def _load(ref: str):
    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


def gpu_measurer(backend: str, settings: TimingSettings):
    """The real measurer an actor times with (collect's GpuMeasurer)."""
    return GpuMeasurer(backend, settings)


class GpuCollector:
    """One GPU's worker: reports its device, then measures a job's tasks into its own shard."""

    def __init__(self, detect: str = DETECT, measurer: str = MEASURER):
        self._detect, self._measurer = detect, measurer
        self._device = None

    def device(self) -> dict[str, Any]:
        if self._device is None:
            self._device = _load(self._detect)()
        d = self._device
        return {"device_id": d.device_id, "backend": d.backend, "row": dict(d.row),
                "reported_name": getattr(d, "reported_name", None), "host": platform.node(),
                "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def run(self, job: Mapping[str, Any]) -> dict[str, Any]:
        """Measure job["items"] (refs, dtypes, shapes, configs) and write job["shard"]; returns counts."""
        from zmlx_pipeline.kernels.harness import GpuUnhealthy
        from zmlx_pipeline.kernels.registry import get_kernel

        info = self.device()
        settings = TimingSettings(**job["settings"])
        measure = _load(self._measurer)(info["backend"], settings)
        specs = {ref: get_kernel(ref) for ref in {it["ref"] for it in job["items"]}}
        deadline = None if job.get("budget_s") is None else time.monotonic() + job["budget_s"]
        counts: dict[str, int] = {}
        with tempfile.TemporaryDirectory(prefix="zmlx-ray-") as tmp, Store(os.path.join(tmp, "actor.duckdb")) as store:
            store.upsert_device(info["row"])
            run_id = store.start_run(info["device_id"], host=info["host"], backend=info["backend"],
                                     mlx_version=_mlx_version(), pipeline_version=__version__,
                                     settings={**job["run_settings"], "gpu": info["gpu"], "ray": True})
            current, done, status = None, 0, "finished"
            try:
                for it in job["items"]:
                    task = Task(specs[it["ref"]], it["dtype"], it["shape"], it["config"])
                    case = (it["ref"], it["dtype"], tuple(sorted(it["shape"].items())))
                    if deadline is not None and case != current and time.monotonic() > deadline:
                        status = "interrupted"
                        break
                    current = case
                    outcome = measure(task)
                    store.record([_measurement(run_id, info["device_id"], task, outcome)])
                    counts[outcome.status] = counts.get(outcome.status, 0) + 1
                    done += 1
                    if done % int(job.get("flush_every") or FLUSH_EVERY) == 0:
                        _write_shard(store, job["shard"])
            except GpuUnhealthy:
                status = "failed"
            store.finish_run(run_id, status)
            _write_shard(store, job["shard"])
        return {"shard": job["shard"], "measured": done, "by_status": counts, "stopped": status, **info}


def _write_shard(store: Store, path: str) -> None:
    """The actor's whole store as its shard, replaced atomically (readers see the old or the new one)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    if store.export_shard(tmp) >= 0:
        os.replace(tmp, path)


def _ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailable("collect --ray needs Ray: pip install 'zmlx-pipeline[ray]'") from None
    return ray


def collect_on_ray(
    store: Store,
    specs: Sequence[KernelSpec],
    kernel_refs: Mapping[str, str],
    *,
    address: str | None = "auto",
    shard_dir: str,
    dtypes: Sequence[str],
    preset: str = "smoke",
    budget_s: float | None = None,
    settings: TimingSettings | None = None,
    shapes_limit: int | None = None,
    configs_limit: int | None = None,
    detect: str = DETECT,
    measurer: str = MEASURER,
    init_kwargs: Mapping[str, Any] | None = None,
    flush_every: int = FLUSH_EVERY,
) -> dict[str, Any]:
    """Measure what the store lacks on every GPU of the cluster; ingests every shard in `shard_dir`.

    Returns {"actors": [per actor: device, host, gpu, measured, stopped, shard], "shards", "ingested",
    "remaining"}. `detect` and `measurer` name (module:attr) the device detection and the measurer
    factory the actors load.
    """
    ray = _ray()
    settings = settings or TimingSettings()
    os.makedirs(shard_dir, exist_ok=True)
    ingested = _ingest_all(store, shard_dir)  # what earlier (or killed) actors left
    if not ray.is_initialized():
        try:
            ray.init(address=address if address not in (None, "local") else None, **dict(init_kwargs or {}))
        except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError and others
            raise RayUnavailable(f"cannot join the Ray cluster at {address!r}: {exc}") from None
    n_gpus = int(ray.cluster_resources().get("GPU", 0))
    if n_gpus < 1:
        raise RayUnavailable("the Ray cluster has no GPU: start its nodes with --num-gpus")
    actor_cls = ray.remote(num_gpus=1)(GpuCollector)
    actors = [actor_cls.remote(detect, measurer) for _ in range(n_gpus)]
    infos = ray.get([a.device.remote() for a in actors])
    run_settings = {"kernels": [s.name for s in specs], "dtypes": list(dtypes), "preset": preset, "budget_s": budget_s,
                    "timing": settings.timer, "warmup": settings.warmup, "samples": settings.samples}
    by_device: dict[str, list[int]] = {}
    for i, info in enumerate(infos):
        by_device.setdefault(info["device_id"], []).append(i)
    futures, planned = [], 0
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for device_id, members in by_device.items():
        row = infos[members[0]]["row"]
        store.upsert_device(row)
        tasks, _ = plan(store, device_id, specs, dtypes, preset, Limits.from_device_row(row), shapes_limit, configs_limit)
        planned += len(tasks)
        for member, share in zip(members, partition_cases(tasks, len(members))):
            if not share:
                continue
            info = infos[member]
            name = f"{device_id}-{info['host']}-gpu{info['gpu'] or member}-{stamp}.parquet".replace("/", "_")
            job = {"settings": dataclasses.asdict(settings), "run_settings": run_settings, "budget_s": budget_s,
                   "flush_every": flush_every,
                   "shard": os.path.join(shard_dir, name),
                   "items": [{"ref": kernel_refs[tasks[i].spec.name], "dtype": tasks[i].dtype,
                              "shape": dict(tasks[i].shape), "config": dict(tasks[i].config)} for i in share]}
            futures.append((member, actors[member].run.remote(job)))
    results = []
    for member, fut in futures:
        try:
            results.append(ray.get(fut))
        except Exception as exc:  # noqa: BLE001 - a lost actor: its last shard is ingested, the rest resumed next run
            results.append({**infos[member], "measured": None, "stopped": f"lost ({type(exc).__name__})", "shard": None})
    got = _ingest_all(store, shard_dir)
    measured = sum(r["measured"] or 0 for r in results)
    actors_out = [{"device": r["device_id"], "host": r["host"], "gpu": r["gpu"], "measured": r["measured"],
                   "stopped": r["stopped"], "shard": r["shard"]} for r in results]
    return {"actors": actors_out, "shards": got["files"], "ingested": got["added"] + ingested["added"],
            "planned": planned, "remaining": max(0, planned - measured)}


def _ingest_all(store: Store, shard_dir: str) -> dict[str, Any]:
    try:
        paths = shard_paths(shard_dir)
    except Exception:  # noqa: BLE001 - an empty folder holds nothing to ingest
        return {"files": [], "added": 0}
    out = ingest_shards(store, paths)  # the rows checked as any ingest checks them
    return {"files": [str(p) for p in paths], "added": int(out.get("added", 0))}
