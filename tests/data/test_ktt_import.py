"""KTT's outputs into the store: its own JSON (statuses, time units, configuration pairs), its T4 files (values
written as text) and its converter's T4 files (a time objective other than `time`), and the tables it writes
that name no parameters (CSV, XML) refused saying what to write instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.data.importers import ImportFileError, import_files
from zmlx_pipeline.pipeline.cli import cli

WILD = Path(__file__).parent / "fixtures" / "kernel_tuner_wild"
A4000 = "nvidia-rtx-a4000"
RTX500 = "NVIDIA RTX 500 Ada Generation Laptop GPU"  # the GPU KTT's tutorial outputs were timed on
RTX500_ID = "nvidia-rtx-500-ada-laptop"


def device_map(tmp_path: Path, entries: dict) -> Path:
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(entries))
    return path


def stored(store) -> list[tuple]:
    return sorted((m["dtype"], json.dumps(m["config"], sort_keys=True), m["status"],
                   None if m["median_us"] is None else round(m["median_us"], 3)) for m in store.measurements())


def test_ktt_json_output_imports_one_timing_per_config(store, tmp_path):
    (row,) = import_files(store, [WILD / "vectorAdd_rtx500ada.ktt.json"])  # under the GPU it names
    assert (row["device"], row["kernel"], row["rows"], row["added"], row["failed"]) == (
        RTX500_ID, "vectorAddition_kernel", 4, 4, 0)
    # TotalDuration in the metadata's Microseconds, the configuration pairs as parameters
    assert stored(store) == sorted([
        ("float32", '{"multiply_block_size": 32}', "ok", 89.536),
        ("float32", '{"multiply_block_size": 64}', "ok", 54.304),
        ("float32", '{"multiply_block_size": 128}', "ok", 46.976),
        ("float32", '{"multiply_block_size": 256}', "ok", 44.672)])
    (run,) = store.runs()
    assert (run["status"], run["settings"]["format"], run["settings"]["device_name"]) == ("imported", "ktt", RTX500)
    assert import_files(store, [WILD / "vectorAdd_rtx500ada.ktt.json"])[0]["added"] == 0
    (device,) = store.devices()
    assert (device["device_id"], device["reported_name"], device["in_catalog"]) == (RTX500_ID, RTX500, True)


def ktt_doc(results: list, unit="Milliseconds") -> dict:
    return {"Metadata": {"ComputeApi": "CUDA", "Device": "NVIDIA RTX A4000", "KttVersion": "2.1",
                         "TimeUnit": unit},
            "Results": results}


def ktt_result(block: int, status="Ok", total=1.5, kernel="k", value_type="UnsignedInt") -> dict:
    return {"Configuration": [{"Name": "block", "Value": block, "ValueType": value_type}],
            "KernelName": kernel, "Status": status, "TotalDuration": total, "ExtraDuration": 0.0}


def test_every_ktt_status_becomes_a_status_and_units_are_the_metadatas(store, tmp_path):
    path = tmp_path / "k" / "run.json"
    path.parent.mkdir()
    path.write_text(json.dumps(ktt_doc([
        ktt_result(32, total=0.25), ktt_result(64, "ComputationFailed", 0.0), ktt_result(128, "ValidationFailed"),
        ktt_result(256, "CompilationFailed", 0.0), ktt_result(512, "DeviceLimitsExceeded", 0.0)])))
    (row,) = import_files(store, [path])
    assert (row["device"], row["rows"], row["failed"]) == (A4000, 5, 4)
    by_block = {m["config"]["block"]: (m["status"], m["median_us"]) for m in store.measurements()}
    assert by_block == {32: ("ok", 250.0), 64: ("launch_error", None), 128: ("wrong_result", None),
                        256: ("compile_error", None), 512: ("launch_error", None)}


def profiled(result: dict, duration: float) -> dict:
    """The run KTT's profile-based searcher repeats under the profiler: its computation carries ProfilingData."""
    return {**result, "TotalDuration": duration, "ComputationResults": [
        {"Duration": duration, "ProfilingData": {"Counters": [{"Name": "sm__warps_active", "Value": 1.0}],
                                                 "RemainingProfilingRuns": 0}}]}


def test_a_profiled_repeat_of_a_config_gives_way_to_its_plain_run(store, tmp_path):
    """KTT's ProfileSearcher output as published: each config timed, then run again under the profiler. The plain
    run is the config's time; a config only ever run under the profiler keeps that run (its one timing)."""
    path = tmp_path / "profile_searcher.json"
    path.write_text(json.dumps(ktt_doc([ktt_result(32, total=0.5), ktt_result(64, "ComputationFailed", 0.0),
                                        profiled(ktt_result(32), 0.75), profiled(ktt_result(128), 2.0)])))
    (row,) = import_files(store, [path])
    assert (row["rows"], row["failed"], row["skipped"]) == (3, 1, 1)
    by_block = {m["config"]["block"]: (m["status"], m["median_us"]) for m in store.measurements()}
    assert by_block == {32: ("ok", 500.0), 64: ("launch_error", None), 128: ("ok", 2000.0)}


def test_a_config_profiled_in_several_passes_keeps_its_last_pass(store, tmp_path):
    """A profile of several passes writes a result per pass (RemainingProfilingRuns 1, then 0)."""
    path = tmp_path / "passes.json"
    path.write_text(json.dumps(ktt_doc([ktt_result(32, total=0.5), profiled(ktt_result(64), 0.9),
                                        profiled(ktt_result(64), 0.8)])))
    (row,) = import_files(store, [path])
    assert (row["rows"], row["skipped"]) == (2, 1)
    assert {m["config"]["block"]: m["median_us"] for m in store.measurements()} == {32: 500.0, 64: 800.0}


def test_two_plain_runs_of_one_config_are_still_refused(store, tmp_path):
    path = tmp_path / "twice.json"
    path.write_text(json.dumps(ktt_doc([ktt_result(32, total=0.5), ktt_result(32, total=0.6),
                                        profiled(ktt_result(32), 0.75)])))
    with pytest.raises(ImportFileError, match="result 0 and result 1 are the same config"):
        import_files(store, [path])
    assert store.measurements() == []


@pytest.mark.parametrize("doc, reason", [
    (ktt_doc([ktt_result(32)], unit="Minutes"), "KTT output with time unit 'Minutes'; KTT writes Nanoseconds"),
    (ktt_doc([ktt_result(32, status="Timeout")]), "result 0: unknown status 'Timeout' (KTT writes Ok,"),
    (ktt_doc([ktt_result(32, total=-1.0)]), "result 0: time -1.0 is not a positive finite time"),
    (ktt_doc([ktt_result(32, kernel="a"), ktt_result(64, kernel="b")]),
     "KTT output of several kernels (a, b); tune and write each kernel to a file of its own"),
    (ktt_doc([{"Status": "Ok", "TotalDuration": 1.0}]), "result 0 has no 'Configuration' list"),
    (ktt_doc([{**ktt_result(32), "Configuration": [{"Name": "block", "Value": 32}, {"Name": "block", "Value": 64}]}]),
     "result 0: parameter 'block' appears twice in its 'Configuration'"),
])
def test_bad_ktt_output_is_refused_and_stores_nothing(store, tmp_path, doc, reason):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ImportFileError) as err:
        import_files(store, [path])
    assert reason in str(err.value) and "\n" not in str(err.value)
    assert store.measurements() == [] and store.runs() == []


def test_ktt_t4_file_reads_values_written_as_text_as_ktt_reads_them(store, tmp_path):
    (row,) = import_files(store, [WILD / "vectorAdd_rtx500ada.t4.json"],
                          device_map=device_map(tmp_path, {RTX500: A4000}))  # a map still files it elsewhere
    assert (row["device"], row["rows"]) == (A4000, 2)
    # "32" in the file: the same config as the KTT JSON output's 32, timed in the metadata's microseconds
    assert stored(store) == [("float32", '{"multiply_block_size": 32}', "ok", 90.656),
                             ("float32", '{"multiply_block_size": 64}', "ok", 62.816)]
    assert store.runs()[0]["settings"]["layout"] == "t4 (KTT: values written as text)"


def test_text_values_are_kept_as_text_in_t4_files_of_other_tools(store, tmp_path):
    doc = json.loads((WILD / "vectorAdd_rtx500ada.t4.json").read_text())
    doc["metadata"]["autotuner"] = "Kernel Tuner"
    path = tmp_path / "other.json"
    path.write_text(json.dumps(doc))
    import_files(store, [path], device=A4000)
    assert {m["config"]["multiply_block_size"] for m in store.measurements()} == {"32", "64"}


def test_a_t4_file_timed_by_another_objective_takes_that_measurements_unit(store, tmp_path):
    # KTT's converter: no metadata, objective "TotalDuration" measured in "Microseconds", runtimes in the same unit
    name = "coulomb_2080_full_search_space_converted.json"
    (row,) = import_files(store, [WILD / name], device_map=device_map(tmp_path, {"coulomb_2080*": "nvidia-rtx-2080"}))
    assert (row["device"], row["rows"], row["failed"]) == ("nvidia-rtx-2080", 3, 0)
    assert [s[3] for s in stored(store)] == [3037.408, 3027.296, 3003.456]


def test_a_t4_objective_that_is_no_time_is_never_read_as_one(store, tmp_path):
    doc = json.loads((WILD / "coulomb_2080_full_search_space_converted.json").read_text())
    for result in doc["results"]:
        result["objectives"] = ["GFLOP/s"]
        result["measurements"][0].update(name="GFLOP/s", unit="GFLOP/s")
        result["times"]["runtimes"] = []
    path = tmp_path / "gflops.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ImportFileError, match="result 0 is correct but has no runtimes and no time measurement "
                                              r"\(it was tuned for 'GFLOP/s', not a kernel time\)"):
        import_files(store, [path], device=A4000)
    assert store.measurements() == []


def test_a_file_that_names_no_gpu_asks_for_a_device(store, tmp_path):
    with pytest.raises(ImportFileError, match="the file names no GPU .*its file name "
                                              "'coulomb_2080_full_search_space_converted' is no catalog device; "
                                              "pass --device <catalog id> or --device-map FILE"):
        import_files(store, [WILD / "coulomb_2080_full_search_space_converted.json"])


KTT_CSV = ("Kernel name,Computation duration (us),Global size,Local size,multiply_block_size,"
           "dram__throughput.avg.pct_of_peak_sustained_elapsed\n"
           "vectorAddition_kernel,77.408,1048576,32,32,52.2868\n")


@pytest.mark.parametrize("name, text, reason", [
    ("2080-vectorAdd_output.csv", KTT_CSV,
     "a CSV table, not JSON (KTT's or BAT's CSV output?): its columns name no device or time unit, nor which are "
     "tuning parameters; write the results as JSON (KTT: OutputFormat::JSON) and import that"),
    ("output.xml", '<?xml version="1.0"?>\n<TuningResults></TuningResults>\n',
     "XML, not JSON (KTT's XML output?); write the results as JSON (KTT: OutputFormat::JSON) and import that"),
])
def test_ktt_tables_without_parameter_names_are_refused_saying_what_to_write(tmp_path, name, text, reason):
    path = tmp_path / name
    path.write_text(text)
    result = CliRunner().invoke(cli, ["import", "--db", str(tmp_path / "s.duckdb"), "--device", A4000, str(path)])
    assert result.exit_code == 1
    assert result.output == f"Error: cannot import {path}: {reason}; nothing of it was stored\n"


SCRIPT = ("import json, sys\n"
          "def main(path, out):\n"
          "    data = json.load(open(path))\n"
          "    print(data, file=sys.stderr)\n")


@pytest.mark.parametrize("name, text, says", [
    ("convert.py", SCRIPT, "not valid JSON: Expecting value at offset 0 (line 1, column 1)"),
    ("note.txt", "one, two\nthree\n", "not valid JSON: Expecting value at offset 0 (line 1, column 1)"),
    ("header-only.csv", "a,b,c\n", "not valid JSON: Expecting value at offset 0 (line 1, column 1)"),
    ("results.csv", "block;time\n32;1.5\n64;\"2,5\"\n", "a CSV table, not JSON"),
], ids=["script", "prose", "one line", "semicolons"])
def test_only_a_file_that_reads_as_a_table_is_called_csv(tmp_path, name, text, says):
    """Lines that split evenly at commas or semicolons are a table; other text (a script) is only not JSON."""
    path = tmp_path / name
    path.write_text(text)
    result = CliRunner().invoke(cli, ["import", "--db", str(tmp_path / "s.duckdb"), "--device", A4000, str(path)])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: cannot import {path}: {says}") and result.output.count("\n") == 1
    assert result.output.endswith("; nothing of it was stored\n")
    assert ("CSV" in result.output) == says.startswith("a CSV")
