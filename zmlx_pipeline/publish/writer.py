"""Writing a bundle atomically: a temp directory inside DIR, fsynced, renamed to its version, then `latest` swapped.

    DIR/
      20260101T120000Z-1a2b3c4d/   one directory per published version (never changed afterwards)
        manifest.json               schema, created, pipeline version, model id, data fingerprint, sha256 of every file
        kernels.json profiles.json tables.json autotune_v3.json devices/<hash>.json
      latest                        the name of the newest version (a small file, replaced with os.replace)

A reader following `latest` sees either the previous complete version or the new complete one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from zmlx_pipeline import __version__
from zmlx_pipeline.runtime.bundle import BUNDLE_SCHEMA, BUNDLE_SCHEMA_VERSION, LATEST, MANIFEST


class PublishError(OSError):
    "The bundle could not be written"


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def encode(obj: Any) -> bytes:
    """Canonical bundle JSON: sorted keys, compact, UTF-8, newline at the end."""
    return (json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n").encode()


def make_manifest(blobs: Mapping[str, bytes], fields: Mapping[str, Any], created: datetime) -> dict:
    files = {name: {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)} for name, blob in sorted(blobs.items())}
    content = hashlib.sha256("".join(f"{n}:{e['sha256']}" for n, e in files.items()).encode()).hexdigest()
    return {
        "schema": BUNDLE_SCHEMA,
        "schema_version": BUNDLE_SCHEMA_VERSION,
        "bundle_id": f"{created.strftime('%Y%m%dT%H%M%SZ')}-{content[:8]}",
        "created": created.isoformat().replace("+00:00", "Z"),
        "pipeline_version": __version__,
        "content_sha256": content,
        **fields,
        "files": files,
    }


def write_files(directory: Path, blobs: Mapping[str, bytes], manifest: dict) -> None:
    """Write every file and the manifest (last) into `directory`, each fsynced."""
    for name, blob in blobs.items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob)
        _fsync_file(target)
    for sub in {(directory / n).parent for n in blobs}:
        _fsync_dir(sub)
    (directory / MANIFEST).write_bytes(encode(manifest))
    _fsync_file(directory / MANIFEST)
    _fsync_dir(directory)


def check_publish_dir(directory: str | os.PathLike) -> None:
    """Refuse a publish directory that cannot be written (a file on its path, no permission) before any work."""
    root = Path(directory)
    blocker = next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise PublishError(f"cannot publish to {root}: {blocker} is a file, not a directory; choose another --to")
    existing = next(p for p in (root, *root.parents) if p.exists())
    try:
        existing.joinpath(".zmlx-write-probe").mkdir()
        existing.joinpath(".zmlx-write-probe").rmdir()
    except FileExistsError:
        pass
    except OSError as exc:
        raise PublishError(f"cannot publish to {root}: {existing} is not writable ({exc.strerror or exc}); "
                           "choose another --to") from None


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def swap_latest(to_dir: Path, name: str) -> None:
    """Point `latest` at a version: write a temp file, fsync, os.replace it over the old pointer."""
    fd, tmp = tempfile.mkstemp(prefix=f".{LATEST}.", dir=to_dir)
    try:
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes it private; readers of the bundle need it
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(name + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, to_dir / LATEST)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(to_dir)


def write_bundle(to_dir: str | os.PathLike, files: Mapping[str, Any], fields: Mapping[str, Any],
                 created: datetime | None = None, versioned: bool = True) -> tuple[dict, Path]:
    """Publish JSON files as a new version under `to_dir` (atomic, then `latest`); returns (manifest, path).

    `versioned=False` replaces `to_dir` itself with the bundle (for the package's default bundle).
    """
    created = created or datetime.now(timezone.utc).replace(microsecond=0)
    blobs = {name: encode(obj) for name, obj in files.items()}
    manifest = make_manifest(blobs, fields, created)
    root = Path(to_dir)
    parent = root if versioned else root.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".publish-", dir=parent))
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it private; a bundle is for others to read
    except OSError as exc:
        raise PublishError(f"cannot write a bundle under {parent}: {exc.strerror or exc}") from None
    try:
        write_files(tmp, blobs, manifest)
        if not versioned:
            old = None
            if root.exists():
                old = parent / f".old-{root.name}-{os.getpid()}"
                os.replace(root, old)
            os.replace(tmp, root)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            _fsync_dir(parent)
            return manifest, root
        name = manifest["bundle_id"]
        final = root / name
        if final.exists():
            if (final / MANIFEST).is_file() and json.loads((final / MANIFEST).read_text())["files"] == manifest["files"]:
                shutil.rmtree(tmp, ignore_errors=True)
                swap_latest(root, name)
                manifest = json.loads((final / MANIFEST).read_text())
                return manifest, final
            n = 2
            while (root / f"{name}.{n}").exists():
                n += 1
            final = root / f"{name}.{n}"
        os.rename(tmp, final)
        _fsync_dir(root)
        swap_latest(root, final.name)
        return manifest, final
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PublishError(f"cannot publish to {root}: {exc.strerror or exc}") from None
