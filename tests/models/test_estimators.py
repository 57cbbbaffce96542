"""Rankers on a small structured store whose best config is known: they must recover it.

The fixture's times follow a formula: the best threadgroup grows with the row length (cols / 8,
clipped to 64..1024) and the best vector width is 4 on NVIDIA, 1 on AMD. A model that ranks
well recovers both on shapes and devices it never saw; a broken ranking does not.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.data.records import Measurement
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models.cv_ensemble import CVEnsembleRanker, weight_grid
from zmlx_pipeline.models.rankers.base import ModelError, Ranker
from zmlx_pipeline.models.rankers.prior import PriorRanker
from zmlx_pipeline.models.transfer import DeviceTransferRanker, spec_distances
from zmlx_pipeline.models.variants import DEFAULT_MODEL, MODEL_VARIANTS, make_ranker
from zmlx_pipeline.models.evaluate import baseline_scores, case_regrets
from zmlx_pipeline.models.features import store_features

NVIDIA = ("nvidia-rtx-a4000", "nvidia-rtx-a5000", "nvidia-rtx-a6000", "nvidia-a40")
AMD = ("amd-radeon-pro-w6800", "amd-mi210")
TGS = (32, 64, 128, 256, 512, 1024)
VECS = (1, 2, 4)
ROWS = (4, 64, 1024)
COLS = (512, 1024, 2048, 4096, 8192)


def best_tg(cols: int) -> int:
    return min(max(cols // 8, 64), 1024)


def best_vec(device_id: str) -> int:
    return 4 if device_id.startswith("nvidia") else 1


def fake_time(device_id: str, rows: int, cols: int, tg: int, vec: int) -> float:
    """Microseconds: bytes over bandwidth, times quadratic penalties (in log2) for a wrong TG or VEC."""
    spec = get_device(device_id)
    base = 2.0 + rows * cols * 4 / (spec.memory_bandwidth_gbps * 1e3)
    tg_pen = 1 + 0.15 * (math.log2(tg) - math.log2(best_tg(cols))) ** 2
    vec_pen = 1 + 0.1 * (math.log2(vec) - math.log2(best_vec(device_id))) ** 2
    return base * tg_pen * vec_pen


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    """The structured store's feature frame (built once: the default model's fits take seconds)."""
    with Store(tmp_path_factory.mktemp("structured") / "store.duckdb") as store:
        for device_id in NVIDIA + AMD:
            store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
        store.record([
            Measurement(run_id="run-1", device_id=d, kernel="k", kernel_version="sha256:0000000000000001",
                        dtype="float32", shape={"rows": r, "cols": c}, config={"TG": tg, "VEC": vec}, status="ok",
                        median_us=fake_time(d, r, c, tg, vec), p10_us=None, p90_us=None, samples=10)
            for d in NVIDIA + AMD for r in ROWS for c in COLS for tg in TGS for vec in VECS
        ])
        return store_features(store)["k"]


HELD_SHAPE = pl.col("shape_log2_cols") == 11  # cols 2048: best TG 256, measured at no training shape
HELD_DEVICE = pl.col("device_id") == "nvidia-rtx-a5000"


@pytest.fixture(scope="module")
def default_on_shapes(features):
    """The default model trained without the held-out shape."""
    return make_ranker(features, DEFAULT_MODEL).fit(features.frame.filter(~HELD_SHAPE))


@pytest.fixture(scope="module")
def default_on_devices(features):
    """The default model trained without the held-out device."""
    return make_ranker(features, DEFAULT_MODEL).fit(features.frame.filter(~HELD_DEVICE))


def regret1(test: pl.DataFrame, scores) -> float:
    """Geometric mean regret@1 over the test cases."""
    r = case_regrets(test, np.asarray(scores, dtype=float), ks=(1,))["r1"].to_numpy()
    return float(np.exp(np.log(r).mean()))


def picks(test: pl.DataFrame, scores) -> pl.DataFrame:
    """The top-scored config of every case: device, cols, TG, VEC."""
    return (test.with_columns(pl.Series("_s", np.asarray(scores, dtype=float)))
            .sort("_s").group_by("device_id", "shape_key", maintain_order=True).first()
            .select("device_id", (2 ** pl.col("shape_log2_cols")).round().cast(pl.Int64).alias("cols"),
                    pl.col("cfg_TG").cast(pl.Int64).alias("TG"), pl.col("cfg_VEC").cast(pl.Int64).alias("VEC")))


def test_prior_is_the_same_on_every_fit_when_neighbours_tie(features):
    """cols 2048 held out: its training neighbours cols 1024 and 4096 are equally near, and with one
    neighbour per case the prior must take the same one on every fit (it followed polars' group_by
    order, which changes from call to call, so the same data gave different models)."""
    train, test = features.frame.filter(~HELD_SHAPE), features.frame.filter(HELD_SHAPE)
    first = PriorRanker(features, neighbours=1).fit(train).score(test)
    for _ in range(12):
        assert np.array_equal(PriorRanker(features, neighbours=1).fit(train).score(test), first)


def test_spec_distances_are_scaled_by_the_training_devices():
    train = np.array([[1.0, 5.0], [3.0, 5.0]])
    d = spec_distances(np.array([[1.0, 9.0], [2.0, 5.0]]), train, ["a", "b"], ["a", "a"], vendor_penalty=2.0)
    # the second spec is the same on every training device: it carries no distance
    assert d[0, 0] == pytest.approx(0.0) and d[0, 1] == pytest.approx(2.0)  # 2 standard deviations apart
    assert d[1, 0] == pytest.approx(1.0 + 2.0)  # halfway, and another vendor
    assert spec_distances(train[:1], train[:1], ["a"], ["a"]).tolist() == [[0.0]]


def test_weight_grid_starts_with_equal_weights():
    grid = weight_grid(3, 0.5)
    assert grid[0] == (1 / 3, 1 / 3, 1 / 3)
    assert len(grid) == 1 + 6 and all(sum(w) == pytest.approx(1.0) for w in grid)


def test_transfer_weights_follow_the_nearest_devices(features):
    ranker = DeviceTransferRanker(features).fit(features.frame.filter(~HELD_DEVICE))
    assert ranker.device_ids == sorted(set(NVIDIA + AMD) - {"nvidia-rtx-a5000"})
    ids, w = ranker.device_weights(features.frame)
    assert np.allclose(w.sum(axis=1), 1.0)
    # a seen device follows its own model most; the unseen NVIDIA device gives AMD almost nothing
    for i, device_id in enumerate(ids):
        if device_id in ranker.device_ids:
            assert w[i].argmax() == ranker.device_ids.index(device_id)
    a5000 = w[ids.index("nvidia-rtx-a5000")]
    amd = [ranker.device_ids.index(d) for d in AMD]
    assert a5000[amd].sum() < 0.05
    with pytest.raises(ModelError, match="unknown estimator 'svm'"):
        DeviceTransferRanker(features, "svm")


@pytest.mark.parametrize("model", [DEFAULT_MODEL, "transfer"])
def test_model_recovers_the_best_config_of_a_held_out_shape(features, default_on_shapes, model):
    train, test = features.frame.filter(~HELD_SHAPE), features.frame.filter(HELD_SHAPE)
    ranker = default_on_shapes if model == DEFAULT_MODEL else make_ranker(features, model).fit(train)
    scores = ranker.score(test)
    got = picks(test, scores)
    assert got["TG"].to_list() == [256] * got.height, got
    assert got.filter(pl.col("device_id").str.starts_with("nvidia"))["VEC"].unique().to_list() == [4]
    model_regret = regret1(test, scores)
    assert model_regret < 1.01
    baselines = baseline_scores(features, train, test)
    for name in ("nearest_shape", "most_common_best"):
        assert model_regret < regret1(test, baselines[name].to_numpy()) - 0.05, name


def test_model_recovers_the_best_config_of_an_unseen_device(features, default_on_devices):
    train, test = features.frame.filter(~HELD_DEVICE), features.frame.filter(HELD_DEVICE)
    scores = default_on_devices.score(test)
    got = picks(test, scores)
    assert got["VEC"].to_list() == [4] * got.height, got  # as on the other NVIDIA devices
    assert got.filter(pl.col("TG") != pl.col("cols").map_elements(best_tg, return_dtype=pl.Int64)).height <= 1
    model_regret = regret1(test, scores)
    assert model_regret < 1.02
    assert model_regret < regret1(test, baseline_scores(features, train, test)["most_common_best"].to_numpy())


class ReversedPrior(PriorRanker):
    """A test double: the prior's ranking turned upside down (the worst config first)."""

    def score(self, test: pl.DataFrame) -> np.ndarray:
        return -super().score(test)


def test_cv_weights_drop_a_member_that_misleads(features, monkeypatch):
    monkeypatch.setitem(MODEL_VARIANTS, "reversed_prior", ReversedPrior)
    train, test = features.frame.filter(~HELD_DEVICE), features.frame.filter(HELD_DEVICE)
    ranker = CVEnsembleRanker(features, ["reversed_prior", "prior"], step=0.25).fit(train)
    # both inner cross-validations (devices left out, shapes held out) see that it misleads
    assert ranker.weights_unseen == [0.0, 1.0] and ranker.weights_seen == [0.0, 1.0]
    # (mean log regret of the chosen weights: the prior misses on new shapes, where TG moves with cols)
    assert ranker.inner_scores["devices"] < 0.01 and 0.0 < ranker.inner_scores["shapes"] < 0.1
    assert regret1(test, ranker.score(test)) < 1.01
    equal = CVEnsembleRanker(features, ["reversed_prior", "prior"])
    equal.fixed = {"weights_seen": [0.5, 0.5], "hedge_seen": False, "weights_unseen": [0.5, 0.5], "hedge_unseen": False}
    assert regret1(test, equal.fit(train).score(test)) > 1.05  # what fixed equal weights would have done
    with pytest.raises(ModelError, match="unknown ensemble member"):
        CVEnsembleRanker(features, ["prior", "nope"])


def _plain(value, where="ranker"):
    """Fail on anything a model file could not hold as data: functions, lambdas, bound methods."""
    if isinstance(value, Ranker):
        for key, item in vars(value).items():
            _plain(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _plain(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _plain(item, f"{where}.{key}")
    else:
        assert not callable(value) or hasattr(value, "get_params"), where


def test_default_model_state_is_plain_data_and_round_trips(features, default_on_devices, tmp_path):
    persist = pytest.importorskip("zmlx_pipeline.models.persist")
    test = features.frame.filter(HELD_DEVICE)
    ranker = default_on_devices
    _plain(ranker)
    persist.save_model(ranker, tmp_path / "m.zmodel")
    loaded = persist.load_model_file(tmp_path / "m.zmodel")
    assert np.allclose(loaded.score(test), ranker.score(test))
