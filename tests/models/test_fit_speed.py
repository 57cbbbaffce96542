"""Fit speed (notes/learning.md, "Training and evaluation time"): an ensemble fits only the members its chosen settings use,
transfer's device models share one deduplication of the test rows, the fit cache shares a per-device
model between fits whose rows for that device are identical, and left-out-device folds of a kernel run
in one worker."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from zmlx_pipeline.models import evaluate as ev, pool as pool_module, transfer, variants
from zmlx_pipeline.models.cv_ensemble import CVEnsembleRanker
from zmlx_pipeline.models.rankers import base as rankers_base
from zmlx_pipeline.models.rankers.base import (
    ModelError,
    clear_fit_cache,
    distinct_rows,
    make_pipeline,
    fit_cached,
    predict_distinct,
    remembered_predictions,
    without_constant_columns,
)
from zmlx_pipeline.models.transfer import DeviceTransferRanker, transfer_features
from zmlx_pipeline.models.features import store_features
from store_fixtures import DEVICES, fill as store_fill



def fill(store, make_measurement, kernels=("k",)) -> None:
    """store_fixtures' store with one kernel."""
    store_fill(store, make_measurement, kernels)


MEMBERS = ["prior", "transfer", "gbr_shared", "simd_aligned"]
HEDGES = ["prior", "transfer", "prior_uniform"]


@pytest.fixture
def kernel(store, make_measurement):
    fill(store, make_measurement, kernels=("k",))
    return store_features(store)["k"]


def _fixed(f, train, weights_seen, hedge_seen, weights_unseen, hedge_unseen, only=None):
    ranker = CVEnsembleRanker(f, MEMBERS, HEDGES)
    ranker.fixed = {"weights_seen": weights_seen, "hedge_seen": hedge_seen,
                    "weights_unseen": weights_unseen, "hedge_unseen": hedge_unseen}
    ranker.only = only
    return ranker.fit(train)


def test_an_ensemble_fits_only_the_members_its_settings_use_and_scores_the_same(kernel, monkeypatch):
    f = kernel
    held = pl.col("device_id") == DEVICES[0]
    train, unseen = f.frame.filter(~held), f.frame.filter(held)
    fitted = []
    real = variants.make_ranker
    monkeypatch.setattr(variants, "make_ranker", lambda feats, m="ensemble": fitted.append(m) or real(feats, m))
    # gbr_shared weighs 0 in both settings and no hedge is on: it is never fitted
    lean = _fixed(f, train, [0.5, 0.5, 0.0, 0.0], False, [0.0, 0.75, 0.0, 0.25], False)
    assert sorted(lean.rankers) == ["prior", "simd_aligned", "transfer"]
    assert "gbr_shared" not in fitted and "prior_uniform" not in fitted
    # the reference: the same settings with every member and hedge fitted (as before `needed` existed)
    monkeypatch.setattr(CVEnsembleRanker, "needed", lambda self: self._names())
    full = _fixed(f, train, [0.5, 0.5, 0.0, 0.0], False, [0.0, 0.75, 0.0, 0.25], False)
    monkeypatch.undo()
    assert set(full.rankers) == set(MEMBERS) | set(HEDGES)
    for test in (train, unseen, f.frame):
        assert np.array_equal(lean.score(test), full.score(test))
    # a hedged setting needs its hedges, whatever their weights
    hedged = _fixed(f, train, [0.0, 0.0, 1.0, 0.0], True, [1.0, 0.0, 0.0, 0.0], False)
    assert hedged.needed() == ["prior", "transfer", "gbr_shared", "prior_uniform"]
    assert sorted(hedged.rankers) == ["gbr_shared", "prior", "prior_uniform", "transfer"]


def test_an_ensemble_fitted_for_one_kind_of_device_refuses_rows_whose_members_it_lacks(kernel):
    f = kernel
    held = pl.col("device_id") == DEVICES[0]
    train, unseen = f.frame.filter(~held), f.frame.filter(held)
    # `only` with `fixed` (train.py's held-out folds): just the seen setting's members
    seen_only = _fixed(f, train, [0.0, 0.0, 1.0, 0.0], False, [1.0, 0.0, 0.0, 0.0], False, only="seen")
    assert sorted(seen_only.rankers) == ["gbr_shared"]
    seen_only.score(train)
    with pytest.raises(ModelError, match="did not fit prior"):
        seen_only.score(unseen)
    unseen_only = _fixed(f, train, [0.0, 0.0, 1.0, 0.0], False, [1.0, 0.0, 0.0, 0.0], False, only="unseen")
    assert sorted(unseen_only.rankers) == ["prior"]
    unseen_only.score(unseen)
    with pytest.raises(ModelError, match="did not fit gbr_shared"):
        unseen_only.score(train)


def test_evaluate_scores_do_not_change_when_unused_members_are_left_out(kernel, monkeypatch):
    """The folds' per-case regrets with every member fitted (needed() patched to all) and without."""
    got = {}
    for lean in (True, False):
        if not lean:
            monkeypatch.setattr(CVEnsembleRanker, "needed", lambda self: self._names())
        got[lean] = pl.concat([ev.evaluate_kernel(kernel, split, ks=(1, 3), models=("ensemble",), baselines=False)
                               for split in ("shapes", "devices")])
    assert got[True].equals(got[False])


def test_distinct_rows_shared_by_several_pipelines_predict_as_each_alone(kernel):
    f = kernel
    own = transfer_features(f)
    # every device's rows repeat the config and shape columns: 3 copies of each transfer feature row
    X = pl.concat([f.frame.select(own.features)] * 200)
    unique, inverse = distinct_rows(X)
    assert inverse is not None and unique.height * 3 == f.frame.height and X.height >= 10_000
    assert unique[inverse].equals(X)
    y = f.frame["log_rel"].to_numpy()
    for i, estimator in enumerate((transfer._device_gbr(), transfer._device_gbr_light())):
        pipeline = make_pipeline(own, estimator).fit(f.frame.select(own.features), y + i)
        assert np.array_equal(predict_distinct(pipeline, X, (unique, inverse)), pipeline.predict(X))
        assert np.array_equal(predict_distinct(pipeline, X), pipeline.predict(X))
    small = f.frame.select(own.features)
    assert distinct_rows(small)[1] is None  # under 10,000 rows: predicted as they are


def _read_columns(pipeline) -> list[str]:
    return [c for _, _, cols in pipeline.steps[0][1].transformers for c in cols]


def test_a_boosting_fit_skips_columns_of_one_value_and_predicts_exactly_the_same(kernel):
    f = kernel
    X = f.frame.select(f.features)
    constant = [c for c in f.features if X[c].n_unique() == 1]
    varying = [c for c in f.features if X[c].n_unique() > 1]
    assert constant and varying  # the fixture's devices share some figures, and configs vary
    y = f.frame["log_rel"].to_numpy()
    clear_fit_cache()
    lean = fit_cached(make_pipeline(f, transfer._device_gbr()), X, y)
    full = make_pipeline(f, transfer._device_gbr()).fit(X, y)
    assert _read_columns(lean) == varying
    assert len(_read_columns(full)) == len(f.features)
    # other rows (another device's figures, unseen values) still predict alike, float for float
    other = X.with_columns(pl.col(c).shuffle(seed=3) for c in f.features)
    assert np.array_equal(lean.predict(other), full.predict(other))
    assert np.array_equal(lean.predict(X), full.predict(X))


def test_columns_are_kept_where_dropping_them_could_change_the_model(kernel):
    f = kernel
    X = f.frame.select(f.features)
    every = list(f.features)
    drawn = transfer._device_gbr().set_params(max_features=0.5)  # draws among the columns it has
    assert _read_columns(without_constant_columns(make_pipeline(f, drawn), X)) == every
    from sklearn.ensemble import RandomForestRegressor
    assert _read_columns(without_constant_columns(make_pipeline(f, RandomForestRegressor()), X)) == every
    one_row = X.head(1)  # every column constant: the pipeline stays as it was, and fits
    assert _read_columns(without_constant_columns(make_pipeline(f, transfer._device_gbr()), one_row)) == every


class _Counting:
    """A fitted pipeline that counts the rows it is asked to predict."""

    def __init__(self, pipeline) -> None:
        self.pipeline, self.rows = pipeline, 0

    def predict(self, X):
        self.rows += len(X)
        return self.pipeline.predict(X)


def test_remembered_predictions_predict_a_row_once_per_pipeline_and_score_the_same(kernel):
    f = kernel
    own = transfer_features(f)
    X = f.frame.select(own.features)
    y = f.frame["log_rel"].to_numpy()
    fitted = [make_pipeline(own, transfer._device_gbr()).fit(X, y + i) for i in range(2)]
    first, second = X.head(X.height * 2 // 3), X.tail(X.height * 2 // 3)  # a third of the rows in both
    counted = [_Counting(p) for p in fitted]
    with remembered_predictions():
        for c, p in zip(counted, fitted):
            assert np.array_equal(predict_distinct(c, first), p.predict(first))
            assert np.array_equal(predict_distinct(c, second), p.predict(second))  # bit for bit
            assert np.array_equal(predict_distinct(c, X), p.predict(X))
            # the second call predicted only the rows the first had not, the third none at all
            seen = set(first.rows())
            assert c.rows == first.height + sum(row not in seen for row in second.rows()) < first.height + second.height
    # outside the block nothing is remembered: every row is predicted again
    plain = _Counting(fitted[0])
    predict_distinct(plain, first)
    predict_distinct(plain, first)
    assert plain.rows == 2 * first.height


def test_remembered_predictions_never_read_back_a_row_whose_second_hash_differs(kernel, monkeypatch):
    f = kernel
    own = transfer_features(f)
    X = f.frame.select(own.features).unique(maintain_order=True)
    pipeline = make_pipeline(own, transfer._device_gbr()).fit(X, np.arange(X.height, dtype=float))
    a, b = X.head(5), X.slice(5, 5)
    same_first = np.arange(5, dtype=np.uint64)
    hashes = {id(a): (same_first, same_first), id(b): (same_first, same_first + np.uint64(100))}
    monkeypatch.setattr(rankers_base, "_row_hashes", lambda frame: hashes[id(frame)])
    counted = _Counting(pipeline)
    with remembered_predictions():
        predict_distinct(counted, a)
        got = predict_distinct(counted, b)  # first hashes collide with a's rows, second hashes do not
    assert counted.rows == 10
    assert np.array_equal(got, pipeline.predict(b))


def test_transfer_shares_a_device_model_between_fits_with_identical_rows_for_it(kernel):
    f = kernel
    clear_fit_cache()
    everything = DeviceTransferRanker(f).fit(f.frame)
    without_last = DeviceTransferRanker(f).fit(f.frame.filter(pl.col("device_id") != DEVICES[-1]))
    shared = {d: p for d, p in zip(everything.device_ids, everything.pipelines)}
    for d, p in zip(without_last.device_ids, without_last.pipelines):
        assert p is shared[d]  # the same fitted object: that device's rows did not change
    # one shape fewer changes every device's rows: every model is fitted anew
    one_shape_less = f.frame.filter(pl.col("shape_key") != f.frame["shape_key"].min())
    other = DeviceTransferRanker(f).fit(one_shape_less)
    assert all(p is not shared[d] for d, p in zip(other.device_ids, other.pipelines))


def test_left_out_device_folds_of_a_kernel_run_together_in_one_worker_with_the_same_results(
        store, make_measurement, monkeypatch):
    kernels = ("k", "k2", "k3", "k4")
    fill(store, make_measurement, kernels=kernels)
    one = ev.evaluate(store, "devices", ks=(1, 3), jobs=1)
    monkeypatch.setattr(pool_module, "PARALLEL_MIN_ROWS", 0)
    submitted = []
    real = ev.submit_kernel
    monkeypatch.setattr(ev, "submit_kernel", lambda *a, **kw: submitted.append(kw.get("together")) or real(*a, **kw))
    tasks = []
    real_submit = ev.KernelPool.submit
    monkeypatch.setattr(ev.KernelPool, "submit", lambda self, k, fn, *a: tasks.append((k, fn.__name__))
                        or real_submit(self, k, fn, *a))
    two = ev.evaluate(store, "devices", ks=(1, 3), jobs=2)
    assert two == one
    assert submitted == [True] * 4  # 4 kernels >= 2 per worker: each kernel's folds are one task
    assert sorted(tasks) == [(k, "_score_folds") for k in kernels]
    tasks.clear()
    features = store_features(store)
    with ev.KernelPool(features, jobs=2) as pool:  # one future per fold unless asked
        alone = ev.submit_kernel(features["k"], "devices", ks=(1, 3), pool=pool)
        together = ev.submit_kernel(features["k"], "devices", ks=(1, 3), pool=pool, together=True)
        assert len(alone) == len(DEVICES) and len(together) == 1
        assert ev.gather_folds(alone, (1, 3)).equals(ev.gather_folds(together, (1, 3)))
