"""Publishing: profile bundles built from the latest (or a named) model, written atomically and versioned.

    from zmlx_pipeline.publish import publish
    result = publish(store, "models/", model_id=None)   # -> {"bundle_id", "path", ...}

The runtime (`zmlx_pipeline.runtime.load_bundle`) reads what this writes.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from zmlx_pipeline.publish.models import DEFAULT_PRUNE_K, ModelSourceError, load_models
from zmlx_pipeline.publish.writer import PublishError, check_publish_dir, write_bundle

__all__ = ["DEFAULT_PRUNE_K", "ModelSourceError", "PublishError", "publish"]


def publish(store, to_dir: str | os.PathLike, model_id: str | Sequence[str] | None = None, *,
            devices: Sequence[str] | None = None, kernels: Sequence[str] | None = None,
            evaluate: bool = True, record: bool = True, versioned: bool = True,
            extra_manifest: dict[str, Any] | None = None,
            progress: Callable[[str], None] | None = None, jobs: int | None = None) -> dict[str, Any]:
    """Build a bundle from the store's newest model per kernel (or the named ones) and publish it under `to_dir`.

    `devices` limits the lookup tables to these devices (plus every measured one; profiles always
    cover the whole catalog); `kernels` limits the kernels. Records the bundle in the store's
    `bundles` table when `record` and the store is writable. Returns what was published (`latest_replaced_link`: what
    a `latest` that was a symbolic link named, now replaced by the pointer file; its target is left as it was;
    `no_entries`: device -> kernel -> why it has no entry there, no config being legal). `jobs`:
    worker processes that build the kernels' tables (None: one per CPU; 1: none; the bundle does not depend on it);
    `progress` gets a line per kernel loaded and built, with the time elapsed and an estimate of the time left.
    """
    from threadpoolctl import threadpool_limits

    from zmlx_pipeline.publish.build import build_contents

    started = time.monotonic()
    # before minutes of building, not after; versioned=False replaces to_dir itself, among its parent's files
    check_publish_dir(to_dir) if versioned else check_publish_dir(Path(to_dir).parent, contents=False)
    if devices is not None:  # a device neither the catalog nor the store knows: said now, not after the fits
        from zmlx_pipeline.publish.build import resolve_devices

        devices = resolve_devices(store, devices)
    # Many small fits and predictions: one thread each is several times faster than contending OpenMP pools.
    with threadpool_limits(limits=1):
        # the rankers are read and the time models fitted with the tables, in the builder's worker processes
        models = load_models(store, model_id, kernels, evaluate=evaluate, progress=progress, time_models=False,
                             jobs=jobs, started=started, rankers=False)
        files, summary = build_contents(store, models, devices=devices, progress=progress, jobs=jobs, started=started)
    created = datetime.now(timezone.utc).replace(microsecond=0)
    fields = {
        "model_id": models.model_id,
        "model_source": models.source,
        "models": models.describe(),
        "data_fingerprint": models.data_fingerprint,
        "kernels": summary["kernels"],
        "measured_devices": summary["measured_devices"],
        **(extra_manifest or {}),
    }
    # read back with the runtime's own checks before `latest` moves: a bundle the runtime would refuse is never
    # published (a config value it cannot use, a registry row altered by hand)
    replaced: list[str] = []  # what a `latest` that was a symbolic link named: the pointer file replaces it
    manifest, path = write_bundle(to_dir, files, fields, created=created, versioned=versioned, verify=True,
                                  replaced=replaced)
    recorded = False
    if record and not getattr(store, "read_only", True) and hasattr(store, "record_bundle"):
        store.record_bundle(manifest["bundle_id"], models.model_id, str(Path(path).resolve()), manifest)
        recorded = True
    return {
        "bundle_id": manifest["bundle_id"],
        "path": str(path),
        "latest": str(Path(to_dir) / "latest") if versioned else None,
        "latest_replaced_link": replaced[0] if replaced else None,
        "model_id": models.model_id,
        "model_source": models.source,
        "data_fingerprint": models.data_fingerprint,
        "files": len(manifest["files"]),
        "bytes": sum(e["bytes"] for e in manifest["files"].values()),
        "recorded": recorded,
        "regret_read_from": models.reused,
        **summary,
    }
