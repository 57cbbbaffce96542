"""A manifest naming a file no system call can open (a NUL byte, a lone surrogate) is refused as an unsafe path: one
BundleError (strict) or one BundleWarning with the bundle in use kept, never the ValueError os.open raises."""

import json
import warnings

import pytest

from bundle_fixtures import copy_bundle
from zmlx_pipeline.runtime import BundleError, BundleWarning, active_bundle, load_bundle, predicted_config

SHAPE = {"rows": 64, "cols": 4096}


@pytest.mark.parametrize("name", ["devices/a\0b.json", "a\ud800.json"], ids=["nul", "surrogate"])
def test_a_manifest_naming_an_unopenable_file_is_refused_in_one_line(toy_bundle, tmp_path, name):
    _, publish_dir = toy_bundle
    good = load_bundle(publish_dir, strict=True)
    before = predicted_config("toy_scale", SHAPE, "float16", device="nvidia-h100-sxm")
    bad = copy_bundle(publish_dir, tmp_path / "bad")
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": "0" * 64, "bytes": 2}
    (bad / "manifest.json").write_text(json.dumps(manifest))
    expect = f"{bad}: manifest names an unsafe path {name!r}"

    with pytest.raises(BundleError) as exc:
        load_bundle(bad, strict=True)
    assert str(exc.value) == expect
    assert active_bundle() is good

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = load_bundle(bad)
    assert [w.category for w in caught] == [BundleWarning]
    assert str(caught[0].message) == (f"zmlx-pipeline: bundle refused: {expect}; still using bundle "
                                      f"{good.bundle_id}")
    assert kept is good and active_bundle() is good
    assert predicted_config("toy_scale", SHAPE, "float16", device="nvidia-h100-sxm") is before
