"""`zmlx-pipeline import` through click's CliRunner: options, one-line errors, exit codes, an untouched store."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.data.catalog import load_catalog
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.pipeline.cli import cli, one_line_warning


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def key_only_cache(device_name: str = "NVIDIA RTX A4000", problem_size=(4096, 4096)) -> dict:
    """A cache whose entries hold only their results, as public Kernel Tuner caches often do."""
    doc = {"device_name": device_name, "kernel_name": "vector_add", "tune_params_keys": ["block_size_x", "vec"],
           "tune_params": {"block_size_x": [64, 128], "vec": [1, 2]}, "objective": "time",
           "cache": {"64,1": {"time": 1.0, "times": [1.0, 1.1]}, "128,1": {"time": 0.5},
                     "64,2": {"time": "CompilationFailedConfig"}, "128,2": {"time": "InvalidConfig"}}}
    if problem_size is not None:
        doc["problem_size"] = list(problem_size)
    return doc


@pytest.fixture
def db(tmp_path) -> Path:
    """A store holding one imported file, so refused imports have something to leave alone."""
    path = tmp_path / "cli.duckdb"
    seed = write(tmp_path / "seed" / "A6000.json", key_only_cache("NVIDIA RTX A6000"))
    assert invoke("import", "--db", path, seed).exit_code == 0
    return path


def contents(db: Path) -> tuple:
    with Store(db, read_only=True) as store:
        return store.measurements(), store.runs(), store.devices()


def test_key_only_cache_imports_with_its_table_and_json(db, tmp_path):
    path = write(tmp_path / "vec" / "a.json", key_only_cache())
    result = invoke("import", "--db", db, "--json", path)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert {k: row[k] for k in ("device", "kernel", "rows", "added", "failed", "skipped")} == {
        "device": "nvidia-rtx-a4000", "kernel": "vector_add", "rows": 3, "added": 3, "failed": 1, "skipped": 1}
    result = invoke("import", "--db", db, path)
    header, _, line = result.output.splitlines()
    # the InvalidConfig entry it skipped is in the table too, as in --json
    assert header.split() == ["file", "device", "kernel", "rows", "added", "failed", "skipped"]
    assert line.split() == [str(path), "nvidia-rtx-a4000", "vector_add", "3", "0", "1", "1"]


def test_the_table_shows_skipped_only_when_a_file_skipped_some(db, tmp_path):
    doc = key_only_cache()
    del doc["cache"]["128,2"]  # no InvalidConfig entry: nothing skipped
    result = invoke("import", "--db", db, write(tmp_path / "vec" / "a.json", doc))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].split() == ["file", "device", "kernel", "rows", "added", "failed"]


def test_a_file_without_problem_size_imports_and_a_second_one_asks_for_the_option(db, tmp_path):
    path = write(tmp_path / "vec" / "a.json", key_only_cache(problem_size=None))
    result = invoke("import", "--db", db, "--json", path)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["added"] == 3
    second = write(tmp_path / "vec" / "b.json", key_only_cache(problem_size=None))
    before = contents(db)
    result = invoke("import", "--db", db, second)
    assert result.exit_code == 1
    assert result.output == (
        f"Error: cannot import {second}: it names no problem size, and a.json (kernel vector_add on nvidia-rtx-a4000 "
        "too) is imported without one; import each in its own command with its own --problem-size, to tell their "
        "sizes apart; nothing of it was stored\n")
    assert contents(db) == before
    result = invoke("import", "--db", db, "--json", "--problem-size", "[25000, 2048, 1]", second)
    assert result.exit_code == 0, result.output
    with Store(db, read_only=True) as store:
        stored = store.measurements(device="nvidia-rtx-a4000")
    assert sorted(json.dumps(m["shape"]) for m in stored) == ['{"x": 25000, "y": 2048, "z": 1}'] * 3 + ["{}"] * 3


def test_a_key_stored_with_another_time_is_refused_in_one_line_and_replace_takes_the_new_one(db, tmp_path):
    slow = write(tmp_path / "slow" / "a.json", key_only_cache())
    fast_doc = key_only_cache()
    fast_doc["cache"]["128,1"] = {"time": 0.25}
    fast = write(tmp_path / "fast" / "a.json", fast_doc)
    assert invoke("import", "--db", db, slow).exit_code == 0
    before = contents(db)
    result = invoke("import", "--db", db, fast)
    assert result.exit_code == 1
    assert result.output == (
        f"Error: cannot import {fast}: config {{\"block_size_x\":128,\"vec\":1}} (float32, shape "
        "{\"x\":4096,\"y\":4096}) of vector_add on nvidia-rtx-a4000 is stored with 500 us, and this file gives 250 us; "
        "pass --replace to replace the stored results with this file's, or leave the file out; nothing of it was "
        "stored\n")
    assert contents(db) == before
    result = invoke("import", "--db", db, "--replace", fast)
    assert result.exit_code == 0, result.output
    header, _, line = result.output.splitlines()
    assert header.split() == ["file", "device", "kernel", "rows", "added", "failed", "replaced", "skipped"]
    assert line.split() == [str(fast), "nvidia-rtx-a4000", "vector_add", "3", "0", "1", "1", "1"]
    with Store(db, read_only=True) as store:
        times = {m["config"]["block_size_x"]: m["median_us"] for m in store.measurements(device="nvidia-rtx-a4000")
                 if m["status"] == "ok"}
    assert times == {64: 1000.0, 128: 250.0}


def test_a_malformed_problem_size_is_a_usage_error(db, tmp_path):
    path = write(tmp_path / "vec" / "a.json", key_only_cache(problem_size=None))
    result = invoke("import", "--db", db, "--problem-size", "4096,big", path)
    assert result.exit_code == 2
    assert "Invalid value for '--problem-size': problem size '4096,big' is neither JSON nor integers" in result.output


def test_an_ambiguous_device_is_refused_listing_candidates_then_a_device_map_settles_it(db, tmp_path):
    path = write(tmp_path / "vec" / "a.json", key_only_cache("NVIDIA H100"))
    before = contents(db)
    result = invoke("import", "--db", db, path)
    assert result.exit_code == 1
    h100s = ", ".join(spec.id for spec in load_catalog() if spec.id.startswith("nvidia-h100-"))
    assert result.output == (
        f"Error: cannot import {path}: device 'NVIDIA H100' does not name one catalog device (it may be {h100s}); "
        "pass --device <its id> or map the file in --device-map; nothing of it was stored\n")
    assert contents(db) == before
    device_map = tmp_path / "devices.toml"
    device_map.write_text('"NVIDIA H100" = "nvidia-h100-sxm"\n')
    result = invoke("import", "--db", db, "--json", "--device-map", device_map, path)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["device"] == "nvidia-h100-sxm"


def test_a_device_map_key_that_matches_no_file_is_one_warning_line_and_the_import_goes_on(db, tmp_path):
    path = write(tmp_path / "vec" / "a.json", key_only_cache("NVIDIA H100"))
    device_map = tmp_path / "devices.json"
    device_map.write_text('{"a.json": "nvidia-h100-sxm", "b100*.json": "nvidia-h200", "Tesla T9": "nvidia-a40"}')
    text = device_map.read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = one_line_warning
        result = invoke("import", "--db", db, "--json", "--device-map", device_map, path)
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"Warning: --device-map {device_map}: the keys 'b100*.json', 'Tesla T9' match no file of this import ({path}) "
        "nor the GPU name one reports; a key is matched, case-sensitive, against each file's name, its name without "
        "suffixes and its path as given\n")
    assert [r["device"] for r in json.loads(result.stdout)] == ["nvidia-h100-sxm"]
    assert device_map.read_bytes() == text


def test_unknown_device_names_the_options_and_device_with_device_map_is_refused(db, tmp_path):
    path = write(tmp_path / "vec" / "a.json", key_only_cache("Quantum GPU 9000"))
    result = invoke("import", "--db", db, path)
    assert result.exit_code == 1
    assert result.output == (
        f"Error: cannot import {path}: device 'Quantum GPU 9000' is not in the catalog; pass --device <catalog id> "
        "or --device-map FILE (`zmlx-pipeline devices` lists the ids) where it is a catalog chip named otherwise: "
        "another chip's id would file its timings as that chip's; a chip the catalog lacks is registered with "
        "`zmlx-pipeline devices add RECORD` (its figures, each with its source) and then imported under its own id; "
        "nothing of it was stored\n")
    device_map = tmp_path / "devices.json"
    device_map.write_text('{"*.json": "nvidia-a40"}')
    result = invoke("import", "--db", db, "--device", "nvidia-a40", "--device-map", device_map, path)
    assert result.exit_code == 1
    assert result.output == "Error: give --device (one device for every file) or --device-map, not both\n"
    result = invoke("import", "--db", db, "--device", "GTX 1080Ti", "--json", path)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["device"] == "nvidia-gtx-1080-ti"


def test_a_core_limit_of_a_core_limited_id_is_refused_by_device_and_device_map(db, tmp_path):
    path = write(tmp_path / "vec" / "a.json", key_only_cache())
    before = contents(db)
    says = ("'nvidia-h200@66sm@32sm' limits nvidia-h200@66sm, which is already core-limited; a core limit is of a "
            "chip (give nvidia-h200@32sm)")
    result = invoke("import", "--db", db, "--device", "nvidia-h200@66sm@32sm", path)
    assert result.exit_code == 1
    assert result.output == (f"Error: --device {says}; `zmlx-pipeline devices` lists them, and `zmlx-pipeline "
                             "devices add RECORD` registers a chip the catalog lacks\n")
    device_map = tmp_path / "devices.json"
    device_map.write_text('{"*.json": "nvidia-h200@66sm@32sm"}')
    result = invoke("import", "--db", db, "--device-map", device_map, path)
    assert result.exit_code == 1
    assert result.output == f"Error: --device-map {device_map}: '*.json' -> {says}; `zmlx-pipeline devices` lists them\n"
    assert contents(db) == before
    result = invoke("import", "--db", db, "--device", "nvidia-h200@32sm", "--json", path)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["device"] == "nvidia-h200@32sm"


def test_a_kernel_name_holding_a_colon_is_refused_in_one_line(db, tmp_path):
    doc = key_only_cache()
    doc["kernel_name"] = "os:system"
    path = write(tmp_path / "vec" / "a.json", doc)
    before = contents(db)
    result = invoke("import", "--db", db, path)
    assert result.exit_code == 1
    assert result.output == (f"Error: cannot import {path}: kernel name 'os:system' holds ':', which names a "
                             "module:attr kernel, not an imported one; give the file a kernel_name, or pass --kernel "
                             "NAME; nothing of it was stored\n")
    result = invoke("import", "--db", db, "--kernel", "examples.row_scale:SPEC", path)
    assert result.exit_code == 1
    assert result.output == ("Error: --kernel 'examples.row_scale:SPEC' holds ':', which names a module:attr kernel, "
                             "not an imported one; give a name without ':'\n")
    assert contents(db) == before


def test_help_names_the_new_options():
    result = invoke("import", "--help")
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for words in ("--device TEXT", "--device-map FILE", "--problem-size TEXT", "--replace",
                  "file-name globs or reported device "
                  "names to catalog ids", "split by commas like 4096,4096, or JSON like [25000, 2048, 1]", "--json"):
        assert words in text, words


# published Kernel Tuner files of every layout (tests/data/fixtures/kernel_tuner_wild/SOURCE.md)
WILD = Path(__file__).parents[1] / "data" / "fixtures" / "kernel_tuner_wild"


# the GPUs of the published files that name none, or none the catalog tells (KTT's tutorial laptop GPU, the RTX 500
# Ada Generation Laptop GPU, is a catalog chip: its files need no entry; nor do valid_example.json, which names its
# A100, and Kernel Tuner's README example vector_add.json, whose GPU is in vector_add-metadata.json beside it)
WILD_MAP = {"AMD Instinct MI50/MI60": "amd-mi50", "Testing": "nvidia-rtx-a4000", "t4_*": "nvidia-a100-pcie-40gb",
            "vector_add_gflops_T4.json": "nvidia-rtx-a4000", "coulomb_2080_*": "nvidia-rtx-2080"}


def test_published_files_import_unchanged_with_a_device_map_for_those_that_name_no_gpu(db, tmp_path):
    before = contents(db)
    result = invoke("import", "--db", db, WILD)
    assert result.exit_code == 1
    (line,) = result.output.splitlines()
    assert line.startswith(f"Error: cannot import {WILD / 'convolution_MI50.json'}: device 'AMD Instinct MI50/MI60' "
                           "names several chips (it may be amd-mi50, amd-mi60)")
    assert contents(db) == before
    device_map = tmp_path / "devices.toml"
    device_map.write_text("".join(f'"{key}" = "{value}"\n' for key, value in WILD_MAP.items()))
    result = invoke("import", "--db", db, "--json", "--device-map", device_map, WILD)
    assert result.exit_code == 0, result.output
    rows = sorted((Path(r["file"]).name, r["device"], r["kernel"], r["rows"], r["failed"])
                  for r in json.loads(result.output))
    # Kernel Tuner's test caches all say convolution_kernel, with other parameters; the T4 files name no kernel and
    # take the folder's name; the store holds a vector_add of other parameters: each parameter set goes under a name
    # of its own, in the order the files are read
    assert rows == sorted([
        ("convolution_MI50.json", "amd-mi50", "convolution_kernel", 2, 0),
        ("killed_mid_entry.json", "nvidia-rtx-a4000", "convolution_kernel_2", 2, 0),
        ("open_cache_looks_like_closed.json", "nvidia-rtx-a4000", "convolution_kernel_3", 2, 0),
        ("open_cache_no_comma.json", "nvidia-rtx-a4000", "convolution_kernel_2", 2, 0),
        ("valid_example.json", "nvidia-a100-pcie-40gb", "convolution_kernel_2", 2, 0),
        ("small_cache_1.0.0.json", "nvidia-rtx-a4000", "convolution_kernel_2", 2, 0),
        ("small_cache_1.1.0.json", "nvidia-rtx-a4000", "convolution_kernel_2", 3, 0),
        ("t4_cache_invalids.json", "nvidia-a100-pcie-40gb", "convolution_kernel_4", 1, 1),
        ("t4_target.json", "nvidia-a100-pcie-40gb", "kernel_tuner_wild_2", 1, 0),
        ("vector_add_gflops_T4.json", "nvidia-rtx-a4000", "kernel_tuner_wild_4", 3, 1),
        ("vector_add.json", "nvidia-rtx-3090", "kernel_tuner_wild_4", 3, 0),
        ("vector_add-metadata.json", None, None, 0, 0),
        ("vector_add_unversioned.json", "nvidia-rtx-a4000", "vector_add_2", 3, 0),
        ("coulomb_2080_full_search_space_converted.json", "nvidia-rtx-2080", "kernel_tuner_wild", 3, 0),
        ("gemm_precision_A4000.json", "nvidia-rtx-a4000", "Xgemm", 4, 0),
        ("vectorAdd_rtx500ada.ktt.json", "nvidia-rtx-500-ada-laptop", "vectorAddition_kernel", 4, 0),
        ("vectorAdd_rtx500ada.t4.json", "nvidia-rtx-500-ada-laptop", "kernel_tuner_wild_3", 2, 0),
        ("vector_add_results.json", "nvidia-a100-pcie-40gb", "vector_add_2", 2, 0),
        ("vector_add_results.json", "nvidia-a100-pcie-40gb", "vector_add_2", 1, 0),
        ("vector_add_results.json", "nvidia-rtx-3090", "vector_add_2", 1, 0),
        ("vector_add_time_energy.json", "nvidia-rtx-4000-ada", "vector_add_3", 2, 0)])
    # the killed run's, 1.0.0's and the open cache's rows are 1.1.0's
    assert len(contents(db)[0]) == len(before[0]) + 45 - 6
    renamed = {Path(r["file"]).name: r["renamed_from"] for r in json.loads(result.output) if "renamed_from" in r}
    assert renamed == {"killed_mid_entry.json": "convolution_kernel", "small_cache_1.0.0.json": "convolution_kernel",
                       "small_cache_1.1.0.json": "convolution_kernel", "t4_cache_invalids.json": "convolution_kernel",
                       "open_cache_looks_like_closed.json": "convolution_kernel",
                       "open_cache_no_comma.json": "convolution_kernel", "valid_example.json": "convolution_kernel",
                       "vector_add.json": "kernel_tuner_wild",
                       "t4_target.json": "kernel_tuner_wild", "vectorAdd_rtx500ada.t4.json": "kernel_tuner_wild",
                       "vector_add_gflops_T4.json": "kernel_tuner_wild", "vector_add_time_energy.json": "vector_add",
                       "vector_add_results.json": "vector_add", "vector_add_unversioned.json": "vector_add"}
    # every stored kernel name holds one parameter set
    params: dict[str, set] = {}
    for row in contents(db)[0]:
        params.setdefault(row["kernel"], set()).add(tuple(sorted(row["config"])))
    assert params == {
        "vector_add": {("block_size_x", "vec")},
        "convolution_kernel": {("block_size_x", "block_size_y", "read_only", "tile_size_x", "tile_size_y",
                                "use_padding")},
        "convolution_kernel_2": {("block_size_x", "block_size_y")},
        "convolution_kernel_3": {("block_size_x", "block_size_y", "object_param")},
        "convolution_kernel_4": {("block_size_x", "block_size_y", "read_only", "tile_size_x", "tile_size_y",
                                  "use_cmem", "use_padding", "use_shmem")},
        "kernel_tuner_wild": {("INNER_UNROLL_FACTOR", "USE_CONSTANT_MEMORY", "USE_SOA", "VECTOR_SIZE",
                               "WORK_GROUP_SIZE_X", "WORK_GROUP_SIZE_Y", "WORK_GROUP_SIZE_Z", "Z_ITERATIONS")},
        "kernel_tuner_wild_2": {("block_size_x", "block_size_y", "read_only", "tile_size_x", "tile_size_y",
                                 "use_cmem", "use_padding", "use_shmem")},
        "kernel_tuner_wild_3": {("multiply_block_size",)},
        "kernel_tuner_wild_4": {("block_size_x",)},
        "vectorAddition_kernel": {("multiply_block_size",)},
        "Xgemm": {("MWG", "VWM")},
        "vector_add_2": {("block_size_x",)},
        "vector_add_3": {("block_size_x", "nvml_gr_clock")}}
    # imported again, every file goes where it went and adds nothing; the table says why each was renamed
    stored = contents(db)
    result = invoke("import", "--db", db, "--device-map", device_map, WILD)
    assert result.exit_code == 0, result.output
    assert contents(db)[0] == stored[0]
    assert ("vector_add_time_energy.json: vector_add has other parameters stored (block_size_x, vec); this file's "
            "(block_size_x, nvml_gr_clock) stored as vector_add_3; name it with --kernel NAME"
            ) in result.output.splitlines()


def test_a_kernel_named_with_an_option_is_never_renamed(db, tmp_path):
    # the seed's vector_add tunes block_size_x and vec; this file tunes block_size_x alone
    before = contents(db)
    path = WILD / "vector_add_unversioned.json"
    result = invoke("import", "--db", db, "--device", "nvidia-rtx-a4000", "--kernel", "vector_add", path)
    assert result.exit_code == 1 and contents(db) == before
    assert result.output == (f"Error: cannot import {path}: --kernel vector_add has other parameters stored "
                             "(block_size_x, vec) than this file's (block_size_x): one kernel holds one config space; "
                             "pass another --kernel NAME, or leave --kernel out to store the file under a name of its "
                             "own; nothing of it was stored\n")
    result = invoke("import", "--db", db, "--json", "--device", "nvidia-rtx-a4000", "--kernel", "vadd", path)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["kernel"] == "vadd" and "renamed_from" not in row


def test_published_files_import_with_nothing_but_a_device_map(db, tmp_path):
    # seven of them name no problem size: each is one case of unknown size
    device_map = tmp_path / "devices.json"
    device_map.write_text(json.dumps(WILD_MAP))
    result = invoke("import", "--db", db, "--json", "--device-map", device_map, WILD)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 21 and sum(r["rows"] for r in rows) == 45
    with Store(db, read_only=True) as store:
        sizes = {r["settings"]["file"]: r["settings"]["problem_size_from"] for r in store.runs()
                 if r["settings"].get("format")}
    assert {f for f, source in sizes.items() if source == "none"} == {
        "vector_add_unversioned.json", "t4_target.json", "vector_add_gflops_T4.json", "vectorAdd_rtx500ada.ktt.json",
        "vectorAdd_rtx500ada.t4.json", "coulomb_2080_full_search_space_converted.json", "vector_add.json"}


def test_files_of_other_kernels_named_after_their_gpu_import_with_no_device_option(db, tmp_path):
    # as the public tuning files are named: the GPU in the file name, no device_name inside
    files = [write(tmp_path / "gemm" / "RTX_3060_laptop.json", key_only_cache("")),
             write(tmp_path / "gemm" / "Radeon_VII.json", key_only_cache("")),
             write(tmp_path / "gemm" / "Quadro_P5000_T4.json", key_only_cache(""))]
    result = invoke("import", "--db", db, "--json", *files)
    assert result.exit_code == 0, result.output
    assert [row["device"] for row in json.loads(result.output)] == [
        "nvidia-rtx-3060-laptop", "amd-radeon-vii", "nvidia-quadro-p5000"]
    before = contents(db)
    fermi = write(tmp_path / "gemm" / "GTX_580.json", key_only_cache(""))
    result = invoke("import", "--db", db, fermi)
    assert result.exit_code == 1 and contents(db) == before
    assert result.output == (f"Error: cannot import {fermi}: the file names no GPU (its device name is empty or absent), "
                             "and its file name 'GTX_580' is no catalog device; pass --device "
                             "<catalog id> or --device-map FILE (`zmlx-pipeline devices` lists the ids); nothing of it "
                             "was stored\n")


def test_a_later_file_that_names_no_gpu_keeps_the_stored_reported_name(db, tmp_path):
    named = write(tmp_path / "vec" / "a.json", key_only_cache("NVIDIA RTX A4000"))
    assert invoke("import", "--db", db, named).exit_code == 0
    unnamed = key_only_cache(None, problem_size=(1024, 1024))
    del unnamed["device_name"]
    unnamed = write(tmp_path / "vec" / "A4000.json", unnamed)  # the GPU from the file name
    assert invoke("import", "--db", db, unnamed).exit_code == 0
    (device,) = [d for d in contents(db)[2] if d["device_id"] == "nvidia-rtx-a4000"]
    assert device["reported_name"] == "NVIDIA RTX A4000"


def test_an_import_stopped_midway_leaves_the_store_as_it_was(db, tmp_path, monkeypatch):
    first = write(tmp_path / "vec" / "a.json", key_only_cache("NVIDIA RTX A4000"))
    second = write(tmp_path / "vec" / "b.json", key_only_cache("NVIDIA RTX A6000", problem_size=(8, 8)))
    before = contents(db)
    real_finish = Store.finish_run

    def stop_on_the_second(self, run_id, status):
        if len(self.runs()) > len(before[1]) + 1:
            raise KeyboardInterrupt
        return real_finish(self, run_id, status)

    monkeypatch.setattr(Store, "finish_run", stop_on_the_second)
    result = invoke("import", "--db", db, first, second)
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1] == "Aborted!"
    assert contents(db) == before


def test_kernel_names_every_file_and_a_blank_one_is_a_usage_error(db, tmp_path):
    path = write(tmp_path / "run7" / "a.json", key_only_cache())
    result = invoke("import", "--db", db, "--json", "--kernel", "vadd_v2", path)
    assert result.exit_code == 0, result.output
    assert [(r["kernel"], r["added"]) for r in json.loads(result.output)] == [("vadd_v2", 3)]
    with Store(db, read_only=True) as store:
        assert {m["kernel"] for m in store.measurements(device="nvidia-rtx-a4000")} == {"vadd_v2"}
    before = contents(db)
    result = invoke("import", "--db", db, "--kernel", " ", path)
    assert result.exit_code == 2 and "Invalid value for --kernel: ' ' names no kernel" in result.output
    assert contents(db) == before


def test_kernel_tuners_readme_example_output_imports_with_the_gpu_its_metadata_file_names(tmp_path):
    # KernelTuner/kernel_tuner examples/cuda/vector_add.py (d845b33): store_output_file("vector_add.json") writes T4
    # results naming no GPU, store_metadata_file("vector_add-metadata.json") the nvidia-smi output beside them
    result = {"timestamp": "2024-03-05 14:02:11.120442+00:00", "configuration": {"block_size_x": 128},
              "times": {"compilation": 412.7, "benchmark": 3.1, "framework": 1.2, "search_algorithm": 0,
                        "validation": 0, "runtimes": [1.0, 1.1]}, "invalidity": "correct", "correctness": 1,
              "measurements": [{"name": "time", "value": 1.05, "unit": "ms"}], "objectives": ["time"]}
    write(tmp_path / "vector_add" / "vector_add.json", {"results": [result], "schema_version": "1.0.0"})
    gpu = {"@id": "00000000:01:00.0", "product_name": "NVIDIA RTX A4000"}
    environment = {"device_query": {"nvidia-smi": {"nvidia_smi_log": {"attached_gpus": "1", "gpu": gpu}}},
                   "requirements": []}
    write(tmp_path / "vector_add" / "vector_add-metadata.json",
          {"metadata": {"operating_system": "Linux", "environment": environment}, "schema_version": "1.0.0"})
    out = invoke("import", "--db", tmp_path / "s.duckdb", "--json", "--problem-size", "10000000",
                 tmp_path / "vector_add")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [(Path(r["file"]).name, r["device"], r["rows"]) for r in rows] == [
        ("vector_add.json", "nvidia-rtx-a4000", 1), ("vector_add-metadata.json", None, 0)]


def test_a_t4_file_given_its_gpu_passes_over_an_unreadable_metadata_file_beside_it(db, tmp_path):
    """vector_add.json with a vector_add-metadata.json that is no JSON: --device names the GPU, so the metadata file
    is not needed; without --device it is the GPU's one source, and the import is refused naming it."""
    folder = tmp_path / "va"
    folder.mkdir()
    (folder / "vector_add.json").write_bytes((WILD / "vector_add.json").read_bytes())
    (folder / "vector_add-metadata.json").write_text("{not json")
    before = contents(db)
    result = invoke("import", "--db", db, folder / "vector_add.json", "--problem-size", "10000000")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"Error: cannot import {folder / 'vector_add-metadata.json'}: not valid JSON: Expecting property name enclosed "
        "in double quotes at offset 1 (line 1, column 2); nothing of it was stored"]
    assert contents(db) == before
    result = invoke("import", "--db", db, "--json", folder / "vector_add.json", "--problem-size", "10000000",
                    "--device", "nvidia-h200")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert (row["device"], row["rows"], row["failed"]) == ("nvidia-h200", 3, 0)
