"""A device registered in the store (`devices add`) is published as a catalog chip is: its profile with the record's
figures, a lookup table when asked for by its name, and lookups answered from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).parents[1] / "pipeline"))

from bundle_fixtures import fill_toy, latest_dir  # noqa: E402
from device_records import ACME, record  # noqa: E402
from zmlx_pipeline.data.registered import register_device  # noqa: E402
from zmlx_pipeline.data.store import Store  # noqa: E402
from zmlx_pipeline.publish import publish  # noqa: E402
from zmlx_pipeline.publish.build import device_records  # noqa: E402


def test_a_registered_device_gets_its_profile_and_table_from_its_record(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        fill_toy(store)  # the toy kernel measured on an H100 and an H200
        register_device(store, record(tmp_path / "acme.json"))
        records = device_records(store)
        out = publish(store, tmp_path / "bundles", devices=["Acme X1"], record=False, jobs=1)
    assert records["acme-x1"]["fp32_tflops"] == ACME["fp32_tflops"] and records["acme-x1"]["in_catalog"] is False
    assert out["devices_with_tables"] == 3 and out["measured_devices"] == ["nvidia-h100-sxm", "nvidia-h200"]
    assert out["no_entries"] == {}  # a config of the toy kernel fits every device
    root = latest_dir(tmp_path / "bundles")
    profile = json.loads((root / "profiles.json").read_text())["devices"]["acme-x1"]
    assert {k: profile[k] for k in ("name", "gpu_cores", "memory_bandwidth_gbps", "fp32_tflops", "in_catalog")} == {
        "name": "Acme X1 Accelerator", "gpu_cores": 20, "memory_bandwidth_gbps": 192.0, "fp32_tflops": 10.75,
        "in_catalog": False}
    assert profile["evidence"] == "extrapolated"  # an Ada chip answered from the Hopper ones measured
    assert "acme-x1" in json.loads((root / "tables.json").read_text())["devices"]

    from zmlx_pipeline.runtime import load_bundle, predicted_config

    load_bundle(root, strict=True)
    answer = predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="acme-x1")
    assert answer.evidence == "extrapolated" and set(answer.config) == {"TG", "VEC"}


def test_the_gpu_a_process_detects_is_the_registered_device_its_name_tells(tmp_path, monkeypatch):
    """A GPU the catalog lacks, registered in the store a bundle was published from, is found by the name its backend
    reports (and its backend and core count): its lookups and profile answer from the device's table, not with the
    default config; one of another core count still gets the default."""
    import types

    import zmlx_pipeline.data.detect as detect
    import zmlx_pipeline.runtime as rt
    from zmlx_pipeline.runtime.device import forget_current_device
    from zmlx_pipeline.runtime.lookup import clear_cache

    with Store(tmp_path / "s.duckdb") as store:
        fill_toy(store)
        register_device(store, record(tmp_path / "acme.json"))
        publish(store, tmp_path / "bundles", devices=["acme-x1"], record=False, jobs=1)
    bundle = rt.load_bundle(latest_dir(tmp_path / "bundles"), strict=True)
    assert json.loads(bundle.data("profiles.json"))["devices"]["acme-x1"]["aliases"] == ["Acme X1"]
    monkeypatch.delenv("ZMLX_PIPELINE_DEVICE", raising=False)
    shape = {"rows": 64, "cols": 4096}
    for reported, cores, found in (("NVIDIA Acme X1 Accelerator", 20, "acme-x1"), ("Acme X1", 20, "acme-x1"),
                                   ("NVIDIA Acme X1 Accelerator", 10, None), ("NVIDIA Acme X2", 20, None)):
        seen = types.SimpleNamespace(device_id="unknown", reported_name=reported, backend="cuda", gpu_cores=cores,
                                     known=False, spec=None)
        monkeypatch.setattr(detect, "detect_device", lambda *a, seen=seen, **k: seen)
        forget_current_device()
        clear_cache()  # the answers remembered for this process's device
        rt.get_current_device_profile.cache_clear()
        answer = rt.predicted_config("toy_scale", shape, "float16")
        assert answer.device == found, reported
        if found:
            assert answer.evidence == "extrapolated" and answer.note.startswith(
                f"this GPU ({reported}) is acme-x1, a device registered in the store bundle {bundle.bundle_id} was "
                "published from. ")
            assert rt.get_current_device_profile().device_id == "acme-x1"
        else:
            assert answer.evidence == "default" and answer.note.startswith(f"this GPU ({reported}) is not in the catalog")
            assert rt.get_current_device_profile().device_id is None
    forget_current_device()
    rt.get_current_device_profile.cache_clear()


def test_publish_writes_registered_devices_names_the_runtime_loads(tmp_path):
    """Whatever names a store's devices bear, the bundle publish writes loads (publish itself loads it strictly): a
    registered device with no aliases lists none, a binned variant of a registered device shares its name, and GPUs
    measured without a registration keep the names their backend reported (a catalog chip's, a registered one's)."""
    with Store(tmp_path / "s.duckdb") as store:
        fill_toy(store, devices=("nvidia-h200",))
        register_device(store, record(tmp_path / "acme.json"))
        register_device(store, record(tmp_path / "acme-10.json", id="acme-x1-10sm", variant="acme-x1-10sm",
                                      gpu_cores=10, fp32_tflops=5.375, aliases=[]))
        for device_id, name in (("unknown-nvidia-h200", "NVIDIA H200"), ("unknown-acme", "Acme X1 Accelerator")):
            store.upsert_device({"device_id": device_id, "name": name, "backend": "cuda", "gpu_cores": 20,
                                 "in_catalog": False, "flagged_unknown": True})
        publish(store, tmp_path / "bundles", devices=["acme-x1"], record=False, jobs=1)
    root = latest_dir(tmp_path / "bundles")
    profiles = json.loads((root / "profiles.json").read_text())["devices"]
    assert profiles["acme-x1-10sm"]["aliases"] == [] and profiles["acme-x1-10sm"]["name"] == "Acme X1 Accelerator"
    assert "aliases" not in profiles["unknown-acme"] and profiles["unknown-nvidia-h200"]["in_catalog"] is False

    from zmlx_pipeline.runtime import load_bundle

    assert load_bundle(root, strict=True).root == root
