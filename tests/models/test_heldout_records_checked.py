"""Held-out case records train could not have written (a regret below 1 or not finite, a hit_rank outside the
case's configs) are one CorruptStore line to evaluate and publish, which would report them as the model's scores,
naming the kernel, method and case and saying to train again; the store is left as it was."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from store_fixtures import fill

from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models.train import train_models
from zmlx_pipeline.pipeline.cli import cli


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A store of kernel k on three devices with a `prior` model trained on it (cases of both splits recorded)."""
    from zmlx_pipeline.data.records import Measurement

    def make(**fields):
        median = fields["median_us"]
        return Measurement(**{"run_id": "run-1", "kernel_version": "sha256:0000000000000001", "status": "ok",
                              "samples": 20, "p10_us": median * 0.95, "p90_us": median * 1.05, **fields})

    path = tmp_path_factory.mktemp("trained") / "s.duckdb"
    with Store(path) as s:
        fill(s, make, kernels=("k",))
        train_models(s, model="prior", models_dir=path.parent / "models", jobs=1)
    return path


def _changed(trained: Path, tmp_path: Path, sql: str) -> tuple[Path, bytes]:
    db = tmp_path / "s.duckdb"
    db.write_bytes(trained.read_bytes())
    (tmp_path / "models").symlink_to(trained.parent / "models")
    con = duckdb.connect(str(db))
    (changed,) = con.execute(sql).fetchone()
    con.close()
    assert changed > 0
    return db, db.read_bytes()


def _one_line(args: list[str], *says: str) -> None:
    """The command ends with exit 1 and one error line (after any progress lines) saying all of `says`."""
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert "Traceback" not in result.output and [line for line in lines if line.startswith("Error: ")] == lines[-1:]
    assert all(s in lines[-1] for s in says), result.output


EVALUATE = ["evaluate", "--split", "shapes", "-k", "k", "--model", "prior", "-j", "1"]


@pytest.mark.parametrize("sql, says", [
    ("UPDATE heldout_cases SET r1 = 0.5, r2 = 0.5, r3 = 0.5, r4 = 0.5, r5 = 0.5 WHERE method = 'prior'",
     "r1 is 0.5, not a regret"),
    ("UPDATE heldout_cases SET r1 = 'nan' WHERE method = 'prior'", "r1 is nan, not a regret"),
    ("UPDATE heldout_cases SET r1 = NULL WHERE method = 'prior'", "r1 is None, not a regret"),
    ("UPDATE heldout_cases SET r3 = 'inf' WHERE method = 'prior'", "r3 is inf, not a regret"),
    ("UPDATE heldout_cases SET r2 = r1 + 1 WHERE method = 'prior'", "above r1"),
    ("UPDATE heldout_cases SET hit_rank = configs + 1 WHERE method = 'prior'", "not a rank from 1 to the case's"),
    ("UPDATE heldout_cases SET hit_rank = 0 WHERE method = 'prior'", "hit_rank is 0, not a rank"),
    # r@1 within 2% of the best means the first pick is the hit (rank 1), and a hit at rank 1 means r@1 is within 2%
    ("UPDATE heldout_cases SET r1 = 1, r2 = 1, r3 = 1, r4 = 1, r5 = 1, r6 = 1, r7 = 1, r8 = 1, r9 = 1, r10 = 1, "
     "hit_rank = least(configs, 3) WHERE method = 'prior' AND configs >= 2", "disagrees with the regrets"),
    ("UPDATE heldout_cases SET r1 = 1.5, r2 = 1.5, r3 = 1.5, r4 = 1.5, r5 = 1.5, r6 = 1.5, r7 = 1.5, r8 = 1.5, "
     "r9 = 1.5, r10 = 1.5, hit_rank = 1 WHERE method = 'prior'", "hit_rank 1 disagrees with the regrets"),
])
def test_evaluate_refuses_records_train_never_writes(trained, tmp_path, monkeypatch, sql, says):
    monkeypatch.chdir(tmp_path)
    db, before = _changed(trained, tmp_path, sql)
    _one_line([EVALUATE[0], "--db", str(db), *EVALUATE[1:]], says, "kernel k, method prior, fold ",
              f"train the kernel again (`zmlx-pipeline train --db {db} -k k`)")
    assert db.read_bytes() == before


def test_a_baselines_record_is_checked_too(trained, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db, before = _changed(trained, tmp_path, "UPDATE heldout_cases SET r1 = 0.9 WHERE method = 'nearest_shape'")
    _one_line([EVALUATE[0], "--db", str(db), *EVALUATE[1:]], "method nearest_shape", "r1 is 0.9")
    assert db.read_bytes() == before


def test_publish_refuses_the_left_out_device_records_it_reads_for_expected_regret(trained, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db, before = _changed(trained, tmp_path,
                          "UPDATE heldout_cases SET r1 = 0.5 WHERE split = 'devices' AND method = 'prior'")
    _one_line(["publish", "--db", str(db), "--to", "pub", "--device", "nvidia-rtx-a4000"], "r1 is 0.5",
              "method prior", f"`zmlx-pipeline train --db {db} -k k`")
    assert db.read_bytes() == before
    assert not (tmp_path / "pub").exists() or not any((tmp_path / "pub").iterdir())


def test_untouched_records_are_read(trained, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db, _ = _changed(trained, tmp_path, "SELECT count(*) FROM heldout_cases")
    result = CliRunner().invoke(cli, [EVALUATE[0], "--db", str(db), *EVALUATE[1:]])
    assert result.exit_code == 0, result.output
    assert "read from the held-out cases train recorded" in result.output
