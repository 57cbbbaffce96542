"""The bundle shipped inside the package: built from the committed shards in data/, fingerprinted by them.

Its manifest records `source_shards` (each shard's name and sha256), so a test can tell when
the committed data no longer matches it; `tools/build_default_bundle.py` rebuilds it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable

from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR


def shard_fingerprints(data_dir: str | os.PathLike) -> dict[str, str]:
    """sha256 of every *.parquet shard directly in `data_dir`, by file name."""
    out = {}
    for path in sorted(Path(data_dir).glob("*.parquet")):
        out[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def build_default_bundle(data_dir: str | os.PathLike, out_dir: str | os.PathLike = DEFAULT_BUNDLE_DIR,
                         progress: Callable[[str], None] | None = None) -> dict:
    """Ingest `data_dir` into a scratch store, train and register the default models, publish to `out_dir`."""
    from threadpoolctl import threadpool_limits

    from zmlx_pipeline.data.shards import ingest_shards
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.models.train import train_models
    from zmlx_pipeline.publish import publish

    shards = shard_fingerprints(data_dir)
    if not shards:
        raise FileNotFoundError(f"no *.parquet shards in {data_dir}")
    with tempfile.TemporaryDirectory(prefix="zmlx-default-bundle-") as tmp:
        with Store(Path(tmp) / "store.duckdb") as store:
            ingest_shards(store, [data_dir])
            if progress:
                progress(f"ingested {len(shards)} shard(s); training")
            with threadpool_limits(limits=1):
                train_models(store, models_dir=Path(tmp) / "models",
                             on_kernel=(lambda k: progress(f"training {k}")) if progress else None)
            return publish(store, out_dir, versioned=False, record=False, progress=progress,
                           extra_manifest={"source_shards": shards, "built_by": "tools/build_default_bundle.py"})
