"""Launch geometry of kernels that declare their tile axes (KernelSpec.tiles): values checked by hand."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.spec import KernelSpecError, TileAxes
from zmlx_pipeline.models.rankers.pipeline import shared_features
from zmlx_pipeline.models.transfer import transfer_features
from zmlx_pipeline.models.variants import DEFAULT_MODEL, make_ranker
from zmlx_pipeline.models.features import declared_tiles, named_tiles, store_features

H100 = "nvidia-h100-sxm"
MATMUL_GEO = ("geo_log2_work_per_thread", "geo_log2_blocks", "geo_tile_waste", "geo_log2_blocks_per_core",
              "geo_log2_waves", "geo_wave_eff", "geo_last_wave_fill", "geo_log2_threads_per_core",
              "geo_log2_steps", "geo_step_waste", "geo_log2_tile_reuse")
# legal matmul configs (the built-in kernel's parameters and constraints: the store's reads refuse any other)
CONFIGS = [{"BM": 16, "BN": 128, "BK": 32, "TG": 128, "WM": 1, "WN": 4, "WG": 0, "STAGES": 4},
           {"BM": 64, "BN": 64, "BK": 64, "TG": 256, "WM": 4, "WN": 2, "WG": 0, "STAGES": 2},
           {"BM": 32, "BN": 64, "BK": 32, "TG": 64, "WM": 1, "WN": 2, "WG": 0, "STAGES": 4}]
SHAPES = [{"M": 100, "N": 4096, "K": 1000}, {"M": 2048, "N": 4096, "K": 4096}]


def record_matmul(store, make_measurement, devices=(H100,), kernel="matmul"):
    for device in devices:
        store.upsert_device({**get_device(device).as_row(), "device_id": device, "in_catalog": True})
        store.record([make_measurement(device_id=device, kernel=kernel, dtype="float16", shape=s, config=c,
                                       median_us=1000.0 + i + 3 * j)  # plausible: faster than memory allows is dropped
                      for i, c in enumerate(CONFIGS) for j, s in enumerate(SHAPES)])


def _json(d: dict) -> str:
    import json

    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def test_matmul_declares_its_tiles():
    tiles = get_kernel("matmul").tiles
    assert tiles == TileAxes(grid={"M": ("BM",), "N": ("BN",)}, threads=("TG",), steps={"K": ("BK",)})
    assert declared_tiles("matmul") == tiles
    assert declared_tiles("swiglu") is None and declared_tiles("conv") is None and declared_tiles("a.b:C") is None
    # the declaration is checked against the kernel's own params and dims
    with pytest.raises(KernelSpecError, match="unknown name.*BQ"):
        get_kernel("matmul").replace(tiles=TileAxes(grid={"M": ("BQ",)}, threads=("TG",)))
    with pytest.raises(KernelSpecError, match="unknown name.*rows"):
        get_kernel("matmul").replace(tiles=TileAxes(grid={"rows": ("BM",)}, threads=("TG",)))
    for seen in ("no", "False", 0, None):  # a truthy "no" would hand the geometry to seen devices' models too
        with pytest.raises(KernelSpecError, match="seen must be True or False"):
            get_kernel("rmsnorm").replace(tiles=TileAxes(grid={"rows": ("ROWS",)}, threads=("TG",), seen=seen))
    # it is no part of the generated code: timings stay valid
    assert get_kernel("matmul").replace(tiles=None).version == get_kernel("matmul").version


def test_matmul_geometry_values(store, make_measurement):
    record_matmul(store, make_measurement)
    f = store_features(store)["matmul"]
    assert f.geometry == MATMUL_GEO and f.geometry_declared
    cores = get_device(H100).gpu_cores
    assert cores == 132
    cfg, shape = CONFIGS[0], SHAPES[0]  # BM 16, BN 128, BK 32, TG 128 on M 100, N 4096, K 1000
    frame = f.frame
    r = next(r for r in frame.iter_rows(named=True)
             if r["shape"] == _json(shape) and r["config"] == _json(cfg))
    blocks = 7 * 32  # ceil(100 / 16) row blocks x 4096 / 128 column blocks
    assert r["geo_log2_blocks"] == pytest.approx(math.log2(blocks))
    assert r["geo_log2_work_per_thread"] == pytest.approx(math.log2(16 * 128 / 128))
    assert r["geo_tile_waste"] == pytest.approx(math.log2(7 * 16 / 100))  # N divides evenly
    assert r["geo_log2_blocks_per_core"] == pytest.approx(math.log2(blocks / cores))
    assert r["geo_log2_waves"] == pytest.approx(math.log2(2))  # 224 blocks on 132 cores
    assert r["geo_wave_eff"] == pytest.approx(224 / 264)
    assert r["geo_last_wave_fill"] == pytest.approx(92 / 132)
    assert r["geo_log2_threads_per_core"] == pytest.approx(math.log2(blocks * 128 / cores))
    assert r["geo_log2_steps"] == pytest.approx(math.log2(32))  # ceil(1000 / 32)
    assert r["geo_step_waste"] == pytest.approx(math.log2(32 * 32 / 1000))
    assert r["geo_log2_tile_reuse"] == pytest.approx(math.log2(16 * 128 / (16 + 128)))
    # an even split: no waste, whole waves
    r = next(r for r in frame.iter_rows(named=True)
             if r["shape"] == _json(SHAPES[1]) and r["config"] == _json(CONFIGS[1]))
    assert r["geo_tile_waste"] == 0.0 and r["geo_step_waste"] == 0.0
    assert r["geo_log2_blocks"] == pytest.approx(math.log2(32 * 64))
    assert r["geo_last_wave_fill"] == pytest.approx((2048 - 15 * 132) / 132)


def test_matmul_geometry_follows_the_core_count(store, make_measurement):
    small = "nvidia-rtx-a4000"
    record_matmul(store, make_measurement, devices=(H100, small))
    f = store_features(store)["matmul"]
    a = f.frame.filter(pl.col("device_id") == H100).sort("config_key", "shape_key")
    b = f.frame.filter(pl.col("device_id") == small).sort("config_key", "shape_key")
    assert a["geo_log2_blocks"].to_list() == b["geo_log2_blocks"].to_list()
    ratio = math.log2(get_device(H100).gpu_cores / get_device(small).gpu_cores)
    assert (b["geo_log2_blocks_per_core"] - a["geo_log2_blocks_per_core"]).to_list() == pytest.approx([ratio] * a.height)


def test_declared_geometry_is_in_the_default_models(store, make_measurement):
    record_matmul(store, make_measurement, devices=(H100, "nvidia-rtx-a4000"))
    mm = store_features(store)["matmul"]
    assert set(MATMUL_GEO) <= set(shared_features(mm).numeric)
    assert set(MATMUL_GEO) <= set(transfer_features(mm).numeric)
    assert not set(MATMUL_GEO) & set(shared_features(mm, geometry=False).numeric)
    assert mm.geometry_seen and mm.for_seen_devices() is mm  # matmul's is read for seen devices too
    # the default ensemble's per-device models see it
    ranker = make_ranker(mm, "transfer").fit(mm.frame)
    assert "geo_log2_waves" in set(ranker.pipelines[0].named_steps["features"].transformers_[0][2])


ROW_CONFIGS = [{"TG": tg, "VEC": vec, "ROWS": rows} for tg in (64, 256) for vec in (1, 4) for rows in (1, 2)]
ROW_DEVICES = (H100, "nvidia-rtx-a4000", "nvidia-a40")


def record_rmsnorm(store, make_measurement):
    for device in ROW_DEVICES:
        store.upsert_device({**get_device(device).as_row(), "device_id": device, "in_catalog": True})
    store.record([make_measurement(device_id=d, kernel="rmsnorm", dtype="float16", shape={"rows": rows, "cols": 4096},
                                   config=c, median_us=200.0 + 3 * i + rows / 64 + 11 * j + (i * j) % 5)
                  for j, d in enumerate(ROW_DEVICES) for i, c in enumerate(ROW_CONFIGS) for rows in (64, 1024, 8192)])


def test_row_kernels_declare_one_threadgroup_per_rows_rows_for_new_devices_only(store, make_measurement):
    from zmlx_pipeline.kernels.builtin.rmsnorm import ROW_TILES

    assert ROW_TILES == TileAxes(grid={"rows": ("ROWS",)}, threads=("TG",), seen=False)
    for kernel in ("rmsnorm", "add_rmsnorm", "layernorm", "softmax"):
        assert declared_tiles(kernel) == ROW_TILES
    assert declared_tiles("topk_gating") == TileAxes(grid={"tokens": ("TOKENS",)}, threads=("TG",), seen=False)
    record_rmsnorm(store, make_measurement)
    f = store_features(store)["rmsnorm"]
    assert f.geometry_declared and not f.geometry_seen
    r = next(r for r in f.frame.iter_rows(named=True) if r["device_id"] == H100
             and r["shape"] == _json({"cols": 4096, "rows": 1024}) and r["config"] == _json({"ROWS": 2, "TG": 64, "VEC": 4}))
    assert r["geo_log2_blocks"] == pytest.approx(math.log2(512))  # 1024 rows, 2 a threadgroup
    assert r["geo_log2_blocks_per_core"] == pytest.approx(math.log2(512 / 132))
    assert r["geo_log2_waves"] == pytest.approx(math.log2(4))  # 512 threadgroups on 132 SMs
    # the models of a seen device read the features without it; a new device's read it
    seen = f.for_seen_devices()
    assert seen.geometry == () and not seen.geometry_declared and seen.frame is f.frame
    assert set(f.geometry) <= set(shared_features(f).numeric)
    assert not set(f.geometry) & set(shared_features(seen).numeric)


def test_the_default_ranker_gives_the_row_geometry_to_its_new_device_part_alone(store, make_measurement):
    record_rmsnorm(store, make_measurement)
    f = store_features(store)["rmsnorm"]
    train = f.frame.filter(pl.col("device_id") != ROW_DEVICES[2])
    ranker = make_ranker(f, DEFAULT_MODEL).fit(train)

    def transfer_columns(ensemble):
        pipeline = ensemble.rankers["transfer"].pipelines[0]
        return set(pipeline.named_steps["features"].transformers_[0][2])

    (seen_ensemble,) = ranker.seen_rankers.values()
    assert not any(c.startswith("geo_") for c in transfer_columns(seen_ensemble))
    assert "geo_log2_blocks_per_core" in transfer_columns(ranker.unseen_ranker)
    # a seen device is scored exactly as by a ranker that never had the geometry
    plain = make_ranker(f.for_seen_devices(), DEFAULT_MODEL)
    plain.only = "seen"
    test = f.frame.filter(pl.col("device_id") == H100)
    np.testing.assert_array_equal(ranker.score(test), plain.fit(train).score(test))


def test_a_kernel_of_another_name_with_the_same_params_gets_no_declared_geometry(store, make_measurement):
    record_matmul(store, make_measurement, kernel="gemm_imported")
    f = store_features(store)["gemm_imported"]
    assert f.geometry == () and not f.geometry_declared
    assert named_tiles(["block_size_x", "tile_size_x", "block_size_y"], ["x", "y"]) == TileAxes(
        grid={"x": ("block_size_x", "tile_size_x"), "y": ("block_size_y",)}, threads=("block_size_x", "block_size_y"))
    assert named_tiles(["BM", "TG"], ["M"]) is None
