"""A store changed outside zmlx-pipeline, and shards of odd types, meet every command as one error line."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from zmlx_pipeline.data.store import Store
from zmlx_pipeline.pipeline.cli import cli


def _one_line(args: list[str], says: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1, result.output
    assert result.output.startswith("Error: ") and says in result.output, result.output


@pytest.mark.parametrize("sql, args, says", [
    ("ALTER TABLE measurements RENAME COLUMN median_us TO med", ["noise"], "table measurements has no column median_us"),
    ("ALTER TABLE measurements ALTER median_us TYPE VARCHAR", ["evaluate", "--split", "shapes", "-k", "my_norm"],
     "column measurements.median_us is VARCHAR, not DOUBLE"),
    ("ALTER TABLE measurements DROP COLUMN p90_us", ["evaluate", "--split", "shapes", "-k", "my_norm"],
     "table measurements has no column p90_us"),
    ("DELETE FROM _migrations", ["ingest", "PLACEHOLDER"], "migration record is damaged"),
    ("UPDATE measurements SET median_us = 'nan'", ["noise"], "an ok row needs a finite positive median_us, not nan"),
    ("UPDATE measurements SET config = 'not json'", ["export", "out.parquet"], "config is not a JSON object"),
    ("UPDATE measurements SET median_us = -1", ["export", "out.parquet"], "finite positive median_us, not -1.0"),
    ("UPDATE models SET scores = 'garbage'", ["models"], "registered model my_norm-1: its scores column is not JSON"),
    ("UPDATE models SET scores = 'garbage'", ["models", "--json"], "its scores column is not JSON"),
    ("UPDATE models SET path = NULL", ["models", "--verify"], "registered model my_norm-1: it has no model file path"),
])
def test_a_store_changed_outside_is_one_line_and_left_as_it_was(tmp_path, monkeypatch, make_measurement, sql, args,
                                                               says, tampered_store):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "s.duckdb"
    before = tampered_store(db, sql)
    shard = tmp_path / "shard.parquet"
    with Store(tmp_path / "other.duckdb") as other:
        other.record([make_measurement(kernel="my_norm")])
        other.export_shard(shard)
    _one_line([args[0], "--db", str(db), *[str(shard) if a == "PLACEHOLDER" else a for a in args[1:]]], says)
    assert db.read_bytes() == before
    assert not (tmp_path / "out.parquet").exists()


def test_a_shard_of_text_timestamps_is_one_line_naming_the_column_and_its_type(tmp_path, make_measurement):
    db = tmp_path / "s.duckdb"
    with Store(db) as s:
        s.record([make_measurement(kernel="my_norm")])
        s.export_shard(tmp_path / "good.parquet")
    con = duckdb.connect()
    con.execute(f"COPY (SELECT * REPLACE (CAST(measured_at AS VARCHAR) AS measured_at) FROM "
                f"read_parquet('{tmp_path / 'good.parquet'}')) TO '{tmp_path / 'text.parquet'}' (FORMAT parquet)")
    con.close()
    before = db.read_bytes()
    _one_line(["ingest", "--db", str(db), str(tmp_path / "text.parquet")],
              f"{tmp_path / 'text.parquet'}: column measured_at is VARCHAR, but a shard's measured_at is a timestamp "
              "(TIMESTAMP)")
    assert db.read_bytes() == before
