"""Rows changed outside zmlx-pipeline that export refuses are refused by the commands that learn from them: train,
evaluate and publish end with one CorruptStore line naming the row, the field and the fix, exit 1, and leave the
store as it was, instead of fitting a model on them (Store.measurements_arrow and Store.devices check them)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.data.store import CorruptStore, Store
from zmlx_pipeline.models.features import store_features
from zmlx_pipeline.pipeline.cli import cli

DEVICES = ("nvidia-rtx-a4000", "nvidia-rtx-a6000")
A4000 = "device_id = 'nvidia-rtx-a4000'"


def _build(path: Path, make_measurement, *sql: str) -> bytes:
    """A store of legal rmsnorm timings on two catalog GPUs (16 configs, 4 shapes each), changed by `sql` through
    DuckDB as someone editing it outside zmlx-pipeline would; returns its bytes."""
    with Store(path) as s:
        for device in DEVICES:
            s.upsert_device({**get_device(device).as_row(), "device_id": device, "in_catalog": True})
        s.record([
            make_measurement(device_id=device, kernel="rmsnorm", dtype="float32", shape={"rows": rows, "cols": 1024},
                             config={"ROWS": 1, "TG": tg, "VEC": vec}, median_us=t, p10_us=t * 0.95, p90_us=t * 1.05)
            for i, device in enumerate(DEVICES) for rows in (1, 16, 256, 4096) for tg in (32, 64, 128, 256)
            for vec in (1, 2, 4) if (t := rows * (1 + i) / vec + abs(tg - 64) / 16 + 1)])
    con = duckdb.connect(str(path))
    for statement in sql:
        con.execute(statement)
    con.close()
    return path.read_bytes()


# (change, what the one line says): the findings of a bad-input pass, each refused by export as by these commands
CHANGES = [
    pytest.param("UPDATE measurements SET shape = '{\"rows\": -8, \"cols\": 1024}' WHERE " + A4000 + " AND shape_key = "
                 "(SELECT min(shape_key) FROM measurements)", "rows=-8 is not a positive integer", id="shape"),
    pytest.param(f"UPDATE measurements SET dtype = 'float64' WHERE {A4000}",
                 "dtype 'float64' is not one the store holds", id="dtype"),
    pytest.param("UPDATE measurements SET p10_us = median_us * 10", "p10_us <= median_us <= p90_us does not hold",
                 id="spread"),
    pytest.param("UPDATE measurements SET config = '{\"ROWS\":1,\"TG\":\"abc\",\"VEC\":4}' WHERE rowid IN "
                 "(SELECT rowid FROM measurements LIMIT 3)", "whose parameters are integers, not TG='abc'",
                 id="config"),
    pytest.param(f"UPDATE devices SET memory_bandwidth_gbps = 0, gpu_cores = NULL WHERE {A4000}",
                 "memory_bandwidth_gbps must be a finite number above 0, not 0.0", id="device"),
]
# further changes export refuses: another check each
MORE = [
    pytest.param("UPDATE measurements SET config = '{\"ROWS\":1,\"TG\":2048,\"VEC\":4}' WHERE rowid IN "
                 "(SELECT rowid FROM measurements LIMIT 1)", "breaks its constraint 'TG <= max_threads'", id="illegal"),
    pytest.param("UPDATE measurements SET shape = '{\"cols\":1024,\"rows\":2}' WHERE rowid IN "
                 "(SELECT rowid FROM measurements WHERE shape = '{\"cols\":1024,\"rows\":1}' LIMIT 1)",
                 "is not the key of shape {\"cols\":1024,\"rows\":2}", id="key"),
    pytest.param(f"UPDATE devices SET gpu_cores = 999 WHERE {A4000}",
                 "nvidia-rtx-a4000: gpu_cores is 999, but the catalog gives nvidia-rtx-a4000 48", id="catalog"),
    pytest.param(f"UPDATE devices SET reported = 'garbage' WHERE {A4000}",
                 "reported must be a JSON object, not 'garbage'", id="reported"),
    pytest.param(f"UPDATE devices SET name = 'Fake name' WHERE {A4000}",
                 "nvidia-rtx-a4000: name is 'Fake name', but the catalog names nvidia-rtx-a4000 'NVIDIA RTX A4000'",
                 id="catalog-name"),
    pytest.param(f"UPDATE devices SET memory_bandwidth_gbps = 'nan' WHERE {A4000}",
                 "(devices table, nvidia-rtx-a4000: memory_bandwidth_gbps must be a finite number above 0, not nan)",
                 id="device-row"),
    pytest.param(f"UPDATE measurements SET run_id = ' run-1' WHERE {A4000}", "run_id ' run-1' starts or ends with "
                 "white space", id="run-id"),
]
COMMANDS = {
    "train": ["train", "-k", "rmsnorm", "-j", "1", "--models-dir", "models"],
    "evaluate": ["evaluate", "--split", "shapes", "-k", "rmsnorm", "-j", "1"],
    "publish": ["publish", "--to", "pub", "--device", "nvidia-rtx-a4000"],
    "export": ["export", "out.parquet"],
}


def _refused(tmp_path: Path, db: Path, command: str, says: str) -> str:
    result = CliRunner().invoke(cli, [COMMANDS[command][0], "--db", str(db), *COMMANDS[command][1:]])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1, result.output
    assert result.output.startswith("Error: ") and says in result.output, result.output
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())
    assert not (tmp_path / "pub").exists() or not any((tmp_path / "pub").iterdir())
    return result.output


@pytest.mark.parametrize("command", ["train", "evaluate", "publish", "export"])
@pytest.mark.parametrize("sql, says", CHANGES)
def test_a_row_export_refuses_is_one_line_to_every_command_that_learns_from_it(tmp_path, monkeypatch,
                                                                               make_measurement, sql, says, command):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "s.duckdb"
    before = _build(db, make_measurement, sql)
    line = _refused(tmp_path, db, command, says)
    if command != "export":
        assert "restore it from a copy, or delete" in line and "ingest" in line
    assert db.read_bytes() == before


@pytest.mark.parametrize("sql, says", MORE)
def test_every_check_of_exports_refuses_the_row_before_train(tmp_path, monkeypatch, make_measurement, sql, says):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "s.duckdb"
    before = _build(db, make_measurement, sql)
    _refused(tmp_path, db, "train", says)
    assert db.read_bytes() == before


def test_configs_of_one_kernel_version_naming_other_parameters_are_refused(tmp_path, make_measurement):
    db = tmp_path / "s.duckdb"
    _build(db, make_measurement)
    with Store(db) as s:  # a config without VEC, its key right: only the other configs tell it apart
        s.record([make_measurement(device_id=DEVICES[0], kernel="rmsnorm", dtype="float32",
                                   shape={"rows": 16, "cols": 1024}, config={"ROWS": 1, "TG": 32},
                                   median_us=5.0, p10_us=4.9, p90_us=5.1)])
        with pytest.raises(CorruptStore, match=r"rmsnorm \(sha256:0000000000000001\) config names parameters "
                                               r"\['ROWS', 'TG'\], but its other configs name \['ROWS', 'TG', 'VEC'\]"):
            store_features(s, "rmsnorm")


def test_the_untouched_store_is_read_in_full(tmp_path, make_measurement):
    db = tmp_path / "s.duckdb"
    _build(db, make_measurement)
    with Store(db, read_only=True) as s:
        assert store_features(s, "rmsnorm")["rmsnorm"].frame.height == 2 * 4 * 4 * 3
        assert [d["device_id"] for d in s.devices()] == list(DEVICES)
