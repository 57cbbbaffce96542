"""Feature frames from the store: device specs, problem dims, config params and ratios, per kernel."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.data.importers import import_files
from zmlx_pipeline.models.rankers.pipeline import shared_features
from zmlx_pipeline.models.transfer import transfer_features
from zmlx_pipeline.models.features import (
    FeatureError,
    device_distances,
    devices_frame,
    measurements_frame,
    store_features,
)

M3, A100 = "apple-m3-max-40c", "nvidia-a100-pcie-40gb"


def add_devices(store, *ids: str) -> None:
    for device_id in ids:
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})


def fill_rmsnorm(store, make_measurement, devices=(M3, A100), version="sha256:0000000000000001") -> None:
    """Our kind of kernel: TG/VEC/ROWS configs over rows x cols shapes, two dtypes."""
    add_devices(store, *devices)
    store.record([
        make_measurement(device_id=d, kernel="rmsnorm", kernel_version=version, dtype=dtype,
                         shape={"rows": rows, "cols": 4096}, config={"TG": tg, "VEC": vec, "ROWS": 1},
                         median_us=float(tg) / vec + rows + (i + 1), extra={"bytes_moved": rows * 4096 * 4})
        for i, d in enumerate(devices) for dtype in ("float16", "float32") for rows in (1, 64)
        for tg in (64, 256, 1024) for vec in (1, 4)
    ])


def test_our_kernel_features(store, make_measurement):
    fill_rmsnorm(store, make_measurement)
    store.record([make_measurement(device_id=M3, kernel="rmsnorm", status="launch_error",
                                   shape={"rows": 1, "cols": 4096}, config={"TG": 2048, "VEC": 1, "ROWS": 1})])
    f = store_features(store)["rmsnorm"]
    df = f.frame
    assert df.height == 2 * 2 * 2 * 3 * 2  # ok rows only
    assert f.params == ("ROWS", "TG", "VEC") and f.shape_dims == ("cols", "rows")
    assert f.threadgroup_param == "TG" and f.thread_params == ("TG",)
    for col in ("dev_log2_gpu_cores", "dev_log2_memory_bandwidth_gbps", "shape_log2_rows", "shape_log2_bytes",
                "cfg_TG", "cfg_log2_TG", "cfg_log2_VEC", "ratio_TG_rows", "ratio_threads_rows",
                "cfg_log2_threads_per_default", "dtype_bytes"):
        assert col in f.numeric, col
    assert "ratio_TG_cols" not in f.numeric  # cols never varies: a ratio to it adds nothing
    assert "cfg_log2_ROWS" not in f.numeric  # one value only
    assert set(f.categorical) == {"dev_vendor", "dev_backend"}
    row = df.filter((pl.col("device_id") == A100) & (pl.col("cfg_TG") == 256) & (pl.col("cfg_VEC") == 4)
                    & (pl.col("shape_log2_rows") == 6) & (pl.col("dtype") == "float16")).row(0, named=True)
    spec = get_device(A100)
    assert row["dev_log2_gpu_cores"] == pytest.approx(math.log2(spec.gpu_cores))
    assert row["ratio_TG_rows"] == pytest.approx(math.log2(256) - 6)
    assert row["cfg_log2_threads_per_default"] == pytest.approx(math.log2(256 / spec.default_threadgroup))
    assert row["shape_log2_bytes"] == pytest.approx(math.log2(64 * 4096 * 4))
    assert row["dtype_bytes"] == 2 and row["dev_vendor"] == "nvidia"
    assert row["log_time"] == pytest.approx(math.log(256 / 4 + 64 + 2))
    # log_rel is relative to the fastest config of each (device, kernel, dtype, shape) case
    assert df.group_by("device_id", "dtype", "shape_key").agg(pl.col("log_rel").min())["log_rel"].to_list() \
        == [0.0] * 8


def test_imported_kernel_features_use_its_own_parameter_names(store, tmp_path):
    cache = {f"{bx},{ty}": {"block_size_x": bx, "block_size_y": 4, "tile_size_y": ty, "use_shmem": ty % 2,
                            "time": bx / 100 + ty, "times": [bx / 100 + ty] * 3}
             for bx in (16, 32, 64) for ty in (1, 2)}
    path = tmp_path / "conv" / "A100.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"device_name": "NVIDIA A100-PCIE-40GB", "kernel_name": "conv",
                                "problem_size": [4096, 2048], "cache": cache,
                                "tune_params_keys": ["block_size_x", "block_size_y", "tile_size_y", "use_shmem"]}))
    import_files(store, [path])
    f = store_features(store)["conv"]
    assert f.params == ("block_size_x", "block_size_y", "tile_size_y", "use_shmem")
    assert f.thread_params == ("block_size_x", "block_size_y") and f.threadgroup_param is None
    assert {"cfg_log2_block_size_x", "cfg_log2_tile_size_y", "cfg_use_shmem", "cfg_log2_threads",
            "shape_log2_x", "shape_log2_y"} <= set(f.numeric)
    assert "cfg_log2_use_shmem" not in f.numeric  # 0 is a value: no log2
    row = f.frame.filter((pl.col("cfg_block_size_x") == 32) & (pl.col("cfg_tile_size_y") == 2)).row(0, named=True)
    assert row["cfg_log2_threads"] == pytest.approx(math.log2(32 * 4))
    assert row["shape_log2_x"] == 12 and row["shape_log2_y"] == 11


def test_only_the_newest_kernel_version_is_used(store, make_measurement):
    fill_rmsnorm(store, make_measurement, devices=(M3,), version="sha256:old")
    fill_rmsnorm(store, make_measurement, devices=(M3,), version="sha256:new")
    f = store_features(store, kernels="rmsnorm")["rmsnorm"]
    assert f.kernel_version == "sha256:new" and set(f.frame["kernel_version"]) == {"sha256:new"}


def test_the_registered_kernels_own_version_wins_over_a_later_one(store, make_measurement):
    """A shard that claims a later version of a built-in kernel than its source cannot displace the
    timings of the code that runs; without the registered version the newest one is used as before."""
    from zmlx_pipeline.kernels.registry import get_kernel

    own = get_kernel("rmsnorm").version
    fill_rmsnorm(store, make_measurement, devices=(M3,), version=own)
    fill_rmsnorm(store, make_measurement, devices=(M3,), version="sha256:fabricated")
    assert store_features(store, kernels="rmsnorm")["rmsnorm"].kernel_version == own


def test_errors_and_frames(store, make_measurement):
    fill_rmsnorm(store, make_measurement, devices=(M3,))
    with pytest.raises(FeatureError, match="no ok measurements of kernel\\(s\\) nope"):
        store_features(store, kernels=["nope"])
    store.record([make_measurement(device_id="unknown-gpu", kernel="k2", config={"TG": 64})])
    with pytest.raises(FeatureError, match="unknown-gpu have no row in the devices table"):
        store_features(store, kernels="k2")
    assert measurements_frame(store).height == 24 + 1
    assert devices_frame(store)["device_id"].to_list() == [M3]


def test_device_distance_is_normalised_and_symmetric(store):
    add_devices(store, M3, A100, "nvidia-rtx-a4000", "nvidia-rtx-a6000")
    ids, dist = device_distances(devices_frame(store))
    assert ids == sorted(ids) and dist.shape == (4, 4)
    assert (dist == dist.T).all() and (dist.diagonal() == 0).all()
    a4000, a6000 = ids.index("nvidia-rtx-a4000"), ids.index("nvidia-rtx-a6000")
    assert dist[a4000, a6000] < dist[a4000, ids.index(M3)]
    _, with_vendor = device_distances(devices_frame(store), vendor_penalty=2.0)
    assert with_vendor[a4000, ids.index(M3)] == pytest.approx(dist[a4000, ids.index(M3)] + 2.0)


def test_rows_versus_row_length(store, make_measurement):
    add_devices(store, M3)
    store.record([make_measurement(device_id=M3, kernel="softmax", shape={"rows": r, "cols": c},
                                   config={"TG": tg}, median_us=float(r * c) / tg)
                  for r in (8, 512) for c in (1024, 4096) for tg in (128, 512)])
    f = store_features(store)["softmax"]
    assert {"shape_ratio_cols_rows", "ratio_TG_cols", "ratio_TG_rows"} <= set(f.numeric)
    row = f.frame.filter((pl.col("shape_log2_rows") == 3) & (pl.col("shape_log2_cols") == 12)).row(0, named=True)
    assert row["shape_ratio_cols_rows"] == pytest.approx(12 - 3)
    # softmax declares features of CACHE and ROWS; data of a space without them gets none
    assert not [c for c in f.frame.columns if c.startswith("cfg_x_")]


def test_declared_features_say_how_much_of_a_row_is_cached(store, make_measurement):
    add_devices(store, M3)
    configs = [{"TG": 512, "VEC": 4, "ROWS": 1, "CACHE": c} for c in (0, 1, 2)] + [
        {"TG": 1024, "VEC": 8, "ROWS": 2, "CACHE": 2}]
    store.record([make_measurement(device_id=M3, kernel="softmax", shape={"rows": 64, "cols": cols},
                                   config=config, median_us=10.0 + i)
                  for cols in (4096, 32768) for i, config in enumerate(configs)])
    f = store_features(store)["softmax"]
    assert {"cfg_x_reg_floats", "cfg_x_row_cached"} <= set(f.numeric)
    # the shared models (config, shape and ratio columns) read them too
    assert {"cfg_x_reg_floats", "cfg_x_row_cached"} <= set(shared_features(f).numeric)
    got = {(2 ** round(r["shape_log2_cols"]), json.loads(r["config"])["CACHE"],
            json.loads(r["config"])["TG"]): (r["cfg_x_reg_floats"], r["cfg_x_row_cached"])
           for r in f.frame.iter_rows(named=True)}
    # F = CACHE * min(16384 / TG, 32) floats a thread; TG / ROWS threads a row
    assert got[(4096, 0, 512)] == (0.0, 0.0)
    assert got[(4096, 1, 512)] == (32.0, 1.0)  # 512 x 32 covers 4096
    assert got[(32768, 1, 512)] == (32.0, 0.5)
    assert got[(32768, 2, 512)] == (64.0, 1.0)
    assert got[(32768, 2, 1024)] == (32.0, pytest.approx(512 * 32 / 32768))
    # read by the per-device models too (Feature.per_device is True for a plain expression)
    assert {"cfg_x_reg_floats", "cfg_x_row_cached"} <= set(transfer_features(f).numeric)


def test_a_feature_kept_out_of_per_device_models(store, make_measurement):
    add_devices(store, M3)
    store.record([make_measurement(device_id=M3, kernel="layernorm", shape={"rows": 64, "cols": cols},
                                   config={"TG": tg, "VEC": 4, "ROWS": rows}, median_us=5.0 + tg / 64)
                  for cols in (768, 4096) for tg in (128, 256) for rows in (1, 2)
                  if (tg // rows) * 4 <= cols])  # legal configs only: the store's reads refuse others
    f = store_features(store)["layernorm"]
    assert "cfg_xs_trips" in f.numeric and "cfg_xs_trips" in shared_features(f).numeric
    assert "cfg_xs_trips" not in transfer_features(f).numeric
    row = f.frame.filter((pl.col("shape_log2_cols") > 9.5) & (pl.col("shape_log2_cols") < 9.6)
                         & (pl.col("cfg_TG") == 256) & (pl.col("cfg_ROWS") == 2)).row(0, named=True)
    assert row["cfg_xs_trips"] == pytest.approx(768 / (128 * 4))  # 1.5: a partial last iteration


def test_apple_gpu_generation_is_a_feature_only_where_an_apple_chip_is(store, make_measurement):
    fill_rmsnorm(store, make_measurement, devices=(M3, A100, "apple-m1-max-32c"))
    f = store_features(store)["rmsnorm"]
    assert "dev_gpu_generation" in f.numeric and "dev_gpu_generation" in f.device_features
    by_device = dict(f.frame.group_by("device_id").agg(pl.col("dev_gpu_generation").unique()).iter_rows())
    assert by_device == {M3: [15.0], "apple-m1-max-32c": [13.0], A100: [0.0]}


def test_features_of_other_devices_are_unchanged_by_the_generation(store, make_measurement):
    fill_rmsnorm(store, make_measurement, devices=(A100, "nvidia-h100-sxm"))
    f = store_features(store)["rmsnorm"]
    assert "dev_gpu_generation" not in f.frame.columns and not any("generation" in c for c in f.features)


def test_a_list_or_object_parameter_of_an_imported_kernel_is_one_category(store, make_measurement):
    """Kernel Tuner lets a parameter hold a list or an object (its own test caches do): the frame reads each value as
    its canonical JSON text, a category, where polars would fail to cast the nested column."""
    add_devices(store, A100)
    store.record([make_measurement(device_id=A100, kernel="lk", shape={"x": 4096},
                                   config={"bs": bs, "lst": lst}, median_us=1.0 + bs / 64 + len(lst))
                  for bs in (32, 64) for lst in ([1, 2], [3])]
                 + [make_measurement(device_id=A100, kernel="ok", shape={"x": 4096}, config={"bs": 32, "o": {"a": 1}},
                                     median_us=2.0)])
    f = store_features(store)["lk"]
    assert sorted(set(f.frame["cfg_lst"].to_list())) == ["[1, 2]", "[3]"] and "cfg_lst" in f.categorical
    assert store_features(store)["ok"].frame["cfg_o"].to_list() == ['{"a": 1}']


def test_publish_refuses_a_kernel_whose_configs_hold_a_list_before_any_work(store, make_measurement):
    from types import SimpleNamespace

    from zmlx_pipeline.publish.build import _check_scalar_configs
    from zmlx_pipeline.publish.writer import PublishError

    add_devices(store, A100)
    store.record([make_measurement(device_id=A100, kernel="lk", shape={"x": 4096}, config={"bs": 32, "lst": [1, 2]},
                                   median_us=2.0)])
    models = SimpleNamespace(kernels={"lk": SimpleNamespace(features=store_features(store)["lk"])})
    with pytest.raises(PublishError, match="kernel 'lk': its parameter 'lst' holds \\[1, 2\\], a list or object"):
        _check_scalar_configs(models)
