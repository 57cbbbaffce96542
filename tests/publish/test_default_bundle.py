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


def test_the_default_bundle_has_tables_for_the_chips_mlx_runs_on_only():
    """A lookup table for each catalog chip MLX runs on (Metal; CUDA at sm_75 or newer) and each measured device, and
    none for a chip MLX cannot run on (a Pascal or Volta GPU, an AMD one), which is answered with the default config
    and why."""
    import zmlx_pipeline.runtime as rt
    from zmlx_pipeline.data.catalog import load_catalog, mlx_runs_on

    bundle = default_bundle()
    catalog = {spec.id: spec for spec in load_catalog()}
    held = set(bundle.tables)
    assert {d for d in held if d in catalog} == {d for d, spec in catalog.items() if mlx_runs_on(spec)}
    assert all("@" in d or d in catalog for d in held)
    shape = {"rows": 4096, "cols": 4096}
    turing = rt.predicted_config("rmsnorm", shape, "float16", device="nvidia-t4")
    assert turing.evidence != "default" and turing.config
    pascal = rt.predicted_config("rmsnorm", shape, "float16", device="nvidia-gtx-1080-ti")
    assert pascal.evidence == "default" and pascal.note.startswith(
        "MLX does not run on device 'nvidia-gtx-1080-ti' (cuda sm_61; MLX runs on metal and cuda at sm_75 or newer), "
        f"so bundle {bundle.bundle_id} has no table for it")
    named = rt.predicted_config("rmsnorm", shape, "float16", device="Tesla V100-SXM2-32GB")
    assert (named.device, named.evidence) == ("nvidia-v100-sxm2-32gb", "default")  # a chip's name: answered as the chip
    assert named.note.startswith("MLX does not run on device 'Tesla V100-SXM2-32GB' (cuda sm_70; ")
