"""A bundle file whose JSON names a key twice in one object is refused in one line naming the file and the key (JSON
would keep the last silently, so which value was meant cannot be told; a publisher never writes one)."""

import hashlib
import json

import pytest

from bundle_fixtures import copy_bundle
from zmlx_pipeline.runtime import BundleError, BundleWarning, active_bundle, load_bundle, predicted_config

SHAPE = {"rows": 4096, "cols": 4096}


def _resign(bundle, name: str, text: str) -> None:
    """Write one file of the bundle and make its manifest entry match it again."""
    blob = text.encode()
    (bundle / name).write_bytes(blob)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_kernels_json_naming_kernels_twice_is_refused_at_load(toy_bundle, tmp_path):
    good = load_bundle(toy_bundle[1], strict=True)
    bad = copy_bundle(toy_bundle[1], tmp_path / "bad")
    text = (bad / "kernels.json").read_text()
    _resign(bad, "kernels.json", '{"kernels": {}, ' + text.strip()[1:])  # an empty `kernels` first, the real last
    with pytest.raises(BundleError) as refused:
        load_bundle(bad, strict=True)
    assert str(refused.value) == f"bundle {bad}: kernels.json names the key 'kernels' twice in one object"
    with pytest.warns(BundleWarning, match="names the key 'kernels' twice") as caught:
        kept = load_bundle(bad)
    assert len(caught) == 1 and kept is good is active_bundle()


def test_a_table_entry_naming_a_field_twice_is_refused_when_the_table_is_read(toy_bundle, tmp_path):
    bad = copy_bundle(toy_bundle[1], tmp_path / "bad")
    name = json.loads((bad / "tables.json").read_text())["devices"]["nvidia-h200"]
    text = (bad / name).read_text()
    assert text.count('"best":') > 1
    _resign(bad, name, text.replace('"best":', '"best":0,"best":', 1))
    load_bundle(bad, strict=True)
    with pytest.raises(BundleError) as refused:
        predicted_config("toy_scale", SHAPE, "float16", device="nvidia-h200")
    assert str(refused.value) == f"bundle {bad}: {name} names the key 'best' twice in one object"


def test_a_manifest_naming_a_file_twice_is_refused(toy_bundle, tmp_path):
    bad = copy_bundle(toy_bundle[1], tmp_path / "bad")
    text = (bad / "manifest.json").read_text()
    assert text.count('"files":{') == 1  # as publish writes it: compact
    (bad / "manifest.json").write_text(text.replace('"files":{', '"files":{"kernels.json":{},', 1))
    with pytest.raises(BundleError) as refused:
        load_bundle(bad, strict=True)
    assert str(refused.value) == f"{bad}: manifest.json names the key 'kernels.json' twice in one object"
