"""models/cv_ensemble.py: the inner selection's loss of a given setting, lighter members fitted only inside
its folds, and a setting of its own for the seen devices measured at few shapes."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from zmlx_pipeline.models import cv_ensemble, variants
from zmlx_pipeline.models.cv_ensemble import CVEnsembleRanker, sparse_devices, weight_grid
from zmlx_pipeline.models.features import store_features
from zmlx_pipeline.models.rankers.base import ModelError
from store_fixtures import fill

MEMBERS = ("prior", "transfer", "gbr_shared", "simd_aligned")
HEDGES = ("prior", "transfer", "prior_uniform")


@pytest.fixture
def kernel(store, make_measurement):
    fill(store, make_measurement, ("k",))
    return store_features(store)["k"]


@pytest.mark.parametrize("split", ["devices", "shapes"])
def test_candidate_loss_is_the_loss_the_selection_minimised(kernel, split):
    ranker = CVEnsembleRanker(kernel, MEMBERS, HEDGES)
    weights, hedge, loss, _ = ranker._select(kernel.frame, split)
    assert loss is not None
    assert ranker.candidate_loss(kernel.frame, split, weights, hedge) == pytest.approx(loss, abs=1e-12)
    # every other setting of the grid loses no less on the same folds (the selection took the lowest)
    others = [ranker.candidate_loss(kernel.frame, split, w, h) for w in weight_grid(len(MEMBERS), 0.25)
              for h in (False, True)]
    assert min(others) == pytest.approx(loss, abs=1e-12)
    assert max(others) > loss


def test_lighter_inner_members_are_fitted_in_their_split_only_and_never_as_the_model(kernel, monkeypatch):
    asked: list[str] = []
    real = variants.make_ranker
    monkeypatch.setattr(variants, "make_ranker", lambda f, m=variants.DEFAULT_MODEL: asked.append(m) or real(f, m))
    light = CVEnsembleRanker(kernel, MEMBERS, HEDGES,
                             inner_fits={"devices": {"gbr_shared": "gbr_shared_light", "transfer": "transfer_light"}})
    light._select(kernel.frame, "devices")
    assert set(asked) == {"prior", "transfer_light", "gbr_shared_light", "simd_aligned", "prior_uniform"}
    asked.clear()
    light._select(kernel.frame, "shapes")  # the shapes selection names no lighter members
    assert set(asked) == {"prior", "transfer", "gbr_shared", "simd_aligned", "prior_uniform"}
    asked.clear()
    light.fixed = {"weights_seen": [0.25] * 4, "hedge_seen": False, "weights_unseen": [0.25] * 4,
                   "hedge_unseen": True}
    light.fit(kernel.frame)
    assert set(asked) == {"prior", "transfer", "gbr_shared", "simd_aligned", "prior_uniform"}
    assert light.rankers["gbr_shared"].pipeline.named_steps["model"].max_iter == 200


def test_unknown_inner_members_or_splits_are_refused(kernel):
    with pytest.raises(ModelError, match="no_such"):
        CVEnsembleRanker(kernel, MEMBERS, inner_fits={"devices": {"gbr_shared": "no_such"}})
    with pytest.raises(ModelError, match="sideways"):
        CVEnsembleRanker(kernel, MEMBERS, inner_fits={"sideways": {}})


def _thinned(store, make_measurement):
    """Kernel k on three devices at six shapes, the third device kept at two of them (a sparse device)."""
    from store_fixtures import fill_moving_best

    devices = ("nvidia-rtx-a4000", "nvidia-rtx-a5000", "nvidia-a40")
    fill_moving_best(store, make_measurement, devices)
    features = store_features(store)["k"]
    frame = features.frame
    keep = (pl.col("device_id") != devices[2]) | pl.col("shape_key").is_in(sorted(frame["shape_key"].unique())[:2])
    return features, frame.filter(keep), devices


def test_sparse_devices_are_those_under_the_share_of_the_best_covered_ones_shapes(store, make_measurement):
    _, frame, devices = _thinned(store, make_measurement)
    assert sparse_devices(frame, 0.5) == [devices[2]]  # 2 shapes against 6
    assert sparse_devices(frame, 0.3) == []  # 2 is not under 0.3 * 6
    assert sparse_devices(frame.filter(pl.col("device_id") == devices[2]), 0.5) == []  # alone it is the best covered


def test_a_sparse_setting_scores_the_sparse_devices_rows_only_and_dense_devices_keep_the_ensembles(
        store, make_measurement, monkeypatch):
    features, frame, devices = _thinned(store, make_measurement)
    plain = CVEnsembleRanker(features, MEMBERS, HEDGES)
    plain.only = "seen"
    plain.fit(frame)
    sparse = CVEnsembleRanker(features, MEMBERS, HEDGES, sparse_share=0.5)
    sparse.only = "seen"
    sparse.fit(frame)
    # too few sparse inner cases (2 shapes, one dtype) to choose on: one setting for all, the plain ensemble's
    assert sparse.sparse_devices == [devices[2]] and sparse.weights_sparse is None
    assert (sparse.weights_seen, sparse.hedge_seen) == (plain.weights_seen, plain.hedge_seen)
    assert np.array_equal(sparse.score(frame), plain.score(frame))
    # with enough of them, the dense devices' setting is still the one chosen on every inner case
    monkeypatch.setattr(cv_ensemble, "GUARD_MIN_CASES", 1)
    chosen = CVEnsembleRanker(features, MEMBERS, HEDGES, sparse_share=0.5)
    chosen.only = "seen"
    chosen.fit(frame)
    assert (chosen.weights_seen, chosen.hedge_seen) == (plain.weights_seen, plain.hedge_seen)
    dense = frame["device_id"] != devices[2]
    assert np.array_equal(chosen.score(frame)[dense.to_numpy()], plain.score(frame)[dense.to_numpy()])


def test_the_sparse_devices_rows_are_ranked_by_their_own_weights(store, make_measurement):
    features, frame, devices = _thinned(store, make_measurement)
    setting = {"hedge_seen": False, "weights_unseen": [0.25] * 4, "hedge_unseen": False}

    def fitted(**fixed):
        ranker = CVEnsembleRanker(features, MEMBERS, HEDGES, sparse_share=0.5)
        ranker.fixed = {**setting, **fixed}
        return ranker.fit(frame)

    both = fitted(weights_seen=[0.0, 0.0, 1.0, 0.0], weights_sparse=[1.0, 0.0, 0.0, 0.0], hedge_sparse=False)
    assert both.selection()["weights_sparse"] == [1.0, 0.0, 0.0, 0.0]
    sparse_rows = (frame["device_id"] == devices[2]).to_numpy()
    by_prior, by_shared = fitted(weights_seen=[1.0, 0.0, 0.0, 0.0]), fitted(weights_seen=[0.0, 0.0, 1.0, 0.0])
    scores = both.score(frame)
    assert np.array_equal(scores[sparse_rows], by_prior.score(frame)[sparse_rows])
    assert np.array_equal(scores[~sparse_rows], by_shared.score(frame)[~sparse_rows])
    assert not np.array_equal(scores[sparse_rows], by_shared.score(frame)[sparse_rows])
