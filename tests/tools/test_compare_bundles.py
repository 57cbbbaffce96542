"""tools/compare_bundles.py: a bundle and its older-schema form compare identical; a changed entry does not."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "runtime"))

from bundle_fixtures import latest_dir, toy_bundle  # noqa: E402,F401
from zmlx_pipeline.publish.writer import write_blobs  # noqa: E402
from zmlx_pipeline.runtime.bundle import read_dir  # noqa: E402
from zmlx_pipeline.runtime.lookup import ENTRY_FIELDS  # noqa: E402

_spec = importlib.util.spec_from_file_location("compare_bundles", REPO / "tools" / "compare_bundles.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def _as_schema_2(src: Path, dest: Path, change=None) -> Path:
    """The bundle with every entry a list by position (schema 2); `change(device_file, table)` may alter one."""
    bundle = read_dir(src)
    blobs = {}
    for name in bundle.logical_names():
        data = bundle.json(name)
        if name.startswith("devices/"):
            for per_dtype in data["kernels"].values():
                for table in per_dtype.values():
                    for kind in table.values():
                        for key, e in kind.items():
                            kind[key] = [e[f] for f in ENTRY_FIELDS if f in e]
            if change:
                change(name, data)
        blobs[name] = json.dumps(data).encode()
    write_blobs(dest, blobs, {"created": bundle.manifest["created"]}, versioned=False, content_schema=2)
    return dest


def test_a_bundle_and_its_schema_2_form_are_identical_and_a_changed_entry_is_named(toy_bundle, tmp_path, capsys):
    src = latest_dir(toy_bundle[1])
    same = _as_schema_2(src, tmp_path / "same")
    assert tool.main([str(src), str(same)]) == 0
    assert capsys.readouterr().out.strip() == "identical"
    h200 = read_dir(src).tables["nvidia-h200"]

    def slower(name, data):
        if name == h200:
            entry = next(iter(data["kernels"]["toy_scale"]["float16"]["buckets"].values()))
            entry[2] = (entry[2] or 1.0) * 2

    changed = _as_schema_2(src, tmp_path / "changed", slower)
    assert tool.main([str(src), str(changed)]) == 1
    out = capsys.readouterr().out
    assert "/tables/nvidia-h200/kernels/toy_scale/float16/buckets/" in out and "/time_us:" in out
