"""Parquet shards: one self-contained file per collector, merged into the central store by ingest.

The SQL lives in store.py; these are the entry points the CLI calls.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from zmlx_pipeline.data.store import (
    SHARD_COLUMNS,
    SHARD_REQUIRED,
    BadShard,
    Store,
    query_shards,
)

__all__ = [
    "SHARD_COLUMNS",
    "SHARD_REQUIRED",
    "BadShard",
    "export_shard",
    "ingest_shard",
    "ingest_shards",
    "query_shards",
    "shard_filename",
    "shard_paths",
]


def shard_filename(device_id: str, when: datetime | None = None) -> str:
    """A file name for a device's shard: `<device slug>-<UTC timestamp>.parquet`."""
    when = when or datetime.now(timezone.utc)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device_id).strip("-").lower() or "device"
    return f"{slug}-{when.strftime('%Y%m%dT%H%M%SZ')}.parquet"


def export_shard(store: Store, path: str | os.PathLike, device: str | None = None) -> int:
    """Write the store's measurements (one device or all) as one zstd Parquet shard; returns rows."""
    return store.export_shard(path, device=device)


def ingest_shard(store: Store, path: str | os.PathLike) -> dict:
    """Merge one shard into the store in one transaction; returns {'rows', 'added', 'skipped'} (and
    'replaced': keys re-measured since the store's timing, whose newest timing wins)."""
    return store.ingest_shard(path)


def shard_paths(source: str | os.PathLike) -> list[Path]:
    """The shards a path names: a directory's *.parquet files (sorted), or the file itself."""
    source = Path(source)
    if source.is_dir():
        found = sorted(p for p in source.glob("*.parquet") if p.is_file())
        if not found:
            raise BadShard(f"{source}: no .parquet shard in this directory")
        return found
    if source.is_file():
        return [source]
    raise BadShard(f"{source}: no such shard file or directory")


def ingest_shards(store: Store, sources: Iterable[str | os.PathLike]) -> dict:
    """Ingest every shard the sources name, all or nothing (one transaction); returns totals and per-file counts."""
    shards = [shard for source in sources for shard in shard_paths(source)]
    return store.ingest_shards(shards)
