"""models/cv_ensemble.py: the inner selection's loss of a given setting, and lighter members fitted only inside
its folds."""

from __future__ import annotations

import pytest

from zmlx_pipeline.models import variants
from zmlx_pipeline.models.cv_ensemble import CVEnsembleRanker, weight_grid
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
