"""An autotune cache entry that contradicts itself (a template parameter named twice, a template and a config that
disagree, or a `tg` that is not the threadgroup its parameters launch) is no answer: which config its time is of cannot be told, so the case is timed again (one warning, as for
other unusable entries) and the new winner replaces the entry."""

import json
import math

import pytest

from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.runtime import cache, load_bundle, tune

SHAPE = {"rows": 3000, "cols": 2048}
H200 = "nvidia-h200"
TEMPLATE_TWICE = [["T", "float16"], ["ROWS", 1], ["TG", 128], ["VEC", 8], ["TG", 64]]


def _time(config: dict) -> float:
    return 10 * (1 + abs(math.log2(config["TG"]) - 8) + 0.3 * abs(math.log2(config["VEC"]) - 2) + 0.1 * config["ROWS"])


class Measure:
    def __init__(self):
        self.calls = []

    def __call__(self, spec, config, shape, dtype):
        self.calls.append(dict(config))
        return "ok", _time(config)


def _cache_with(path, value) -> tuple[str, str]:
    """A v3 cache file holding `value` as the H200's rmsnorm entry of SHAPE in float16."""
    from zmlx_pipeline.runtime.tuner import _device_and_mlx

    spec = get_kernel("rmsnorm")
    dkey = cache.device_keys(*_device_and_mlx(H200)[:2])[0]
    key = cache.entry_key("rmsnorm", spec.version, SHAPE, spec.shape_grid.dims, "float16", list(spec.params))
    path.write_text(json.dumps({"schema_version": "3.0", "devices": {dkey: {"entries": {key: value}}}}))
    return dkey, key


@pytest.mark.parametrize("value, why", [
    ({"tg": [128, 1, 1], "template": TEMPLATE_TWICE, "median_us": 1.0}, "its template names 'TG' twice"),
    ({"tg": [128, 1, 1], "template": [["T", "float16"], ["ROWS", 1], ["TG", 64], ["VEC", 8]],
      "config": {"ROWS": 1, "TG": 128, "VEC": 8}, "median_us": 1.0}, "its config gives 'TG' 128, its template 64"),
    ({"tg": [256, 1, 1], "template": [["T", "float16"], ["ROWS", 1], ["TG", 128], ["VEC", 8]], "median_us": 1.0},
     r"its tg \[256, 1, 1\] is not the threadgroup its parameters launch \(\[128, 1, 1\]\)"),
    ({"tg": [256, 1, 1], "template": [["T", "float16"], ["ROWS", 1], ["TG", 128], ["VEC", 8]]},
     r"its tg \[256, 1, 1\] is not the threadgroup"),
    ({"tg": [256, 1, 1], "template": [["T", "float16"], ["ROWS", 1], ["TG", 128], ["VEC", 8]],
      "config": {"ROWS": 1, "TG": 128, "VEC": 8}, "median_us": 1.0}, r"its tg \[256, 1, 1\] is not the threadgroup"),
    ({"tg": "128", "template": [["T", "float16"], ["ROWS", 1], ["TG", 128], ["VEC", 8]], "median_us": 1.0},
     r"its tg '128' is no threadgroup"),
], ids=["a template parameter twice", "template and config disagree", "tg and template disagree",
        "tg and a ZMLX-trimmed template disagree", "tg and config disagree", "a tg that is no threadgroup"])
def test_an_entry_that_contradicts_itself_is_timed_again_and_replaced(real_bundle, tmp_path, value, why):
    load_bundle(real_bundle[1], strict=True)
    path = tmp_path / "autotune_v3.json"
    dkey, key = _cache_with(path, value)
    measure = Measure()
    with pytest.warns(UserWarning, match=f"the cached entry of rmsnorm .* is not used.*{why}") as caught:
        result = tune("rmsnorm", SHAPE, "float16", device=H200, measure=measure, cache_path=str(path))
    assert len([w for w in caught if "is not used" in str(w.message)]) == 1
    assert result.source == "timed" and measure.calls and result.median_us == _time(result.config)
    entry = json.loads(path.read_text())["devices"][dkey]["entries"][key]
    assert entry["config"] == result.config and entry["median_us"] == result.median_us
    names = [name for name, _ in entry["template"]]
    assert len(names) == len(set(names)) and not cache.contradiction(entry)


def test_contradiction_says_what_contradicts(tmp_path):
    assert cache.contradiction({"tg": [128, 1, 1], "template": TEMPLATE_TWICE}) == \
        "its template names 'TG' twice (128 and 64)"
    assert cache.config_of({"tg": [128, 1, 1], "template": TEMPLATE_TWICE}, ["ROWS", "TG", "VEC"]) is None
    assert "its config gives 'TG' 128, its template 64" == cache.contradiction(
        {"config": {"TG": 128}, "template": [["T", "float16"], ["TG", 64]]})
    written = cache.entry_value({"TG": 128, "VEC": 8, "ROWS": 1}, "float16")
    assert cache.contradiction(written) == "" and cache.config_of(written) == {"TG": 128, "VEC": 8, "ROWS": 1}
    zmlx_saved = {"tg": [128, 1, 1], "template": [["T", "float16"], ["ROWS", 1], ["TG", 128], ["VEC", 8]]}
    assert cache.config_of(zmlx_saved, ["ROWS", "TG", "VEC"]) == {"ROWS": 1, "TG": 128, "VEC": 8}


@pytest.mark.parametrize("tg", [[128, 1, 1], [128], None], ids=["as launched", "padded with 1s", "no tg"])
def test_an_entry_whose_tg_is_the_launched_threadgroup_is_a_hit(real_bundle, tmp_path, tg):
    load_bundle(real_bundle[1], strict=True)
    path = tmp_path / "autotune_v3.json"
    value = {"template": [["T", "float16"], ["ROWS", 1], ["TG", 128], ["VEC", 8]], **({"tg": tg} if tg else {})}
    _cache_with(path, value)
    measure = Measure()
    result = tune("rmsnorm", SHAPE, "float16", device=H200, measure=measure, cache_path=str(path))
    assert (result.source, result.config, measure.calls) == ("cache", {"ROWS": 1, "TG": 128, "VEC": 8}, [])


def test_threadgroup_disagreement_says_what_disagrees():
    template = [["T", "float16"], ["TG", 128]]
    assert cache.threadgroup_disagreement({"tg": [128, 1, 1], "template": template}, (128, 1, 1)) == ""
    assert cache.threadgroup_disagreement({"template": template}, (128, 1, 1)) == ""
    assert cache.threadgroup_disagreement({"tg": [64, 2, 1], "template": template}, (128, 1, 1)) == \
        "its tg [64, 2, 1] is not the threadgroup its parameters launch ([128, 1, 1])"
    for junk in ([True, 1, 1], [], [1, 1, 1, 1], [128.0, 1, 1], {"x": 1}):
        assert cache.threadgroup_disagreement({"tg": junk}, (128, 1, 1)).startswith(f"its tg {junk!r} is no")
