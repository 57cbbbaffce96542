"""Speed without changed results: worker processes (jobs), the fit cache, the vectorised inner selection,
and the held-out folds that keep the final fit's ensemble selection."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.models import estimators, evaluate as ev
from zmlx_pipeline.models.estimators import (
    CVEnsembleRanker,
    _FoldRegret,
    clear_fit_cache,
    fit_cached,
    interleave,
    interleave_ranks,
    make_pipeline,
)
from zmlx_pipeline.models.evaluate import EvaluationError, KernelPool, check_jobs, evaluate
from zmlx_pipeline.models.features import CASE, store_features
from zmlx_pipeline.models.train import train_models

DEVICES = ("nvidia-rtx-a4000", "nvidia-rtx-a6000", "nvidia-a100-pcie-40gb")


def fill(store, make_measurement, kernels=("k", "k2")) -> None:
    for device_id in DEVICES:
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
    store.record([
        make_measurement(device_id=d, kernel=kernel, dtype="float32", shape={"rows": rows, "cols": 1024},
                         config={"TG": tg, "VEC": vec},
                         median_us=(rows * (1 + i) / vec + abs(tg - 64 * rows ** 0.5) / 16 + 1) * (1 + j / 7))
        for j, kernel in enumerate(kernels) for i, d in enumerate(DEVICES) for rows in (1, 16, 256, 4096)
        for tg in (64, 128, 256, 1024) for vec in (1, 2, 4)
    ])


def _old_regret_logs(frame: pl.DataFrame, scores: np.ndarray, ks) -> float:
    """The inner selection's loss as the polars code computed it before _FoldRegret (the reference)."""
    df = frame.select(*CASE, "config_key", "median_us").with_columns(pl.Series("_s", np.asarray(scores, float)))
    df = df.sort([*CASE, "_s", "config_key"]).with_columns(pl.int_range(1, pl.len() + 1).over(CASE).alias("_r"))
    out = df.group_by(CASE).agg(
        [(pl.col("median_us").filter(pl.col("_r") <= k).min() / pl.col("median_us").min()).log().alias(f"r{k}")
         for k in ks])
    return float(out.select(pl.mean_horizontal([f"r{k}" for k in ks])).to_series().to_numpy().mean())


def test_check_jobs():
    assert check_jobs(None) >= 1 and check_jobs(3) == 3
    for bad in (0, -1, 1.5, True):
        with pytest.raises(EvaluationError, match="jobs"):
            check_jobs(bad)


def test_fold_regret_matches_the_polars_reference(store, make_measurement):
    fill(store, make_measurement, kernels=("k",))
    frame = store_features(store)["k"].frame
    rng = np.random.default_rng(0)
    regret = _FoldRegret(frame, (1, 5))
    for scores in (rng.random(frame.height), np.round(rng.random(frame.height), 1), np.zeros(frame.height)):
        assert regret.mean(scores) == pytest.approx(_old_regret_logs(frame, scores, (1, 5)), rel=1e-12, abs=1e-15)


def test_interleave_from_ranks_matches_the_polars_one(store, make_measurement):
    fill(store, make_measurement, kernels=("k",))
    frame = store_features(store)["k"].frame
    rng = np.random.default_rng(1)
    regret = _FoldRegret(frame, (1,))
    lists = [rng.random(frame.height), np.round(rng.random(frame.height), 1), np.zeros(frame.height)]
    assert np.array_equal(interleave_ranks([regret.ranks(v) for v in lists]), interleave(frame, lists))


def test_fit_cached_returns_the_same_fit_for_the_same_rows_only(store, make_measurement):
    fill(store, make_measurement, kernels=("k",))
    f = store_features(store)["k"]
    clear_fit_cache()
    X, y = f.frame.select(f.features), f.frame["log_rel"].to_numpy()
    make = lambda: make_pipeline(f, estimators._device_gbr())  # noqa: E731
    first = fit_cached(make(), X, y)
    assert fit_cached(make(), X, y) is first
    assert fit_cached(make(), X, y, np.ones(len(y))) is not first  # weights are part of the key
    other = fit_cached(make(), X, y + 1.0)
    assert other is not first
    fresh = make().fit(X, y)  # a cached fit predicts exactly as an uncached one
    assert np.array_equal(first.predict(X), fresh.predict(X))


def test_evaluate_is_the_same_in_workers_and_in_process(store, make_measurement, monkeypatch):
    fill(store, make_measurement)
    one = evaluate(store, "devices", ks=(1, 3), jobs=1)
    monkeypatch.setattr(ev, "PARALLEL_MIN_ROWS", 0)
    with KernelPool(store_features(store), jobs=2) as pool:
        assert pool.parallel
    two = evaluate(store, "devices", ks=(1, 3), jobs=2)
    assert two == one
    assert {r["method"] for r in one["results"]} >= {"ensemble", "most_common_best"}


def test_a_small_store_stays_in_process(store, make_measurement):
    fill(store, make_measurement, kernels=("k",))
    with KernelPool(store_features(store), jobs=4) as pool:
        assert not pool.parallel and pool.submit("k", lambda f: f.kernel).result() == "k"


def test_train_keeps_the_selection_in_held_out_folds_and_the_same_scores_in_workers(
        store, make_measurement, monkeypatch):
    fill(store, make_measurement)
    calls = []
    real = CVEnsembleRanker._select
    monkeypatch.setattr(CVEnsembleRanker, "_select", lambda self, *a: calls.append(a[1]) or real(self, *a))
    one = train_models(store, jobs=1)
    # the inner selection ran only in the final fits (two splits per kernel), never in a held-out fold
    assert calls == ["devices", "shapes"] * 2
    assert all(r["scores"]["prune_split"] == "shapes" and r["scores"]["prune_k"] for r in one)
    monkeypatch.setattr(ev, "PARALLEL_MIN_ROWS", 0)
    two = train_models(store, jobs=2)
    timing = ("fit_s", "train_s")
    for a, b in zip(one, two):
        assert {k: v for k, v in a["scores"].items() if k not in timing} == \
            {k: v for k, v in b["scores"].items() if k not in timing}
        assert a["data_fingerprint"] == b["data_fingerprint"]
