"""Kernel Tuner cache and T4 files into the store: content-detected formats, atomic and idempotent."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import zmlx_pipeline
from zmlx_pipeline.data.importers import ImportFileError, UnmatchedDevice, import_files, parse_file
from zmlx_pipeline.data.importers.kernel_tuner import kernel_version
from zmlx_pipeline.data.keys import mapping_key
from zmlx_pipeline.pipeline.cli import cli

DATASETS = Path(zmlx_pipeline.__file__).resolve().parents[2] / "shared/datasets/kernel-tuner"
A100 = "nvidia-a100-pcie-40gb"


def cache_doc(device_name="NVIDIA A100-PCIE-40GB", keys=("block_size_x", "tile_size_y"), entries=None) -> dict:
    """A tiny Kernel Tuner cache file: one timed config, one that failed to run, one to compile."""
    entries = entries or [
        ({"block_size_x": 32, "tile_size_y": 1}, 2.0, [1.0, 2.0, 3.0, 4.0, 5.0]),
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
    plain_named_gz = write(tmp_path / "k2" / "A100_T4.json.gz", t4_doc(problem_size=[10, 20]))
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
    text = json.dumps(cache_doc())
    cut = tmp_path / "A100.json"
    cut.write_text(text[: len(text) // 2])
    with pytest.raises(ImportFileError, match=r"A100.json: not valid JSON \(truncated\?\)"):
        import_files(store, [cut])
    doc = cache_doc()
    del doc["cache"]
    no_cache = write(tmp_path / "x" / "A100.json", doc)
    with pytest.raises(ImportFileError, match="a Kernel Tuner cache file without 'cache'"):
        import_files(store, [no_cache])
    assert store.measurements() == [] and store.runs() == []


def test_unknown_device_is_refused_unless_overridden(store, tmp_path):
    path = write(tmp_path / "toy" / "mystery.json", cache_doc(device_name="Quantum GPU 9000"))
    with pytest.raises(UnmatchedDevice, match="device 'Quantum GPU 9000' is not in the catalog; pass --device"):
        import_files(store, [path])
    assert store.measurements() == []
    (row,) = import_files(store, [path], device="nvidia-rtx-a6000")
    assert row["device"] == "nvidia-rtx-a6000" and row["added"] == 3
    (row,) = import_files(store, [write(tmp_path / "t2" / "x.json", cache_doc(device_name="?"))], device="RTX A4000")
    assert row["device"] == "nvidia-rtx-a4000"


def test_empty_device_name_is_taken_from_the_file_name(store, tmp_path):
    path = write(tmp_path / "toy" / "MI250X.json.gz", cache_doc(device_name=""), gz=True)
    assert import_files(store, [path])[0]["device"] == "amd-mi250x"


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


@pytest.mark.skipif(not DATASETS.is_dir(), reason="shared Kernel Tuner datasets not present")
def test_real_files_import_completely(store, tmp_path):
    files = [DATASETS / "convolution_milo" / "A6000_original.json.gz",
             DATASETS / "dedispersion_milo" / "MI250X_T4.json.gz"]
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
    data = (DATASETS / "convolution_milo" / "A100.json.gz").read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImportFileError, match="truncated gzip stream"):
        import_files(store, [cut])
    assert len(store.measurements(device=A100)) == 0
