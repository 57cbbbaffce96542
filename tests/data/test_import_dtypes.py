"""A parameter that picks the data type (PRECISION, use_fp16, TYPE, ...) becomes the dtype of each imported case:
one file with several precisions gives the cases of several dtypes; a value that names no data type the store
holds is refused, naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.core.dtypes import DTYPE_BYTES
from zmlx_pipeline.data.importers import import_files
from zmlx_pipeline.data.importers.dtypes import PARAMETERS, VALUES, split_dtype
from zmlx_pipeline.pipeline.cli import cli

WILD = Path(__file__).parent / "fixtures" / "kernel_tuner_wild"
A4000 = "nvidia-rtx-a4000"


def test_a_cache_with_two_precisions_becomes_two_dtypes_of_one_kernel(store):
    (row,) = import_files(store, [WILD / "gemm_precision_A4000.json"])
    assert (row["device"], row["kernel"], row["rows"], row["added"]) == (A4000, "Xgemm", 4, 4)
    got = sorted((m["dtype"], m["config"]["MWG"], m["median_us"]) for m in store.measurements())
    assert got == [("float16", 16, 9250.0), ("float16", 32, 7750.0), ("float32", 16, 14500.0), ("float32", 32, 11250.0)]
    # PRECISION is the dtype, not a launch parameter: the configs of both dtypes are the same configs
    assert {json.dumps(m["config"], sort_keys=True) for m in store.measurements()} == {
        '{"MWG": 16, "VWM": 1}', '{"MWG": 32, "VWM": 1}'}
    assert len({m["kernel_version"] for m in store.measurements()}) == 1
    assert store.runs()[0]["settings"]["dtype_from"] == "PRECISION"
    assert "dtype_assumed" not in store.runs()[0]["settings"]


def kt_cache(name: str, values: list, extra_param: str | None = None) -> dict:
    keys = ["block_size_x", name] + ([extra_param] if extra_param else [])
    cache = {}
    for i, value in enumerate(values):
        entry = {"block_size_x": 32 * (i + 1), name: value, "time": 1.0 + i, "times": [1.0 + i]}
        if extra_param:
            entry[extra_param] = value
        cache[",".join(str(entry[k]) for k in keys)] = entry
    return {"device_name": "NVIDIA RTX A4000", "kernel_name": "k", "problem_size": [1024], "tune_params_keys": keys,
            "tune_params": {}, "objective": "time", "cache": cache}


@pytest.mark.parametrize("name, values, dtypes", [
    ("PRECISION", [32, 16], ["float32", "float16"]),
    ("precision", ["float", "half"], ["float32", "float16"]),
    ("use_fp16", [0, 1], ["float32", "float16"]),
    ("use_fp16", [False, True], ["float32", "float16"]),
    ("TYPE", ["float", "__nv_bfloat16"], ["float32", "bfloat16"]),
    ("dtype", ["float16", "float32"], ["float16", "float32"]),
])
def test_data_type_parameters_as_published_files_spell_them(store, tmp_path, name, values, dtypes):
    path = tmp_path / "k.json"
    path.write_text(json.dumps(kt_cache(name, values)))
    import_files(store, [path])
    got = sorted((m["config"]["block_size_x"], m["dtype"]) for m in store.measurements())
    assert got == [(32, dtypes[0]), (64, dtypes[1])]
    assert all(name not in m["config"] for m in store.measurements())


def test_a_type_parameter_whose_values_name_no_data_type_stays_a_parameter(store, tmp_path):
    path = tmp_path / "k.json"
    path.write_text(json.dumps(kt_cache("TYPE", [0, 2])))
    import_files(store, [path])
    assert sorted((m["config"]["TYPE"], m["dtype"]) for m in store.measurements()) == [(0, "float32"), (2, "float32")]
    # a file that names no data type is taken as single precision, and its run says the dtype was assumed
    settings = store.runs()[0]["settings"]
    assert settings["dtype_assumed"] == "float32" and "dtype_from" not in settings


@pytest.mark.parametrize("name, values, extra, reason", [
    # BAT's SHOC-derived tuners: PRECISION in [32, 64]
    ("PRECISION", [32, 64], None, "PRECISION=64 is a precision the store does not hold (it holds float16, bfloat16, "
                                  "float32); import a copy of the file without those entries"),
    ("precision", ["float", "double"], None, "precision='double' is a precision the store does not hold"),
    ("PRECISION", [32, 3232], None, "PRECISION=3232 is a precision the store does not hold"),
    ("PRECISION", [32, 7], None, "PRECISION=7 names no data type, while its other values do"),
    ("precision", ["float", "half"], "TYPE", "several parameters pick the data type (precision, TYPE)"),
])
def test_values_that_name_no_data_type_the_store_holds_are_refused(tmp_path, name, values, extra, reason):
    path = tmp_path / "k.json"
    path.write_text(json.dumps(kt_cache(name, values, extra)))
    db = tmp_path / "s.duckdb"
    result = CliRunner().invoke(cli, ["import", "--db", str(db), str(path)])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: cannot import {path}: {reason}")
    assert result.output.endswith("; nothing of it was stored\n") and result.output.count("\n") == 1


def test_a_t4_file_with_a_precision_gives_its_dtypes(store, tmp_path):
    results = [{"configuration": {"block_size_x": bx, "precision": p}, "invalidity": "correct",
                "times": {"runtimes": [0.5]}, "measurements": [{"name": "time", "value": 0.5, "unit": "ms"}],
                "objectives": ["time"]} for bx, p in ((32, "half"), (32, "float"))]
    path = tmp_path / "A4000_T4.json"
    path.write_text(json.dumps({"schema_version": "1.0.0", "results": results}))
    (row,) = import_files(store, [path], problem_size=[1024])
    assert row["rows"] == 2 and row["skipped"] == 0
    assert sorted(m["dtype"] for m in store.measurements()) == ["float16", "float32"]


def test_the_table_maps_only_to_dtypes_the_store_holds_or_to_refusal():
    assert set(PARAMETERS.values()) <= set(VALUES)
    mapped = {v for table in VALUES.values() for v in table.values()}
    assert mapped - {None} <= set(DTYPE_BYTES)
    split = split_dtype([{"a": 1}], "float32")
    assert split.parameter is None and split.dtypes == ["float32"]
