"""A device registered in the store (`devices add`) with fewer threads per threadgroup than the default (256 here) is
held to its own limits: tune reads them, and its cache metadata, from the bundle's profile of it (the catalog has no
row), so no config of 512 or 1024 threads is offered, timed or launched; lookups' legal configs respect them too,
for a kernel whose published constraints never read the thread limit (imported measurements) as well, and publish
holds the device's tables to the same rule (no entry names a config past 256; none at all where no config fits),
leaving a catalog chip's as they were.

Nothing is timed on a GPU: the measurer and the launched function are test doubles."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "pipeline"))

from bundle_fixtures import build_registered, latest_dir  # noqa: E402
from device_records import record  # noqa: E402
from zmlx_pipeline.kernels.registry import get_kernel  # noqa: E402
from zmlx_pipeline.kernels.spec import Limits  # noqa: E402
from zmlx_pipeline.runtime import (  # noqa: E402
    LaunchRefused,
    autotune,
    candidates,
    get_device_profile,
    load_bundle,
    predicted_config,
    tune,
)
from zmlx_pipeline.runtime.lookup import lookup  # noqa: E402
from zmlx_pipeline.runtime.tuner import ranked_configs  # noqa: E402

SHAPE = {"rows": 4096, "cols": 4096}
TOY = {"rows": 64, "cols": 4096}
NAMES = ["acme-x1", "Acme X1"]
#: the registered device's limits, as its record gives them
ACME_LIMITS = Limits(max_threads=256, simd_width=32, tg_mem_bytes=49152)


@pytest.fixture(scope="module")
def publish_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("registered-256")
    return build_registered(root, record(root / "acme.json", max_threads_per_threadgroup=256))[1]


@pytest.fixture
def bundle(publish_dir):
    return load_bundle(publish_dir, strict=True)


class Recorder:
    """A measurer that times every config it is given from its threadgroup (smaller is faster)."""

    def __init__(self, status: str = "ok"):
        self.calls: list[dict] = []
        self.status = status

    def __call__(self, spec, config, shape, dtype):
        self.calls.append(dict(config))
        return (self.status, float(config["TG"]) if self.status == "ok" else None)


def _tgs(configs) -> set[int]:
    return {int(c["TG"]) for c in configs}


def _legal_here() -> list[dict]:
    return get_kernel("rmsnorm").legal_configs(SHAPE, "float16", ACME_LIMITS)


def test_rmsnorm_has_configs_past_256_threads_elsewhere():
    wide = get_kernel("rmsnorm").legal_configs(SHAPE, "float16", Limits(max_threads=1024, tg_mem_bytes=49152))
    assert {512, 1024} <= _tgs(wide) and max(_tgs(_legal_here())) == 256


@pytest.mark.parametrize("device", NAMES)
@pytest.mark.parametrize("device_aware", [True, False])
def test_tune_never_times_a_config_past_the_registered_limit(bundle, tmp_path, device, device_aware):
    measure = Recorder()
    path = tmp_path / "autotune_v3.json"
    result = tune("rmsnorm", SHAPE, "float16", device=device, device_aware=device_aware, measure=measure,
                  cache_path=str(path))
    assert measure.calls and max(_tgs(measure.calls)) <= 256
    assert result.legal == len(_legal_here()) and result.config["TG"] <= 256
    if not device_aware:  # every legal config of the device timed: exactly those of its own limits
        assert sorted(map(json.dumps, measure.calls)) == sorted(map(json.dumps, _legal_here()))
    (section,) = json.loads(path.read_text())["devices"].values()
    meta = section["metadata"]
    assert meta["device_id"] == "acme-x1" and meta["gpu_cores"] == 20 and meta["family"] == "ada"
    assert meta["memory_bandwidth_gbps"] == 192.0 and meta["default_threadgroup"] == 256


def test_an_untimed_answer_is_legal_on_the_registered_device(bundle):
    result = tune("rmsnorm", SHAPE, "float16", device="Acme X1", use_cache=False, measure=Recorder("wrong_result"))
    assert result.source in ("default", "predicted") and result.config["TG"] <= 256


def test_the_ranked_fallbacks_hold_no_config_past_the_limit(bundle):
    ranked = ranked_configs(get_kernel("rmsnorm"), SHAPE, "float16", device="Acme X1")
    assert len(ranked) == len(_legal_here()) and max(_tgs(ranked)) == 256


def test_autotune_never_launches_a_config_past_the_limit(bundle, tmp_path):
    launched: list[dict] = []

    @autotune("rmsnorm", device="Acme X1", measure=Recorder(), cache_path=str(tmp_path / "autotune_v3.json"),
              shape=lambda x: dict(SHAPE), dtype=lambda x: "float16")
    def rmsnorm(x, config=None):
        launched.append(dict(config))
        raise ValueError("refused")  # every config refused: the wrapper walks every fallback it has

    with pytest.raises(LaunchRefused):
        rmsnorm(object())
    assert len(launched) == len(_legal_here()) and max(_tgs(launched)) == 256


def _registered_gpu(monkeypatch):
    """This process's GPU: the registered device, which the catalog does not know (detected, not named)."""
    import zmlx_pipeline.data.detect as detect
    from zmlx_pipeline.runtime import tuner
    from zmlx_pipeline.runtime.device import forget_current_device

    found = types.SimpleNamespace(device_id="unknown-acme-x1-accelerator", reported_name="Acme X1 Accelerator",
                                  backend="cuda", gpu_cores=20, known=False, spec=None)
    monkeypatch.delenv("ZMLX_PIPELINE_DEVICE", raising=False)
    monkeypatch.setattr(detect, "detect_device", lambda *a, **k: found)
    monkeypatch.setattr(tuner, "_DEVICES", {})
    forget_current_device()


def test_tune_on_the_detected_registered_gpu_reads_its_limits(bundle, tmp_path, monkeypatch):
    _registered_gpu(monkeypatch)
    measure = Recorder()
    path = tmp_path / "autotune_v3.json"
    result = tune("rmsnorm", SHAPE, "float16", device_aware=False, measure=measure, cache_path=str(path))
    assert max(_tgs(measure.calls)) == 256 and result.legal == len(_legal_here())
    (key,) = json.loads(path.read_text())["devices"]
    assert key.rpartition("_")[0] == "acme-x1"


def test_a_bare_autotune_on_the_detected_registered_gpu_keeps_to_its_limit(bundle, monkeypatch):
    _registered_gpu(monkeypatch)
    got = autotune(lambda x, threadgroup=None: threadgroup)(types.SimpleNamespace(shape=(8, 4096), dtype="float16"))
    assert got[0] <= 256


@pytest.mark.parametrize("device", NAMES)
def test_lookups_offer_no_config_past_the_registered_limit(bundle, device):
    answer = predicted_config("toy_scale", TOY, "float16", device=device)
    assert answer.device == "acme-x1" and answer.config["TG"] <= 256
    assert answer.candidates and max(_tgs(answer.candidates)) <= 256
    assert max(_tgs(candidates("toy_scale", TOY, "float16", k=12, device=device))) <= 256
    assert max(_tgs(lookup("toy_scale", TOY, "float16", device=device)["candidates"])) <= 256
    profile = get_device_profile(device)
    assert profile.max_threads_per_threadgroup == 256 and max(profile.threadgroup_candidates) <= 256


def test_a_catalog_chip_is_still_offered_its_wider_configs(bundle):
    answer = predicted_config("toy_scale", TOY, "float16", device="nvidia-h200")
    assert 512 in _tgs(answer.candidates)


def _entries(publish_dir: Path, device: str) -> tuple[list[dict], list[tuple[str, str, dict]]]:
    """The toy kernel's configs and every (kind, shape key, entry) of its float16 table for `device` in the bundle."""
    latest = latest_dir(publish_dir)
    configs = json.loads((latest / "kernels.json").read_text())["kernels"]["toy_scale"]["configs"]
    table = json.loads((latest / json.loads((latest / "tables.json").read_text())["devices"][device]).read_text())
    return configs, [(kind, key, entry) for kind, entries in table["kernels"]["toy_scale"]["float16"].items()
                     for key, entry in entries.items()]


def test_published_entries_name_no_config_past_the_registered_limit(publish_dir):
    configs, entries = _entries(publish_dir, "acme-x1")
    fitting = sum(c["TG"] <= 256 for c in configs)
    assert len(entries) == 6 and fitting == 9
    for _, _, entry in entries:
        assert configs[entry["best"]]["TG"] <= 256 and entry["best"] == entry["ranked"][0]
        assert max(configs[i]["TG"] for i in entry["ranked"]) <= 256
        assert entry["n_legal"] == len(entry["ranked"]) == fitting


#: the H200's float16 entries of this bundle (kind, shape key) -> best (TG, VEC), as published before publish held
#: each device to the runtime's thread rule: a catalog chip of 1024 threads keeps every one, 512-thread configs too
H200_BESTS = {
    ("buckets", "10,0"): (64, 2), ("buckets", "10,6"): (64, 2), ("buckets", "10,12"): (256, 2),
    ("buckets", "12,0"): (64, 2), ("buckets", "12,6"): (256, 2), ("buckets", "12,12"): (256, 2),
    ("measured", "1024,1"): (64, 2), ("measured", "1024,64"): (64, 2), ("measured", "1024,4096"): (256, 2),
    ("measured", "4096,1"): (64, 2), ("measured", "4096,64"): (256, 2), ("measured", "4096,4096"): (256, 2),
}


def test_a_catalog_chips_entries_are_unchanged_by_the_rule(publish_dir):
    configs, entries = _entries(publish_dir, "nvidia-h200")
    got = {(kind, key): (configs[e["best"]]["TG"], configs[e["best"]]["VEC"]) for kind, key, e in entries}
    assert got == H200_BESTS
    assert all(e["n_legal"] == len(e["ranked"]) == 12 and 512 in {configs[i]["TG"] for i in e["ranked"]}
               for _, _, e in entries)


def test_a_device_no_config_fits_gets_no_entry_and_lookups_say_so(tmp_path_factory):
    root = tmp_path_factory.mktemp("registered-32")
    publish_dir = build_registered(root, record(root / "acme.json", max_threads_per_threadgroup=32,
                                                default_threadgroup=32))[1]
    latest = latest_dir(publish_dir)
    assert "acme-x1" not in json.loads((latest / "tables.json").read_text())["devices"]
    load_bundle(publish_dir, strict=True)
    answer = predicted_config("toy_scale", TOY, "float16", device="Acme X1")
    assert (answer.config, answer.evidence, answer.candidates) == (None, "none", [])
    assert "TG <= max_threads" in answer.note
