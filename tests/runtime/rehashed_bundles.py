"""A published bundle edited and re-hashed: one JSON edit, then every manifest sha256 and size recomputed, so the
hashes match and only the contents checks (and the lookups) stand between the edit and an answer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

from bundle_fixtures import copy_bundle


def rehashed(publish_dir: Path, dest: Path, edits: dict[str, Callable[[Any], Any]]) -> Path:
    """A copy of the latest bundle of `publish_dir` at `dest` with each file named in `edits` (its logical name, or
    `device:<id>` for a device's table) changed in place by its function, and the manifest re-hashed."""
    root = copy_bundle(publish_dir, dest)
    tables = json.loads((root / "tables.json").read_text())["devices"]
    for name, edit in edits.items():
        path = root / (tables[name[len("device:"):]] if name.startswith("device:") else name)
        data = json.loads(path.read_text())
        changed = edit(data)
        path.write_text(json.dumps(data if changed is None else changed))
    manifest = json.loads((root / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        blob = (root / name).read_bytes()
        entry.update(sha256=hashlib.sha256(blob).hexdigest(), bytes=len(blob))
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def every_entry(table: dict):
    """Every entry of a device table: (kernel, dtype, part, key, entry)."""
    for kernel, by_dtype in table["kernels"].items():
        for dtype, parts in by_dtype.items():
            for part in ("measured", "buckets", "between"):
                for key, entry in (parts.get(part) or {}).items():
                    yield kernel, dtype, part, key, entry
