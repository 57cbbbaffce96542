"""Model files and exported shards never go into a published bundle or a publish directory: a bundle would no
longer be what its manifest hashed, and a publish directory holding other files refuses every later publish."""

import hashlib
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))

from bundle_fixtures import build_toy, latest_dir  # noqa: E402
from zmlx_pipeline.pipeline.cli import cli  # noqa: E402
from zmlx_pipeline.runtime.bundle import published_place  # noqa: E402


@pytest.fixture(scope="module")
def toy_bundle(tmp_path_factory):
    """(store path, publish dir) of the toy bundle (tests/runtime/bundle_fixtures.py)."""
    return build_toy(tmp_path_factory.mktemp("toy"))


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def where(publish_dir: Path, name: str) -> Path:
    return {"bundle": latest_dir(publish_dir), "inside": latest_dir(publish_dir) / "sub",
            "publish dir": publish_dir}[name]


@pytest.mark.parametrize("name, says", [("bundle", "is a published bundle"),
                                        ("inside", "it is inside the published bundle"),
                                        ("publish dir", "is a publish directory (its latest names the newest bundle")])
def test_train_refuses_a_models_dir_in_a_bundle_or_publish_dir_before_any_fit(toy_bundle, name, says):
    db, publish_dir = toy_bundle
    before = digest(publish_dir)
    target = where(publish_dir, name)
    result = CliRunner().invoke(cli, ["train", "--db", str(db), "--models-dir", str(target), "-j", "1"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: cannot save models in {target}: ") and says in lines[0]
    assert digest(publish_dir) == before and not (latest_dir(publish_dir) / "sub").exists()


@pytest.mark.parametrize("name, says", [("bundle", "is a published bundle"),
                                        ("publish dir", "is a publish directory")])
def test_export_refuses_a_shard_in_a_bundle_or_publish_dir(toy_bundle, name, says):
    db, publish_dir = toy_bundle
    before = digest(publish_dir)
    out = where(publish_dir, name) / "x.parquet"
    result = CliRunner().invoke(cli, ["export", "--db", str(db), str(out)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith(f"Error: cannot export to {out}: ") and says in result.output
    assert len(result.output.splitlines()) == 1 and digest(publish_dir) == before


def test_other_folders_and_a_bundles_parent_are_not_published_places(toy_bundle, tmp_path):
    _, publish_dir = toy_bundle
    assert published_place(tmp_path) is None and published_place(tmp_path / "new" / "models") is None
    assert published_place(publish_dir.parent) is None  # the folder holding the publish dir
    (tmp_path / "latest").write_text("not a bundle version\n")  # a file of that name that points at nothing
    assert published_place(tmp_path) is None
    (tmp_path / "manifest.json").write_text('{"name": "a web app"}')  # another tool's manifest
    assert published_place(tmp_path) is None


@pytest.mark.parametrize("name, says", [("bundle", "is a published bundle"),
                                        ("inside", "it is inside the published bundle"),
                                        ("publish dir", "is a publish directory (its latest names the newest bundle")])
def test_contribute_refuses_an_out_in_a_bundle_or_publish_dir_before_measuring(toy_bundle, tmp_path, monkeypatch,
                                                                              name, says):
    from zmlx_pipeline.data import detect
    from zmlx_pipeline.pipeline import collect as stage

    db, publish_dir = toy_bundle
    store = tmp_path / "store.duckdb"
    store.write_bytes(db.read_bytes())
    before, stored = digest(publish_dir), store.read_bytes()
    metal = detect.detect_device({"device_name": "Apple M3 Max", "architecture": "applegpu_g15s"}, backend="metal",
                                 ioreg="")
    monkeypatch.setattr(detect, "detect_device", lambda: metal)
    monkeypatch.setattr(stage, "GpuMeasurer", lambda backend, settings: pytest.fail("measured"))
    out = where(publish_dir, name)
    result = CliRunner().invoke(cli, ["contribute", "--db", str(store), "--budget", "1s", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: cannot write the shard into {out}: ") and says in result.output
    assert result.output.endswith(", which holds what publish writes alone; choose another --out\n")
    assert len(result.output.splitlines()) == 1 and digest(publish_dir) == before and store.read_bytes() == stored


@pytest.mark.parametrize("name, says", [("bundle", "is a published bundle"),
                                        ("inside", "it is inside the published bundle"),
                                        ("publish dir", "is a publish directory (its latest names the newest bundle")])
def test_report_refuses_an_out_in_a_bundle_or_publish_dir_before_any_work(toy_bundle, name, says):
    db, publish_dir = toy_bundle
    before, stored = digest(publish_dir), db.read_bytes()
    out = where(publish_dir, name)
    result = CliRunner().invoke(cli, ["report", "--db", str(db), "--out", str(out), "--heatmaps", "0"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: cannot write the report to {out}: ") and says in result.output
    assert result.output.endswith(", which holds what publish writes alone; pass --out a directory outside it\n")
    assert len(result.output.splitlines()) == 1 and digest(publish_dir) == before and db.read_bytes() == stored
    assert not (latest_dir(publish_dir) / "sub").exists()
