"""Kernel Tuner's store_results file into the store: one imported run per device and problem size it holds, its
times in milliseconds, and the files it cannot give kernel times from refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.data.importers import ImportFileError, import_files, parse_file, parse_sections
from zmlx_pipeline.pipeline.cli import cli

WILD = Path(__file__).parent / "fixtures" / "kernel_tuner_wild"
RESULTS = WILD / "vector_add_results.json"


def test_each_device_and_problem_size_is_a_run_of_its_own(store):
    rows = import_files(store, [RESULTS])
    assert [(r["device"], r["kernel"], r["rows"], r["added"]) for r in rows] == [
        ("nvidia-a100-pcie-40gb", "vector_add", 2, 2),
        ("nvidia-a100-pcie-40gb", "vector_add", 1, 1),
        ("nvidia-rtx-3090", "vector_add", 1, 1)]
    got = sorted((m["device_id"], m["shape"]["x"], m["config"]["block_size_x"], round(m["median_us"], 3), m["samples"])
                 for m in store.measurements())
    assert got == [("nvidia-a100-pcie-40gb", 1000000, 128, 21.3, 1),
                   ("nvidia-a100-pcie-40gb", 10000000, 256, 162.1, 1),
                   ("nvidia-a100-pcie-40gb", 10000000, 512, 164.4, 1),
                   ("nvidia-rtx-3090", 10000000, 1024, 139.8, 1)]
    runs = store.runs()
    assert len(runs) == 3 and {r["status"] for r in runs} == {"imported"}
    assert sorted(json.dumps(r["settings"]["section"], sort_keys=True) for r in runs) == sorted([
        '{"device_name": "NVIDIA_A100_PCIE_40GB", "problem_size": "10000000"}',
        '{"device_name": "NVIDIA_A100_PCIE_40GB", "problem_size": "1000000"}',
        '{"device_name": "NVIDIA_GeForce_RTX_3090", "problem_size": "10000000"}'])
    assert sum(r["added"] for r in import_files(store, [RESULTS])) == 0


def test_the_device_map_maps_each_sections_reported_name(store, tmp_path):
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"NVIDIA_GeForce_RTX_3090": "nvidia-rtx-3090-ti"}))
    rows = import_files(store, [RESULTS], device_map=mapping)
    assert [r["device"] for r in rows] == ["nvidia-a100-pcie-40gb", "nvidia-a100-pcie-40gb", "nvidia-rtx-3090-ti"]


def test_parse_file_of_a_file_of_several_sections_points_to_parse_sections():
    assert len(parse_sections(RESULTS)) == 3
    with pytest.raises(ImportFileError, match="it holds 3 devices or problem sizes; read it with parse_sections"):
        parse_file(RESULTS)


def results_doc(**changes) -> dict:
    doc = json.loads(RESULTS.read_text())
    doc.update(changes)
    return doc


@pytest.mark.parametrize("doc, reason", [
    (results_doc(objective="GFLOP/s", objective_higher_is_better=True),
     "a Kernel Tuner results file stored for 'GFLOP/s', which holds no kernel times; import the cache file of the "
     "same run (tune_kernel's cache=) instead"),
    (results_doc(version_number="2.0"), "a Kernel Tuner results file of version_number '2.0'; versions read: 1.0"),
    (results_doc(tunable_parameters=["block_size_x", "tile"]), "record 0 lacks parameters tile"),
    (results_doc(data=[{"device_name": "NVIDIA_A100_PCIE_40GB", "problem_size": "100",
                        "tunable_parameters": {"block_size_x": 32}, "time": float("nan")}]),
     "record 0: time nan is not a positive finite time"),
])
def test_results_files_without_usable_times_are_refused_through_the_cli(tmp_path, doc, reason):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    db = tmp_path / "s.duckdb"
    result = CliRunner().invoke(cli, ["import", "--db", str(db), str(RESULTS), str(path)])
    assert result.exit_code == 1
    assert result.output == f"Error: cannot import {path}: {reason}; nothing of it was stored\n"
    # the good file given beside it went in neither: the store the import created is gone again
    assert not db.exists()


def test_tune_kernels_saved_return_value_is_refused_saying_what_to_import(store, tmp_path):
    path = tmp_path / "scan-results.json"
    path.write_text(json.dumps([[{"BLOCK_SIZE": 16, "PRECISION": 32, "time": 0.5, "GB/s": 12.0}],
                                {"device_name": "NVIDIA GeForce RTX 2080 Ti", "iterations": 7}], indent=4))
    with pytest.raises(ImportFileError) as err:
        import_files(store, [path])
    assert str(err.value) == (
        f"cannot import {path}: the results and environment tune_kernel returns, saved as JSON: its entries do not "
        "say which fields are tuned parameters; import the cache file of the run (tune_kernel's cache=) or its T4 "
        "output (store_output_file); nothing of it was stored")


def test_tune_kernels_results_saved_alone_are_refused_saying_what_to_import(store, tmp_path):
    """As kernel_tuner_paper's convolution_basinhopping_BFGS_0.json: json.dump of the results list alone."""
    path = tmp_path / "convolution_basinhopping_BFGS_0.json"
    path.write_text(json.dumps([{"block_size_x": 128, "block_size_y": 4, "read_only": 0, "time": 4.53},
                                {"block_size_x": 144, "block_size_y": 4, "read_only": 0, "time": 4.96}]))
    with pytest.raises(ImportFileError) as err:
        import_files(store, [path], device="nvidia-gtx-titan-x")
    assert str(err.value) == (
        f"cannot import {path}: the results tune_kernel returns, saved as JSON: its entries do not say which fields "
        "are tuned parameters, nor which GPU ran them; import the cache file of the run (tune_kernel's cache=) or its "
        "T4 output (store_output_file); nothing of it was stored")
    assert store.measurements() == []


def legacy_doc() -> dict:
    """store_results of a Kernel Tuner before the version number (kernel_tuner/integration.py at 1050f07)."""
    return {"NVIDIA-A100-PCIE-40GB": {"4096x4096": [{"block_size_x": 32, "block_size_y": 4, "time": 1.25},
                                                    {"block_size_x": 64, "block_size_y": 2, "time": 1.27}]},
            "GeForce-GTX-TITAN-X": {"4096x4096": [{"block_size_x": 16, "block_size_y": 8, "time": 3.5}]}}


def test_a_results_file_of_an_older_kernel_tuner_reads_its_records(store, tmp_path):
    path = tmp_path / "convolution" / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps(legacy_doc()))
    rows = import_files(store, [path])
    assert [(r["device"], r["kernel"], r["rows"]) for r in rows] == [
        ("nvidia-a100-pcie-40gb", "convolution", 2), ("nvidia-gtx-titan-x", "convolution", 1)]
    got = sorted((m["device_id"], json.dumps(m["config"], sort_keys=True), m["shape"]["y"], m["median_us"])
                 for m in store.measurements())
    assert got == [("nvidia-a100-pcie-40gb", '{"block_size_x": 32, "block_size_y": 4}', 4096, 1250.0),
                   ("nvidia-a100-pcie-40gb", '{"block_size_x": 64, "block_size_y": 2}', 4096, 1270.0),
                   ("nvidia-gtx-titan-x", '{"block_size_x": 16, "block_size_y": 8}', 4096, 3500.0)]


@pytest.mark.parametrize("doc, reason", [
    ({"NVIDIA-A100-PCIE-40GB": {"4096x4096": [{"block_size_x": 1, "GFLOP/s": 120.0}]}},
     "a results file of an older Kernel Tuner whose record 0 of NVIDIA-A100-PCIE-40GB at 4096x4096 holds no 'time' "
     "(it was stored for another objective); import the cache file of the run instead"),
    ({"GeForce-GTX-TITAN-X": {"4096x4096": [{"block_size_x": 16, "time": 3.5}]},
      "NVIDIA-A100-PCIE-40GB": {"4096x4096": [{"block_size_x": 1, "tile": 2, "time": 1.0}]}},
     "a results file of an older Kernel Tuner whose record 0 of NVIDIA-A100-PCIE-40GB at 4096x4096 names fields "
     "block_size_x, tile, time, not block_size_x, time"),
])
def test_older_results_files_that_cannot_be_read_completely_are_refused(store, tmp_path, doc, reason):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ImportFileError) as err:
        import_files(store, [path])
    assert str(err.value) == f"cannot import {path}: {reason}; nothing of it was stored"
    assert store.measurements() == []
