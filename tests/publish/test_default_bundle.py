"""The bundle shipped with the package was built from the committed shards, and says which."""

from zmlx_pipeline.publish.default import shard_fingerprints
from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR, default_bundle

from bundle_fixtures import REPO


def test_the_default_bundle_matches_the_committed_shards():
    manifest = default_bundle().manifest  # verifies every file's sha256 on the way
    recorded = manifest.get("source_shards")
    current = shard_fingerprints(REPO / "data")
    assert recorded == current, (
        "data/ no longer matches the default bundle's manifest: run `python tools/build_default_bundle.py` "
        f"and commit {DEFAULT_BUNDLE_DIR.relative_to(REPO)}"
    )
    assert manifest["data_fingerprint"].startswith("sha256:")


def test_the_default_bundle_is_package_data():
    import tomllib

    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["zmlx_pipeline"]
    files = [p.relative_to(REPO / "zmlx_pipeline") for p in DEFAULT_BUNDLE_DIR.rglob("*") if p.is_file()]
    assert files and all(any(f.match(g) for g in globs) for f in files)


def test_the_default_bundle_ships_compact():
    """Every file but the manifest is stored gzip-compressed (a compact schema), several times smaller than its JSON."""
    bundle = default_bundle()
    files = bundle.manifest["files"]
    assert bundle.compact and files and all(name.endswith(".gz") for name in files)
    stored = sum(entry["bytes"] for entry in files.values())
    inflated = sum(len(bundle.data(name)) for name in bundle.logical_names())
    assert stored * 4 < inflated
