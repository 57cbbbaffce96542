"""Compiled CUDA kernels on disk, one file per program: built once per machine, shared by every process.

NVRTC takes 1-2.5 s per kernel config; a process that finds its cubin (or PTX) here loads it in milliseconds.
An entry is keyed by everything that changes the binary (the caller's fields: source hash, arch,
NVRTC and MLX versions, compile options), written atomically (a temporary file renamed over the
name, so two processes writing one entry leave one whole file), and carries the sha256 of its
program (base64 in the file: a cubin is binary): an entry that is truncated, fails its checksum or was made for other fields is rebuilt, never
returned. A build holds a lock on its entry across processes, so processes that need one program
(collect's per-GPU workers) compile it once. Standard library only.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from zmlx_pipeline.core.files import write_json_atomic

ENV = "ZMLX_PIPELINE_PTX_CACHE"
FORMAT = "zmlx-pipeline-ptx/2"  # /1 held PTX as text: its entries are rebuilt


def cache_dir() -> Path:
    """$ZMLX_PIPELINE_PTX_CACHE, else ~/.cache/zmlx-pipeline/ptx."""
    return Path(os.environ.get(ENV) or Path.home() / ".cache" / "zmlx-pipeline" / "ptx")


def entry_key(fields: Mapping[str, Any]) -> str:
    """The entry's name: a sha256 of its fields as canonical JSON (any changed field, another entry)."""
    text = json.dumps(dict(fields), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class PtxCache:
    """A directory of compiled programs: read() verifies, write() is atomic, get_or_build() compiles once."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else cache_dir()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.built = 0  # entries this object compiled (a warm cache compiles none)
        self.rebuilt = 0  # of those, entries that were on disk but corrupt or stale

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def read(self, fields: Mapping[str, Any]) -> bytes | None:
        """The entry's program when it is whole, matches its checksum and was made for these fields; else None."""
        key = entry_key(fields)
        try:
            record = json.loads(self.path(key).read_text())
            ptx = base64.b64decode(record["program_b64"], validate=True)
            ok = (record.get("format") == FORMAT and record.get("fields") == json.loads(json.dumps(dict(fields), default=str))
                  and record.get("size") == len(ptx) and record.get("sha256") == hashlib.sha256(ptx).hexdigest())
        except (OSError, ValueError, KeyError, TypeError, AttributeError, binascii.Error):
            return None
        return ptx if ok else None

    def write(self, fields: Mapping[str, Any], ptx: bytes) -> Path:
        """Store the program for these fields: written to a temporary file in the directory, then renamed."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(entry_key(fields))
        record = {"format": FORMAT, "fields": json.loads(json.dumps(dict(fields), default=str)), "size": len(ptx),
                  "sha256": hashlib.sha256(ptx).hexdigest(), "program_b64": base64.b64encode(ptx).decode("ascii")}
        write_json_atomic(path, record)
        return path

    def get_or_build(self, fields: Mapping[str, Any], build: Callable[[], bytes]) -> bytes:
        """The cached program for these fields, else build() once (threads asking for one entry wait for it)."""
        key = entry_key(fields)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            ptx = self.read(fields)
            if ptx is not None:
                return ptx
            with self._process_lock(key):
                ptx = self.read(fields)  # another process may have built it while we waited
                if ptx is not None:
                    return ptx
                existed = self.path(key).exists()
                ptx = build()
                self.built += 1
                self.rebuilt += existed
                try:
                    self.write(fields, ptx)
                except OSError:
                    pass  # a read-only or full cache directory costs a compile next time, nothing else
                return ptx

    @contextlib.contextmanager
    def _process_lock(self, key: str):
        """An exclusive lock on one entry across processes (collect's per-GPU workers need the same programs),
        so each is compiled once on the machine; without fcntl or a writable directory, no lock."""
        try:
            import fcntl

            self.root.mkdir(parents=True, exist_ok=True)
            fh = open(self.root / f"{key}.lock", "a")
        except (ImportError, OSError):
            yield
            return
        try:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield
        finally:
            fh.close()  # closing releases the lock


def build_all(cache: PtxCache, jobs: Iterable[tuple[Mapping[str, Any], Callable[[], bytes]]],
              workers: int | None = None) -> list[bytes | BaseException]:
    """get_or_build for every (fields, build) at once in threads (NVRTC through ctypes releases the GIL);
    each item's PTX, or the exception its build raised, in order."""
    jobs = list(jobs)
    if not jobs:
        return []

    def one(job):
        try:
            return cache.get_or_build(*job)
        except Exception as exc:  # noqa: BLE001 - returned: the launch reports it as its config's failure
            return exc

    n = workers or min(len(jobs), max(1, os.cpu_count() or 1))
    if n <= 1:
        return [one(j) for j in jobs]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="zmlx-nvrtc") as pool:
        return list(pool.map(one, jobs))
