"""A device whose table fails its checks (a bundle loaded without strict) answers with the catalog default, and the
answer's note says the table was refused, not that the bundle lacks the device; a core limit answered from a held
limit whose table was refused says so too, rather than raising a bare AttributeError."""

import warnings

import pytest
from rehashed_bundles import rehashed

from zmlx_pipeline.runtime import BundleError, load_bundle, predicted_config
from zmlx_pipeline.runtime.bundle import BundleWarning

LIMIT = "nvidia-h100-sxm@32sm"  # held by the real bundle, measured
SHAPE = {"rows": 4096, "cols": 4096}


def _broken(table):
    entry = next(iter(table["kernels"]["rmsnorm"]["float16"]["buckets"].values()))
    entry["best"] = "first"  # no index: the table fails its checks


@pytest.fixture
def broken(real_bundle, tmp_path):
    return rehashed(real_bundle[1], tmp_path / "b", {f"device:{LIMIT}": _broken})


def test_a_refused_table_is_named_as_refused_in_the_answer(broken):
    load_bundle(broken)
    with pytest.warns(BundleWarning, match="unusable"):
        pred = predicted_config("rmsnorm", SHAPE, "float16", device=LIMIT)
    assert (pred.evidence, pred.device) == ("default", LIMIT) and pred.config is not None
    assert pred.note.startswith(f"the table of '{LIMIT}' in bundle ") and "failed its checks" in pred.note
    assert "not in bundle" not in pred.note and "in the catalog" not in pred.note
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once; the note says it on every answer
        again = predicted_config("rmsnorm", {"rows": 1000, "cols": 1000}, "float16", device=LIMIT)
    assert "failed its checks" in again.note


def test_a_limit_answered_from_a_refused_table_says_so(broken):
    load_bundle(broken)
    with pytest.warns(BundleWarning, match="unusable"):
        pred = predicted_config("rmsnorm", SHAPE, "float16", device="nvidia-h100-sxm@20sm")
    assert pred.evidence == "default" and pred.device == "nvidia-h100-sxm@20sm"
    assert f"the table of {LIMIT} it would answer from failed its checks" in pred.note


def test_strict_loading_still_refuses_the_table(broken):
    load_bundle(broken, strict=True)
    with pytest.raises(BundleError, match="malformed table"):
        predicted_config("rmsnorm", SHAPE, "float16", device=LIMIT)
