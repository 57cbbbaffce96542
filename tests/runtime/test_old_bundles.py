"""Bundles published before table entries had named fields (schema 2, and its compact form 3) still answer.

The toy bundle is written again as such a bundle: every table entry a list in ENTRY_FIELDS' order, the manifest
of schema 2, then rewritten compact (schema 3). Every lookup must answer exactly as from the bundle it came from.
"""

import json

import pytest

from bundle_fixtures import TOY_DEVICES, TOY_SHAPES, latest_dir
from zmlx_pipeline.publish.writer import rewrite_bundle, write_blobs
from zmlx_pipeline.runtime import BundleError, active_bundle, load_bundle, predicted_config
from zmlx_pipeline.runtime.bundle import read_dir
from zmlx_pipeline.runtime.lookup import ENTRY_FIELDS

DEVICES = (*TOY_DEVICES, "apple-m3-max-40c", "nvidia-h100-pcie", "nvidia-a100-sxm4-80gb")


def _positional(entry: dict) -> list:
    """An entry as schema 2 wrote it: a list by position, the time bound only where a time was moved."""
    values = [entry[f] for f in ENTRY_FIELDS[:6]]
    return values + [entry["time_bound"]] if "time_bound" in entry else values


@pytest.fixture
def schema_2(toy_bundle, tmp_path):
    """The toy bundle as schema 2 wrote it (positional entries), and its compact form (schema 3)."""
    src = read_dir(latest_dir(toy_bundle[1]))
    blobs, lists = {}, 0
    for name in src.logical_names():
        data = src.json(name)
        if name.startswith("devices/"):
            for per_dtype in data["kernels"].values():
                for table in per_dtype.values():
                    for kind in table.values():
                        for key, entry in kind.items():
                            kind[key] = _positional(entry)
                            lists += 1
        blobs[name] = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    fields = {k: v for k, v in src.manifest.items() if k not in ("schema", "schema_version", "bundle_id",
                                                                    "content_sha256", "files")}
    manifest, plain = write_blobs(tmp_path / "schema2", blobs, fields, versioned=False, content_schema=2)
    assert manifest["schema_version"] == 2 and lists > 20
    compact_manifest, compact = rewrite_bundle(plain, tmp_path / "schema3", compact=True)
    assert compact_manifest["schema_version"] == 3
    back, _ = rewrite_bundle(compact, tmp_path / "schema2-again", compact=False)
    assert back["schema_version"] == 2 and back["files"] == manifest["files"]
    return plain, compact


def _answers():
    return [(device, tuple(shape.items()), p.config, p.evidence, p.predicted_us, p.expected_regret, p.candidates,
             p.bucket, p.prune_k, p.note)
            for device in DEVICES
            for shape in (*TOY_SHAPES, {"rows": 300, "cols": 2000}, {"rows": 70000, "cols": 1024})
            for p in [predicted_config("toy_scale", shape, "float16", device=device)]]


def test_schema_2_and_its_compact_form_answer_as_the_bundle_they_came_from(toy_bundle, schema_2):
    load_bundle(toy_bundle[1], strict=True)
    assert active_bundle().schema_version == 4
    named = _answers()
    assert {a[3] for a in named} >= {"measured", "predicted", "extrapolated"}
    assert any(a[4] is not None for a in named if a[3] == "predicted")
    for path, schema in zip(schema_2, (2, 3)):
        load_bundle(path, strict=True)
        assert active_bundle().schema_version == schema
        assert _answers() == named, schema


def test_an_entry_that_is_neither_a_list_nor_an_object_falls_back_to_the_default_with_a_warning(schema_2, tmp_path):
    from zmlx_pipeline.runtime import BundleWarning

    src = read_dir(schema_2[0])
    blobs = {name: src.data(name) for name in src.logical_names()}
    name = src.tables["nvidia-h200"]
    table = json.loads(blobs[name])
    first = next(iter(table["kernels"]["toy_scale"]["float16"]["measured"]))
    table["kernels"]["toy_scale"]["float16"]["measured"][first] = "3"
    blobs[name] = json.dumps(table).encode()
    write_blobs(tmp_path / "bad", blobs, {"created": src.manifest["created"]}, versioned=False, content_schema=2)
    load_bundle(tmp_path / "bad", strict=True)
    with pytest.raises(BundleError, match="must be an object"):  # strict: the bundle it was pointed at, or nothing
        predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h200")
    load_bundle(tmp_path / "bad")
    with pytest.warns(BundleWarning, match="the table of nvidia-h200 is unusable"):
        p = predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h200")
    assert p.evidence == "default"
