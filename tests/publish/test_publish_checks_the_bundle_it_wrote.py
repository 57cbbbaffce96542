"""publish reads the bundle it wrote back with the runtime's own checks before `latest` moves: one the runtime would
refuse (a value it cannot use, from a registry row altered by hand, say) is refused in one line naming the kernel and
field, and the earlier publish stays exactly as it was."""

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from bundle_fixtures import fill_toy, latest_dir
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.publish import PublishError, publish
from zmlx_pipeline.runtime import load_bundle


@pytest.fixture
def toy_store(tmp_path) -> Path:
    db = tmp_path / "toy.duckdb"
    with Store(db) as store:
        fill_toy(store)
    return db


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` (hidden ones too) and its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} \
        if root.exists() else {}


def _spoil(monkeypatch, change) -> None:
    """Make publish's build hand over files changed by `change(files)`, as if its sources held such values."""
    from zmlx_pipeline.publish import build

    real = build.build_contents

    def spoiled(*args, **kwargs):
        files, summary = real(*args, **kwargs)
        change(files)
        return files, summary

    monkeypatch.setattr(build, "build_contents", spoiled)


def _prune_k_zero(files: dict) -> None:  # what a models row altered to prune_k -3 made publish write
    files["kernels.json"]["kernels"]["toy_scale"]["prune_k"] = 0


def _best_past_the_configs(files: dict) -> None:
    name = files["tables.json"]["devices"]["nvidia-h200"]
    entry = next(iter(files[name]["kernels"]["toy_scale"]["float16"]["measured"].values()))
    entry["best"] = 99999


@pytest.mark.parametrize("change, problem", [
    (_prune_k_zero, "malformed index files: kernels.json: kernels[toy_scale].prune_k must be a whole number from 1 "
                    "to 4096, not int 0"),
    (_best_past_the_configs, "malformed table devices/"),
], ids=["index file", "device table"])
def test_a_bundle_the_runtime_would_refuse_is_not_published(toy_store, tmp_path, monkeypatch, change, problem):
    out = tmp_path / "pub"
    with Store(toy_store) as store:
        first = publish(store, out, devices=["nvidia-h200"], evaluate=False)
    before = _tree(out)
    _spoil(monkeypatch, change)
    with Store(toy_store) as store, pytest.raises(PublishError) as refused:
        publish(store, out, devices=["nvidia-h200"], evaluate=False)
    message = str(refused.value)
    assert message.startswith(f"cannot publish to {out}: the new bundle: ") and problem in message
    assert message.endswith("; the runtime would refuse it, so nothing was published (what was there is unchanged)")
    assert "\n" not in message
    assert _tree(out) == before  # no new version, no temp directory, `latest` as it was
    assert (out / "latest").read_text().strip() == Path(first["path"]).name
    assert load_bundle(out, strict=True).bundle_id == first["bundle_id"]


def test_the_publish_command_refuses_it_in_one_line_and_creates_nothing(toy_store, tmp_path, monkeypatch):
    from zmlx_pipeline.pipeline.cli import cli

    _spoil(monkeypatch, _prune_k_zero)
    out = tmp_path / "new" / "pub"
    result = CliRunner().invoke(cli, ["publish", "--db", str(toy_store), "--to", str(out), "--device", "nvidia-h200"])
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: cannot publish to {out}: the new bundle: malformed index files: kernels.json: "
                      "kernels[toy_scale].prune_k must be a whole number from 1 to 4096, not int 0; the runtime would "
                      "refuse it, so nothing was published (what was there is unchanged)"]
    assert not (tmp_path / "new").exists()  # the directories it made for the bundle are gone again
    with Store(toy_store, read_only=True) as store:
        assert store.bundles() == []


def test_a_default_bundle_that_would_be_refused_leaves_the_one_there(toy_store, tmp_path, monkeypatch):
    """versioned=False (the package's default bundle) replaces a directory whole: refused, the old one stays."""
    out = tmp_path / "default_bundle"
    with Store(toy_store) as store:
        publish(store, out, versioned=False, record=False, evaluate=False, devices=["nvidia-h200"])
    before = _tree(tmp_path)
    _spoil(monkeypatch, _prune_k_zero)
    with Store(toy_store) as store, pytest.raises(PublishError, match=r"prune_k must be a whole number"):
        publish(store, out, versioned=False, record=False, evaluate=False, devices=["nvidia-h200"])
    assert _tree(tmp_path) == before and not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    assert json.loads((out / "manifest.json").read_text())["schema_version"] == 4


def test_the_package_default_bundle_is_checked_against_its_own_built_in_kernels(tmp_path):
    """A bundle written as the package's default holds the built-in kernels themselves: their own constraints (topk
    gating's power-of-two test uses `&`, which the runtime does not evaluate) are taken as they are, as the runtime
    takes the shipped bundle's; rewriting the shipped bundle in place with the check on goes through."""
    import shutil

    from zmlx_pipeline.publish.writer import rewrite_bundle, verify_written, write_blobs
    from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR, read_dir, registered_kernels

    shipped = tmp_path / "shipped"
    shutil.copytree(DEFAULT_BUNDLE_DIR, shipped)
    own = registered_kernels(shipped)
    assert any("&" in c for c in own["topk_gating"]["constraints"])
    verify_written(shipped, shipped, own_builtins=True)
    bundle = read_dir(shipped)
    blobs = {name: bundle.data(name) for name in bundle.logical_names()}
    fields = {k: v for k, v in bundle.manifest.items() if k in ("bundle_id", "source_shards", "data_fingerprint")}
    out = tmp_path / "default_bundle"
    manifest, path = write_blobs(out, blobs, fields, versioned=False, compact=True, verify=True)
    assert path == out and registered_kernels(out) == own
    assert rewrite_bundle(out, out)[1] == out
