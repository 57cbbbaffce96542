"""`zmlx-pipeline kernels` through click's CliRunner: the registered kernels and those imported into a store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.data.store import default_db_path
from zmlx_pipeline.kernels.builtin import BUILTIN
from zmlx_pipeline.pipeline.cli import cli

BUILTINS = ", ".join(BUILTIN)


def invoke(*args, **kwargs):
    return CliRunner().invoke(cli, [str(a) for a in args], **kwargs)


def cache(device_name: str, times: dict[str, float]) -> dict:
    """A Kernel Tuner cache of vector_add at 4096 x 1024 whose entries hold only their key and time."""
    return {"device_name": device_name, "kernel_name": "vector_add", "problem_size": [4096, 1024],
            "tune_params_keys": ["block_size_x", "vec"], "tune_params": {"block_size_x": [64, 128], "vec": [1, 2]},
            "objective": "time", "cache": {key: {"time": t} if t else {"time": "CompilationFailedConfig"}
                                            for key, t in times.items()}}


def imported(db: Path, tmp_path: Path) -> Path:
    """`db` after importing vector_add measured on an A4000 (3 configs, one failed) and an A6000 (2 configs)."""
    files = []
    for name, doc in (("A4000.json", cache("NVIDIA RTX A4000", {"64,1": 1.0, "128,1": 0.5, "64,2": 0})),
                      ("A6000.json", cache("NVIDIA RTX A6000", {"64,1": 0.8, "128,2": 0.4}))):
        files.append(tmp_path / "files" / name)
        files[-1].parent.mkdir(exist_ok=True)
        files[-1].write_text(json.dumps(doc))
    result = invoke("import", "--db", db, *files)
    assert result.exit_code == 0, result.output
    return db


def test_without_a_store_the_builtins_are_listed_and_no_store_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv("ZMLX_PIPELINE_DB", str(tmp_path / "data" / "store.duckdb"))
    result = invoke("kernels", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["name"] for r in rows] == list(BUILTIN) and {r["source"] for r in rows} == {"built-in"}
    assert not default_db_path().exists() and not default_db_path().parent.exists()
    table = invoke("kernels")
    assert table.exit_code == 0 and "in the store" not in table.output
    assert [line.split()[0] for line in table.output.splitlines()[2:]] == list(BUILTIN)


def test_an_imported_kernel_is_listed_with_its_parameters_dims_devices_and_files(tmp_path):
    db = imported(tmp_path / "k.duckdb", tmp_path)
    result = invoke("kernels", "--db", db, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["name"] for r in rows] == [*BUILTIN, "vector_add"]
    row = rows[-1]
    assert row["source"] == "imported" and row["store"] == str(db)
    assert row["parameters"] == {"block_size_x": [64, 128], "vec": [1, 2]} and row["configs"] == 4
    assert row["shape_dims"] == ["x", "y"] and row["dim_values"] == {"x": [4096], "y": [1024]}
    assert row["shapes"] == [{"x": 4096, "y": 1024}] and row["dtypes"] == ["float32"]
    assert [(d["device"], d["rows"], d["by_status"]) for d in row["devices"]] == [
        ("nvidia-rtx-a4000", 3, {"ok": 2, "compile_error": 1}), ("nvidia-rtx-a6000", 2, {"ok": 2})]
    assert [(i["file"], i["format"], i["device"], i["rows"]) for i in row["imports"]] == [
        ("A4000.json", "kernel_tuner_cache", "nvidia-rtx-a4000", 3),
        ("A6000.json", "kernel_tuner_cache", "nvidia-rtx-a6000", 2)]
    assert row["collected_runs"] == 0


def test_the_table_adds_the_store_s_kernels_under_the_builtins(tmp_path):
    db = imported(tmp_path / "k.duckdb", tmp_path)
    result = invoke("kernels", "--db", db)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    title = lines.index(f"in the store {db}:")
    assert [line.split()[0] for line in lines[2:title - 1]] == list(BUILTIN) and lines[title - 1] == ""
    assert lines[title + 1].split() == ["kernel", "source", "parameters", "configs", "shapes", "devices", "files",
                                        "measured"]
    assert lines[title + 3].split() == ["vector_add", "imported", "block_size_x=64/128", "vec=1/2", "4", "x=4096",
                                        "y=1024", "nvidia-rtx-a4000:3", "nvidia-rtx-a6000:2",
                                        "A4000.json", "(kernel_tuner_cache)", "A6000.json", "(kernel_tuner_cache)",
                                        "at", "import", "(no", "date", "in", "the", "file)"]


def test_k_names_an_imported_kernel_from_the_default_store(tmp_path):
    imported(default_db_path(), tmp_path)  # $ZMLX_PIPELINE_DB (conftest): read without --db
    result = invoke("kernels", "-k", "vector_add", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["name"] == "vector_add" and row["parameters"]["vec"] == [1, 2]
    both = invoke("kernels", "-k", "vector_add,rmsnorm", "--json")
    assert [r["name"] for r in json.loads(both.output)] == ["vector_add", "rmsnorm"]
    table = invoke("kernels", "-k", "vector_add")
    assert table.output.splitlines()[0] == f"in the store {default_db_path()}:"  # no table of built-ins above it


def test_an_unknown_kernel_is_one_line_listing_the_builtins_and_the_store_s(tmp_path):
    db = imported(tmp_path / "k.duckdb", tmp_path)
    result = invoke("kernels", "--db", db, "-k", "vector_sub")
    assert result.exit_code == 1
    assert result.output == (f"Error: unknown kernel 'vector_sub'; known kernels: {BUILTINS}; in the store {db}: "
                             "vector_add (or give a module:attr path)\n")
    without = invoke("kernels", "-k", "vector_add")  # the default store does not exist: only the built-ins are known
    assert without.exit_code == 1
    assert without.output == (f"Error: unknown kernel 'vector_add'; known kernels: {BUILTINS} (or give a "
                              "module:attr path)\n")
    assert not default_db_path().exists()


def test_a_db_that_does_not_exist_is_an_error_and_is_not_made(tmp_path):
    missing = tmp_path / "typo.duckdb"
    for args in (("kernels", "--db", missing), ("kernels", "--db", missing, "-k", "rmsnorm")):
        result = invoke(*args)
        assert result.exit_code == 1
        assert result.output.startswith(f"Error: no store at {missing}") and result.output.count("\n") == 1
    assert not missing.exists()


HOLD = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
print("held", flush=True)
time.sleep(60)
"""


def test_a_default_store_another_process_holds_leaves_its_kernels_out_with_a_warning(tmp_path, subprocess_env):
    imported(default_db_path(), tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(default_db_path())], stdout=subprocess.PIPE,
                              text=True, env=subprocess_env)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.warns(UserWarning, match=r"is locked by another process.*; what it holds is left out"):
            result = invoke("kernels", "--json")
        assert result.exit_code == 0, result.output
        assert [r["name"] for r in json.loads(result.output)] == list(BUILTIN)
        named = invoke("kernels", "--db", default_db_path())  # named, the store is what was asked for: an error
        assert named.exit_code == 1 and "locked by another process" in named.output
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert os.path.exists(default_db_path())


def test_an_import_s_rows_show_when_the_file_says_they_were_timed(tmp_path):
    wild = Path(__file__).resolve().parents[1] / "data" / "fixtures" / "kernel_tuner_wild"
    db = imported(tmp_path / "k.duckdb", tmp_path)  # vector_add: caches without a date
    result = invoke("import", "--db", db, "--device", "nvidia-rtx-a4000", wild / "small_cache_1.0.0.json")
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(invoke("kernels", "--db", db, "--json").output) if "store" in r}
    (dated,) = rows["convolution_kernel"]["imports"]
    assert dated["measured_at_from"] == "entries"
    assert (dated["first_measured_at"], dated["last_measured_at"]) == ("2023-12-22 09:54:05.502007",
                                                                     "2023-12-22 09:54:06.508453")
    assert {i["measured_at_from"] for i in rows["vector_add"]["imports"]} == {"import"}
    table = invoke("kernels", "--db", db, "-k", "convolution_kernel,vector_add").output.splitlines()
    assert table[1].split()[-1] == "measured"
    assert table[3].startswith("convolution_kernel") and table[3].endswith("  2023-12-22")
    assert table[4].startswith("vector_add") and table[4].endswith("  at import (no date in the file)")
