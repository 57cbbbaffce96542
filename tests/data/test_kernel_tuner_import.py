"""Kernel Tuner cache and T4 files into the store: content-detected formats, both cache layouts, every failure
marker Kernel Tuner writes, device names as people write them, atomic and idempotent."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import zmlx_pipeline
from zmlx_pipeline.data.catalog import load_catalog
from zmlx_pipeline.data.importers import ImportFileError, UnmatchedDevice, import_files, parse_file
from zmlx_pipeline.data.importers.kernel_tuner import kernel_version
from zmlx_pipeline.core.keys import mapping_key
from zmlx_pipeline.pipeline.cli import cli

# the shared reference data sits beside the repository (../shared), in CI as in every checkout
DATASETS = Path(zmlx_pipeline.__file__).resolve().parents[2] / "shared/datasets/kernel-tuner"
NO_GPU = "the file names no GPU (its device name is empty or absent), and its file name"
A100 = "nvidia-a100-pcie-40gb"


@pytest.fixture
def datasets() -> Path:
    """The shared Kernel Tuner data; missing data is a failure, not a skip."""
    if not DATASETS.is_dir():
        pytest.fail(f"the shared Kernel Tuner data is not at {DATASETS} (../shared beside the repository)")
    return DATASETS


def snapshot(store) -> tuple:
    """Everything an import may write, to show a refused import wrote nothing."""
    return store.measurements(), store.runs(), store.devices()


def cache_doc(device_name="NVIDIA A100-PCIE-40GB", keys=("block_size_x", "tile_size_y"), entries=None) -> dict:
    """A tiny Kernel Tuner cache file: one timed config, one that failed to run, one to compile."""
    entries = entries or [
        ({"block_size_x": 32, "tile_size_y": 1}, 3.0, [1.0, 2.0, 3.0, 4.0, 5.0]),  # time: the mean of the times
        ({"block_size_x": 64, "tile_size_y": 1}, "RuntimeFailedConfig", None),
        ({"block_size_x": 64, "tile_size_y": 2}, "CompilationFailedConfig", None),
    ]
    cache = {}
    for config, time, times in entries:
        entry = {k: config[k] for k in keys}
        entry["time"] = time
        if times is not None:
            entry["times"] = times
        entry["compile_time"] = 100.0
        cache[",".join(str(config[k]) for k in keys)] = entry
    return {"device_name": device_name, "kernel_name": "toy_kernel", "problem_size": [64, 32],
            "tune_params_keys": list(keys), "tune_params": {}, "objective": "time", "cache": cache}


def t4_doc(problem_size=None) -> dict:
    """A tiny T4 file: a correct result, a compile failure and a runtime failure."""
    metadata = {"timeunit": "miliseconds"}
    if problem_size is not None:
        metadata["problem_size"] = problem_size
    result = lambda cfg, inv, runtimes: {  # noqa: E731
        "configuration": cfg, "invalidity": inv, "times": {"runtimes": runtimes},
        "measurements": [{"name": "time", "value": sum(runtimes) / len(runtimes) if runtimes else None, "unit": ""}],
    }
    return {"schema_version": "1.0.0", "metadata": metadata, "results": [
        result({"block_size_x": 8, "block_size_y": 32}, "correct", [0.5, 0.25, 0.75]),
        result({"block_size_x": 16, "block_size_y": 32}, "compile", []),
        result({"block_size_x": 32, "block_size_y": 32}, "runtime", []),
    ]}


def write(path: Path, doc: dict, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_cache_file_becomes_measurements_and_one_imported_run(store, tmp_path):
    path = write(tmp_path / "toy" / "A100.json", cache_doc())
    (row,) = import_files(store, [path])
    assert row == {"file": str(path), "device": A100, "kernel": "toy_kernel", "rows": 3, "added": 3,
                   "failed": 2, "skipped": 0, "run_id": row["run_id"]}
    got = {m["config_key"]: m for m in store.measurements()}
    ok = got[mapping_key({"block_size_x": 32, "tile_size_y": 1})]
    assert ok["status"] == "ok" and ok["dtype"] == "float32"
    assert ok["shape"] == {"x": 64, "y": 32}
    assert ok["median_us"] == pytest.approx(3000.0)  # median of the times, ms -> us
    assert ok["p10_us"] == pytest.approx(1400.0) and ok["p90_us"] == pytest.approx(4600.0)
    assert ok["samples"] == 5
    assert ok["kernel_version"] == kernel_version("toy_kernel", ["tile_size_y", "block_size_x"])
    run_err = got[mapping_key({"block_size_x": 64, "tile_size_y": 1})]
    assert (run_err["status"], run_err["error"], run_err["median_us"]) == ("launch_error", "RuntimeFailedConfig", None)
    assert got[mapping_key({"block_size_x": 64, "tile_size_y": 2})]["status"] == "compile_error"
    (run,) = store.runs()
    assert run["status"] == "imported" and run["finished_at"] is not None and run["device_id"] == A100
    assert run["settings"]["file"] == "A100.json"
    assert run["settings"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert store.devices()[0]["device_id"] == A100 and store.devices()[0]["in_catalog"]


def test_t4_file_takes_kernel_and_problem_size_from_the_search_space(store, tmp_path):
    path = write(tmp_path / "toy_milo" / "A4000_T4.json.gz", t4_doc(), gz=True)
    write(tmp_path / "search-spaces" / "toy_milo.json", {
        "General": {"BenchmarkName": "toy_milo"},
        "ConfigurationSpace": {"TuningParameters": [{"Name": "block_size_x", "Default": 8},
                                                    {"Name": "block_size_y", "Default": 32}]},
        "KernelSpecification": {"KernelName": "toy_kernel", "ProblemSize": [250, 20, 1]},
    })
    (row,) = import_files(store, [path])
    assert (row["device"], row["kernel"], row["rows"], row["failed"]) == ("nvidia-rtx-a4000", "toy_milo", 3, 2)
    by_status = {m["status"]: m for m in store.measurements()}
    assert set(by_status) == {"ok", "compile_error", "launch_error"}
    assert by_status["ok"]["shape"] == {"x": 250, "y": 20, "z": 1}
    assert by_status["ok"]["median_us"] == pytest.approx(500.0) and by_status["ok"]["samples"] == 3


def test_format_is_told_by_content_not_name(store, tmp_path):
    gz_named_json = write(tmp_path / "k" / "A100.json", cache_doc(), gz=True)
    plain_named_gz = write(tmp_path / "k2" / "A100-PCIE-40GB_T4.json.gz", t4_doc(problem_size=[10, 20]))
    rows = import_files(store, [gz_named_json, plain_named_gz])
    assert [r["added"] for r in rows] == [3, 3]
    assert [r["kernel"] for r in rows] == ["toy_kernel", "k2"]  # a T4 file without a kernel name: its folder


def test_reimport_adds_nothing(store, tmp_path):
    path = write(tmp_path / "toy" / "A100.json.gz", cache_doc(), gz=True)
    assert import_files(store, [path])[0]["added"] == 3
    again = import_files(store, [path])[0]
    assert (again["added"], again["rows"], again["run_id"]) == (0, 3, None)
    assert len(store.measurements()) == 3 and len(store.runs()) == 1


def test_parameter_order_does_not_change_identity(store, tmp_path):
    first = write(tmp_path / "a" / "A100.json", cache_doc(keys=("block_size_x", "tile_size_y")))
    second = write(tmp_path / "b" / "A100.json", cache_doc(keys=("tile_size_y", "block_size_x")))
    one, two = parse_file(first), parse_file(second)
    assert list(one.measurements[0].config) != list(two.measurements[0].config)
    assert [m.config_key for m in one.measurements] == [m.config_key for m in two.measurements]
    assert one.kernel_version == two.kernel_version
    import_files(store, [first])
    assert import_files(store, [second])[0]["added"] == 0


def test_truncated_gzip_is_refused_and_nothing_is_stored(store, tmp_path):
    good = write(tmp_path / "toy" / "A100.json", cache_doc())
    whole = gzip.compress(json.dumps(cache_doc(device_name="NVIDIA RTX A4000")).encode())
    cut = tmp_path / "toy" / "A4000.json.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ImportFileError) as info:
        import_files(store, [good, cut])
    message = str(info.value)
    assert str(cut) in message and "truncated" in message and "\n" not in message
    assert store.measurements() == [] and store.runs() == [] and store.devices() == []


def test_truncated_json_and_missing_cache_are_refused(store, tmp_path):
    text = json.dumps(t4_doc(problem_size=[8]))
    cut = tmp_path / "A100.json"
    cut.write_text(text[: len(text) // 2])
    with pytest.raises(ImportFileError, match=r"A100.json: not valid JSON \(truncated\?\)"):
        import_files(store, [cut])
    text = json.dumps(cache_doc())
    cut.write_text(text[: text.index('"64,1"')] + '"64,1": {"block_size_x": 64, "tile_')  # a cache cut mid-entry
    header_cut = tmp_path / "A4000.json"
    header_cut.write_text(text[: text.index('"cache"') - 20])
    with pytest.raises(ImportFileError, match=r"A4000.json: not valid JSON \(truncated\?\)"):
        import_files(store, [header_cut])
    assert [m.config for m in parse_file(cut).measurements] == [{"block_size_x": 32, "tile_size_y": 1}]
    doc = cache_doc()
    del doc["cache"]
    no_cache = write(tmp_path / "x" / "A100.json", doc)
    with pytest.raises(ImportFileError, match="a Kernel Tuner cache file without 'cache'"):
        import_files(store, [no_cache])
    assert store.measurements() == [] and store.runs() == []


def test_unknown_device_is_refused_unless_overridden(store, tmp_path):
    path = write(tmp_path / "toy" / "mystery.json", cache_doc(device_name="Quantum GPU 9000"))
    with pytest.raises(UnmatchedDevice) as info:
        import_files(store, [path])
    assert str(info.value) == (
        f"cannot import {path}: device 'Quantum GPU 9000' is not in the catalog; pass --device <catalog id> or "
        "--device-map FILE (`zmlx-pipeline devices` lists the ids) where it is a catalog chip named otherwise: "
        "another chip's id would file its timings as that chip's; a chip the catalog lacks is registered with "
        "`zmlx-pipeline devices add RECORD` (its figures, each with its source) and then imported under its own id; "
        "nothing of it was stored")
    assert store.measurements() == []
    (row,) = import_files(store, [path], device="nvidia-rtx-a6000")
    assert row["device"] == "nvidia-rtx-a6000" and row["added"] == 3
    (row,) = import_files(store, [write(tmp_path / "t2" / "x.json", cache_doc(device_name="?"))], device="RTX A4000")
    assert row["device"] == "nvidia-rtx-a4000"


def test_empty_device_name_is_taken_from_the_file_name(store, tmp_path):
    path = write(tmp_path / "toy" / "MI250X.json.gz", cache_doc(device_name=""), gz=True)
    assert import_files(store, [path])[0]["device"] == "amd-mi250x"


@pytest.mark.parametrize("stem, device_id", [
    ("H20", "nvidia-h20"), ("H800_SXM5", "nvidia-h800-sxm"), ("B300", "nvidia-b300"), ("GB200", "nvidia-gb200"),
    ("GB300", "nvidia-gb300"), ("L20", "nvidia-l20"), ("L40S", "nvidia-l40s"), ("A800-SXM4-80GB", "nvidia-a800-sxm4-80gb"),
])
def test_data_centre_gpus_are_found_from_the_file_name(store, tmp_path, stem, device_id):
    path = write(tmp_path / "toy" / f"{stem}.json", cache_doc(device_name=""))
    assert import_files(store, [path])[0]["device"] == device_id


def test_a_name_two_gpus_share_is_refused_naming_both(store, tmp_path):
    path = write(tmp_path / "toy" / "x.json", cache_doc(device_name="NVIDIA A800"))
    with pytest.raises(UnmatchedDevice, match="nvidia-a800-sxm4-80gb, nvidia-a800-pcie-80gb"):
        import_files(store, [path])
    assert store.measurements() == [] and store.runs() == []


def test_subspace_file_gets_the_described_defaults_and_filter_size_goes_to_the_shape(store, tmp_path):
    write(tmp_path / "search-spaces" / "conv.json", {
        "General": {"BenchmarkName": "conv"},
        "ConfigurationSpace": {"TuningParameters": [
            {"Name": "block_size_x", "Default": 16}, {"Name": "tile_size_y", "Default": 1},
            {"Name": "use_shmem", "Default": 1}, {"Name": "filter_width", "Default": 15}]},
    })
    doc = cache_doc()
    for entry in doc["cache"].values():
        entry["filter_width"] = 15
    doc["tune_params_keys"].append("filter_width")
    full = write(tmp_path / "conv" / "A100.json", doc)
    sub = write(tmp_path / "conv" / "A6000_original.json", cache_doc(device_name="NVIDIA RTX A6000"))
    one, two = parse_file(full), parse_file(sub)
    assert one.measurements[0].config == {"block_size_x": 32, "tile_size_y": 1, "use_shmem": 1}
    assert two.measurements[0].config == one.measurements[0].config
    assert one.shape == two.shape == {"x": 64, "y": 32, "filter_width": 15}
    assert one.kernel == two.kernel == "conv" and one.kernel_version == two.kernel_version
    assert two.source["filled_from_defaults"] == {"use_shmem": 1, "filter_width": 15}


def test_cli_import_prints_a_table_and_one_line_errors(tmp_path):
    path = write(tmp_path / "toy" / "A100.json", cache_doc())
    db = tmp_path / "cli.duckdb"
    runner = CliRunner()
    result = runner.invoke(cli, ["import", "--db", str(db), str(path)])
    assert result.exit_code == 0, result.output
    header, rule, line = result.output.splitlines()
    assert header.split() == ["file", "device", "kernel", "rows", "added", "failed"]
    assert line.split() == [str(path), A100, "toy_kernel", "3", "3", "2"]
    result = runner.invoke(cli, ["import", "--db", str(db), "--json", str(path)])
    assert json.loads(result.output)[0]["added"] == 0
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    result = runner.invoke(cli, ["import", "--db", str(db), str(bad)])
    assert result.exit_code == 1
    assert result.output == (f"Error: cannot import {bad}: neither a Kernel Tuner cache file (no 'cache') "
                             "nor a T4 file (no 'results'); nothing of it was stored\n")


def test_real_files_import_completely(store, tmp_path, datasets):
    files = [datasets / "convolution_milo" / "A6000_original.json.gz",
             datasets / "dedispersion_milo" / "MI250X_T4.json.gz"]
    rows = import_files(store, files)
    assert [(r["device"], r["kernel"], r["rows"], r["added"]) for r in rows] == [
        ("nvidia-rtx-a6000", "convolution_milo", 2442, 2442),
        ("amd-mi250x", "dedispersion_milo", 11130, 11130),
    ]
    summary = {(s["device"], s["kernel"]): s for s in store.summary()}
    assert summary[("nvidia-rtx-a6000", "convolution_milo")]["by_status"] == {
        "ok": 2266, "launch_error": 72, "compile_error": 104}
    assert summary[("amd-mi250x", "dedispersion_milo")]["measurements"] == 11130
    # half a real file: refused, nothing of it stored
    cut = tmp_path / "convolution_milo" / "A100.json.gz"
    cut.parent.mkdir()
    data = (datasets / "convolution_milo" / "A100.json.gz").read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImportFileError, match="truncated gzip stream"):
        import_files(store, [cut])
    assert len(store.measurements(device=A100)) == 0


# ------------------------------------------------------------------------------------------
# the two cache layouts, on the real files


def key_only(doc: dict) -> dict:
    """The same cache with its entries holding only their results: the parameters live in the keys."""
    names = set(doc.get("tune_params_keys") or doc["tune_params"])
    return {**doc, "cache": {k: {f: v for f, v in e.items() if f not in names} for k, e in doc["cache"].items()}}


def without_keys_list(doc: dict) -> dict:
    """The same cache without tune_params_keys: the key order is tune_params' order, as Kernel Tuner builds it."""
    return {k: v for k, v in doc.items() if k != "tune_params_keys"}


def as_stored(parsed) -> list[tuple]:
    return [(m.config_key, m.config, m.status, m.median_us, m.p10_us, m.p90_us, m.samples, m.error)
            for m in parsed.measurements]


def test_real_cache_file_in_every_layout_gives_the_same_rows(store, tmp_path, datasets):
    source = datasets / "convolution_milo" / "A100.json.gz"
    doc = json.loads(gzip.decompress(source.read_bytes()))
    folder = tmp_path / "convolution_milo"
    (tmp_path / "search-spaces").mkdir()
    (tmp_path / "search-spaces" / "convolution_milo.json").write_bytes(
        (datasets / "search-spaces" / "convolution_milo.json").read_bytes())
    original = parse_file(source)
    keys = parse_file(write(folder / "A100_keys.json.gz", key_only(doc), gz=True))
    no_list = parse_file(write(folder / "A100_nolist.json", without_keys_list(key_only(doc))))
    assert len(original.measurements) == 4362 and original.failed == 161
    assert as_stored(keys) == as_stored(no_list) == as_stored(original)
    assert keys.kernel_version == no_list.kernel_version == original.kernel_version
    assert keys.shape == no_list.shape == original.shape == {"x": 4096, "y": 4096, "filter_height": 15,
                                                             "filter_width": 15}
    assert (original.source["layout"], keys.source["layout"], no_list.source["layout"]) == ("entries", "keys", "keys")
    assert all(type(v) is int for m in keys.measurements for v in m.config.values())
    assert import_files(store, [source])[0]["added"] == 4362
    assert [r["added"] for r in import_files(store, [keys.path, no_list.path])] == [0, 0]


def test_real_t4_results_in_other_time_units_and_without_metadata(tmp_path, datasets):
    doc = json.loads(gzip.decompress((datasets / "dedispersion_milo" / "A4000_T4.json.gz").read_bytes()))
    doc["results"] = doc["results"][:40]
    (tmp_path / "search-spaces").mkdir()
    (tmp_path / "search-spaces" / "dedispersion_milo.json").write_bytes(
        (datasets / "search-spaces" / "dedispersion_milo.json").read_bytes())
    base = parse_file(write(tmp_path / "dedispersion_milo" / "A4000_T4.json", doc))
    seconds = json.loads(json.dumps(doc))
    seconds["metadata"]["timeunit"] = "Seconds"
    for result in seconds["results"]:
        result["times"]["runtimes"] = [t / 1000 for t in result["times"]["runtimes"]]
    bare = {k: v for k, v in doc.items() if k != "metadata"}
    in_seconds = parse_file(write(tmp_path / "dedispersion_milo" / "s.json", seconds), device="RTX A4000")
    no_metadata = parse_file(write(tmp_path / "dedispersion_milo" / "bare.json", bare), device="nvidia-rtx-a4000")
    assert base.shape == {"x": 25000, "y": 2048, "z": 1} and base.device.id == "nvidia-rtx-a4000"
    assert [m.median_us for m in in_seconds.measurements] == pytest.approx([m.median_us for m in base.measurements])
    assert [m.median_us for m in no_metadata.measurements] == [m.median_us for m in base.measurements]
    assert 100_000 < base.measurements[0].median_us < 300_000  # 186 ms


# ------------------------------------------------------------------------------------------
# small files modelled on those found in the wild


def kt_cache(entries: dict, keys=("block_size_x", "block_size_y"), tune_params=None, **top) -> dict:
    """A Kernel Tuner cache document around the given entries (key -> entry)."""
    doc = {"device_name": "NVIDIA RTX A4000", "kernel_name": "vector_add", "problem_size": [4096, 4096],
           "tune_params_keys": list(keys),
           "tune_params": tune_params or {"block_size_x": [16, 32], "block_size_y": [1, 2]},
           "objective": "time", "cache": entries}
    doc.update(top)
    return {k: v for k, v in doc.items() if v is not None}


def entry(bx=16, by=1, time=1.5, **more) -> dict:
    return {"block_size_x": bx, "block_size_y": by, "time": time, **more}


def refused(store, path, match=None, **options) -> str:
    """The one-line error of a refused import, after checking it left the store as it was."""
    before = snapshot(store)
    with pytest.raises(ImportFileError) as info:
        import_files(store, [path], **options)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and message.endswith("nothing of it was stored")
    assert snapshot(store) == before
    return message


@pytest.fixture
def seeded(store, tmp_path):
    """A store holding one imported file, so a refused import has something to leave alone."""
    import_files(store, [write(tmp_path / "seed" / "A100.json", cache_doc())])
    return store


def test_every_failure_marker_kernel_tuner_writes_becomes_a_status(store, tmp_path):
    doc = kt_cache({
        "16,1": entry(16, 1, 2.0, times=[1.0, 2.0, 3.0]),
        "16,2": entry(16, 2, "CompilationFailedConfig"),
        "32,1": entry(32, 1, "RuntimeFailedConfig"),
        "32,2": entry(32, 2, "InvalidConfig"),
    })
    (row,) = import_files(store, [write(tmp_path / "k" / "a.json", doc)])
    assert (row["rows"], row["failed"], row["skipped"]) == (3, 2, 1)
    got = {(m["config"]["block_size_x"], m["config"]["block_size_y"]): (m["status"], m["error"])
           for m in store.measurements()}
    assert got == {(16, 1): ("ok", None), (16, 2): ("compile_error", "CompilationFailedConfig"),
                   (32, 1): ("launch_error", "RuntimeFailedConfig")}


def test_markers_in_the_error_field_or_the_objective_and_old_huge_times(store, tmp_path):
    # newer Kernel Tuner puts the failure in "__error__"; older ones in the objective's field
    # (no "time" at all when tuning for GFLOP/s); the oldest wrote a time of 1e20
    doc = kt_cache({
        "16,1": entry(16, 1, 2.0, **{"GFLOP/s": 100.0}),
        "16,2": {"block_size_x": 16, "block_size_y": 2, "__error__": "CompilationFailedConfig", "compile_time": 5},
        "32,1": {"block_size_x": 32, "block_size_y": 1, "GFLOP/s": "RuntimeFailedConfig"},
        "32,2": entry(32, 2, 1e20),
    }, objective="GFLOP/s")
    (row,) = import_files(store, [write(tmp_path / "k" / "a.json", doc)])
    statuses = sorted((m["config"]["block_size_x"], m["config"]["block_size_y"], m["status"])
                      for m in store.measurements())
    assert statuses == [(16, 1, "ok"), (16, 2, "compile_error"), (32, 1, "launch_error"), (32, 2, "launch_error")]
    assert row["failed"] == 3


def test_key_only_entries_take_the_types_of_their_tune_params(store, tmp_path):
    tune = {"bs": [16, 32], "c1": [1.0, 2.5], "order": ["ijk", "kji"], "unroll": [True, False]}
    doc = kt_cache({"32,2.5,kji,False": {"time": 1.0}, "16,1.0,ijk,True": {"time": 2.0}},
                   keys=list(tune), tune_params=tune)
    parsed = parse_file(write(tmp_path / "k" / "a.json", doc))
    configs = [m.config for m in parsed.measurements]
    assert configs == [{"bs": 32, "c1": 2.5, "order": "kji", "unroll": False},
                       {"bs": 16, "c1": 1.0, "order": "ijk", "unroll": True}]
    assert [type(v) for v in configs[1].values()] == [int, float, str, bool]
    assert parsed.source["layout"] == "keys"
    # without tune_params for a parameter, the literal is read: int, float, True/False, else text
    doc = kt_cache({"64,0.5,x,True": {"time": 1.0}}, keys=["a", "b", "c", "d"], tune_params={"a": []})
    assert parse_file(write(tmp_path / "k" / "b.json", doc)).measurements[0].config == {
        "a": 64, "b": 0.5, "c": "x", "d": True}


def test_without_tune_params_keys_the_order_is_tune_params_and_never_an_empty_config(seeded, tmp_path):
    doc = kt_cache({"2,16": {"time": 1.0}, "1,32": {"time": 2.0}}, tune_params_keys=None,
                   tune_params={"block_size_y": [1, 2], "block_size_x": [16, 32]})
    (row,) = import_files(seeded, [write(tmp_path / "k" / "a.json", doc)])
    assert (row["rows"], row["added"], row["skipped"]) == (2, 2, 0)
    assert sorted((m["config"]["block_size_x"], m["config"]["block_size_y"])
                  for m in seeded.measurements(kernel="vector_add")) == [(16, 2), (32, 1)]
    nothing = kt_cache({"16,1": {"time": 1.0}, "32,1": {"time": 2.0}}, tune_params_keys=None)
    del nothing["tune_params"]
    path = write(tmp_path / "k" / "b.json", nothing)
    assert refused(seeded, path) == (
        f"cannot import {path}: it names no tuned parameters (no 'tune_params_keys' and no 'tune_params'), so its "
        "entries' configurations cannot be told; nothing of it was stored")


@pytest.mark.parametrize(
    "cache, reason",
    [
        ({"16,1,7": {"time": 1.0}},
         "cache entry '16,1,7': its key splits into 3 values on ',' but tune_params_keys names 2 parameters "
         "(block_size_x, block_size_y)"),
        ({"16,4": {"time": 1.0}}, "cache entry '16,4': value '4' of block_size_y is not among its tune_params values"),
        ({"16,1": entry(32, 1, 1.0)}, "cache entry '16,1': its key gives block_size_x=16 but the entry holds "
                                      "block_size_x=32"),
        ({"16,1": {"block_size_x": 16, "time": 1.0}}, "cache entry '16,1' lacks parameters block_size_y"),
        ({"16,1": entry(time=float("nan"))}, "cache entry '16,1': 'time' is NaN, neither a time nor a failure marker"),
        ({"16,1": entry(time=None)}, "cache entry '16,1': 'time' is neither a number nor a failure marker"),
        ({"16,1": entry(time=-2.0)}, "cache entry '16,1': time -2.0 is not a positive finite time"),
        ({"16,1": entry(time=1.0, times=[1.0, 0.0])},
         "cache entry '16,1': its times hold 0.0, not a positive finite time"),
        ({"16,1": entry(time=1e-300)}, "cache entry '16,1': time 1e-300 is 1e-297 us, under 1 ns, faster than any kernel "
         "launch: the file's time unit may be wrong, or the entry damaged"),
        ({"16,1": entry(time=2e-7, times=[2e-7, 2e-7])}, "cache entry '16,1': time 2e-07 is 0.0002 us, under 1 ns, "
         "faster than any kernel launch: the file's time unit may be wrong, or the entry damaged"),
        ({"16,1": entry(time="OutOfMemoryConfig")}, "cache entry '16,1': unknown failure marker 'OutOfMemoryConfig' "
         "(Kernel Tuner writes CompilationFailedConfig, InvalidConfig, RuntimeFailedConfig)"),
        ({"16,1": {"block_size_x": 16, "block_size_y": 1, "score": 0.5}}, "cache entry '16,1' has no 'time'"),
    ],
)
def test_bad_entries_are_refused_naming_file_entry_and_reason(seeded, tmp_path, cache, reason):
    path = write(tmp_path / "k" / "bad.json", kt_cache({"32,2": entry(32, 2, 1.0), **cache}))
    assert refused(seeded, path) == f"cannot import {path}: {reason}; nothing of it was stored"


def test_a_git_lfs_pointer_is_refused_saying_to_fetch_the_file(seeded, tmp_path):
    path = tmp_path / "k" / "hotspot_MI50.json"
    path.parent.mkdir(parents=True)
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 1203\n")
    assert refused(seeded, path) == (f"cannot import {path}: it is a Git LFS pointer, not the tuning file it stands "
                                     "for: fetch the file with `git lfs pull` in its repository, then import it; "
                                     "nothing of it was stored")


def test_a_cache_tuned_for_another_objective_than_time_is_refused_saying_so(seeded, tmp_path):
    # the benchmark hub's hyperparameter-tuning caches score search strategies, not kernels
    doc = kt_cache({"10,50": {"popsize": 10, "maxiter": 50, "score": -0.4, "scores": [-0.4]}},
                   keys=["popsize", "maxiter"], tune_params={"popsize": [10], "maxiter": [50]},
                   objective="score", problem_size=[])
    path = write(tmp_path / "hyper" / "x86_64.json", doc)
    assert "cache entry '10,50' has no 'time' (the file was tuned for 'score', not a kernel time)" in refused(
        seeded, path, device="nvidia-a40")


def test_a_cache_left_open_by_a_stopped_run_is_closed_as_kernel_tuner_closes_it(store, tmp_path):
    closed = json.dumps(kt_cache({"16,1": entry(16, 1, 1.0), "32,1": entry(32, 1, 2.0)}), indent="")
    open_with_comma = closed.rstrip()[:-3].rstrip() + ","  # what Kernel Tuner leaves: the last entry and a comma
    path = tmp_path / "k" / "open.json"
    path.parent.mkdir()
    path.write_text(open_with_comma)
    (row,) = import_files(store, [path])
    assert (row["rows"], row["added"]) == (2, 2)
    assert store.runs()[0]["settings"]["closed_open_cache"] is True
    open_without_comma = (open_with_comma[:-1].replace(',1"', ',2"')  # new keys, and no comma after the last entry
                          .replace('"block_size_y": 1', '"block_size_y": 2'))
    path.write_text(open_without_comma)
    assert [m.config for m in parse_file(path).measurements] == [{"block_size_x": 16, "block_size_y": 2},
                                                                 {"block_size_x": 32, "block_size_y": 2}]
    header_only = closed[: closed.index('"cache": {') + len('"cache": {')]
    path.write_text(header_only)
    assert "its 'cache' has no entries" in refused(store, path)


def _with_repeated_key(doc: dict, where: str, key: str, first_value) -> str:
    """The document as JSON text with `key` written once more, holding `first_value`, at the start of the object
    `where` names ("" for the document itself, "cache" for the cache): json would keep the later value."""
    text = json.dumps(doc)
    opening = "{" if not where else f'"{where}": {{'
    at = text.index(opening) + len(opening)
    return text[:at] + f"{json.dumps(key)}: {json.dumps(first_value)}, " + text[at:]


@pytest.mark.parametrize("where, key, first_value", [
    ("cache", "16,1", entry(16, 1, 99.0)),  # two timings of one config: which is right is not for us to guess
    ("", "kernel_name", "other_kernel"),
    ("", "problem_size", [64, 64]),
])
def test_a_json_object_naming_a_key_twice_is_refused_naming_the_file_and_the_key(seeded, tmp_path, where, key,
                                                                                 first_value):
    path = tmp_path / "dup" / "A4000.json"
    path.parent.mkdir()
    path.write_text(_with_repeated_key(kt_cache({"16,1": entry(16, 1, 1.0), "32,1": entry(32, 1, 2.0)}), where, key,
                                       first_value))
    assert f"the key {key!r} appears twice in one JSON object" in refused(seeded, path)


def test_a_cache_left_open_naming_an_entry_twice_is_refused(seeded, tmp_path):
    text = _with_repeated_key(kt_cache({"16,1": entry(16, 1, 1.0), "32,1": entry(32, 1, 2.0)}), "cache", "32,1",
                              entry(32, 1, 99.0))
    path = tmp_path / "dup" / "A4000.json"
    path.parent.mkdir()
    path.write_text(text.rstrip()[:-2] + ",")  # as a stopped run leaves it: read entry by entry
    assert "the key '32,1' appears twice in one JSON object" in refused(seeded, path)
    path.write_text(text.rstrip()[:-2] + ', "16,1": {"block_size_x": 16, "bl')  # and with its last entry cut off
    assert "the key '32,1' appears twice in one JSON object" in refused(seeded, path)


@pytest.mark.parametrize("left_open", [False, True])
def test_an_entry_written_twice_alike_is_read_once(seeded, tmp_path, left_open):
    """A cache holding one entry twice, byte for byte (Kernel Tuner's dashboard test cache as published), says
    nothing twice: it imports, once; the same key with another time is still refused (above)."""
    text = _with_repeated_key(kt_cache({"16,1": entry(16, 1, 1.0), "32,1": entry(32, 1, 2.0)}), "cache", "32,1",
                              entry(32, 1, 2.0))
    path = write(tmp_path / "dup" / "A4000.json", {})
    path.write_text(text.rstrip()[:-2] + "," if left_open else text)
    before = len(seeded.measurements())
    (row,) = import_files(seeded, [path])
    assert row["rows"] == 2 and len(seeded.measurements()) == before + 2


def test_a_gzipped_file_and_its_t4_metadata_naming_a_key_twice_are_refused(seeded, tmp_path):
    gz = tmp_path / "dup" / "A4000.json.gz"
    gz.parent.mkdir()
    gz.write_bytes(gzip.compress(_with_repeated_key(kt_cache({"16,1": entry()}), "", "device_name", "x").encode()))
    assert "the key 'device_name' appears twice" in refused(seeded, gz)
    results = write(tmp_path / "t4" / "A4000-results.json", t4_doc(problem_size=[4096]))
    metadata = tmp_path / "t4" / "A4000-metadata.json"
    metadata.write_text('{"data": {"name": "NVIDIA RTX A4000"}, "data": {"name": "NVIDIA A100"}}')
    before = snapshot(seeded)
    with pytest.raises(ImportFileError, match=f"cannot import {metadata}: the key 'data' appears twice"):
        import_files(seeded, [results])
    assert snapshot(seeded) == before


def test_a_device_map_naming_a_key_twice_is_refused(seeded, tmp_path):
    path = write(tmp_path / "vec" / "A4000.json", kt_cache({"16,1": entry()}))
    mapping = tmp_path / "map.json"
    mapping.write_text('{"A4000*": "nvidia-rtx-a4000", "A4000*": "nvidia-a100-sxm4-80gb"}')
    with pytest.raises(ImportFileError, match=r"--device-map .*map.json: the key 'A4000\*' appears twice"):
        import_files(seeded, [path], device_map=mapping)


def test_the_cli_refuses_a_repeated_key_in_one_line_and_makes_no_store(tmp_path):
    path = tmp_path / "dup" / "A4000.json"
    path.parent.mkdir()
    path.write_text(_with_repeated_key(kt_cache({"16,1": entry(16, 1, 1.0)}), "cache", "16,1", entry(16, 1, 99.0)))
    db = tmp_path / "new.duckdb"
    result = CliRunner().invoke(cli, ["import", "--db", str(db), str(path)])
    assert result.exit_code == 1, result.output
    assert result.output == (f"Error: cannot import {path}: the key '16,1' appears twice in one JSON object, with "
                             "different values (only one value of a key can be kept: remove the other); nothing of "
                             "it was stored\n")
    assert not db.exists()
    result = CliRunner().invoke(cli, ["import", "--db", str(db), "--problem-size", '{"x": 1, "x": 2}', str(path)])
    assert result.exit_code == 2 and "the key 'x' appears twice" in result.output.splitlines()[-1]
    assert not db.exists()


def test_problem_size_from_the_file_the_search_space_or_the_option(seeded, tmp_path):
    # Kernel Tuner's own test cache has no problem_size; "callable" is what it writes for a function
    doc = kt_cache({"16,1": entry(16, 1, 1.0)}, problem_size=None)
    path = write(tmp_path / "vec" / "A4000.json", doc)
    (row,) = import_files(seeded, [path], problem_size=[100000])
    assert seeded.measurements(kernel="vector_add")[0]["shape"] == {"x": 100000}
    assert seeded.runs()[-1]["settings"]["problem_size_from"] == "--problem-size"
    write(tmp_path / "search-spaces" / "vec3.json", {"KernelSpecification": {"ProblemSize": [512, 2]}})
    described = write(tmp_path / "vec3" / "A4000.json", doc)
    assert parse_file(described).shape == {"x": 512, "y": 2}
    assert parse_file(described).source["problem_size_from"] == "search-space description"
    sized = write(tmp_path / "vec4" / "A4000.json", kt_cache({"16,1": entry(16, 1, 1.0)}))
    assert "--problem-size [64, 64] disagrees with the problem size of its file ({'x': 4096, 'y': 4096})" in refused(
        seeded, sized, problem_size=[64, 64])
    assert parse_file(sized, problem_size=[4096, 4096]).shape == {"x": 4096, "y": 4096}
    for text, shape in (("4096x2048", {"x": 4096, "y": 2048}), ("[25000, 2048, 1]", {"x": 25000, "y": 2048, "z": 1}),
                        ("80000000", {"x": 80000000})):
        as_text = write(tmp_path / "vec6" / "A4000.json", kt_cache({"16,1": entry(16, 1, 1.0)}, problem_size=text))
        assert parse_file(as_text).shape == shape
    # a size Kernel Tuner computes from the tuned parameters ("block_size_x * 4") is no size of the case
    strings = write(tmp_path / "vec5" / "A4000.json", kt_cache({"16,1": entry(16, 1, 1.0)},
                                                             problem_size=["block_size_x * 4", 8]))
    assert parse_file(strings, problem_size=[1024, 8]).shape == {"x": 1024, "y": 8}


def test_a_file_without_a_usable_problem_size_is_one_case_of_unknown_size(store, tmp_path):
    # no problem size, "callable" (a function of the parameters) or parameter names instead of numbers: the timings are
    # still one case, of a size nobody wrote down; its shape is empty and the file says why
    two = {"16,1": entry(16, 1, 1.0), "32,1": entry(32, 1, 2.0)}
    files = {name: write(tmp_path / name / "A4000.json", kt_cache(two, kernel_name=name, problem_size=size))
             for name, size in (("none", None), ("callable", "callable"), ("names", ["block_size_x", 8]))}
    rows = import_files(store, list(files.values()))
    assert [(r["kernel"], r["rows"], r["added"]) for r in rows] == [("none", 2, 2), ("callable", 2, 2), ("names", 2, 2)]
    assert {m["kernel"]: m["shape"] for m in store.measurements()} == {"none": {}, "callable": {}, "names": {}}
    settings = [r["settings"] for r in store.runs()]
    assert [s["problem_size_from"] for s in settings] == ["none"] * 3
    assert [s.get("problem_size_in_file") for s in settings] == [None, "callable", ["block_size_x", 8]]
    # the same file again (or grown by a resumed run) goes in as before; another file of unknown size would
    # share its keys, so it is refused until --problem-size tells the two apart
    assert import_files(store, [files["none"]])[0]["added"] == 0
    other = write(tmp_path / "none" / "A4000_run2.json", kt_cache({"16,1": entry(16, 1, 5.0)}, kernel_name="none",
                                                                   problem_size=None))
    assert refused(store, other) == (
        f"cannot import {other}: it names no problem size, and A4000.json (kernel none on nvidia-rtx-a4000 too) is "
        "imported without one; import each in its own command with its own --problem-size, to tell their sizes apart; "
        "nothing of it was stored")
    assert import_files(store, [other], problem_size=[8192])[0]["added"] == 1
    both = [write(tmp_path / "two" / f"{n}.json", kt_cache({"16,1": entry()}, kernel_name="two", problem_size=None))
            for n in ("a", "b")]
    before = snapshot(store)
    with pytest.raises(ImportFileError, match="b.json: it names no problem size, and a.json"):
        import_files(store, both)
    # the hint followed: each in its own command, with its own size
    assert [import_files(store, [p], problem_size=[n])[0]["added"] for p, n in zip(both, (1024, 2048))] == [1, 1]


def test_parse_problem_size_accepts_integers_and_json():
    from zmlx_pipeline.data.importers import parse_problem_size

    assert parse_problem_size("4096,4096") == [4096, 4096]
    assert parse_problem_size("4096, 4096") == [4096, 4096]
    assert parse_problem_size("[25000, 2048, 1]") == [25000, 2048, 1]
    assert parse_problem_size('{"rows": 8, "cols": 512}') == {"rows": 8, "cols": 512}
    assert parse_problem_size("80000000") == 80000000
    for bad in ("4096,abc", "[1.5]", "[]", '"callable"'):
        with pytest.raises(ValueError):
            parse_problem_size(bad)


@pytest.mark.parametrize("text", ["4096x4096", "+4096", "4096,,4096", ",4096", "4096 4096", "(4096, 4096)",
                                  "\u0664\u0660\u0669\u0666", "4096,\u0664"])
def test_parse_problem_size_refuses_forms_other_than_json_or_comma_separated_ascii_digits(text):
    from zmlx_pipeline.data.importers import parse_problem_size

    with pytest.raises(ValueError, match="neither JSON nor integers split by commas: write whole numbers in ASCII"):
        parse_problem_size(text)


def test_parse_problem_size_refuses_a_json_object_naming_a_dim_twice():
    from zmlx_pipeline.data.importers import parse_problem_size

    with pytest.raises(ValueError, match="the key 'x' appears twice"):
        parse_problem_size('{"x": 1, "x": 2}')


def t4(results: list, metadata: dict | None = None) -> dict:
    doc = {"schema_version": "1.0.0", "results": results}
    if metadata is not None:
        doc["metadata"] = metadata
    return doc


def t4_result(bx: int, invalidity="correct", runtimes=None, value=None, unit="") -> dict:
    measurements = [] if value is None else [{"name": "time", "value": value, "unit": unit}]
    return {"configuration": {"block_size_x": bx}, "invalidity": invalidity, "correctness": 1,
            "times": {"runtimes": runtimes or []}, "measurements": measurements}


def test_t4_variants_invalidity_values_units_and_missing_measurements(store, tmp_path):
    # as Kernel Tuner's store_output_file writes them: no metadata, "ms" on the time measurement
    doc = t4([
        t4_result(16, "correct", [1.0, 2.0, 3.0], 2.0, "ms"),
        t4_result(32, "correct", None, 4.0, "ms"),  # a single time, no runtimes
        t4_result(64, "Compile", None, "CompilationFailedConfig", "ms"),
        t4_result(128, "runtime"),
        t4_result(256, "timeout"),
        t4_result(512, "correctness"),
        t4_result(1024, "constraints", None, "InvalidConfig", "ms"),
    ], metadata={"problem_size": [1000]})
    (row,) = import_files(store, [write(tmp_path / "vec" / "A4000_T4.json", doc)])
    assert (row["device"], row["rows"], row["failed"], row["skipped"]) == ("nvidia-rtx-a4000", 6, 4, 1)
    got = {m["config"]["block_size_x"]: (m["status"], m["median_us"], m["samples"]) for m in store.measurements()}
    assert got == {16: ("ok", 2000.0, 3), 32: ("ok", 4000.0, 1), 64: ("compile_error", None, 0),
                   128: ("launch_error", None, 0), 256: ("timeout", None, 0), 512: ("wrong_result", None, 0)}
    assert "time_unit_assumed" not in store.runs()[0]["settings"]  # its results name theirs
    for unit, scale in (("microseconds", 1.0), ("us", 1.0), ("ns", 1e-3), ("sec", 1e6), ("MILLISECONDS", 1e3)):
        one = t4([t4_result(16, "correct", [3.0])], {"timeunit": unit, "problem_size": [1000]})
        parsed = parse_file(write(tmp_path / "u" / "A4000_T4.json", one))
        assert parsed.measurements[0].median_us == 3.0 * scale and "time_unit_assumed" not in parsed.source
    # a file naming no unit anywhere is read in Kernel Tuner's, and its run's settings say so
    unnamed = parse_file(write(tmp_path / "n" / "A4000_T4.json", t4([t4_result(16, "correct", [3.0])],
                                                                     {"problem_size": [1000]})))
    assert unnamed.measurements[0].median_us == 3000.0 and unnamed.source["time_unit_assumed"] == "milliseconds"


@pytest.mark.parametrize(
    "results, metadata, reason",
    [
        ([t4_result(16, "correct")], {}, "result 0 is correct but has no runtimes and no time measurement"),
        ([t4_result(16, "correct", [1.0]), {"configuration": {"block_size_y": 2}, "invalidity": "runtime"}], {},
         "result 0 lacks parameters block_size_y that other results set"),
        ([t4_result(16, "crashed")], {},
         "result 0: unknown invalidity 'crashed' (T4 writes compile, correct, correctness, runtime, timeout, "
         "constraints)"),
        ([t4_result(16, "correct", [1.0])], {"timeunit": "fortnights"}, "unknown time unit 'fortnights'"),
        ([t4_result(16, "correct", [1.0, float("inf")])], {},
         "result 0: its times hold inf, not a positive finite time"),
    ],
)
def test_bad_t4_results_are_refused(seeded, tmp_path, results, metadata, reason):
    path = write(tmp_path / "vec" / "A4000_T4.json", t4(results, {"problem_size": [8], **metadata}))
    assert refused(seeded, path) == f"cannot import {path}: {reason}; nothing of it was stored"


# ------------------------------------------------------------------------------------------
# devices


def test_reported_names_as_people_write_them(store, tmp_path):
    names = {"GeForce GTX 1080Ti": "nvidia-gtx-1080-ti", "Tesla V100-SXM2-32GB": "nvidia-v100-sxm2-32gb",
             "NVIDIA GeForce RTX 3090": "nvidia-rtx-3090", "AMD Instinct MI250X": "amd-mi250x",
             "A100-SXM4-80GB": "nvidia-a100-sxm4-80gb"}
    for i, (name, device_id) in enumerate(names.items()):
        path = write(tmp_path / "k" / f"{i}.json", kt_cache({"16,1": entry()}, device_name=name))
        assert parse_file(path).device.id == device_id, name


def catalog_ids(test) -> str:
    """The ids of the catalog rows that pass `test`, in catalog order, as an error lists them."""
    return ", ".join(spec.id for spec in load_catalog() if test(spec))


@pytest.mark.parametrize(
    "name, candidates",
    [("Tesla V100", lambda s: s.id.startswith("nvidia-v100-")),
     ("gfx90a", lambda s: s.architecture == "gfx90a"),
     ("NVIDIA A100 80GB", lambda s: s.id.startswith("nvidia-a100-") and s.memory_gb == 80)],
)
def test_an_ambiguous_device_name_is_refused_listing_the_candidates(seeded, tmp_path, name, candidates):
    path = write(tmp_path / "k" / "a.json", kt_cache({"16,1": entry()}, device_name=name))
    assert refused(seeded, path) == (
        f"cannot import {path}: device {name!r} does not name one catalog device (it may be "
        f"{catalog_ids(candidates)}); pass --device <its id> or map the file in --device-map; nothing of it was stored")
    assert import_files(seeded, [path], device="nvidia-v100-sxm2-16gb")[0]["device"] == "nvidia-v100-sxm2-16gb"


def test_a_file_name_is_never_cut_down_to_another_chip(seeded, tmp_path):
    # RTX_3060_laptop is the laptop chip (its own row), not the desktop RTX 3060 the first two words name
    path = write(tmp_path / "k" / "RTX_3060_laptop.json", kt_cache({"16,1": entry()}, device_name=""))
    assert parse_file(path).device.id == "nvidia-rtx-3060-laptop"
    # a laptop chip the catalog lacks is refused, never read as the desktop card
    path = write(tmp_path / "k" / "RTX_3050_laptop.json", kt_cache({"16,1": entry()}, device_name=""))
    # and its hint never names the desktop chip: "laptop" belongs to the name
    assert f"{NO_GPU} 'RTX_3050_laptop' is no catalog device; pass --device" in refused(seeded, path)
    hinted = write(tmp_path / "k" / "b.json", kt_cache({"16,1": entry()}, device_name="NVIDIA H100 SXM5 64GB"))
    h100s = ", ".join(spec.id for spec in load_catalog() if spec.id.startswith("nvidia-h100-"))
    assert (f"device 'NVIDIA H100 SXM5 64GB' is not in the catalog (catalog devices whose names hold it: {h100s}); "
            "pass --device <catalog id>") in refused(seeded, hinted)
    named = write(tmp_path / "k" / "RTX_2080_Ti_T4.json", t4([t4_result(16, "correct", [1.0])], {"problem_size": [8]}))
    assert parse_file(named).device.id == "nvidia-rtx-2080-ti"


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_device_map_by_file_glob_or_reported_name(store, tmp_path, suffix):
    a = write(tmp_path / "k" / "node07_run1.json", kt_cache({"16,1": entry()}, device_name=""))
    b = write(tmp_path / "k" / "other.json", kt_cache({"32,1": entry(32)}, device_name="Tesla V100"))
    c = write(tmp_path / "k" / "third.json", kt_cache({"32,2": entry(32, 2)}, device_name="RTX A4000"))
    mapping = {"node07_*": "nvidia-a100-sxm4-80gb", "tesla v100": "Tesla V100-PCIE-16GB"}
    map_file = tmp_path / f"map{suffix}"
    map_file.write_text(json.dumps(mapping) if suffix == ".json"
                        else "\n".join(f'"{k}" = "{v}"' for k, v in mapping.items()))
    rows = import_files(store, [a, b, c], device_map=map_file)
    assert [r["device"] for r in rows] == ["nvidia-a100-sxm4-80gb", "nvidia-v100-pcie-16gb", "nvidia-rtx-a4000"]
    assert [r["settings"]["device_from"] for r in store.runs()] == ["--device-map", "--device-map", "reported"]


def test_a_device_map_key_that_matches_nothing_refuses_a_file_it_missed_and_a_dot_slash_key_matches(
        seeded, tmp_path, monkeypatch):
    """A key written for a file it does not match (`a.json` for `A.json`) left that file under its reported device."""
    path = write(tmp_path / "k" / "A.json", kt_cache({"16,1": entry()}, device_name="NVIDIA A100-PCIE-40GB"))
    map_file = tmp_path / "map.json"
    before = snapshot(seeded)
    map_file.write_text('{"a.json": "nvidia-h100-sxm"}')
    for key in ("a.json", "runs/A.json", "other/a.json"):
        map_file.write_text(json.dumps({key: "nvidia-h100-sxm", "Z*.json": "nvidia-h200"}))
        assert refused(seeded, path, device_map=map_file) == (
            f"cannot import {path}: the key {key!r} of --device-map {map_file} looks meant for it but does not match it "
            "(it would be stored as nvidia-a100-pcie-40gb, the device it reports): a key is matched, case-sensitive, "
            "against each file's name, its name without suffixes and its path as given; fix the key, or import that "
            "file without the map; nothing of it was stored")
    map_file.write_text('{"A.json ": "nvidia-h100-sxm"}')
    with pytest.raises(ImportFileError, match="the key 'A.json ' has white space at its start or end"):
        import_files(seeded, [path], device_map=map_file)
    assert snapshot(seeded) == before
    # the path as given (k/A.json) matches the key ./k/A.json; a key for files not imported (a map written for a
    # whole data set) is named in a warning, and the import goes on
    monkeypatch.chdir(tmp_path)
    map_file.write_text(json.dumps({"./k/A.json": "nvidia-h100-sxm", "Z*.json": "nvidia-h200"}))
    with pytest.warns(UserWarning) as caught:
        rows = import_files(seeded, [Path("k") / "A.json"], device_map=map_file)
    assert [r["device"] for r in rows] == ["nvidia-h100-sxm"]
    assert [str(w.message) for w in caught] == [
        f"--device-map {map_file}: the key 'Z*.json' matches no file of this import (k/A.json) nor the GPU name one "
        "reports; a key is matched, case-sensitive, against each file's name, its name without suffixes and its path "
        "as given"]


def test_bad_device_maps_are_refused_before_anything_is_stored(seeded, tmp_path):
    path = write(tmp_path / "k" / "node07.json", kt_cache({"16,1": entry()}, device_name=""))
    cases = {
        '{"node07*": "A100 80GB"}': "'node07*' -> 'A100 80GB' does not name one catalog device (it may be "
                                    + catalog_ids(lambda s: s.id.startswith("nvidia-a100-") and s.memory_gb == 80)
                                    + "); give its id",
        '{"node07*": "warp drive"}': "'node07*' -> 'warp drive' is neither a catalog id nor a catalog device name; "
                                     "`zmlx-pipeline devices` lists them",
        '{"node07*": 7}': "'node07*' maps to 7, not a catalog id",
        "[1, 2]": 'expected a non-empty object of "file glob or device name": "catalog id"',
    }
    map_file = tmp_path / "map.json"
    before = snapshot(seeded)
    for text, reason in cases.items():
        map_file.write_text(text)
        with pytest.raises(ImportFileError) as info:
            import_files(seeded, [path], device_map=map_file)
        assert str(info.value) == f"--device-map {map_file}: {reason}"
    map_file.write_text('{"node07*": "nvidia-a40", "*.json": "nvidia-a10"}')
    assert "gives it several devices ('node07*' -> nvidia-a40, '*.json' -> nvidia-a10)" in refused(
        seeded, path, device_map=map_file)
    with pytest.raises(ImportFileError, match="give --device .* or --device-map, not both"):
        import_files(seeded, [path], device="nvidia-a40", device_map=map_file)
    assert snapshot(seeded) == before


def test_a_reported_name_key_and_a_glob_that_give_one_file_two_devices_are_refused(seeded, tmp_path):
    """A file matched by a glob and by its reported name gets no device picked between them; keys that agree do."""
    path = write(tmp_path / "k" / "dm1.json", kt_cache({"16,1": entry()}, device_name="Testing"))
    map_file = tmp_path / "map.json"
    map_file.write_text('{"Testing": "nvidia-h200", "dm*.json": "nvidia-h100-sxm"}')
    assert refused(seeded, path, device_map=map_file) == (
        f"cannot import {path}: --device-map {map_file} gives it several devices ('dm*.json' -> nvidia-h100-sxm, "
        "'Testing' -> nvidia-h200); make one key match it; nothing of it was stored")
    map_file.write_text('{"Testing": "nvidia-h200", "dm*.json": "nvidia-h200"}')
    assert [r["device"] for r in import_files(seeded, [path], device_map=map_file)] == ["nvidia-h200"]


def test_a_bad_device_option_is_refused_with_what_to_give(store, tmp_path):
    path = write(tmp_path / "k" / "a.json", cache_doc())
    with pytest.raises(ImportFileError) as info:
        import_files(store, [path], device="H100")
    assert str(info.value) == ("--device 'H100' does not name one catalog device (it may be "
                               f"{catalog_ids(lambda s: s.id.startswith('nvidia-h100-'))}); give its id")
    assert store.measurements() == []


# ------------------------------------------------------------------------------------------
# several files


def test_a_refused_file_among_good_ones_stores_none_of_them(seeded, tmp_path):
    good = write(tmp_path / "k" / "A4000.json", kt_cache({"16,1": entry()}))
    bad = write(tmp_path / "k" / "A6000.json", kt_cache({"16,1,3": {"time": 1.0}}, device_name="RTX A6000"))
    before = snapshot(seeded)
    with pytest.raises(ImportFileError, match=f"cannot import {bad}: cache entry '16,1,3'"):
        import_files(seeded, [good, bad])
    assert snapshot(seeded) == before


def test_a_store_failure_midway_stores_none_of_the_files(store, tmp_path, monkeypatch):
    from zmlx_pipeline.data.store import StoreError

    first = write(tmp_path / "k" / "A4000.json", kt_cache({"16,1": entry()}))
    second = write(tmp_path / "k" / "A6000.json", kt_cache({"16,1": entry()}, device_name="RTX A6000"))
    real_record = store.record
    calls = []

    def record_then_fail(measurements):
        calls.append(1)
        if len(calls) == 2:
            raise StoreError("disk full")
        return real_record(measurements)

    monkeypatch.setattr(store, "record", record_then_fail)
    with pytest.raises(ImportFileError) as info:
        import_files(store, [first, second])
    assert str(info.value) == (f"cannot store {second}: disk full; nothing of any file was stored, the store is "
                               "as it was")
    assert (store.measurements(), store.runs(), store.devices()) == ([], [], [])
    monkeypatch.setattr(store, "record", real_record)
    assert [r["added"] for r in import_files(store, [first, second])] == [1, 1]


def test_a_directory_tree_laid_out_as_the_benchmark_hub_imports_in_one_call(store, tmp_path):
    # one folder per kernel, the search-space descriptions in their own folder: read for the files, not imported
    root = tmp_path / "hub"
    write(root / "search-spaces" / "toy_milo.json", {
        "General": {"BenchmarkName": "toy_milo"},
        "ConfigurationSpace": {"TuningParameters": [{"Name": "block_size_x", "Default": 8},
                                                    {"Name": "block_size_y", "Default": 32}]},
        "KernelSpecification": {"KernelName": "toy_kernel", "ProblemSize": [250, 20, 1]}})
    t4_file = write(root / "toy_milo" / "A4000_T4.json.gz", t4_doc(), gz=True)
    cache_file = write(root / "vector_add" / "sub" / "A100.json", cache_doc())
    rows = import_files(store, [root, cache_file])  # a file named twice is read once
    assert [(Path(r["file"]).name, r["device"], r["kernel"], r["rows"]) for r in rows] == [
        ("A4000_T4.json.gz", "nvidia-rtx-a4000", "toy_milo", 3), ("A100.json", A100, "toy_kernel", 3),
        ("toy_milo.json", None, None, 0)]
    assert len(store.measurements()) == 6 and len(store.runs()) == 2
    assert str(t4_file) in {r["file"] for r in rows}


@pytest.mark.parametrize("file_name, word, chip", [
    ("convolution_MI250X.json", "MI250X", "amd-mi250x"),  # <kernel>_<GPU>, as published with an empty device_name
    ("gemm_RTX_2070_SUPER_run1.json", "RTX 2070 SUPER", "nvidia-rtx-2070-super"),
    ("dedisp_RTX_A4000.json", "RTX A4000", "nvidia-rtx-a4000"),
    ("MI250X_vector_add.json", "MI250X", "amd-mi250x"),  # the file's own kernel name after the GPU's
    ("vector_add_RTX_3070_Mobile.json", "RTX 3070 Mobile", "nvidia-rtx-3070-laptop"),
])
def test_a_file_named_for_its_kernel_and_gpu_is_refused_naming_the_chip_to_pass(seeded, tmp_path, file_name, word,
                                                                               chip):
    path = write(tmp_path / "k" / file_name, kt_cache({"16,1": entry()}, device_name=""))
    before = snapshot(seeded)
    assert refused(seeded, path) == (
        f"cannot import {path}: {NO_GPU} {path.name.removesuffix('.json')!r} is no catalog device (its word "
        f"{word!r} is {chip}: pass --device {chip} if it ran there); pass --device <catalog id> or --device-map FILE "
        "(`zmlx-pipeline devices` lists the ids); nothing of it was stored")
    assert snapshot(seeded) == before
    # the hint's fix works
    assert import_files(seeded, [path], device=chip)[0]["device"] == chip


@pytest.mark.parametrize("file_name", ["RTX_3050_laptop.json",  # "laptop" belongs to a name: never the desktop card
                                       "GTX_580.json",  # never the RX 580
                                       "A100_vs_MI250X.json",  # two chips
                                       "hotspot_A100.json",  # four A100 rows
                                       # a word after the chip may make it another part: never the one it qualifies
                                       "vector_add_RTX_4070_Notebook.json", "vector_add_RTX_2060_MaxQ.json",
                                       "vector_add_RTX_4090_D.json", "vector_add_RX_6800_M.json",
                                       "vector_add_H100_SXM_66sm.json", "gemm_nvidia-h200-32sm.json",
                                       "vector_add_H100_SXM_MIG_1g.10gb.json", "H100_PCIe_94GB.json",
                                       "RTX_3050_OEM.json", "MI250X_GCD.json", "RX_580_2048SP.json",
                                       "laptop_RTX_3050.json",  # a word of device names before it
                                       "notebook_RTX_4070.json", "MaxQ_RTX_2060.json", "sms=66_H100_SXM.json"])
def test_no_chip_is_hinted_where_the_file_name_does_not_tell_one(seeded, tmp_path, file_name):
    path = write(tmp_path / "k" / file_name, kt_cache({"16,1": entry()}, device_name=""))
    message = refused(seeded, path)
    assert NO_GPU in message and "is no catalog device" in message
    assert "if it ran there" not in message and "pass --device <catalog id> or --device-map FILE" in message


def test_a_batch_maps_each_files_gpu_and_an_unmapped_file_stores_none_of_them(seeded, tmp_path):
    folder = tmp_path / "runs"
    for name in ("node1.json", "node2.json", "bench.json"):
        write(folder / name, t4([t4_result(16, "correct", [1.0], 1.0, "ms")]))
    mapping = write(tmp_path / "map.json", {"node*.json": "nvidia-a100-sxm4-80gb"})
    before = snapshot(seeded)
    result = CliRunner().invoke(cli, ["import", "--db", str(seeded.path), "--device-map", str(mapping),
                                      "--problem-size", "1024", str(folder)])
    assert result.exit_code == 1
    assert result.output == (
        f"Error: cannot import {folder / 'bench.json'}: {NO_GPU} 'bench' is no catalog device; pass --device "
        "<catalog id> or --device-map FILE (`zmlx-pipeline devices` lists the ids); nothing of it was stored\n")
    assert snapshot(seeded) == before
    write(mapping, {"node*.json": "nvidia-a100-sxm4-80gb", "bench.json": "nvidia-rtx-3060-laptop"})
    result = CliRunner().invoke(cli, ["import", "--db", str(seeded.path), "--device-map", str(mapping),
                                      "--problem-size", "1024", "--json", str(folder)])
    assert result.exit_code == 0, result.output
    assert [(Path(r["file"]).name, r["device"], r["added"]) for r in json.loads(result.output)] == [
        ("bench.json", "nvidia-rtx-3060-laptop", 1), ("node1.json", "nvidia-a100-sxm4-80gb", 1),
        ("node2.json", "nvidia-a100-sxm4-80gb", 0)]


def test_a_directory_without_tuning_files_is_refused_naming_it(tmp_path):
    empty = tmp_path / "nothing"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a tuning file")
    result = CliRunner().invoke(cli, ["import", "--db", str(tmp_path / "s.duckdb"), str(empty)])
    assert result.exit_code == 1
    assert result.output == (f"Error: no Kernel Tuner files to import in {empty}: it holds no .json or .json.gz "
                             "file (hidden files and folders left out)\n")


def test_a_t4_results_file_takes_its_device_from_the_metadata_file_beside_it(store, tmp_path):
    # Kernel Tuner's store_metadata_file writes nvidia-smi / rocm-smi output next to the results
    # (the benchmark hub's W7800-results.json.gz and W7800-metadata.json.gz)
    folder = tmp_path / "vec"
    results = write(folder / "node3-results.json", t4([t4_result(16, "correct", [1.0], 1.0, "ms")]))
    smi = {"nvidia-smi": {"nvidia_smi_log": {"gpu": [{"product_name": "NVIDIA A100-SXM4-80GB"},
                                                     {"product_name": "NVIDIA A100-SXM4-80GB"}]}}}
    metadata = write(folder / "node3-metadata.json", {"schema_version": "1.0.0", "metadata": {
        "operating_system": "Linux", "environment": {"device_query": smi, "requirements": []}}})
    rows = import_files(store, [folder], problem_size=[8])
    assert [(Path(r["file"]).name, r["device"], r["rows"], r["added"]) for r in rows] == [
        ("node3-results.json", "nvidia-a100-sxm4-80gb", 1, 1), ("node3-metadata.json", None, 0, 0)]
    rocm = {"rocm-smi": {"card0": {"Card Series": "AMD Instinct MI250X", "Card model": "0x740c"}}}
    write(folder / "node3-metadata.json", {"metadata": {"environment": {"device_query": rocm}}})
    assert parse_file(results, problem_size=[8]).device.id == "amd-mi250x"
    with pytest.raises(ImportFileError, match="only describe the machine of a T4 results file"):
        import_files(store, [metadata])


def test_a_t4_file_named_as_kernel_tuners_readme_example_names_it_takes_its_device_from_the_metadata_beside_it(
        store, tmp_path):
    # KernelTuner/kernel_tuner examples/cuda/vector_add.py (d845b33, "the minimal example from the README"):
    # store_output_file("vector_add.json", ...) and store_metadata_file("vector_add-metadata.json"), the results
    # file written by kernel_tuner/file_utils.py store_output_file (no device in it)
    folder = tmp_path / "vector_add"
    write(folder / "vector_add.json", t4([t4_result(128, "correct", [1.0], 1.0, "ms")]))
    smi = {"nvidia-smi": {"nvidia_smi_log": {"attached_gpus": "1", "gpu": {"@id": "00000000:01:00.0",
                                                                           "product_name": "NVIDIA RTX A4000"}}}}
    write(folder / "vector_add-metadata.json", {"metadata": {"operating_system": "Linux", "environment": {
        "device_query": smi, "requirements": []}}, "schema_version": "1.0.0"})
    rows = import_files(store, [folder], problem_size=[10000000])
    assert [(Path(r["file"]).name, r["device"], r["rows"]) for r in rows] == [
        ("vector_add.json", "nvidia-rtx-a4000", 1), ("vector_add-metadata.json", None, 0)]


# ------------------------------------------------------------------------------------------
# files as published (tests/data/fixtures/kernel_tuner_wild/SOURCE.md names the public file each is modelled on)

WILD = Path(__file__).parent / "fixtures" / "kernel_tuner_wild"


def wild_map(tmp_path) -> Path:
    """A device map for the published files that name no GPU ("Testing", "", a file name that is none)."""
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"Testing": "nvidia-rtx-a4000", "t4_*": "nvidia-a100-pcie-40gb",
                                "vector_add_gflops_T4.json": "nvidia-rtx-a4000",
                                "AMD Instinct MI50/MI60": "amd-mi50"}))
    return path


# one map for the whole folder, imported a file at a time: its other files' keys are named in a warning, not refused
@pytest.mark.filterwarnings("ignore:--device-map .* match(es)? no file of this import")
@pytest.mark.parametrize(
    "name, device, rows, failed, skipped, fastest_us, size",
    [
        # schema 1.0.0 and 1.1.0 entries, and an unversioned cache: medians of the kept repetitions, in us
        ("small_cache_1.0.0.json", "nvidia-rtx-a4000", 2, 0, 0, 3871.744, None),
        ("small_cache_1.1.0.json", "nvidia-rtx-a4000", 3, 0, 0, 3637.248, None),
        ("vector_add_unversioned.json", "nvidia-rtx-a4000", 3, 0, 0, 25.152, None),
        ("open_cache_looks_like_closed.json", "nvidia-rtx-a4000", 2, 0, 0, 3871.744, None),
        ("killed_mid_entry.json", "nvidia-rtx-a4000", 2, 0, 0, 3871.744, None),
        # a cache left open with no comma after its last entry
        ("open_cache_no_comma.json", "nvidia-rtx-a4000", 2, 0, 0, 3871.744, None),
        # an objective ("TEST") that no entry holds: the entries' time is read, under the GPU the file names
        ("valid_example.json", "nvidia-a100-pcie-40gb", 2, 0, 0, 3871.744, None),
        ("convolution_MI50.json", "amd-mi50", 2, 0, 0, 10823.668, None),
        ("t4_cache_invalids.json", "nvidia-a100-pcie-40gb", 1, 1, 0, None, None),
        ("t4_target.json", "nvidia-a100-pcie-40gb", 1, 0, 0, 12257.820, None),
        ("vector_add_gflops_T4.json", "nvidia-rtx-a4000", 3, 1, 1, 38.9, [100000]),
        # Kernel Tuner's README example output: the GPU from vector_add-metadata.json beside it
        ("vector_add.json", "nvidia-rtx-3090", 3, 0, 0, 130.1, None),
        # energy, power and clock fields beside the time, a clock among the parameters, one integer problem size
        ("vector_add_time_energy.json", "nvidia-rtx-4000-ada", 2, 0, 0, 3164.672, None),
    ],
)
def test_published_files_import_unchanged(store, tmp_path, name, device, rows, failed, skipped, fastest_us, size):
    (row,) = import_files(store, [WILD / name], device_map=wild_map(tmp_path), problem_size=size)
    assert (row["device"], row["rows"], row["added"], row["failed"], row["skipped"]) == (
        device, rows, rows, failed, skipped)
    stored = store.measurements()
    timed = [m["median_us"] for m in stored if m["median_us"] is not None]
    assert (not timed) if fastest_us is None else min(timed) == pytest.approx(fastest_us, abs=1e-3)
    # a failed config is never a timing, and every ok row is one
    assert all((m["median_us"] is None) == (m["status"] != "ok") for m in stored)
    again = import_files(store, [WILD / name], device_map=wild_map(tmp_path), problem_size=size)
    assert again[0]["added"] == 0 and len(store.measurements()) == rows


def test_cache_schema_versions_give_the_same_rows(tmp_path):
    # 1.1.0 writes each entry's parameters after its results: the same configs and timings as 1.0.0
    old, new = (parse_file(WILD / f"small_cache_{v}.json", device="nvidia-rtx-a4000") for v in ("1.0.0", "1.1.0"))
    assert as_stored(old) == as_stored(new)[:2]
    assert old.kernel_version == new.kernel_version and old.shape == new.shape == {"x": 4096, "y": 4096}


def test_a_run_killed_mid_entry_imports_its_complete_entries(store, tmp_path):
    parsed = parse_file(WILD / "killed_mid_entry.json", device="nvidia-rtx-a4000")
    assert [m.config for m in parsed.measurements] == [{"block_size_x": 16, "block_size_y": 1},
                                                       {"block_size_x": 16, "block_size_y": 2}]
    assert parsed.source["closed_open_cache"] is True
    assert parsed.source["dropped_cut_off_entry"].startswith('"32,1": {"block_size_x": 32')
    # a line damaged in the middle, with complete entries after it, is not a cut-off: refused whole
    lines = (WILD / "killed_mid_entry.json").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith('"16,1"'))
    lines[at] = lines[at][:60]
    damaged = tmp_path / "k" / "damaged.json"
    damaged.parent.mkdir()
    damaged.write_text("\n".join(lines))
    assert "not valid JSON" in refused(store, damaged, device="nvidia-rtx-a4000")
    # on one line too (json.dumps without indent): an entry damaged before others is never read as the end
    one_line = json.dumps(kt_cache({"16,1": entry(16, 1, 1.0), "32,1": entry(32, 1, 2.0), "32,2": entry(32, 2, 3.0)}))
    damaged.write_text(one_line.replace('"time": 2.0', '"time": 2.0.1'))
    assert "not valid JSON" in refused(store, damaged)
    for cut_at, kept in (('"time": 2.0', 1), ('"block_size_x": 32, "block_size_y": 2, "time": 3.0', 2)):
        for cut in ("", "tr", "3.", "-"):
            damaged.write_text(one_line[: one_line.index(cut_at) + len(cut_at) - 3] + cut)
            assert len(parse_file(damaged).measurements) == kept, (cut_at, cut)
    # cut-off caches keep what they held: importing the finished file later adds only the rest
    import_files(store, [WILD / "killed_mid_entry.json"], device="nvidia-rtx-a4000")
    rows = import_files(store, [WILD / "small_cache_1.0.0.json", WILD / "small_cache_1.1.0.json"],
                        device="nvidia-rtx-a4000")
    assert [r["added"] for r in rows] == [0, 1]


def test_published_files_that_name_their_gpu_import_with_no_device_option(store):
    # valid_example.json names it in device_name; Kernel Tuner's README example writes it to vector_add-metadata.json
    rows = import_files(store, [WILD / name for name in ("valid_example.json", "vector_add.json",
                                                         "vector_add-metadata.json")])
    assert [(r["device"], r["kernel"], r["rows"], r["failed"]) for r in rows] == [
        ("nvidia-a100-pcie-40gb", "convolution_kernel", 2, 0), ("nvidia-rtx-3090", "kernel_tuner_wild", 3, 0),
        (None, None, 0, 0)]
    sources = {r["settings"]["file"]: r["settings"]["device_from"] for r in store.runs()}
    assert sources == {"valid_example.json": "reported", "vector_add.json": "reported"}


def test_published_files_that_name_no_gpu_say_what_to_pass(store, tmp_path):
    assert "device 'Testing' is not in the catalog; pass --device <catalog id> or --device-map FILE" in refused(
        store, WILD / "small_cache_1.0.0.json")
    assert (f"{NO_GPU} 't4_cache_invalids' is no catalog device; pass --device <catalog id> or --device-map FILE"
            in refused(store, WILD / "t4_cache_invalids.json"))
    assert refused(store, WILD / "convolution_MI50.json") == (
        f"cannot import {WILD / 'convolution_MI50.json'}: device 'AMD Instinct MI50/MI60' names several chips (it "
        "may be amd-mi50, amd-mi60); pass --device <its id> or map the file in --device-map; nothing of it was stored")


def test_a_t4_file_tuned_for_gflops_without_times_is_refused_saying_so(seeded, tmp_path):
    doc = json.loads((WILD / "vector_add_gflops_T4.json").read_text())
    for result in doc["results"]:
        result["times"]["runtimes"] = []
        result["measurements"] = [m for m in result["measurements"] if m["name"] != "time"]
    path = write(tmp_path / "vec" / "A4000_T4.json", doc)
    assert refused(seeded, path, problem_size=[8]) == (
        f"cannot import {path}: result 0 is correct but has no runtimes and no time measurement (it was tuned for "
        "'GFLOP/s', not a kernel time); nothing of it was stored")


@pytest.mark.parametrize(
    "name, device_id",
    [("NVIDIA GeForce RTX 3090", "nvidia-rtx-3090"), ("Tesla V100-SXM2-32GB", "nvidia-v100-sxm2-32gb"),
     ("A100-PCIE-40GB", "nvidia-a100-pcie-40gb"), ("AMD Instinct MI250X", "amd-mi250x"),
     ("NVIDIA RTX A6000", "nvidia-rtx-a6000"), ("GeForce GTX TITAN X", "nvidia-gtx-titan-x"),
     ("Tesla K20c", "nvidia-tesla-k20"), ("Tesla K40m", "nvidia-tesla-k40"), ("Tesla K20Xm", "nvidia-tesla-k20x"),
     ("TITAN X (Pascal)", "nvidia-titan-x-pascal"), ("NVIDIA A100 80GB PCIe", "nvidia-a100-pcie-80gb"),
     ("NVIDIA H100 80GB HBM3", "nvidia-h100-sxm"), ("AMD Instinct MI300X VF", "amd-mi300x"),
     ("Tesla V100-DGXS-32GB", "nvidia-v100-sxm2-32gb"), ("AMD Radeon PRO W7800", "amd-radeon-pro-w7800"),
     ("NVIDIA TITAN Xp COLLECTORS EDITION", "nvidia-titan-xp"), ("TitanV", "nvidia-titan-v"),
     ("NVIDIA GeForce RTX 3060 Laptop GPU", "nvidia-rtx-3060-laptop"),
     ("NVIDIA GeForce RTX 4090 Laptop GPU", "nvidia-rtx-4090-laptop"), ("Quadro GV100", "nvidia-quadro-gv100"),
     ("Quadro P5000", "nvidia-quadro-p5000"), ("Quadro K6000", "nvidia-quadro-k6000"),
     ("NVIDIA RTX A5500", "nvidia-rtx-a5500"), ("NVIDIA RTX A1000", "nvidia-rtx-a1000"),
     ("Tesla P100-PCIE-12GB", "nvidia-p100-pcie-12gb"), ("Tesla K10.G2.8GB", "nvidia-tesla-k10"),
     ("NVIDIA GeForce GTX 1650 SUPER", "nvidia-gtx-1650-super"), ("AMD Radeon VII", "amd-radeon-vii"),
     ("AMD Radeon Pro VII", "amd-radeon-pro-vii"), ("Radeon RX Vega 64", "amd-radeon-rx-vega-64"),
     ("Radeon RX 580 Series", "amd-radeon-rx-580"), ("NVIDIA H200 NVL", "nvidia-h200-nvl"),
     ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "nvidia-rtx-pro-6000-blackwell-max-q"),
     ("AMD Radeon AI PRO R9700", "amd-radeon-ai-pro-r9700")],
)
def test_device_names_as_kernel_tuner_files_write_them(tmp_path, name, device_id):
    path = write(tmp_path / "k" / "a.json", kt_cache({"16,1": entry()}, device_name=name))
    assert parse_file(path).device.id == device_id


@pytest.mark.parametrize(
    "file_name, device_id",
    [("RTX_3060_laptop.json.gz", "nvidia-rtx-3060-laptop"), ("RTX_4070_Laptop_T4.json", "nvidia-rtx-4070-laptop"),
     ("RTX_Titan.json.gz", "nvidia-titan-rtx"), ("Quadro_P5000.json", "nvidia-quadro-p5000"),
     ("Quadro_GV100_extended.json", "nvidia-quadro-gv100"), ("RTX_A5500.json", "nvidia-rtx-a5500"),
     ("RTX_2060S.json", "nvidia-rtx-2060-super"), ("Radeon_VII.json", "amd-radeon-vii"),
     ("RX_Vega_64.json", "amd-radeon-rx-vega-64"), ("RX580_T4.json", "amd-radeon-rx-580")],
)
def test_a_file_named_after_its_gpu_imports_with_no_device_map(store, tmp_path, file_name, device_id):
    # files of other kernels on other GPUs, named as the public tuning files are, with no device_name inside
    doc = (t4([t4_result(16, "correct", [1.0], 1.0, "ms")], {"problem_size": [8]}) if "_T4" in file_name
           else kt_cache({"16,1": entry(), "32,1": entry(32, 1, 2.5)}, device_name="", kernel_name="convolution"))
    path = write(tmp_path / "conv" / file_name, doc, gz=file_name.endswith(".gz"))
    (row,) = import_files(store, [path])
    assert row["device"] == device_id
    assert {m["device_id"] for m in store.measurements()} == {device_id}


@pytest.mark.parametrize("file_name", ["t4_cache.json", "T4.json", "t4_results.json", "T4-output.json"])
def test_a_file_named_only_for_the_t4_format_is_refused_never_taken_for_the_t4_gpu(seeded, tmp_path, file_name):
    """Kernel Tuner's own test cache test/test_convert_files/t4_cache.json names no GPU: "t4" is the format."""
    path = write(tmp_path / "k" / file_name, kt_cache({"16,1": entry()}, device_name=""))
    assert refused(seeded, path) == (
        f"cannot import {path}: it names no GPU, and its file name {file_name.removesuffix('.json')!r} may stand for "
        "the T4 format as well as the T4 GPU; pass --device <catalog id> or --device-map FILE; nothing of it was "
        "stored")
    assert import_files(seeded, [path], device="nvidia-t4")[0]["device"] == "nvidia-t4"


@pytest.mark.parametrize("file_name", ["T4_T4.json", "Tesla_T4.json", "T4_cache_T4.json"])
def test_a_t4_gpu_named_beside_the_format_is_the_t4(store, tmp_path, file_name):
    path = write(tmp_path / "k" / file_name, kt_cache({"16,1": entry()}, device_name=""))
    assert import_files(store, [path])[0]["device"] == "nvidia-t4"


@pytest.mark.parametrize(
    "name, file_name",
    [("GeForce GTX 580", "a.json"), ("Tesla C2050", "a.json"), ("", "GTX_580.json"), ("", "Tesla_C2070.json")],
)
def test_a_fermi_gpu_is_refused_saying_what_to_pass_never_matched(seeded, tmp_path, name, file_name):
    # Fermi (GTX 580, Tesla C20x0) predates the catalog's Kepler-to-Blackwell span; GTX 580 is not the RX 580
    path = write(tmp_path / "k" / file_name, kt_cache({"16,1": entry()}, device_name=name))
    said = f"device {name!r} is not in the catalog" if name else f"{NO_GPU} {file_name.removesuffix('.json')!r} is no catalog device"
    otherwise = (" where it is a catalog chip named otherwise: another chip's id would file its timings as that "
                 "chip's; a chip the catalog lacks is registered with `zmlx-pipeline devices add RECORD` (its "
                 "figures, each with its source) and then imported under its own id") if name else ""
    assert refused(seeded, path) == (
        f"cannot import {path}: {said}; pass --device <catalog id> or "
        f"--device-map FILE (`zmlx-pipeline devices` lists the ids){otherwise}; nothing of it was stored")


@pytest.mark.parametrize(
    "name, told",
    [("gfx90a:sramecc+:xnack-", "it may be amd-mi210, amd-mi250, amd-mi250x"),
     ("NVIDIA H100", "it may be nvidia-h100-pcie, nvidia-h100-sxm, nvidia-h100-nvl"),
     ("AMD Instinct MI50/MI60", "names several chips (it may be amd-mi50, amd-mi60)"),
     ("Apple M1 Pro", "it may be apple-m1-pro-14c, apple-m1-pro-16c"),  # Kernel Tuner's OpenCL backend on a Mac
     ("NVIDIA GeForce RTX 3050 Laptop GPU", "is not in the catalog"),
     ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "is a MIG instance (a slice of nvidia-a100-sxm4-40gb with part of its "
                                          "SMs and memory), which the catalog has no row for")],
)
def test_device_names_that_tell_no_one_chip_are_refused_never_guessed(seeded, tmp_path, name, told):
    path = write(tmp_path / "k" / "a.json", kt_cache({"16,1": entry()}, device_name=name))
    message = refused(seeded, path)
    assert told in message and "pass --device" in message


def test_a_cache_written_indented_and_cut_off_inside_an_entry_keeps_its_complete_entries(store, tmp_path):
    # kernel_tuner/cache/file.py write_cache dumps the whole cache with indent=0: an entry spans many lines
    doc = json.loads((WILD / "small_cache_1.1.0.json").read_text())
    text = json.dumps(doc, indent=0)
    cut = text[: text.index('"32,1"')] + text[text.index('"32,1"'):][:250]
    assert cut.count("\n") > 40 and not cut.rstrip().endswith("}")
    path = tmp_path / "k" / "indented.json"
    path.parent.mkdir()
    path.write_text(cut)
    parsed = parse_file(path, device="nvidia-rtx-a4000")
    assert [m.config for m in parsed.measurements] == [{"block_size_x": 16, "block_size_y": 1},
                                                       {"block_size_x": 16, "block_size_y": 2}]


def test_a_t4_file_converted_from_a_cache_tuned_for_gflops_reads_its_runtimes_never_the_gflops(store, tmp_path):
    # kernel_tuner/cache/convert.py convert_cache_to_t4: one measurement, named after the objective, unit "";
    # runtimes from the entry's "times", left out where the entry has none
    doc = {"metadata": {"timeunit": "miliseconds"}, "schema_version": "1.0.0", "results": [
        {"timestamp": "2023-12-22 09:54:05.502007+00:00", "configuration": {"block_size_x": 16},
         "times": {"compilation": 918.6, "framework": 105.2, "search_algorithm": 0, "validation": 0,
                   "runtimes": [3.976, 3.879, 3.873]},
         "invalidity": "correct", "correctness": 1,
         "measurements": [{"name": "GFLOP/s", "value": 1948.16, "unit": ""}], "objectives": ["GFLOP/s"]},
        {"timestamp": "2023-12-22 09:54:06.508453+00:00", "configuration": {"block_size_x": 32},
         "times": {"compilation": 855.1, "framework": 2.1, "search_algorithm": 0, "validation": 0},
         "invalidity": "compile", "correctness": 0,
         "measurements": [{"name": "GFLOP/s", "value": "CompilationFailedConfig", "unit": ""}],
         "objectives": ["GFLOP/s"]}]}
    path = write(tmp_path / "conv" / "A4000_T4.json", doc)
    parsed = parse_file(path, problem_size=[4096, 4096])
    assert [(m.status, m.median_us) for m in parsed.measurements] == [("ok", pytest.approx(3879.0)),
                                                                      ("compile_error", None)]
    del doc["results"][0]["times"]["runtimes"]
    write(path, doc)
    assert ("result 0 is correct but has no runtimes and no time measurement (it was tuned for 'GFLOP/s', not a "
            "kernel time)") in refused(store, path, problem_size=[4096, 4096])


def rocm_metadata(card: dict) -> dict:
    """A T4 metadata document holding one card of rocm-smi --showallinfo --json output."""
    return {"metadata": {"environment": {"device_query": {"rocm-smi": {"card0": card}}}}}


@pytest.mark.parametrize(
    "card, device_id",
    [({"Card series": "Navi 31 [Radeon Pro W7800]", "Card model": "0x7448"}, "amd-radeon-pro-w7800"),
     ({"Card Series": "0x740c", "Device Name": "Aldebaran/MI200 [Instinct MI250X/MI250]",
       "Marketing Name": "AMD Instinct MI250X"}, "amd-mi250x")],
)
def test_rocm_smi_fields_as_rocm_versions_fill_them(store, tmp_path, card, device_id):
    folder = tmp_path / "vec"
    results = write(folder / "node3-results.json", t4([t4_result(16, "correct", [1.0], 1.0, "ms")]))
    write(folder / "node3-metadata.json", rocm_metadata(card))
    assert parse_file(results, problem_size=[8]).device.id == device_id


@pytest.mark.parametrize(
    "card, device_id",
    [({"Card series": "Vega 20 [Radeon VII]", "Card model": "0x66af"}, "amd-radeon-vii"),
     ({"Card Series": "Radeon RX 580 Series", "Card model": "0x67df"}, "amd-radeon-rx-580"),
     ({"Card Series": "0x687f", "Marketing Name": "Radeon RX Vega 56"}, "amd-radeon-rx-vega-56")],
)
def test_rocm_smi_names_of_gcn_boards(store, tmp_path, card, device_id):
    folder = tmp_path / "vec"
    results = write(folder / "node3-results.json", t4([t4_result(16, "correct", [1.0], 1.0, "ms")]))
    write(folder / "node3-metadata.json", rocm_metadata(card))
    assert parse_file(results, problem_size=[8]).device.id == device_id


def test_a_pci_ids_name_of_every_polaris_board_is_refused_listing_those_catalogued(seeded, tmp_path):
    folder = tmp_path / "vec"
    results = write(folder / "node3-results.json", t4([t4_result(16, "correct", [1.0], 1.0, "ms")]))
    write(folder / "node3-metadata.json", rocm_metadata({"Card series": "Ellesmere [Radeon RX 470/480/570/580/590]"}))
    assert "names several chips (it may be amd-radeon-rx-580, amd-radeon-rx-590)" in refused(
        seeded, results, problem_size=[8])


def test_a_rocm_smi_name_of_several_boards_is_refused_listing_them(seeded, tmp_path):
    folder = tmp_path / "vec"
    results = write(folder / "node3-results.json", t4([t4_result(16, "correct", [1.0], 1.0, "ms")]))
    card = {"Card series": "0x740c", "Device Name": "Aldebaran/MI200 [Instinct MI250X/MI250]"}
    write(folder / "node3-metadata.json", rocm_metadata(card))
    assert "device 'Instinct MI250X/MI250' names several chips (it may be amd-mi250x, amd-mi250)" in refused(
        seeded, results, problem_size=[8])


def test_a_failure_written_into_any_result_of_an_entry_fails_it(store, tmp_path):
    # a config whose metric Kernel Tuner could not compute holds the failure there; its time is no timing
    doc = kt_cache({"16,1": entry(16, 1, 2.0), "32,1": entry(32, 1, 2.5, **{"GFLOP/s": "RuntimeFailedConfig"}),
                    "32,2": entry(32, 2, 3.0, energy="InvalidConfig")})
    (row,) = import_files(store, [write(tmp_path / "k" / "a.json", doc)])
    assert (row["rows"], row["failed"], row["skipped"]) == (2, 1, 1)
    assert sorted((m["config"]["block_size_x"], m["status"], m["median_us"]) for m in store.measurements()) == [
        (16, "ok", 2000.0), (32, "launch_error", None)]


def test_a_byte_order_mark_and_repetitions_in_a_t4_measurement_are_read(tmp_path):
    path = tmp_path / "k" / "A4000.json"
    path.parent.mkdir()
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(kt_cache({"16,1": entry()})).encode())
    assert parse_file(path).measurements[0].median_us == 1500.0
    # the T4 schema allows a measurement's value to be an array: the repetitions
    doc = t4([{"configuration": {"block_size_x": 16}, "invalidity": "correct", "correctness": 1, "times": {},
               "measurements": [{"name": "time", "value": [1.0, 3.0, 2.0], "unit": "ms"}]}], {"problem_size": [8]})
    (m,) = parse_file(write(tmp_path / "vec" / "A4000_T4.json", doc)).measurements
    assert (m.median_us, m.samples) == (2000.0, 3)


@pytest.mark.parametrize(
    "file_name, device_id",
    [("A4000_f=bruteforce_i=0.json", "nvidia-rtx-a4000"),  # fjwillemsen/kernel_tuner_paper results/hotspot/
     ("RTX_Titan.json.gz", "nvidia-titan-rtx"),  # AutoTuningAssociation/benchmark_hub cachefiles/convolution/
     ("TitanXp_T4.json", "nvidia-titan-xp"), ("MI250X_T4.json.gz", "amd-mi250x")],
)
def test_file_names_of_published_files_name_their_gpu(tmp_path, file_name, device_id):
    path = write(tmp_path / "k" / file_name, kt_cache({"16,1": entry()}, device_name=""), gz=file_name.endswith(".gz"))
    assert parse_file(path).device.id == device_id


@pytest.mark.parametrize("file_name, kernel, hint", [
    ("axpy_d_RTX_4090_D.json", "axpy_d", None),  # the kernel's "d" is no licence to drop the GPU's D
    ("gemm_RTX_2070_SUPER.json", "gemm_super", "nvidia-rtx-2070-super"),  # nor its "super" the card's SUPER
    ("RTX_2070_SUPER_gemm_super.json", "gemm_super", "nvidia-rtx-2070-super"),  # the whole kernel name after it
])
def test_only_the_kernels_whole_name_after_the_chip_is_passed_over(seeded, tmp_path, file_name, kernel, hint):
    path = write(tmp_path / "k" / file_name, kt_cache({"16,1": entry()}, device_name="", kernel_name=kernel))
    message = refused(seeded, path)
    assert (f"pass --device {hint} if it ran there" in message) if hint else ("if it ran there" not in message)


@pytest.mark.parametrize("file_name", ["H100_SXM_sms=66.json", "H100_SXM_mps=50.json", "H100_SXM_num_sm=32.json",
                                       "H100_SXM_active_thread_percentage=50.json"])
def test_a_file_name_setting_that_limits_the_gpu_is_never_dropped_as_a_run_setting(seeded, tmp_path, file_name):
    """`f=bruteforce` describes the run; `sms=66` is a core-limited GPU, never the whole H100 it is a part of."""
    path = write(tmp_path / "k" / file_name, kt_cache({"16,1": entry()}, device_name=""))
    before = snapshot(seeded)
    message = refused(seeded, path)
    assert NO_GPU in message and "nvidia-h100-sxm if it ran there" not in message
    assert snapshot(seeded) == before


def test_a_time_written_over_its_repetitions_is_the_timing(store, tmp_path):
    # autotuning_methodology's ktt_values_to_kerneltuner.py rewrites each entry's "time" with KTT's duration
    # (or a failure marker) and leaves Kernel Tuner's "times" as they were; Kernel Tuner itself writes the mean
    doc = kt_cache({"16,1": entry(16, 1, 2.0, times=[1.0, 2.0, 3.0]),
                    "32,1": entry(32, 1, 7.5, times=[10.0, 10.5, 9.5]),
                    "32,2": entry(32, 2, "CompilationFailedConfig", times=[4.0, 4.1, 3.9])}, device_name="")
    (row,) = import_files(store, [write(tmp_path / "convolution" / "RTX_3090.json", doc)])
    got = {m["config"]["block_size_x"] * 10 + m["config"]["block_size_y"]: (m["status"], m["median_us"], m["samples"])
           for m in store.measurements()}
    assert got == {161: ("ok", 2000.0, 3), 321: ("ok", 7500.0, 1), 322: ("compile_error", None, 0)}
    assert store.runs()[0]["settings"]["entries_timed_by_time_not_times"] == 1
    assert row["device"] == "nvidia-rtx-3090"


def test_t4_results_of_one_file_in_different_units_are_each_read_in_their_own(tmp_path):
    doc = t4([t4_result(16, "correct", [2.0], 2.0, "ms"), t4_result(32, "correct", [0.003], 0.003, "s"),
              t4_result(64, "correct", [4.0], 4.0, "")], {"problem_size": [8]})
    got = [m.median_us for m in parse_file(write(tmp_path / "vec" / "A4000_T4.json", doc)).measurements]
    assert got == pytest.approx([2000.0, 3000.0, 4000.0])  # "" takes the file's first unit given, ms
    doc["metadata"]["timeunit"] = "us"  # the metadata's unit is every result's
    got = [m.median_us for m in parse_file(write(tmp_path / "vec" / "A4000_T4.json", doc)).measurements]
    assert got == pytest.approx([2.0, 0.003, 4.0])


def test_a_run_stopped_before_its_first_config_is_reported_beside_others_and_refused_alone(store, tmp_path):
    # Kernel Tuner writes the header (up to `"cache": {`) before it times anything
    text = (WILD / "small_cache_1.0.0.json").read_text()
    header_only = tmp_path / "k" / "stopped.json"
    header_only.parent.mkdir()
    header_only.write_text(text[: text.index('"cache": {') + len('"cache": {')])
    all_invalid = write(tmp_path / "k" / "invalid.json", kt_cache({"16,1": entry(16, 1, "InvalidConfig")}))
    rows = import_files(store, [WILD / "small_cache_1.0.0.json", header_only, all_invalid], device="nvidia-rtx-a4000")
    assert [(Path(r["file"]).name, r["device"], r["rows"], r["added"]) for r in rows] == [
        ("small_cache_1.0.0.json", "nvidia-rtx-a4000", 2, 2), ("stopped.json", None, 0, 0),
        ("invalid.json", None, 0, 0)]
    assert len(store.runs()) == 1
    assert refused(store, header_only) == (
        f"cannot import {header_only}: its 'cache' has no entries; nothing of it was stored")
    assert "no measurements in it (every entry is a config its restrictions exclude)" in refused(store, all_invalid)


def test_nan_and_infinity_as_python_writes_them(store, tmp_path):
    # json.dumps writes float("nan") and float("inf") as NaN and Infinity: in a metric they are no concern, an
    # infinite time is a failed config (as Kernel Tuner's 1e20), a NaN time is neither a time nor a marker
    path = tmp_path / "k" / "A4000.json"
    path.parent.mkdir()
    path.write_text(json.dumps(kt_cache({"16,1": entry(16, 1, 1.5, times=[1.5], **{"GFLOP/s": float("nan")}),
                                         "32,1": entry(32, 1, float("inf"), energy=float("inf"))})))
    assert "NaN" in path.read_text() and "Infinity" in path.read_text()
    (row,) = import_files(store, [path])
    assert (row["rows"], row["failed"]) == (2, 1)
    assert sorted((m["config"]["block_size_x"], m["status"], m["median_us"]) for m in store.measurements()) == [
        (16, "ok", 1500.0), (32, "launch_error", None)]
    bad = tmp_path / "k" / "A6000.json"
    bad.write_text(json.dumps(kt_cache({"16,1": entry(16, 1, float("nan"), times=[1.5])}, device_name="RTX A6000")))
    assert refused(store, bad) == (f"cannot import {bad}: cache entry '16,1': 'time' is NaN, neither a time nor a "
                                   "failure marker; nothing of it was stored")


def test_parameter_values_of_every_json_type_are_kept_as_written(store, tmp_path):
    # text, booleans, lists and null as parameter values (a vector type, a switch, a tile shape, "no limit")
    keys = ("vector", "use_shmem", "tile", "max_regs")
    entries = {f"{v},{s},{t},{m}": {"vector": v, "use_shmem": s, "tile": t, "max_regs": m, "time": 1.0 + i,
                                     "times": [1.0 + i]}
               for i, (v, s, t, m) in enumerate([("float4", True, [4, 1], None), ("float2", False, [2, 2], 64)])}
    path = write(tmp_path / "k" / "A4000.json", kt_cache(entries, keys=keys, tune_params={}))
    (row,) = import_files(store, [path])
    assert row["rows"] == 2
    got = sorted((json.dumps(m["config"], sort_keys=True), m["median_us"]) for m in store.measurements())
    assert got == [('{"max_regs": 64, "tile": [2, 2], "use_shmem": false, "vector": "float2"}', 2000.0),
                   ('{"max_regs": null, "tile": [4, 1], "use_shmem": true, "vector": "float4"}', 1000.0)]
    assert import_files(store, [path])[0]["added"] == 0


def test_null_measurements_of_failed_t4_results_are_no_concern(store, tmp_path):
    failed = t4_result(32, "runtime")
    failed["measurements"] = [{"name": "time", "value": None, "unit": "ms"}]
    failed["times"]["runtimes"] = None
    path = write(tmp_path / "k" / "A4000_T4.json", t4([t4_result(16, "correct", [1.0], 1.0, "ms"), failed]))
    (row,) = import_files(store, [path], problem_size=[64])
    assert (row["rows"], row["failed"]) == (2, 1)
    bad = write(tmp_path / "k" / "A6000_T4.json", t4([{**failed, "invalidity": "correct"}]))
    assert "result 0 is correct but has no runtimes and no time measurement" in refused(store, bad, problem_size=[64])


def test_a_cache_of_kernel_tuners_parallel_runner_names_its_gpu_once_per_worker(store, tmp_path):
    # the parallel runner writes one device name per GPU it tuned on
    path = write(tmp_path / "k" / "run.json", kt_cache({"16,1": entry()}, device_name=["NVIDIA A100-PCIE-40GB"] * 4))
    (row,) = import_files(store, [path])
    assert (row["device"], row["rows"]) == (A100, 1)
    mixed = write(tmp_path / "k" / "mixed.json",
                  kt_cache({"16,1": entry()}, device_name=["NVIDIA A100-PCIE-40GB", "NVIDIA RTX A4000"]))
    assert refused(store, mixed) == (
        f"cannot import {mixed}: it was tuned on several GPUs at once (NVIDIA A100-PCIE-40GB, NVIDIA RTX A4000), whose "
        "timings it does not tell apart; import a cache of one GPU model; nothing of it was stored")


def test_a_path_that_is_no_regular_file_is_refused_before_it_is_read(seeded, tmp_path):
    import os
    import threading

    fifo = tmp_path / "k" / "A4000.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)

    def unblock() -> None:  # should the import wait on the FIFO after all, end the wait so the test fails, not hangs
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    timer = threading.Timer(10, unblock)
    timer.start()
    try:
        assert "a FIFO (named pipe), not a regular file to read" in refused(seeded, fifo)
        before = snapshot(seeded)
        with pytest.raises(ImportFileError, match=r"--device-map .*A4000.json: a FIFO \(named pipe\), not a regular"):
            import_files(seeded, [write(tmp_path / "k2" / "a.json", kt_cache({"16,1": entry()}))], device_map=fifo)
        assert snapshot(seeded) == before
    finally:
        timer.cancel()
    assert "a character device, not a regular file to read" in refused(seeded, Path("/dev/zero"))


def test_a_file_past_the_size_limit_is_refused_unread_and_so_is_one_that_unpacks_past_it(seeded, tmp_path,
                                                                                        monkeypatch):
    from zmlx_pipeline.data.importers import kernel_tuner

    doc = kt_cache({"16,1": entry()})
    size = len(json.dumps(doc).encode())
    monkeypatch.setattr(kernel_tuner, "MAX_FILE_BYTES", size - 1)
    plain = write(tmp_path / "k" / "a.json", doc)
    assert f"larger than {size - 1} bytes, the most a file read here may hold" in refused(seeded, plain)
    packed = write(tmp_path / "k" / "b.json.gz", doc, gz=True)
    assert packed.stat().st_size < size - 1
    assert f"its gzip stream unpacks to more than {size - 1} bytes" in refused(seeded, packed)
    monkeypatch.setattr(kernel_tuner, "MAX_FILE_BYTES", size)
    assert import_files(seeded, [packed])[0]["added"] == 1


def test_json_nested_past_what_the_reader_can_take_is_malformed_not_a_crash(seeded, tmp_path):
    deep = tmp_path / "k" / "deep.json"
    deep.parent.mkdir()
    deep.write_text("[" * 200_000 + "]" * 200_000)
    assert "not valid JSON: nested deeper than a tuning file can be" in refused(seeded, deep)
    deep.write_text('{"cache": {"16,1": ' + "[" * 200_000)  # the reader of a cache left open goes as deep
    assert "not valid JSON: nested deeper than a tuning file can be" in refused(seeded, deep)
    with pytest.raises(ImportFileError, match="deep.json: not valid JSON \\(nested too deep\\)"):
        import_files(seeded, [write(tmp_path / "k2" / "a.json", kt_cache({"16,1": entry()}))], device_map=deep)


BAD_PROBLEM_SIZES = {
    "zero": ([0], "problem size [0]: x=0 is not a positive integer"),
    "zero beside a size": ([0, 4096], "problem size [0, 4096]: x=0 is not a positive integer"),
    "negative": ([-5], "problem size [-5]: x=-5 is not a positive integer"),
    "a bool": ([True], "problem size [True]: x=True is not a positive integer"),
    "a fraction": ([1.5], "problem size [1.5]: x=1.5 is not a positive integer"),
    "empty": ([], "problem size [] is empty"),
    "past an array dimension": ([2**70], f"problem size [{2**70}]: x={2**70} is larger than an array dimension can "
                                         "be (2147483647)"),
    "an unnamed dim": ({"": 5}, "problem size {'': 5}: dimension name '' is not a name"),
    "a name of no parameter": ("big", "problem size 'big' is neither sizes nor an expression of the tuned "
                                      "parameters (block_size_x, block_size_y)"),
}


@pytest.mark.parametrize("case", sorted(BAD_PROBLEM_SIZES))
def test_a_problem_size_that_is_no_size_is_refused_saying_why(seeded, tmp_path, case):
    size, reason = BAD_PROBLEM_SIZES[case]
    path = write(tmp_path / "vec" / "A4000.json", kt_cache({"16,1": entry()}, problem_size=size))
    assert refused(seeded, path) == f"cannot import {path}: {reason} (in its file); nothing of it was stored"
    unsized = write(tmp_path / "vec2" / "A4000.json", kt_cache({"16,1": entry()}, problem_size=None))
    before = snapshot(seeded)
    with pytest.raises(ImportFileError, match=r"^--problem-size: "):
        import_files(seeded, [unsized], problem_size=size)
    assert snapshot(seeded) == before


def test_an_integer_of_thousands_of_digits_is_refused_as_no_size_not_a_crash(seeded, tmp_path):
    """Python refuses to read an int of over 4300 digits (ValueError); such a size reads as infinite, and is no size:
    said as too large, the digits cut short."""
    path = tmp_path / "big" / "A4000.json"
    path.parent.mkdir()
    text = json.dumps(kt_cache({"16,1": entry()}, problem_size=[4096])).replace("[4096]", "[" + "9" * 5000 + "]", 1)
    path.write_text(text)
    assert (f"x={'9' * 20}... (5000 digits) is larger than an array dimension can be (2147483647)"
            in refused(seeded, path))


@pytest.mark.parametrize("text", ["0", "0,4096", '{"": 5}', "[true]", "[-5]", "1180591620717411303424",
                                  "[" * 100_000])
def test_a_problem_size_option_that_is_no_size_is_a_usage_error(store, tmp_path, text):
    from zmlx_pipeline.data.importers import parse_problem_size

    with pytest.raises(ValueError):
        parse_problem_size(text)
    path = write(tmp_path / "vec" / "A4000.json", kt_cache({"16,1": entry()}, problem_size=None))
    result = CliRunner().invoke(cli, ["import", str(path), "--problem-size", text])
    assert result.exit_code == 2 and "Invalid value for '--problem-size'" in result.output, result.output
    assert store.measurements() == []


def test_a_kernel_name_that_is_no_name_is_refused_and_a_missing_one_is_the_folders(seeded, tmp_path, monkeypatch):
    number = write(tmp_path / "vec" / "A4000.json", kt_cache({"16,1": entry()}, kernel_name=5))
    assert refused(seeded, number) == f"cannot import {number}: its kernel_name is 5, not a name; nothing of it was stored"
    hidden = write(tmp_path / "vec" / "A4000_b.json", kt_cache({"16,1": entry()}, kernel_name="vector\u202eadd"))
    assert "kernel name 'vector\\u202eadd' holds a control character" in refused(seeded, hidden)
    t4_number = write(tmp_path / "vec" / "A4000_T4.json", t4([t4_result(16, "correct", [1.0])], {"kernel_name": 7}))
    assert "its metadata's kernel_name is 7, not a name" in refused(seeded, t4_number, problem_size=[64])
    # a kernel_name given empty names nothing, and is refused as a name, not replaced by the folder's
    for blank in ("", "  "):
        empty = write(tmp_path / "vec_add" / "A4000.json", kt_cache({"16,1": entry()}, kernel_name=blank))
        assert refused(seeded, empty) == (f"cannot import {empty}: its kernel_name is empty; give the file a "
                                          "kernel_name, or pass --kernel NAME; nothing of it was stored")
    assert import_files(seeded, [empty], kernel="named")[0]["kernel"] == "named"  # unless the kernel is named
    # no kernel name (absent, or a T4 file, which has none): the folder's, also for a file named from inside it
    absent = write(tmp_path / "vec_add" / "A4000.json", kt_cache({"16,1": entry()}, kernel_name=None))
    t4_file = write(tmp_path / "vec_t4" / "A4000_T4.json", t4([t4_result(16, "correct", [1.0])]))
    monkeypatch.chdir(tmp_path / "vec_t4")
    rows = import_files(seeded, [absent, Path(t4_file.name)])
    assert [r["kernel"] for r in rows] == ["vec_add", "vec_t4"]
    assert {m["kernel"] for m in seeded.measurements()} == {"toy_kernel", "named", "vec_add", "vec_t4"}


def test_a_file_named_after_a_built_in_kernel_must_be_that_kernel(seeded, tmp_path):
    clash = write(tmp_path / "k" / "A4000.json", kt_cache({"16,1": entry()}, kernel_name="rmsnorm", problem_size=[4096]))
    assert refused(seeded, clash) == (
        f"cannot import {clash}: kernel 'rmsnorm' is built in, with shape dims rows, cols, not x; an imported kernel "
        "may take a built-in kernel's name only with its shape dims and parameters: give it a name of its own (its "
        "kernel_name, or import --kernel); nothing of it was stored")
    dims_only = write(tmp_path / "k" / "A4000_b.json", kt_cache({"16,1": entry()}, kernel_name="rmsnorm",
                                                                problem_size={"rows": 8, "cols": 4096}))
    assert "with parameters ROWS, TG, VEC, not block_size_x, block_size_y" in refused(seeded, dims_only)
    assert import_files(seeded, [clash], kernel="rms_tuned")[0]["added"] == 1  # named its own: imported
    same = {"8,1,4": {"TG": 8, "ROWS": 1, "VEC": 4, "time": 1.0}}
    fits = write(tmp_path / "k" / "A4000_c.json", kt_cache(same, keys=("TG", "ROWS", "VEC"), tune_params={},
                                                           kernel_name="rmsnorm", problem_size={"rows": 8, "cols": 4096}))
    (row,) = import_files(seeded, [fits])
    assert (row["kernel"], row["added"]) == ("rmsnorm", 1)


def test_the_cli_refuses_a_bad_file_in_one_line_and_stores_nothing(tmp_path):
    db = tmp_path / "s.duckdb"
    good = write(tmp_path / "k" / "A4000.json", kt_cache({"16,1": entry()}))
    assert CliRunner().invoke(cli, ["import", "--db", str(db), str(good)]).exit_code == 0
    for doc in (kt_cache({"32,1": entry(32)}, kernel_name="rmsnorm"), kt_cache({"32,1": entry(32)}, problem_size=[0])):
        bad = write(tmp_path / "k2" / "A4000.json", doc)
        result = CliRunner().invoke(cli, ["import", "--db", str(db), str(bad)])
        assert result.exit_code == 1 and result.output.startswith(f"Error: cannot import {bad}: "), result.output
        assert result.output.count("\n") == 1 and "Traceback" not in result.output
    from zmlx_pipeline.data.store import Store

    with Store(db, read_only=True) as store:
        assert len(store.measurements()) == 1


# ------------------------------------------------------------------------------------------
# one sort of value per parameter; nothing but a cut-off after the document


def test_parameter_values_written_as_text_are_read_as_their_key_reads_them(store, tmp_path):
    # Kernel Tuner tells configs apart by str(value): "16" is the 16 of tune_params, stored as one config with it
    doc = kt_cache({"16,1": entry("16", 1, 1.0), "32,1": entry(32, "1", 2.0), "32,2": entry(32, 2, 3.0)})
    path = write(tmp_path / "k" / "A4000.json", doc)
    assert [m.config for m in parse_file(path).measurements] == [
        {"block_size_x": 16, "block_size_y": 1}, {"block_size_x": 32, "block_size_y": 1},
        {"block_size_x": 32, "block_size_y": 2}]
    named = kt_cache({"float,1": entry("float", 1, 1.0), "half,1": entry("half", 1, 2.0)},
                     keys=("vector", "block_size_y"), tune_params={"vector": ["float", "half"], "block_size_y": [1]})
    named["cache"] = {k: {"vector": v.pop("block_size_x"), **v} for k, v in named["cache"].items()}
    path = write(tmp_path / "k" / "A4000_b.json", named)
    assert [m.config["vector"] for m in parse_file(path).measurements] == ["float", "half"]


def test_line_ids_of_kernel_tuners_cache_module_name_text_booleans_and_null_as_json(seeded, tmp_path):
    # kernel_tuner/cache/cache.py (KernelTuner/kernel_tuner 4be4a04, Cache.Lines.__get_line_id, written by
    # `ktcache merge`): a line id is json.dumps(values, separators=(",", ":"))[1:-1], so text is quoted and
    # booleans and None are true and null, where util.py's keys write str(value); the file is write_cache's indent=0
    keys = ("block_size_x", "vector", "use_shmem", "max_regs")
    lines = {}
    for i, values in enumerate([(128, "float", True, None), (256, "float4", False, 64)]):
        line_id = json.dumps(list(values), separators=(",", ":"))[1:-1]
        lines[line_id] = {"time": 1.0 + i, "compile_time": 100.0, "verification_time": 0, "benchmark_time": 1.0,
                          "strategy_time": 0, "framework_time": 0.5, "timestamp": "2024-06-01 12:00:00.123456",
                          "times": [1.0 + i], **dict(zip(keys, values))}
    doc = {"schema_version": "1.1.0", **kt_cache(lines, keys=keys, tune_params={
        "block_size_x": [128, 256], "vector": ["float", "float4"], "use_shmem": [True, False], "max_regs": [None, 64]})}
    path = tmp_path / "k" / "A4000.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc, indent=0))
    assert '"128,\\"float\\",true,null": {' in path.read_text()
    assert [(m.config, m.median_us) for m in parse_file(path).measurements] == [
        ({"block_size_x": 128, "vector": "float", "use_shmem": True, "max_regs": None}, 1000.0),
        ({"block_size_x": 256, "vector": "float4", "use_shmem": False, "max_regs": 64}, 2000.0)]
    # a key that names another value in either form is still refused
    lines['128,"float",true,null']["vector"] = "half"
    path.write_text(json.dumps(doc, indent=0))
    assert "its key gives vector=\"float\" but the entry holds vector='half'" in refused(seeded, path)


def test_a_parameter_holding_values_of_two_sorts_is_refused_naming_it_and_the_entry(seeded, tmp_path):
    doc = kt_cache({"16,1": entry(16, 1, 1.0), "wide,1": entry("wide", 1, 2.0)}, tune_params={"block_size_y": [1]})
    path = write(tmp_path / "k" / "A4000.json", doc)
    assert refused(seeded, path) == (
        f"cannot import {path}: cache entry 'wide,1': block_size_x is 'wide' (text), but cache entry '16,1' gives it "
        "16 (a number); a parameter's values must all be of one sort; nothing of it was stored")


def test_a_parameter_of_another_sort_than_another_files_or_the_stores_is_refused(store, tmp_path):
    numbers = write(tmp_path / "k" / "A4000.json", kt_cache({"16,1": entry(16, 1, 1.0)}))
    text = write(tmp_path / "k" / "A6000.json", kt_cache({"wide,1": entry("wide", 1, 2.0)}, device_name="RTX A6000",
                                                        tune_params={"block_size_y": [1]}))
    with pytest.raises(ImportFileError, match="A6000.json: block_size_x is 'wide' \\(text\\), but A4000.json gives "
                                              "it 16"):
        import_files(store, [numbers, text])
    assert snapshot(store) == ([], [], [])
    import_files(store, [numbers])
    with pytest.raises(ImportFileError, match="but the store \\(kernel vector_add\\) gives it 16 \\(a number\\)"):
        import_files(store, [text])


@pytest.mark.parametrize("after", ["}}", " garbage", "\n{DOC}"])  # a brace too many, garbage, a second document
def test_text_after_a_complete_cache_is_refused_naming_the_offset(seeded, tmp_path, after):
    text = json.dumps(kt_cache({"16,1": entry(16, 1, 1.0), "32,1": entry(32, 1, 2.0)}))
    path = tmp_path / "k" / "A4000.json"
    path.parent.mkdir()
    path.write_text(text + after.replace("{DOC}", text))
    offset = len(text) + len(after) - len(after.lstrip())  # where the first thing after the document starts
    message = refused(seeded, path)
    assert f"not valid JSON: more text after the end of its JSON document (a second document, or garbage) at offset " \
           f"{offset} " in message
    # a cache Kernel Tuner left open or cut off is still read: every complete entry
    path.write_text(text[: text.index('"32,1"')] + '"32,1": {"block_size_x": 32, "bl')
    assert len(parse_file(path).measurements) == 1
