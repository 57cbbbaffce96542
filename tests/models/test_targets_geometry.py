"""Per-case normalised targets, launch geometry relative to the device, and the models that use them."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
from sklearn.dummy import DummyRegressor

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.data.importers import import_files
from zmlx_pipeline.models.rankers.base import ModelError
from zmlx_pipeline.models.rankers.pipeline import PipelineRanker, shared_features
from zmlx_pipeline.models.rankers.prior import PriorRanker
from zmlx_pipeline.models.variants import MODEL_VARIANTS, make_ranker
from zmlx_pipeline.models.features import CASE, TARGETS, store_features

A100, A4000, A6000 = "nvidia-a100-pcie-40gb", "nvidia-rtx-a4000", "nvidia-rtx-a6000"
FILES = {A100: "A100", A4000: "A4000", A6000: "A6000"}


def conv_time(device: str, bx: int, by: int, tx: int, shmem: int) -> float:
    """Milliseconds with a device-dependent best config (A4000 likes small blocks, others big ones)."""
    cores = get_device(device).gpu_cores
    best_bx = 32 if device == A4000 else 128
    return ((1 + abs(math.log2(bx / best_bx))) * (1 + 0.1 * abs(tx - 2)) * (1 + 0.05 * abs(math.log2(by / 4)))
            * (0.5 if shmem else 1.0) * 100 / cores)


def import_conv(store, tmp_path, devices=(A100, A4000, A6000)) -> None:
    """A Kernel Tuner style kernel: block_size_x/tile_size_x over a 4096 x 2048 problem (x, y)."""
    folder = tmp_path / "conv"
    folder.mkdir(exist_ok=True)
    paths = []
    for device in devices:
        cache = {f"{bx},{by},{tx},{s}": {"block_size_x": bx, "block_size_y": by, "tile_size_x": tx, "use_shmem": s,
                                         "time": conv_time(device, bx, by, tx, s),
                                         "times": [conv_time(device, bx, by, tx, s)] * 3}
                 for bx in (16, 32, 48, 64, 128, 256) for by in (1, 2, 4, 8) for tx in (1, 2, 3) for s in (0, 1)}
        path = folder / f"{FILES[device]}.json"
        path.write_text(json.dumps({"device_name": get_device(device).name, "kernel_name": "conv",
                                    "problem_size": [4096, 2048], "cache": cache,
                                    "tune_params_keys": ["block_size_x", "block_size_y", "tile_size_x",
                                                         "use_shmem"]}))
        paths.append(path)
    import_files(store, paths)


def test_case_targets(store, tmp_path):
    import_conv(store, tmp_path)
    df = store_features(store)["conv"].frame
    assert set(TARGETS) <= set(df.columns)
    for (device,), case in df.group_by("device_id"):
        t = case.sort("log_time")
        assert t["log_rel"][0] == 0.0
        assert t["log_med"].to_numpy() == pytest.approx(t["log_time"].to_numpy() - np.median(t["log_time"].to_numpy()))
        assert t["rank_pct"].min() == 0.0 and 0.95 < t["rank_pct"].max() <= 1.0  # the slowest may tie
        assert (np.diff(t["rank_pct"].to_numpy()) >= 0).all()  # rank follows time
        # ties share a rank: the configs' ranks average to exactly 0.5
        assert t["rank_pct"].mean() == pytest.approx(0.5)
    # the scale is gone: every device's rank targets are alike although its times differ by its core count
    spread = df.group_by("device_id").agg(pl.col("rank_pct").max(), pl.col("median_us").min())
    assert spread["rank_pct"].n_unique() == 1 and spread["median_us"].n_unique() == 3


def test_geometry_features_follow_the_launch_and_the_device(store, tmp_path):
    import_conv(store, tmp_path)
    f = store_features(store)["conv"]
    geo = ["geo_log2_work_per_thread", "geo_log2_blocks", "geo_tile_waste", "geo_log2_blocks_per_core",
           "geo_log2_waves", "geo_wave_eff", "geo_last_wave_fill", "geo_log2_threads_per_core"]
    assert f.geometry == tuple(geo) and set(geo) <= set(f.frame.columns)
    assert not f.geometry_declared  # inferred from Kernel Tuner's names: the default models leave it out
    # opt-in only: in every tree model's features they let it memorise the training devices
    assert not set(geo) & set(f.numeric)
    assert set(geo) <= set(shared_features(f, geometry=True).numeric)
    assert not set(geo) & set(shared_features(f).numeric)
    row = f.frame.filter((pl.col("device_id") == A100) & (pl.col("cfg_block_size_x") == 48)
                         & (pl.col("cfg_block_size_y") == 4) & (pl.col("cfg_tile_size_x") == 3)).row(0, named=True)
    # x: 4096 / (48 * 3) -> 29 blocks (padded to 4176 of 4096); y: 2048 / 4 -> 512 blocks (no tile_size_y)
    blocks = math.ceil(4096 / 144) * 512
    assert row["geo_log2_blocks"] == pytest.approx(math.log2(blocks))
    assert row["geo_log2_work_per_thread"] == pytest.approx(math.log2(3))
    assert row["geo_tile_waste"] == pytest.approx(math.log2(29 * 144 / 4096))
    cores = get_device(A100).gpu_cores
    assert row["geo_log2_blocks_per_core"] == pytest.approx(math.log2(blocks / cores))
    assert row["geo_wave_eff"] == pytest.approx(blocks / (math.ceil(blocks / cores) * cores))
    assert row["geo_log2_threads_per_core"] == pytest.approx(math.log2(blocks * 48 * 4 / cores))
    # the same config on a device with fewer cores gets more blocks per core
    other = f.frame.filter((pl.col("device_id") == A4000) & (pl.col("config_key") == row["config_key"])).row(0, named=True)
    assert other["geo_log2_blocks"] == row["geo_log2_blocks"]
    assert other["geo_log2_blocks_per_core"] == pytest.approx(math.log2(blocks / get_device(A4000).gpu_cores))


def test_no_geometry_for_kernels_without_named_axes(store, make_measurement):
    from zmlx_pipeline.data.catalog import get_device as spec_of

    store.upsert_device({**spec_of(A100).as_row(), "device_id": A100, "in_catalog": True})
    store.record([make_measurement(device_id=A100, kernel="norm_imported", shape={"rows": r, "cols": 4096},
                                   config={"TG": tg, "ROWS": 1}, median_us=float(tg + r)) for r in (1, 64) for tg in (64, 256)])
    f = store_features(store)["norm_imported"]
    assert f.geometry == () and not [c for c in f.frame.columns if c.startswith("geo_")]
    assert f.frame["rank_pct"].to_list() and f.frame["log_med"].null_count() == 0


def test_pipeline_ranker_regresses_the_named_target(store, tmp_path):
    import_conv(store, tmp_path)
    f = store_features(store)["conv"]
    # a constant model predicts its target's mean: 0.5 for rank_pct (every case's ranks average to it)
    ranker = PipelineRanker(f, DummyRegressor(strategy="mean"), target="rank_pct").fit(f.frame)
    assert ranker.score(f.frame[:3]) == pytest.approx([0.5] * 3)
    ranker = PipelineRanker(f, DummyRegressor(strategy="mean"), target="log_med").fit(f.frame)
    assert ranker.score(f.frame[:1])[0] == pytest.approx(f.frame["log_med"].mean())
    with pytest.raises(ModelError, match="unknown target 'speed'"):
        PipelineRanker(f, DummyRegressor(), target="speed")


def test_rank_prior_is_the_mean_rank_on_the_training_devices(store, tmp_path):
    import_conv(store, tmp_path)
    f = store_features(store)["conv"]
    train = f.frame.filter(pl.col("device_id") != A6000)
    test = f.frame.filter(pl.col("device_id") == A6000)
    scores = PriorRanker(f, uniform=True, vendor_penalty=0.0, target="rank_pct").fit(train).score(test)
    expected = test.select("config_key").join(train.group_by("config_key").agg(pl.col("rank_pct").mean()),
                                              on="config_key", how="left", maintain_order="left")["rank_pct"]
    assert scores == pytest.approx(expected.to_numpy())
    # log_rel's prior differs: it weighs by how much slower, not by place
    by_time = PriorRanker(f, uniform=True, vendor_penalty=0.0).fit(train).score(test)
    assert not np.allclose(by_time, scores)
    with pytest.raises(ModelError, match="unknown prior target"):
        PriorRanker(f, target="log_time")


@pytest.mark.parametrize("model", ["gbr_med", "prior_rank_uniform", "transfer_geo"])
def test_new_variants_rank_an_unseen_device(store, tmp_path, model):
    import_conv(store, tmp_path)
    f = store_features(store)["conv"]
    assert model in MODEL_VARIANTS
    train = f.frame.filter(pl.col("device_id") != A6000)
    test = f.frame.filter(pl.col("device_id") == A6000)
    scores = make_ranker(f, model).fit(train).score(test)
    ranked = test.with_columns(pl.Series("_s", scores)).sort("_s")
    # shared memory helps on every device: a model that learned the order mostly ranks it first
    assert ranked["cfg_use_shmem"][:5].mean() >= 0.6
    assert ranked["median_us"][:5].mean() < ranked["median_us"][-5:].mean()
    assert len(scores) == test.height and set(CASE) <= set(test.columns)


def test_transfer_geo_models_see_the_geometry(store, tmp_path):
    import_conv(store, tmp_path)
    f = store_features(store)["conv"]
    train = f.frame.filter(pl.col("device_id") != A6000)
    columns = {name: set(make_ranker(f, name).fit(train).pipelines[0].named_steps["features"].transformers_[0][2])
               for name in ("transfer", "transfer_geo")}
    assert "geo_log2_blocks_per_core" in columns["transfer_geo"]
    assert not any(c.startswith("geo_") for c in columns["transfer"])
