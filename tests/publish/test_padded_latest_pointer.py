"""A `latest` pointer the runtime reads (a version's name, padded with white space up to MAX_POINTER_BYTES) is an
earlier publish's to publish too, so a directory the runtime serves is never one publish refuses; a longer one is
refused in one line, the directory left as it was."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))

from bundle_fixtures import fill_toy, tree_digest  # noqa: E402
from zmlx_pipeline.data.store import Store  # noqa: E402
from zmlx_pipeline.pipeline.cli import cli  # noqa: E402
from zmlx_pipeline.runtime.bundle import MAX_POINTER_BYTES, read_dir  # noqa: E402


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[Path, Path]:
    """(store, publish directory) of the toy kernel for the H200."""
    root = tmp_path_factory.mktemp("padded")
    with Store(root / "s.duckdb") as store:
        fill_toy(store)
    result = CliRunner().invoke(cli, ["publish", "--db", str(root / "s.duckdb"), "--to", str(root / "out"),
                                      "--device", "nvidia-h200"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return root / "s.duckdb", root / "out"


def _publish(db: Path, out: Path):
    return CliRunner().invoke(cli, ["publish", "--db", str(db), "--to", str(out), "--device", "nvidia-h200"],
                              catch_exceptions=False)


def test_a_padded_pointer_the_runtime_reads_is_published_over(published):
    db, out = published
    name = (out / "latest").read_text().strip()
    (out / "latest").write_text(name + "\n" + " " * (MAX_POINTER_BYTES - len(name) - 1))
    assert read_dir(out).bundle_id
    result = _publish(db, out)
    assert result.exit_code == 0, result.output
    new = (out / "latest").read_text()
    assert new.endswith("\n") and (out / new.strip() / "manifest.json").is_file()
    assert (out / name / "manifest.json").is_file()


def test_a_pointer_past_the_limit_is_refused_and_nothing_changes(published):
    db, out = published
    name = (out / "latest").read_text().strip()
    (out / "latest").write_text(name + "\n" + " " * (MAX_POINTER_BYTES - len(name)))
    before = tree_digest(out), db.read_bytes()
    result = _publish(db, out)
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"Error: cannot publish to {out}: its latest is not a publish's pointer to the newest bundle (it is too long "
        "to name a bundle version); remove it or choose another --to"]
    assert (tree_digest(out), db.read_bytes()) == before
