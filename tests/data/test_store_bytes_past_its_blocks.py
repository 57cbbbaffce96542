"""A store file with bytes past its last whole block and no write-ahead log beside it (bytes added to its end): refused
in one line that says so, not as a file cut short, and left byte for byte as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.pipeline.cli import cli

SHARD = Path(__file__).parents[2] / "data" / "nvidia-h100-sxm-32sm.parquet"


@pytest.fixture
def grown(tmp_path) -> Path:
    db = tmp_path / "store.duckdb"
    assert CliRunner().invoke(cli, ["ingest", "--db", str(db), str(SHARD)]).exit_code == 0
    assert not db.with_name(db.name + ".wal").exists()
    db.write_bytes(db.read_bytes() + b"x" * 700)
    return db


@pytest.mark.parametrize("args", [["summary"], ["ingest", str(SHARD)]])
def test_bytes_added_past_the_last_block_are_said_as_such(grown, args):
    before = grown.read_bytes()
    size = len(before)
    result = CliRunner().invoke(cli, [*args, "--db", str(grown)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        f"Error: store {grown} is damaged (its file of {size} bytes ends 700 bytes into a block after its "
        f"{(size - 700 - 3 * 4096) // 262144} whole blocks of 262144 bytes, with no write-ahead log beside it: bytes "
        "were added to its end or a write stopped midway): restore it from a copy or pass another --db"]
    assert grown.read_bytes() == before


def test_a_file_cut_short_is_still_said_to_be(tmp_path):
    db = tmp_path / "store.duckdb"
    assert CliRunner().invoke(cli, ["ingest", "--db", str(db), str(SHARD)]).exit_code == 0
    db.write_bytes(db.read_bytes()[:-100])
    before = db.read_bytes()
    result = CliRunner().invoke(cli, ["summary", "--db", str(db)])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: store {db} is damaged (cut short: its file holds {len(before)} bytes, "
                                    "too few for the ")
    assert db.read_bytes() == before
