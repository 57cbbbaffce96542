"""Every kernel of a bundle of schema 2 on (the schema that added it) has a measured_range of each of its dims:
without it lookups would never mark a shape outside what was measured, so such a bundle is refused in one line."""

import hashlib
import json

import pytest

from bundle_fixtures import copy_bundle
from zmlx_pipeline.runtime import BundleError, BundleWarning, active_bundle, load_bundle, predicted_config

FAR = {"rows": 1, "cols": 999999936}  # far past every measured cols


def _edit_kernels(bundle, change, schema_version=None) -> None:
    kernels = json.loads((bundle / "kernels.json").read_text())
    change(kernels["kernels"]["toy_scale"])
    blob = json.dumps(kernels).encode()
    (bundle / "kernels.json").write_bytes(blob)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"]["kernels.json"] = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}
    if schema_version is not None:
        manifest["schema_version"] = schema_version
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_the_published_range_marks_a_far_shape(toy_bundle):
    load_bundle(toy_bundle[1], strict=True)
    assert predicted_config("toy_scale", FAR, "float16", device="nvidia-h200").outside_range == ("cols",)


@pytest.mark.parametrize("change, missing, schema", [
    (lambda meta: meta.pop("measured_range"), "cols, rows", None),
    (lambda meta: meta.__setitem__("measured_range", {}), "cols, rows", None),
    (lambda meta: meta["measured_range"].pop("cols"), "cols", None),
    (lambda meta: meta.pop("measured_range"), "cols, rows", 2),
], ids=["absent", "empty", "a dim left out", "schema 2"])
def test_a_kernel_without_its_measured_range_is_refused(toy_bundle, tmp_path, change, missing, schema):
    good = load_bundle(toy_bundle[1], strict=True)
    bad = copy_bundle(toy_bundle[1], tmp_path / "bad")
    _edit_kernels(bad, change, schema)
    with pytest.raises(BundleError) as refused:
        load_bundle(bad, strict=True)
    assert str(refused.value) == (f"{bad}: malformed index files: kernels.json: kernels[toy_scale] lacks the "
                                  f"measured_range of {missing}, which every kernel of a schema-{schema or 4} bundle "
                                  "has for each of its dims")
    with pytest.warns(BundleWarning) as caught:
        kept = load_bundle(bad)
    assert len(caught) == 1 and kept is good is active_bundle()


def test_a_schema_1_bundle_never_had_one(toy_bundle, tmp_path):
    """Schema 1 predates measured ranges: its lookups bound shapes by the published buckets' (lookup.py)."""
    old = copy_bundle(toy_bundle[1], tmp_path / "old")
    _edit_kernels(old, lambda meta: meta.pop("measured_range"), schema_version=1)
    assert load_bundle(old, strict=True).schema_version == 1
