"""`devices add` of a record listing an alias twice, or its own name as an alias: refused in one line naming the alias,
the store left byte for byte as it was; a store that registered such a record before still reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from device_records import record
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.pipeline.cli import cli

SHARD = Path(__file__).parents[2] / "data" / "nvidia-h100-sxm-32sm.parquet"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.parametrize("aliases, says", [
    (["Acme X1", "Acme X1"], "alias 'Acme X1' is listed twice"),
    (["Acme X1", "Acme X1 Accelerator"], "alias 'Acme X1 Accelerator' is its name"),
])
def test_an_alias_given_twice_is_refused_and_nothing_stored(tmp_path, aliases, says):
    db = tmp_path / "s.duckdb"
    assert invoke("ingest", "--db", db, SHARD).exit_code == 0
    before = db.read_bytes()
    path = record(tmp_path / "acme.json", aliases=aliases)
    result = invoke("devices", "add", path, "--db", db)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        f"Error: cannot register {path}: device 'acme-x1': {says}; list each alias once, and not the name; "
        "nothing was stored"]
    assert db.read_bytes() == before


def test_a_store_holding_such_a_registration_from_before_still_reads(tmp_path, monkeypatch):
    import zmlx_pipeline.data.catalog as catalog

    db = tmp_path / "s.duckdb"
    real = catalog.registration_problems
    monkeypatch.setattr(catalog, "registration_problems", lambda spec, *a, **k: [
        p for p in real(spec, *a, **k) if "listed twice" not in p.text])  # as a release before the check wrote it
    for module in ("zmlx_pipeline.data.store", "zmlx_pipeline.data.registered"):
        monkeypatch.setattr(f"{module}.registration_problems", catalog.registration_problems)
    assert invoke("devices", "add", record(tmp_path / "acme.json", aliases=["Acme X1", "Acme X1"]),
                  "--db", db).exit_code == 0
    monkeypatch.undo()
    with Store(db, read_only=True) as store:
        (spec,) = store.registered_devices()
    assert spec.aliases == ("Acme X1", "Acme X1")
    listed = invoke("devices", "--db", db)
    assert listed.exit_code == 0 and "acme-x1" in listed.output
