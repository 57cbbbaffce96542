"""publish(): a verified, versioned, JSON-only bundle with profiles for every catalog chip and the v3 cache."""

import hashlib
import json
from pathlib import Path

import pytest

from bundle_fixtures import TOY_DEVICES, TOY_SHAPES, build_toy, fill_toy, latest_dir, toy_best
from zmlx_pipeline.data.catalog import load_catalog
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.publish import ModelSourceError, publish
from zmlx_pipeline.publish.build import STORE_K
from zmlx_pipeline.runtime import cache as cache_file


def test_layout_manifest_and_hashes(toy_bundle):
    db, publish_dir = toy_bundle
    root = latest_dir(publish_dir)
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["schema"] == "zmlx-pipeline-bundle" and manifest["schema_version"] == 4
    for field in ("created", "pipeline_version", "model_id", "data_fingerprint", "bundle_id", "models"):
        assert manifest[field], field
    assert manifest["data_fingerprint"].startswith("sha256:")
    on_disk = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} - {"manifest.json"}
    assert on_disk == set(manifest["files"])
    for name, entry in manifest["files"].items():
        blob = (root / name).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == entry["sha256"] and len(blob) == entry["bytes"]
        json.loads(blob)  # JSON only: every file parses, nothing is a pickle
    with Store(db, read_only=True) as store:
        (recorded,) = store.bundles()
    assert recorded["bundle_id"] == manifest["bundle_id"] and recorded["manifest"]["files"] == manifest["files"]
    assert Path(recorded["path"]) == root.resolve()


def test_profiles_cover_every_catalog_chip_with_evidence(toy_bundle):
    profiles = json.loads((latest_dir(toy_bundle[1]) / "profiles.json").read_text())["devices"]
    assert {s.id for s in load_catalog()} <= set(profiles)
    evidence = {d: p["evidence"] for d, p in profiles.items()}
    assert {evidence[d] for d in TOY_DEVICES} == {"measured"}
    # toy_scale was measured on Hopper chips only: an Apple chip is extrapolated, another Hopper chip predicted
    assert evidence["apple-m3-max-40c"] == "extrapolated" and evidence["nvidia-h100-pcie"] == "predicted"
    for p in profiles.values():
        assert p["seed"]["default_tg"] == p["default_threadgroup"] and p["seed"]["candidates"]
        assert p["catalog_default_threadgroup"] == 256
    seed = json.loads((latest_dir(toy_bundle[1]) / "profiles.json").read_text())["seed_table"]
    assert seed["M3_Max"]["device_id"] == "apple-m3-max-40c" and seed["M3_Max"]["gpu_cores"] == 40
    assert seed["M1"]["device_id"] == "apple-m1-8c" and seed["nvidia-h200"]["evidence"] == "measured"
    assert set(seed["M4_Pro"]) >= {"gpu_cores", "memory_bandwidth", "default_tg", "candidates"}


def test_entries_carry_config_candidates_time_regret_and_evidence(toy_bundle):
    root = latest_dir(toy_bundle[1])
    kernels = json.loads((root / "kernels.json").read_text())["kernels"]
    meta = kernels["toy_scale"]
    tables = json.loads((root / "tables.json").read_text())["devices"]
    h100 = json.loads((root / tables["nvidia-h100-sxm"]).read_text())["kernels"]["toy_scale"]["float16"]
    for shape in TOY_SHAPES:
        key = ",".join(str(shape[d]) for d in meta["dims"])
        e = h100["measured"][key]
        assert set(e) == {"best", "ranked", "time_us", "expected_regret", "evidence", "n_legal"}
        assert meta["configs"][e["best"]] == toy_best("nvidia-h100-sxm", shape)
        assert (e["expected_regret"], e["evidence"], e["n_legal"]) == (1.0, "measured", 12)
        assert e["ranked"][0] == e["best"] and e["time_us"] > 0
    for bucket, e in h100["buckets"].items():
        assert e["evidence"] == "predicted" and e["time_us"] > 0
        assert len(e["ranked"]) == min(len(meta["configs"]), meta["stored_k"])
    assert meta["stored_k"] == max(STORE_K, meta["prune_k_trained"])
    # the published k: training's, or more where the replay through the lookup needs more
    replay = meta["prune_k_lookup"]
    assert replay["cases"] > 0 and replay["max_k"] == min(meta["stored_k"], len(meta["configs"]))
    assert meta["prune_k"] == max(meta["prune_k_trained"], replay["k"] if replay["k"] is not None else replay["max_k"])
    regret = meta["expected_regret"]
    assert regret["unseen_device"] >= 1.0  # two devices: each left out once
    seen = regret["seen_device"] if regret["seen_device"] is not None else regret["unseen_device"]
    assert {e["expected_regret"] for e in h100["buckets"].values()} == {seen}
    m4 = json.loads((root / tables["apple-m4-max-40c"]).read_text())["kernels"]["toy_scale"]["float16"]
    # an Apple chip is extrapolated from a Hopper chip: with one family measured no such jump was validated
    assert {e["expected_regret"] for e in m4["buckets"].values()} == {None} and not m4["measured"]
    assert {e["evidence"] for e in m4["buckets"].values()} == {"extrapolated"} and regret["cross_family"] is None
    pcie = json.loads((root / tables["nvidia-h100-pcie"]).read_text())["kernels"]["toy_scale"]["float16"]
    assert {e["expected_regret"] for e in pcie["buckets"].values()} == {regret["unseen_device"]}
    assert {e["evidence"] for e in pcie["buckets"].values()} == {"predicted"}
    # no spec, so no work terms: no time is moved to a chip that was not measured
    assert meta["work"] is None and {e["time_us"] for e in pcie["buckets"].values()} == {None}
    assert {e["time_bound"] for e in pcie["buckets"].values()} == {None}
    assert len(tables) == len([s for s in load_catalog()])  # a no-spec kernel: every catalog chip


def test_the_v3_cache_layout_holds_the_winners_for_existing_loaders(toy_bundle):
    data = json.loads((latest_dir(toy_bundle[1]) / "autotune_v3.json").read_text())
    assert data["schema_version"] == "3.0"
    assert set(data["devices"]) == {f"{d}_0.30.0" for d in TOY_DEVICES}
    section = data["devices"]["nvidia-h200_0.30.0"]
    assert section["metadata"]["family"] == "hopper" and section["metadata"]["gpu_cores"] == 132
    found = 0
    for key, value in section["entries"].items():
        parsed = json.loads(key)  # what ZMLX's loader does with a key ...
        tuple(value["tg"]), [tuple(t) for t in value["template"]]  # ... and with a value
        assert set(parsed) >= {"name", "shapes", "dtypes", "grid"}
        if value["source"] == "measured":
            found += 1
            assert value["config"] == toy_best("nvidia-h200", dict(zip(("rows", "cols"), parsed["shapes"][0])))
    assert found == len(TOY_SHAPES)
    assert cache_file.read_cache(latest_dir(toy_bundle[1]) / "autotune_v3.json")["devices"].keys() == data["devices"].keys()


def test_registered_models_are_used_and_named_ones_chosen(tmp_path):
    from threadpoolctl import threadpool_limits

    from zmlx_pipeline.models.train import train_models

    with Store(tmp_path / "s.duckdb") as store:
        fill_toy(store)
        with threadpool_limits(limits=1):
            (row,) = train_models(store, models_dir=tmp_path / "models")
        result = publish(store, tmp_path / "out", evaluate=False)
        assert result["model_id"] == row["model_id"] and result["model_source"] == "registry"
        manifest = json.loads((Path(result["path"]) / "manifest.json").read_text())
        assert manifest["models"]["toy_scale"]["source"] == "registry"
        assert manifest["data_fingerprint"] == row["data_fingerprint"]
        assert publish(store, tmp_path / "out", row["model_id"], evaluate=False)["model_id"] == row["model_id"]
        with pytest.raises(ModelSourceError, match="no registered model 'nope'"):
            publish(store, tmp_path / "out", "nope")


def test_an_empty_store_is_a_clear_error(tmp_path):
    with Store(tmp_path / "empty.duckdb") as store, pytest.raises(ModelSourceError, match="no ok measurements"):
        publish(store, tmp_path / "out")
    assert not (tmp_path / "out" / "latest").exists()


def test_publishing_is_deterministic_in_content(tmp_path):
    _, a = build_toy(tmp_path / "a")
    _, b = build_toy(tmp_path / "b")
    ma = json.loads((latest_dir(a) / "manifest.json").read_text())
    mb = json.loads((latest_dir(b) / "manifest.json").read_text())
    assert ma["files"] == mb["files"] and ma["content_sha256"] == mb["content_sha256"]


def test_every_bucket_is_published_also_shapes_larger_than_the_l2(real_bundle):
    # Candidate rows carry a placeholder time; screened as measurements, every shape whose bytes
    # exceed the L2 looked "faster than memory" and its bucket was silently left out.
    root = latest_dir(real_bundle[1])
    meta = json.loads((root / "kernels.json").read_text())["kernels"]["rmsnorm"]
    tables = json.loads((root / "tables.json").read_text())["devices"]
    large = [k for k, s in meta["buckets"].items() if s["rows"] * s["cols"] * 2 > 50 * 2**20]
    assert large, "the rmsnorm grid has shapes larger than the H100's L2"
    for device in ("nvidia-h100-sxm", "nvidia-h200"):
        published = json.loads((root / tables[device]).read_text())["kernels"]["rmsnorm"]["float16"]["buckets"]
        assert set(published) == set(meta["buckets"]), device


def test_measured_devices_get_the_models_ranking_at_every_point_between_the_grid_buckets(real_bundle):
    # the power-of-two box of rmsnorm's grids (rows 2^0..2^15, cols 2^10..2^14) less the grid's own buckets
    root = latest_dir(real_bundle[1])
    meta = json.loads((root / "kernels.json").read_text())["kernels"]["rmsnorm"]
    tables = json.loads((root / "tables.json").read_text())["devices"]
    grid = set(meta["buckets"])
    box = {f"{r},{c}" for r in range(16) for c in range(10, 15)}
    assert grid < box
    measured = meta["trained_devices"]
    assert measured == ["nvidia-h100-sxm@32sm"]
    for device in tables:
        t = json.loads((root / tables[device]).read_text())["kernels"]["rmsnorm"]
        for dtype, table in t.items():
            if device in measured:
                assert set(table["between"]) == box - grid, (device, dtype)
                e = table["between"]["10,13"]
                assert e["best"] == e["ranked"][0] and len(e["ranked"]) == meta["stored_k"]
                assert e["evidence"] == "predicted" and e["time_us"] > 0 and e["n_legal"] > len(e["ranked"])
            else:  # an autotuner runs only where a device was measured; others keep the grid's buckets
                assert "between" not in table, (device, dtype)


def test_between_points_cover_the_box_of_every_dimension_and_skip_taken_buckets():
    from zmlx_pipeline.publish.build import _between_shapes

    shapes = [{"M": 1, "N": 4096}, {"M": 16, "N": 4096}, {"M": 8, "N": 1024}]
    got = _between_shapes(["M", "N"], shapes, {(0, 12), (4, 12), (3, 10)})
    assert {(s["M"], s["N"]) for s in got} == {(m, n) for m in (1, 2, 4, 8, 16) for n in (1024, 2048, 4096)} \
        - {(1, 4096), (16, 4096), (8, 1024)}
    assert _between_shapes(["M"], [], set()) == []
