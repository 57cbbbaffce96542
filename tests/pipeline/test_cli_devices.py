"""`zmlx-pipeline devices` and `devices add` through click's CliRunner: a device the catalog lacks registered from its
record, refused records as one line with the fix and an untouched store, and the registered device imported, listed
and found by its name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from device_records import ACME, SHEET, record
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.pipeline.cli import cli


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def cache(device_name: str) -> dict:
    """A small Kernel Tuner cache (schema 1.0.0) naming its GPU: two configs, each timed twice."""
    entry = {"block_size_x": 0, "time": 0.0, "times": [], "compile_time": 310.2, "verification_time": 0,
             "benchmark_time": 1.3, "strategy_time": 0, "framework_time": 0.9, "timestamp": "2024-05-02 10:11:12"}
    timed = ((64, 0.5), (128, 0.25))
    return {"schema_version": "1.0.0", "device_name": device_name, "kernel_name": "vector_add",
            "problem_size": [10000000], "tune_params_keys": ["block_size_x"],
            "tune_params": {"block_size_x": [64, 128]}, "objective": "time",
            "cache": {str(b): {**entry, "block_size_x": b, "time": t, "times": [t, t]} for b, t in timed}}


@pytest.fixture
def db(tmp_path) -> Path:
    """A store holding one imported file, so refused commands have something to leave alone."""
    path = tmp_path / "cli.duckdb"
    seed = tmp_path / "seed" / "A6000.json"
    seed.parent.mkdir()
    seed.write_text(json.dumps(cache("NVIDIA RTX A6000")))
    assert invoke("import", "--db", path, seed).exit_code == 0
    return path


def contents(db: Path) -> tuple:
    with Store(db, read_only=True) as store:
        return store.measurements(), store.runs(), store.devices(), store.registered_devices()


def test_a_record_registers_the_device_once_and_the_listing_marks_it(db, tmp_path):
    path = record(tmp_path / "acme.json")
    result = invoke("devices", "add", path, "--db", db)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == (f"acme-x1 registered in {db}: import its files by the GPU name they "
                                              "report or with --device acme-x1")
    with Store(db, read_only=True) as store:
        (spec,) = store.registered_devices()
        (row,) = [d for d in store.devices() if d["device_id"] == "acme-x1"]
    assert (spec.name, spec.gpu_cores, spec.fp32_tflops, spec.aliases) == (
        "Acme X1 Accelerator", 20, 10.75, ("Acme X1",))
    assert spec.sources["gpu_cores"] == "acme-x1:gpu_cores" and spec.sources["simd_width"] == "cuda-guide-cc"
    assert (row["in_catalog"], row["flagged_unknown"], row["memory_bandwidth_gbps"]) == (False, False, 192.0)
    assert row["reported"]["registration"]["sources"]["acme-x1:gpu_cores"] == SHEET
    before = contents(db)
    again = invoke("devices", "add", path, "--db", db, "--json")  # the same record: nothing changes
    assert again.exit_code == 0, again.output
    out = json.loads(again.output)
    assert (out["added"], out["device"]["id"], out["device"]["registered"]) == (False, "acme-x1", True)
    assert contents(db) == before
    listed = invoke("devices", "--db", db, "--json")
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)["devices"]
    assert [r["id"] for r in rows if r["registered"]] == ["acme-x1"]
    assert not any(r["registered"] for r in rows if r["id"] == "nvidia-rtx-a6000")
    table = invoke("devices", "--db", db, "--vendor", "nvidia")
    assert table.exit_code == 0
    (line,) = [ln for ln in table.output.splitlines() if "acme-x1" in ln]
    assert line.split()[:3] == ["*", "acme-x1", "Acme"]  # registered, not this machine's
    assert f"1 registered in {db} (registered: *)" in table.output
    assert "acme-x1" not in invoke("devices", "--db", db, "--vendor", "amd").output


def test_a_toml_record_registers_as_json_does(tmp_path):
    db = tmp_path / "s.duckdb"
    lines = [f"{k} = {json.dumps(v)}" for k, v in ACME.items() if k != "sources"]
    lines.append("[sources]")
    lines += [f"{k} = {json.dumps(v)}" if isinstance(v, str)
              else f'{k} = {{title = "{v["title"]}", url = "{v["url"]}"}}' for k, v in ACME["sources"].items()]
    path = tmp_path / "acme.toml"
    path.write_text("\n".join(lines) + "\n")
    result = invoke("devices", "add", path, "--db", db, "--json")
    assert result.exit_code == 0, result.output
    with Store(db, read_only=True) as store:
        (spec,) = store.registered_devices()
    assert spec.id == "acme-x1" and spec.l2_bytes == 25165824


def test_the_listing_reads_no_store_that_is_not_there(tmp_path):
    result = invoke("devices", "--db", tmp_path / "none.duckdb", "--json")
    assert result.exit_code == 0, result.output
    assert not any(r["registered"] for r in json.loads(result.output)["devices"])
    assert not (tmp_path / "none.duckdb").exists()


REFUSED = [
    ("missing", {"gpu_cores": None}, "device 'acme-x1': missing field gpu_cores; add each, every figure cited under "
                                     "sources (`zmlx-pipeline devices --json` shows catalog rows)"),
    ("zero", {"memory_bandwidth_gbps": 0}, "device 'acme-x1': memory_bandwidth_gbps must be a positive number, got 0; "
                                           "give memory_bandwidth_gbps as a finite number above 0"),
    ("negative", {"memory_gb": -8}, "device 'acme-x1': memory_gb must be a positive number, got -8; give memory_gb as "
                                    "a finite number above 0"),
    ("infinite", {"clock_mhz": float("inf")}, "device 'acme-x1': clock_mhz must be a positive number, got inf; give "
                                              "clock_mhz as a finite number above 0"),
    ("not a number", {"fp32_tflops": float("nan")}, "device 'acme-x1': fp32_tflops must be a positive number, got nan; "
                                                    "give fp32_tflops as a finite number above 0"),
    ("fraction", {"gpu_cores": 20.5}, "device 'acme-x1': gpu_cores must be a whole number, got 20.5; give gpu_cores "
                                      "as a whole number, without a decimal point"),
    ("uncited", {"sources": {k: v for k, v in ACME["sources"].items() if k != "clock_mhz"}},
     "device 'acme-x1': clock_mhz cites no source; cite where the figure comes from under sources.clock_mhz"),
    ("vendor", {"vendor": "intel"}, "device 'acme-x1': vendor 'intel' is not one of apple, nvidia, amd; give vendor "
                                    "as one of them"),
    ("catalog id", {"id": "nvidia-rtx-500-ada-laptop"},
     "device 'nvidia-rtx-500-ada-laptop': duplicate id; give the device an id of its own"),
    ("catalog name", {"name": "NVIDIA RTX 500 Ada Generation Laptop GPU"},  # same name, other core count: no bin of it
     "device 'acme-x1': its name 'NVIDIA RTX 500 Ada Generation Laptop GPU' is read as catalog chip "
     "nvidia-rtx-500-ada-laptop; give it a name of its own (if it is nvidia-rtx-500-ada-laptop, use that id)"),
    ("catalog alias", {"aliases": ["RTX 500 Ada"]},
     "device 'acme-x1': name/alias 'RTX 500 Ada' also names 'nvidia-rtx-500-ada-laptop'; give the device a name of its "
     "own (if it is nvidia-rtx-500-ada-laptop, use that id)"),
    ("resolves to a chip", {"aliases": ["RTX 4090 Mobile 16GB"]},
     "device 'acme-x1': its name 'RTX 4090 Mobile 16GB' is read as catalog chip nvidia-rtx-4090-laptop; give it a "
     "name of its own (if it is nvidia-rtx-4090-laptop, use that id)"),
    ("id read as a chip", {"id": "rtx-4090"},
     "device 'rtx-4090': its id 'rtx-4090' is read as catalog chip nvidia-rtx-4090; give it an id of its own (if it "
     "is nvidia-rtx-4090, use that id)"),
    ("control character", {"name": "Acme\nX1"}, "device 'acme-x1': name 'Acme\\nX1' holds a control character; write "
                                                "name in printable characters"),
    ("fullwidth name", {"name": "\uff2e\uff36\uff29\uff24\uff29\uff21 \uff28\uff12\uff10\uff10"},
     "device 'acme-x1': name '\uff2e\uff36\uff29\uff24\uff29\uff21 \uff28\uff12\uff10\uff10' holds characters Unicode "
     "compatibility form (NFKC) writes otherwise (as 'NVIDIA H200'); write name in plain characters"),
    ("fullwidth alias", {"aliases": ["\uff32\uff34\uff38 \uff14\uff10\uff19\uff10"]},
     "device 'acme-x1': alias '\uff32\uff34\uff38 \uff14\uff10\uff19\uff10' holds characters Unicode compatibility "
     "form (NFKC) writes otherwise (as 'RTX 4090'); write alias in plain characters"),
    ("fullwidth id", {"id": "\uff41cme-x1"},
     "device '\uff41cme-x1': id '\uff41cme-x1' holds characters Unicode compatibility form (NFKC) writes otherwise "
     "(as 'acme-x1'); write id in plain characters"),
    ("zero-width alias", {"aliases": ["Acme\u200bX1"]}, "device 'acme-x1': alias 'Acme\\u200bX1' holds a format "
                                                         "character (U+200B, zero-width); write alias without it"),
    ("threadgroup above the limit", {"default_threadgroup": 4096},
     "device 'acme-x1': default_threadgroup 4096 is above max_threads_per_threadgroup 1024; give a default threadgroup "
     "the chip can launch (256)"),
    ("threadgroup above a narrow limit", {"default_threadgroup": 256, "max_threads_per_threadgroup": 128},
     "device 'acme-x1': default_threadgroup 256 is above max_threads_per_threadgroup 128; give a default threadgroup "
     "the chip can launch (128)"),
    ("threadgroup of part of a SIMD group, narrow limit", {"default_threadgroup": 100, "max_threads_per_threadgroup": 160},
     "device 'acme-x1': default_threadgroup 100 is not a multiple of simd_width 32; give a whole number of SIMD groups "
     "(160)"),
    ("threadgroup of part of a SIMD group", {"default_threadgroup": 100},
     "device 'acme-x1': default_threadgroup 100 is not a multiple of simd_width 32; give a whole number of SIMD groups "
     "(256)"),
    ("SIMD width of 7", {"simd_width": 7, "default_threadgroup": 252, "max_threads_per_threadgroup": 1022},
     "device 'acme-x1': simd_width 7 is not a power of two; give the chip's SIMD width (32 on NVIDIA and Apple chips, "
     "32 or 64 on AMD's)"),
    ("architecture of no chip", {"architecture": "banana"},
     "device 'acme-x1': architecture 'banana' is no cuda architecture; write it as sm_ and the compute capability, 30 "
     "or more (sm_75, sm_90a)"),
    ("compute capability 1.2", {"architecture": "sm_12"},
     "device 'acme-x1': architecture 'sm_12' is no cuda architecture; write it as sm_ and the compute capability, 30 "
     "or more (sm_75, sm_90a)"),
    ("source without a url", {"sources": {**ACME["sources"], "gpu_cores": {"title": "t"}}},
     "sources.gpu_cores gives no url; give the https:// address of the page the figure comes from, or cite a catalog "
     "source's id"),
    ("script as a url", {"sources": {**ACME["sources"], "gpu_cores": {"title": "t", "url": "javascript:alert(1)"}}},
     "sources.gpu_cores url 'javascript:alert(1)' is not an https:// address; give the https:// address of the page "
     "the figure comes from"),
    ("ftp url", {"sources": {**ACME["sources"], "clock_mhz": {"title": "t", "url": "ftp://x"}}},
     "sources.clock_mhz url 'ftp://x' is not an https:// address; give the https:// address of the page the figure "
     "comes from"),
    ("source of no field", {"sources": {**ACME["sources"], "bogus_field": SHEET}},
     "device 'acme-x1': sources.bogus_field names no field of a device; cite each figure under its own field's name "
     "(gpu_cores, clock_mhz), or leave it out"),
    ("long alias", {"aliases": ["X" * 5000]}, f"device 'acme-x1': alias {'X' * 40!r}... has 5000 characters; give "
                                             "alias in at most 120 characters"),
    ("vendor and backend", {"vendor": "amd"}, "device 'acme-x1': an amd chip runs backend rocm with core_unit cus, not "
                                              "cuda with sms; give backend 'rocm' and core_unit 'cus'"),
    ("unknown field", {"tdp_watts": 35}, "device 'acme-x1': unknown fields ['tdp_watts']; leave them out: a record "
                                         "holds a catalog row's fields (`zmlx-pipeline devices --json` shows them)"),
]


@pytest.mark.parametrize("changes, says", [(c, s) for _, c, s in REFUSED], ids=[i for i, _, _ in REFUSED])
def test_a_record_the_catalog_would_refuse_is_refused_in_one_line_and_stores_nothing(db, tmp_path, changes, says):
    path = record(tmp_path / "acme.json", **changes)
    before = contents(db)
    result = invoke("devices", "add", path, "--db", db)
    assert result.exit_code == 1, result.output
    assert result.output == f"Error: cannot register {path}: {says}; nothing was stored\n"
    assert contents(db) == before


@pytest.mark.parametrize("text, says", [
    ('{"id": "acme-x1", ', "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 19 "
                           "(char 18))"),
    ('["acme-x1"]', "it holds a list, not the device's fields"),
    ('{"id": "acme-x1", "id": "acme-x2"}', "the key 'id' appears twice in one JSON object, with different values "
                                           "(only one value of a key can be kept: remove the other)"),
], ids=["cut short", "a list", "a key twice"])
def test_a_file_that_is_no_record_is_refused_and_makes_no_store(tmp_path, text, says):
    path = tmp_path / "acme.json"
    path.write_text(text)
    db = tmp_path / "new.duckdb"
    result = invoke("devices", "add", path, "--db", db)
    assert result.exit_code == 1, result.output
    assert result.output == (f"Error: cannot register {path}: {says}; write the record as one JSON object (or, in a "
                             ".toml file, one TOML table) of a catalog row's fields, each figure cited under sources; "
                             "nothing was stored\n")
    assert not db.exists()


def test_an_id_registered_with_another_record_is_refused_and_kept(db, tmp_path):
    assert invoke("devices", "add", record(tmp_path / "acme.json"), "--db", db).exit_code == 0
    before = contents(db)
    result = invoke("devices", "add", record(tmp_path / "acme2.json", gpu_cores=24), "--db", db)
    assert result.exit_code == 1
    assert result.output == (f"Error: device 'acme-x1' is in store {db} already, registered with another record "
                             "(gpu_cores differs): give the record another id, or pass --replace to change its figures\n")
    assert contents(db) == before
    other = record(tmp_path / "acme3.json", id="acme-x1-oc", name="Acme X1 OC", aliases=["Acme X1"])
    result = invoke("devices", "add", other, "--db", db)  # a name of a registered device is refused as a chip's is
    assert result.exit_code == 1 and "name/alias 'Acme X1' also names 'acme-x1'" in result.output
    assert contents(db) == before


def test_a_registered_device_imports_under_its_own_id_by_the_name_a_file_reports(db, tmp_path):
    tuned = tmp_path / "vec" / "x1.json"
    tuned.parent.mkdir()
    tuned.write_text(json.dumps(cache("NVIDIA Acme X1 Accelerator")))
    before = contents(db)
    refused = invoke("import", "--db", db, tuned)  # the catalog lacks it: the message names the command to register it
    assert refused.exit_code == 1 and "`zmlx-pipeline devices add RECORD`" in refused.output
    assert contents(db) == before
    assert invoke("devices", "add", record(tmp_path / "acme.json"), "--db", db).exit_code == 0
    result = invoke("import", "--db", db, "--json", tuned)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert (row["device"], row["kernel"], row["added"]) == ("acme-x1", "vector_add", 2)
    with Store(db, read_only=True) as store:
        rows = store.measurements(device="acme-x1")
        (device,) = [d for d in store.devices() if d["device_id"] == "acme-x1"]
    assert sorted((m["config"]["block_size_x"], m["median_us"]) for m in rows) == [(64, 500.0), (128, 250.0)]
    assert (device["in_catalog"], device["reported_name"]) == (False, "NVIDIA Acme X1 Accelerator")
    assert device["reported"]["registration"]["device"]["id"] == "acme-x1"  # the import kept its record
    by_name = invoke("import", "--db", db, "--json", "--device", "Acme X1", "--kernel", "vadd2", tuned)
    assert by_name.exit_code == 0, by_name.output
    assert json.loads(by_name.output)[0]["device"] == "acme-x1"
    summary = invoke("summary", "--db", db, "--json", "--device", "Acme X1")
    assert summary.exit_code == 0, summary.output
    assert {r["kernel"] for r in json.loads(summary.output)} == {"vector_add", "vadd2"}


def test_a_catalog_chip_keeps_its_names_beside_a_registered_device(db, tmp_path):
    assert invoke("devices", "add", record(tmp_path / "acme.json"), "--db", db).exit_code == 0
    tuned = tmp_path / "vec" / "a.json"
    tuned.parent.mkdir()
    tuned.write_text(json.dumps(cache("NVIDIA RTX 500 Ada Generation Laptop GPU")))
    result = invoke("import", "--db", db, "--json", tuned)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["device"] == "nvidia-rtx-500-ada-laptop"


def test_a_default_store_another_process_holds_leaves_the_catalog_listed_with_a_warning(tmp_path, monkeypatch):
    from zmlx_pipeline.data.store import StoreLocked
    from zmlx_pipeline.pipeline import cli as cli_module

    with Store(tmp_path / "store.duckdb"):  # the default store of the tests (ZMLX_PIPELINE_DB)
        pass

    def held(*args, **kwargs):
        raise StoreLocked("store is locked by another process (pid 4242)")

    monkeypatch.setattr(cli_module, "open_store", held)
    result = CliRunner().invoke(cli, ["devices", "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ("Warning: the devices registered in the store are not listed: store is locked by another "
                             "process (pid 4242)\n")
    assert len(json.loads(result.stdout)["devices"]) > 250
    result = invoke("devices", "--db", tmp_path / "store.duckdb")  # a store named is read or refused
    assert result.exit_code == 1 and result.output == "Error: store is locked by another process (pid 4242)\n"


def test_replace_mends_a_registered_devices_figures_and_says_to_train_again(db, tmp_path):
    assert invoke("devices", "add", record(tmp_path / "acme.json"), "--db", db).exit_code == 0
    result = invoke("devices", "add", record(tmp_path / "acme2.json", gpu_cores=24), "--db", db, "--replace")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == (f"acme-x1 now has these figures in {db}, its measurements kept: models "
                                              "trained before read its old ones, so train again, then publish")
    with Store(db, read_only=True) as store:
        (spec,) = store.registered_devices()
    assert spec.gpu_cores == 24
    before = contents(db)
    amd = record(tmp_path / "amd.json", vendor="amd", backend="rocm", architecture="gfx1100", core_unit="cus",
                  family="rdna3", simd_width=32, threadgroup_memory_bytes=65536)
    kind = invoke("devices", "add", amd, "--db", db, "--replace")
    assert kind.exit_code == 1 and kind.output == (
        f"Error: device 'acme-x1' is registered with vendor 'nvidia', and --replace mends a device's figures, not what "
        "kind of chip it is (vendor 'amd'): give the record another id\n")
    assert contents(db) == before
    refused = invoke("devices", "add", record(tmp_path / "a6000.json", id="nvidia-rtx-a6000", name="Acme 6000",
                                              aliases=[]), "--db", db, "--replace")
    assert refused.exit_code == 1 and "Traceback" not in refused.output  # a catalog chip's id is never replaced
    assert contents(db)[3] == (spec,)


@pytest.mark.parametrize("device", ["acme-x1@10sm", "Acme X1@10sm"])
def test_a_core_limit_of_a_registered_device_is_refused_naming_it(db, tmp_path, device):
    """A core limit is of a catalog chip only: one of a registered device is refused saying what it is, not with
    catalog ids like it."""
    assert invoke("devices", "add", record(tmp_path / "acme.json"), "--db", db).exit_code == 0
    before = contents(db)
    tuned = tmp_path / "vec" / "x1.json"
    tuned.parent.mkdir()
    tuned.write_text(json.dumps(cache("NVIDIA Acme X1 Accelerator")))
    result = invoke("import", "--db", db, "--device", device, tuned)
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.startswith(f"Error: --device {device!r} limits acme-x1, a device registered in the store; a "
                                    "core limit (@<N>sm) is only of a catalog chip (give acme-x1)")
    assert contents(db) == before


def registered_shard(tmp_path: Path, folder: str, **changes) -> Path:
    """A shard exported from a store of its own that registered ACME with `changes` and imported a file onto it."""
    other = tmp_path / folder / "store.duckdb"
    other.parent.mkdir()
    device_id = changes.get("id", ACME["id"])
    assert invoke("devices", "add", record(other.parent / "record.json", **changes), "--db", other).exit_code == 0
    tuned = other.parent / "tuned.json"
    tuned.write_text(json.dumps(cache("Acme card")))
    assert invoke("import", "--db", other, "--device", device_id, tuned).exit_code == 0
    shard = other.parent / "shard.parquet"
    assert invoke("export", "--db", other, shard).exit_code == 0
    return shard


def test_a_shard_of_a_device_registered_with_the_same_record_ingests(db, tmp_path):
    assert invoke("devices", "add", record(tmp_path / "acme.json"), "--db", db).exit_code == 0
    result = invoke("ingest", "--db", db, registered_shard(tmp_path, "b"))
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "1 shard(s), 2 rows: 2 added, 0 already present"
    with Store(db, read_only=True) as store:
        assert [s.id for s in store.registered_devices()] == ["acme-x1"]
        assert len(store.measurements(device="acme-x1")) == 2


def refused_ingest(db: Path, shard: Path) -> str:
    """The one `Error:` line of an ingest of `shard` that must be refused whole, the store left as it was."""
    before = contents(db)
    result = invoke("ingest", "--db", db, shard)
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.rstrip().endswith("nothing was ingested, the store is unchanged")
    assert contents(db) == before
    return result.output


def test_a_shard_of_a_device_registered_with_another_record_is_refused(db, tmp_path):
    assert invoke("devices", "add", record(tmp_path / "acme.json"), "--db", db).exit_code == 0
    shard = registered_shard(tmp_path, "b", memory_bandwidth_gbps=300.0)
    assert refused_ingest(db, shard).startswith(
        f"Error: {shard}, row 1: device 'acme-x1' is registered with another record than store {db}'s "
        "(memory_bandwidth_gbps differs): run `zmlx-pipeline devices add --replace RECORD` in one of the stores")


def test_a_shard_of_a_new_registered_device_named_as_a_registered_one_is_refused(db, tmp_path):
    assert invoke("devices", "add", record(tmp_path / "acme.json"), "--db", db).exit_code == 0
    shard = registered_shard(tmp_path, "c", id="acme-x2", variant="acme-x2", name="Acme X2", aliases=["Acme X1"])
    assert refused_ingest(db, shard).startswith(
        f"Error: {shard}, row 1: the device registration it carries cannot join store {db}: device 'acme-x2': "
        "name/alias 'Acme X1' also names 'acme-x1'; give the device a name of its own")


def test_two_shards_registering_one_name_under_two_ids_are_refused_together(db, tmp_path):
    first = registered_shard(tmp_path, "b")
    second = registered_shard(tmp_path, "c", id="acme-x2", variant="acme-x2", aliases=["Acme Two"])
    before = contents(db)
    result = invoke("ingest", "--db", db, first, second)
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.startswith(f"Error: {second}, row 1: the device registration it carries cannot join store "
                                    f"{db}: device 'acme-x2': name/alias 'Acme X1 Accelerator' also names 'acme-x1'")
    assert contents(db) == before
    assert invoke("ingest", "--db", db, first).exit_code == 0  # alone, it goes in
