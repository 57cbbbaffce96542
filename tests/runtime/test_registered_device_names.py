"""A device registered in the store (`devices add`) is named in lookups as a catalog chip is: by its id, or by its
name or an alias as people write them (answered under its id); a name of several such devices, or of none, is
refused as before. A core limit of it (`acme-x1@10sm`) is refused, as import and ingest refuse it (a core limit is
of a catalog chip), unless the bundle holds that very id."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "pipeline"))

from bundle_fixtures import build_registered, latest_dir  # noqa: E402
from device_records import record  # noqa: E402
from rehashed_bundles import rehashed  # noqa: E402
from zmlx_pipeline.runtime import (  # noqa: E402
    UnknownDeviceError,
    get_device_profile,
    load_bundle,
    predicted_config,
    tune,
)
from zmlx_pipeline.runtime.lookup import lookup  # noqa: E402
from zmlx_pipeline.runtime.profiles import profile_table  # noqa: E402

SHAPE = {"rows": 64, "cols": 4096}
NAMES = ["Acme X1", "acme x1", "ACME-X1", "Acme X1 Accelerator", "NVIDIA Acme X1 Accelerator"]


@pytest.fixture(scope="module")
def publish_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("registered")
    return build_registered(root, record(root / "acme.json"))[1]


def _predict(device):
    return predicted_config("toy_scale", SHAPE, "float16", device=device)


@pytest.mark.parametrize("name", NAMES)
def test_a_registered_devices_name_or_alias_is_answered_under_its_id(publish_dir, name):
    load_bundle(publish_dir, strict=True)
    by_id, by_name = _predict("acme-x1"), _predict(name)
    assert by_name.device == "acme-x1" and by_name.note == f"device {name!r} read as acme-x1. {by_id.note}"
    assert (by_name.config, by_name.candidates, by_name.evidence) == (by_id.config, by_id.candidates, by_id.evidence)
    assert lookup("toy_scale", SHAPE, "float16", device=name)["device"] == "acme-x1"
    assert get_device_profile(name).device_id == "acme-x1"
    (row,) = profile_table([name])
    assert row["device_id"] == "acme-x1" and row["note"] == f"{name!r} read as acme-x1"


def test_a_registered_name_in_the_environment_is_answered_under_its_id(publish_dir, monkeypatch):
    from zmlx_pipeline.runtime.device import forget_current_device

    load_bundle(publish_dir, strict=True)
    monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", "Acme X1")
    forget_current_device()
    answer = predicted_config("toy_scale", SHAPE, "float16")
    assert answer.device == "acme-x1" and answer.note.startswith("device 'Acme X1' read as acme-x1. ")
    forget_current_device()


def test_a_tune_for_a_registered_name_caches_under_its_id(publish_dir, tmp_path):
    load_bundle(publish_dir, strict=True)
    path = tmp_path / "autotune_v3.json"
    result = tune("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", device="Acme X1", cache_path=str(path),
                  device_aware=False, measure=lambda spec, cfg, shape, dtype: ("ok", 1.0 if cfg["TG"] == 128 else 10.0))
    assert result.source == "timed" and result.config["TG"] == 128
    assert [key.rpartition("_")[0] for key in json.loads(path.read_text())["devices"]] == ["acme-x1"]


def test_an_unknown_name_is_still_refused(publish_dir):
    load_bundle(publish_dir, strict=True)
    with pytest.raises(UnknownDeviceError, match=r"^unknown device 'Acme X2': neither a catalog id"):
        _predict("Acme X2")


def test_a_name_of_two_registered_devices_is_refused_naming_both(publish_dir, tmp_path):
    def twin(profiles):  # a binned variant: the same names, fewer cores (a bundle may hold no other name twice)
        profiles["devices"]["acme-x1b"] = {**profiles["devices"]["acme-x1"], "device_id": "acme-x1b", "gpu_cores": 16}

    load_bundle(rehashed(publish_dir, tmp_path / "twins", {"profiles.json": twin}), strict=True)
    for name in ("Acme X1", "Acme X1 Accelerator"):
        for call in (lambda: _predict(name), lambda: lookup("toy_scale", SHAPE, "float16", device=name),
                     lambda: get_device_profile(name)):
            with pytest.raises(UnknownDeviceError, match=rf"'{name}' does not name one chip; it may be acme-x1, "
                                                         r"acme-x1b$"):
                call()
    assert _predict("acme-x1b").device == "acme-x1b"  # each still answers by its id


LIMITED = "limits acme-x1, a device registered in the store; a core limit (@<N>sm) is only of a catalog chip (give acme-x1)"


@pytest.mark.parametrize("device", ["acme-x1@10sm", "Acme X1@10sm", "acme-x1@19sm", "acme-x1@20sm"])
def test_a_core_limit_of_a_registered_device_is_refused_as_import_refuses_it(publish_dir, tmp_path, device):
    load_bundle(publish_dir, strict=True)
    message = f"^device {device!r} {LIMITED}$".replace("(", r"\(").replace(")", r"\)")
    calls = [lambda: _predict(device), lambda: lookup("toy_scale", SHAPE, "float16", device=device),
             lambda: tune("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", device=device,
                          cache_path=str(tmp_path / "c.json"), measure=lambda *a: ("ok", 1.0))]
    for call in calls:
        with pytest.raises(UnknownDeviceError, match=message):
            call()
    with pytest.raises(UnknownDeviceError, match=LIMITED.replace("(", r"\(").replace(")", r"\)")):
        get_device_profile(device)
    assert _predict("nvidia-h200@66sm").device == "nvidia-h200"  # a catalog chip's limit is answered as before


def test_a_core_limit_of_a_registered_device_the_bundle_holds_is_answered(publish_dir, tmp_path):
    def limited(profiles):
        whole = profiles["devices"]["acme-x1"]
        profiles["devices"]["acme-x1@10sm"] = {**whole, "device_id": "acme-x1@10sm", "gpu_cores": 10,
                                               "core_limited_from": "acme-x1", "name": "Acme X1 Accelerator [10 SMs]"}

    load_bundle(rehashed(publish_dir, tmp_path / "held", {"profiles.json": limited}), strict=True)
    assert get_device_profile("acme-x1@10sm").gpu_cores == 10
    assert lookup("toy_scale", SHAPE, "float16", device="acme-x1@10sm")["config"] is not None
    with pytest.raises(UnknownDeviceError, match=LIMITED.replace("(", r"\(").replace(")", r"\)")):
        _predict("acme-x1@12sm")


def test_the_bundle_holds_the_registered_device(publish_dir):
    profile = json.loads((latest_dir(publish_dir) / "profiles.json").read_text())["devices"]["acme-x1"]
    assert profile["in_catalog"] is False and profile["aliases"] == ["Acme X1"]


def test_a_gpu_measured_without_a_registration_is_no_registered_device(publish_dir, tmp_path, monkeypatch):
    """A GPU the catalog lacks, measured but never registered, is published listing no aliases: it shares the
    registered device's name unchecked, so neither detection nor a name nor a core limit takes it for one."""
    from zmlx_pipeline.runtime import device

    def measured(profiles):
        whole = profiles["devices"]["acme-x1"]
        profiles["devices"]["unknown-acme"] = {k: v for k, v in whole.items() if k != "aliases"} | {
            "device_id": "unknown-acme"}

    bundle = load_bundle(rehashed(publish_dir, tmp_path / "measured", {"profiles.json": measured}), strict=True)
    assert not device.is_registered(bundle.profiles["unknown-acme"]) and device.is_registered(
        bundle.profiles["acme-x1"])
    monkeypatch.setattr(device, "_DETECTED", [("NVIDIA Acme X1 Accelerator", "cuda", 20)])
    assert device.registered_for_detected(bundle.profiles) == "acme-x1"
    assert _predict("Acme X1 Accelerator").device == "acme-x1"
    assert get_device_profile("unknown-acme@10sm").gpu_cores == 10  # a limit of it is not refused as a registered one's
