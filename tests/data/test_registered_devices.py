"""Devices registered in a store: found by id and name only where no catalog chip is, checked as catalog rows are,
stored once, carried by their shards, and refused when read back changed."""

from __future__ import annotations

import dataclasses
import json

import duckdb
import pytest

from zmlx_pipeline.data.catalog import (
    AmbiguousDevice,
    CatalogError,
    DeviceSpec,
    catalog_problems,
    catalog_sources,
    UnknownDevice,
    get_device,
    registration_problems,
    resolve_device,
    validate_catalog,
)
from zmlx_pipeline.data.registered import DeviceRecordError, register_device
from zmlx_pipeline.data.store import CorruptStore, DeviceTaken, Store

CITED = {"gpu_cores": "techpowerup-gpu-db", "memory_bandwidth_gbps": "techpowerup-gpu-db",
         "max_threads_per_threadgroup": "cuda-guide-cc", "simd_width": "cuda-guide-cc",
         "threadgroup_memory_bytes": "cuda-guide-cc", "architecture": "cuda-guide-cc", "l2_bytes": "techpowerup-gpu-db",
         "clock_mhz": "techpowerup-gpu-db", "fp32_tflops": "derived-gpu-fp32", "memory_gb": "techpowerup-gpu-db",
         "default_threadgroup": "convention-default-threadgroup"}


def chip(device_id: str, name: str, *aliases: str, **figures) -> DeviceSpec:
    """A made-up Ada chip: the RTX 4060 Laptop GPU's figures under another id and name."""
    return dataclasses.replace(get_device("nvidia-rtx-4060-laptop"), id=device_id, name=name, variant=device_id,
                               aliases=aliases, notes=None, sources=dict(CITED), **figures)


def record_file(tmp_path, spec: DeviceSpec, name: str = "record.json"):
    row = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
           if getattr(spec, f.name) is not None}
    row["aliases"] = list(spec.aliases)
    path = tmp_path / name
    path.write_text(json.dumps(row))
    return path


def test_a_registered_device_is_found_by_its_id_and_names_only_where_no_catalog_chip_is():
    acme = chip("acme-x1", "Acme X1 Accelerator", "Acme X1")
    assert resolve_device("acme-x1", (acme,)) is acme
    assert resolve_device("NVIDIA Acme X1 Accelerator", (acme,)) is acme  # brand words dropped as for the catalog
    assert resolve_device("acme_x1", (acme,)) is acme
    # a catalog chip's names stay its own, whatever is registered
    assert resolve_device("RTX 4060 Laptop GPU", (acme,)).id == "nvidia-rtx-4060-laptop"
    with pytest.raises(UnknownDevice) as info:
        resolve_device("Acme X1", ())
    assert str(info.value) == "'Acme X1' is neither a catalog id nor a catalog device name"
    with pytest.raises(UnknownDevice) as info:
        resolve_device("Acme X9", (acme,))
    assert str(info.value) == ("'Acme X9' is neither a catalog id nor a catalog device name, nor one registered in "
                               "the store")


def test_a_name_two_registered_devices_share_tells_neither():
    x1, x2 = chip("acme-x1", "Acme X1 Fast", "Acme X1"), chip("acme-x1b", "Acme X1 Slow", "Acme X1")
    with pytest.raises(AmbiguousDevice) as info:
        resolve_device("Acme X1", (x1, x2))
    assert info.value.candidates == ("acme-x1", "acme-x1b")


def test_registration_is_checked_as_the_catalog_is_beside_the_catalog_and_the_registered():
    acme = chip("acme-x1", "Acme X1 Accelerator", "Acme X1")
    assert registration_problems(acme, {}) == []
    texts = [p.text for p in registration_problems(chip("acme-x2", "Acme X2", "Acme X1"), {}, (acme,))]
    assert texts == ["device 'acme-x2': name/alias 'Acme X1' also names 'acme-x1'",
                     "alias 'Acme X1' is listed by more than one device"]
    (problem,) = registration_problems(chip("acme-x3", "Acme X3", memory_gb=float("nan")), {})
    assert problem == ("device 'acme-x3': memory_gb must be a positive number, got nan",
                       "give memory_gb as a finite number above 0")
    # a registered device a later catalog row clashes with stays registered: only the new record's problems count
    old = chip("old-rtx-500", "RTX 500 Ada Laptop GPU 4GB", "RTX 500 Ada")
    assert registration_problems(acme, {}, (old,)) == []


def test_the_catalog_check_refuses_figures_no_chip_has():
    t4 = get_device("nvidia-t4")
    odd = [dataclasses.replace(t4, **{"id": f"x-{i}", "name": f"X {i}", "aliases": (), **figure})
           for i, figure in enumerate([{"clock_mhz": float("inf")}, {"memory_gb": float("nan")}, {"gpu_cores": 40.5},
                                       {"vendor": "intel"}, {"name": 7}, {"l2_bytes": 2**40}])]
    assert validate_catalog((t4, *odd)) == [
        "device 'x-0': clock_mhz must be a positive number, got inf",
        "device 'x-1': memory_gb must be a positive number, got nan",
        "device 'x-2': gpu_cores must be a whole number, got 40.5",
        "device 'x-3': vendor 'intel' is not one of apple, nvidia, amd",
        "device 'x-4': name must be text, got 7",
        "device 'x-5': l2_bytes 1099511627776 is past any chip's (at most 2147483647)",
    ]


def test_the_catalog_check_refuses_limits_that_contradict_each_other_or_the_backend():
    """The rules every catalog row keeps (validate_catalog() is empty), which a registered device keeps too."""
    t4, m1, amd = get_device("nvidia-t4"), get_device("apple-m1-7c"), get_device("amd-radeon-rx-7900-xtx")
    odd = [dataclasses.replace(row, **{"id": f"x-{i}", "name": f"X {i}", "aliases": (), "gpu_arch": None, **change})
           for i, (row, change) in enumerate([
               (t4, {"simd_width": 12, "default_threadgroup": 48}), (t4, {"default_threadgroup": 2048}), (t4, {"default_threadgroup": 48}),
               (t4, {"architecture": "sm_20"}), (t4, {"architecture": "gfx1100"}), (m1, {"architecture": "sm_75"}),
               (amd, {"architecture": "apple9"}), (t4, {"architecture": "sm_90a"}), (amd, {"architecture": "gfx90a"})])]
    assert [p for p in validate_catalog((t4, *odd)) if "gpu_arch" not in p] == [
        "device 'x-0': simd_width 12 is not a power of two",
        "device 'x-1': default_threadgroup 2048 is above max_threads_per_threadgroup 1024",
        "device 'x-2': default_threadgroup 48 is not a multiple of simd_width 32",
        "device 'x-3': architecture 'sm_20' is no cuda architecture",
        "device 'x-4': architecture 'gfx1100' is no cuda architecture",
        "device 'x-5': architecture 'sm_75' is no metal architecture",
        "device 'x-6': architecture 'apple9' is no rocm architecture",
    ]


def test_a_declared_source_gives_an_https_address_where_it_gives_one():
    """The catalog's conventions (convention-*, recorded-*) cite no page; any other address is https://."""
    t4 = get_device("nvidia-t4")
    sources = {"convention-x": {"title": "a rule of ours"}, "page": {"title": "t", "url": "https://example.com/a"},
               "plain": {"title": "t", "url": "http://example.com/a"}, "script": {"title": "t", "url": "javascript:x"},
               "no host": {"title": "t", "url": "https:///a"}}
    texts = [p.text for p in catalog_problems((t4,), {**catalog_sources(), **sources})]
    assert texts == ["source 'plain': url 'http://example.com/a' is not an https:// address",
                     "source 'script': url 'javascript:x' is not an https:// address",
                     "source 'no host': url 'https:///a' is not an https:// address"]


def test_a_row_missing_a_field_names_it():
    with pytest.raises(CatalogError, match=r"^device 'x': missing fields gpu_cores, clock_mhz$"):
        DeviceSpec.from_json({k: v for k, v in dataclasses.asdict(get_device("nvidia-t4")).items()
                              if k not in ("gpu_cores", "clock_mhz")} | {"id": "x"})


def test_a_device_is_registered_once_and_never_over_a_measured_one(store, tmp_path):
    acme = chip("acme-x1", "Acme X1 Accelerator", "Acme X1")
    path = record_file(tmp_path, acme)
    assert register_device(store, path)["added"] is True
    assert register_device(store, path)["added"] is False
    assert store.registered_devices() == (acme,)
    with pytest.raises(DeviceTaken, match="registered with another record"):
        register_device(store, record_file(tmp_path, dataclasses.replace(acme, gpu_cores=30), "other.json"))
    # what collect records of a GPU the catalog lacks: its reported name, flagged
    store.upsert_device({"device_id": "unknown-acme-x9", "name": "Acme X9", "backend": "cuda", "in_catalog": False,
                         "flagged_unknown": True, "reported": {"device_name": "Acme X9"}})
    with pytest.raises(DeviceTaken, match="'unknown-acme-x9' is in store .* already, a device measured already"):
        register_device(store, record_file(tmp_path, chip("unknown-acme-x9", "Acme X9"), "x9.json"), replace=True)
    assert [s.id for s in store.registered_devices()] == ["acme-x1"]


def test_replace_gives_a_registered_device_new_figures_and_keeps_its_measurements(store, tmp_path, make_measurement):
    acme = chip("acme-x1", "Acme X1 Accelerator", "Acme X1")
    assert register_device(store, record_file(tmp_path, acme))["added"] is True
    store.record([make_measurement(device_id="acme-x1", kernel="vector_add", config={"block_size_x": 64})])
    store.upsert_device({"device_id": "acme-x1", "reported_name": "NVIDIA Acme X1 Accelerator"})  # as an import does
    mended = dataclasses.replace(acme, memory_bandwidth_gbps=256.0, aliases=("Acme X1", "X1"))
    out = register_device(store, record_file(tmp_path, mended, "mended.json"), replace=True)
    assert (out["added"], out["replaced"]) == (False, True)
    assert store.registered_devices() == (mended,)
    (row,) = store.devices()
    assert (row["memory_bandwidth_gbps"], row["reported_name"], row["in_catalog"]) == (
        256.0, "NVIDIA Acme X1 Accelerator", False)
    assert len(store.measurements(device="acme-x1")) == 1
    again = register_device(store, record_file(tmp_path, mended, "mended.json"), replace=True)
    assert (again["added"], again["replaced"]) == (False, False)  # the same record: nothing changes


def test_a_figure_past_what_a_device_row_holds_is_refused_with_the_file(store, tmp_path):
    path = record_file(tmp_path, chip("acme-x1", "Acme X1", memory_bandwidth_gbps=1e16))
    with pytest.raises(DeviceRecordError) as info:
        register_device(store, path)
    assert str(info.value) == (f"cannot register {path}: device 'acme-x1': memory_bandwidth_gbps must be a finite "
                               "number above 0, not 1e+16; give the chip's own figure; nothing was stored")
    assert store.devices() == []


def test_a_shard_carries_a_registered_device_to_another_store(store, tmp_path, make_measurement):
    acme = chip("acme-x1", "Acme X1 Accelerator", "Acme X1")
    register_device(store, record_file(tmp_path, acme))
    store.record([make_measurement(device_id="acme-x1", kernel="my_norm")])
    store.export_shard(tmp_path / "acme.parquet")
    with Store(tmp_path / "other.duckdb") as other:
        other.ingest_shards([tmp_path / "acme.parquet"])
        assert other.registered_devices() == (acme,)
        assert resolve_device("Acme X1", other.registered_devices()).id == "acme-x1"


def test_a_registration_changed_outside_is_refused_when_read(tmp_path):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        register_device(store, record_file(tmp_path, chip("acme-x1", "Acme X1")))
    con = duckdb.connect(str(db))
    con.execute("UPDATE devices SET reported = '{\"registration\": {\"device\": {\"id\": \"acme-x1\"}}}'")
    con.close()
    with Store(db, read_only=True) as store, pytest.raises(CorruptStore) as info:
        store.registered_devices()
    assert str(info.value).startswith(f"store {db} holds a device registration no `devices add` would write (acme-x1: "
                                      "device 'acme-x1': missing fields name, vendor")


def test_a_registered_figure_changed_outside_is_refused_when_read(tmp_path):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        register_device(store, record_file(tmp_path, chip("acme-x1", "Acme X1")))
    con = duckdb.connect(str(db))
    con.execute("""UPDATE devices SET reported = json_object('registration', json_merge_patch(
        json_extract(reported, '$.registration'), '{"device": {"clock_mhz": -1}}'))""")
    con.close()
    with Store(db, read_only=True) as store, pytest.raises(CorruptStore, match=r"\(acme-x1: device 'acme-x1': "
                                                                                r"clock_mhz must be a positive number, "
                                                                                r"got -1\)"):
        store.registered_devices()
