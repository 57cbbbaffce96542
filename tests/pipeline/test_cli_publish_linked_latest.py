"""`publish --to DIR` where DIR's `latest` is a symbolic link (made by a user or a deployment tool) that the runtime
follows to a bundle: the new version is written into DIR and the link replaced, atomically, by the ordinary pointer
file naming it, the output saying so; nothing is written through the link, and what it led to stays as it was. A link
that leads to no bundle is refused in one line saying what to do, before any work. Such a DIR is a publish directory
to the commands that refuse to write into one (export, train's models)."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))

from bundle_fixtures import fill_toy, latest_dir  # noqa: E402
from zmlx_pipeline.data.store import Store  # noqa: E402
from zmlx_pipeline.pipeline.cli import cli  # noqa: E402
from zmlx_pipeline.runtime import load_bundle  # noqa: E402
from zmlx_pipeline.runtime.bundle import published_place  # noqa: E402

TODO = ("remove the link (publish then writes latest as the pointer file to the new bundle; what the link names is "
        "kept) or choose another --to")


pytestmark = pytest.mark.usefixtures("fresh_runtime")  # tests/pipeline/conftest.py


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[Path, Path]:
    """(store path, a publish directory holding one version) of the toy kernel, published for the H200."""
    root = tmp_path_factory.mktemp("linked-latest")
    db = root / "s.duckdb"
    with Store(db) as store:
        fill_toy(store)
    result = CliRunner().invoke(cli, ["publish", "--db", str(db), "--to", str(root / "pub"), "--device",
                                      "nvidia-h200"])
    assert result.exit_code == 0, result.output
    return db, root / "pub"


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def _publish(db: Path, to: Path, *more: str):
    return CliRunner().invoke(cli, ["publish", "--db", str(db), "--to", str(to), "--device", "nvidia-h200", *more])


def _linked(published, tmp_path: Path, how: str) -> tuple[Path, str, Path]:
    """(a publish directory whose latest is a link, the link's text, the folder holding what it leads to)."""
    version = latest_dir(published[1])
    to = tmp_path / "pub"
    to.mkdir()
    if how in ("a version beside it", "its manifest"):
        shutil.copytree(version, to / version.name)
        link, kept = version.name if how == "a version beside it" else f"{version.name}/manifest.json", to / version.name
    else:  # a release folder elsewhere, as a deployment tool keeps one; DIR holds only the link
        releases = tmp_path / "releases"
        shutil.copytree(version, releases / version.name)
        (releases / "current").write_text(version.name + "\n")
        link, kept = str(releases / ("current" if how == "a pointer file elsewhere" else version.name)), releases
    os.symlink(link, to / "latest")
    return to, link, kept


HOWS = ["a version beside it", "its manifest", "a bundle elsewhere", "a pointer file elsewhere"]


@pytest.mark.parametrize("how", HOWS)
def test_publish_replaces_a_latest_link_with_the_pointer_file(published, tmp_path, how):
    to, link, kept = _linked(published, tmp_path, how)
    assert published_place(to) == f"{to} is a publish directory (its latest links to the newest bundle)"
    before = _tree(kept)
    result = _publish(published[0], to, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["latest_replaced_link"] == link and out["latest"] == str(to / "latest")
    latest = to / "latest"
    assert not latest.is_symlink() and latest.read_text() == out["bundle_id"] + "\n"
    assert Path(out["path"]).parent == to and (Path(out["path"]) / "manifest.json").is_file()
    assert _tree(kept) == before  # nothing written through the link: what it led to is as it was
    assert load_bundle(to, strict=True).bundle_id == out["bundle_id"]
    assert not [p.name for p in to.iterdir() if p.name.startswith(".")]  # no temp file left beside latest


def test_the_table_output_says_the_link_was_replaced(published, tmp_path):
    to, link, _ = _linked(published, tmp_path, "a pointer file elsewhere")
    result = _publish(published[0], to)
    assert result.exit_code == 0, result.output
    bundle_id = (to / "latest").read_text().strip()
    assert result.stdout.splitlines()[-1] == (f"{to / 'latest'} was a symbolic link to {link!r}; it is now the "
                                              f"pointer file naming {bundle_id} (what the link named is unchanged)")
    again = _publish(published[0], to)  # the pointer file now: an earlier publish's, said nothing of
    assert again.exit_code == 0, again.output
    assert "symbolic link" not in again.stdout


@pytest.mark.parametrize("how, why", [
    ("dangling", "which does not exist"),
    ("a loop", "which cannot be followed"),
    ("a folder with no bundle", "which leads to no bundle"),
    ("a pointer naming nothing", "which leads to no bundle"),
])
def test_a_latest_link_that_leads_to_no_bundle_is_refused_before_any_work(published, tmp_path, monkeypatch, how,
                                                                          why):
    def no_work(*args, **kwargs):
        raise AssertionError("publish's work started")

    monkeypatch.setattr("zmlx_pipeline.publish.load_models", no_work)
    to = tmp_path / "pub"
    to.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = {"dangling": str(tmp_path / "gone"), "a loop": "latest", "a folder with no bundle": str(elsewhere),
            "a pointer naming nothing": str(elsewhere / "pointer")}[how]
    (elsewhere / "pointer").write_text("20260101T000000Z-deadbeef\n")
    os.symlink(link, to / "latest")
    before = _tree(tmp_path)
    result = _publish(published[0], to)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.output == (f"Error: cannot publish to {to}: its latest is a symbolic link to {link!r}, {why}; "
                             f"{TODO}\n")
    assert _tree(tmp_path) == before and (to / "latest").is_symlink()
    assert published_place(to) is None  # not a publish directory the runtime can read


def test_export_refuses_a_publish_directory_whose_latest_is_a_link(published, tmp_path):
    to, _, _ = _linked(published, tmp_path, "a version beside it")
    result = CliRunner().invoke(cli, ["export", "--db", str(published[0]), str(to / "shard.parquet")])
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.output == (f"Error: cannot export to {to / 'shard.parquet'}: {to} is a publish directory (its "
                             "latest links to the newest bundle), which holds what publish writes alone; choose "
                             "another path\n")
    assert not (to / "shard.parquet").exists()
