"""SeenUnseenRanker (`split_rel`): one model for the training devices, the ensemble for new ones.

On the structured store of test_estimators.py (the best config follows a formula), checks that
rows are routed by whether their device was trained on, that a ranker fitted for one kind of row
refuses the other, that bad member lists are refused, and that the fixed selection and model
files give the same scores.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from test_estimators import HELD_DEVICE, HELD_SHAPE, features, picks, regret1  # noqa: F401 (fixture)

from zmlx_pipeline.models.cv_ensemble import CVEnsembleRanker
from zmlx_pipeline.models.rankers.base import ModelError, relative_to_case
from zmlx_pipeline.models.seen_unseen import SeenUnseenRanker
from zmlx_pipeline.models.variants import MODEL_VARIANTS, make_ranker
from zmlx_pipeline.models.evaluate import case_regrets, evaluate_kernel


@pytest.fixture()
def cheap(monkeypatch):
    """A cheap cross-validated ensemble to stand in for the default one (fits in well under a second)."""
    monkeypatch.setitem(MODEL_VARIANTS, "cheap_cv",
                        lambda f: CVEnsembleRanker(f, ["prior", "simd_aligned"], ["prior_uniform"], step=0.5,
                                                   name="cheap_cv"))
    return "cheap_cv"


def test_rows_are_routed_by_whether_their_device_was_trained_on(features, cheap):
    # train without one device and one shape: the test frame holds seen devices' rows (held-out shape)
    # and the unseen device's rows
    train = features.frame.filter(~HELD_DEVICE & ~HELD_SHAPE)
    test = features.frame.filter(HELD_DEVICE | HELD_SHAPE)
    ranker = SeenUnseenRanker(features, ["prior", "prior_uniform"], cheap).fit(train)
    got = ranker.score(test)
    seen = ~test["device_id"].eq("nvidia-rtx-a5000").to_numpy()
    assert seen.any() and (~seen).any()
    seen_rows = test.filter(pl.Series(seen))
    expected = (relative_to_case(seen_rows, make_ranker(features, "prior").fit(train).score(seen_rows))
                + relative_to_case(seen_rows, make_ranker(features, "prior_uniform").fit(train).score(seen_rows))) / 2
    assert np.allclose(got[seen], expected)
    unseen_rows = test.filter(pl.Series(~seen))
    ensemble = make_ranker(features, cheap)
    ensemble.only = "unseen"
    assert np.allclose(got[~seen], ensemble.fit(train).score(unseen_rows))
    # the seen members never see a new device: that part is the ensemble's alone (and only its
    # unseen setting was chosen)
    assert ranker.unseen_ranker.only == "unseen"


def test_only_fits_one_part_and_refuses_rows_of_the_other(features, cheap):
    train = features.frame.filter(~HELD_DEVICE)
    seen_rows, new_rows = features.frame.filter(~HELD_DEVICE), features.frame.filter(HELD_DEVICE)
    for_seen = SeenUnseenRanker(features, ["prior"], cheap)
    for_seen.only = "seen"
    for_seen.fit(train)
    assert for_seen.unseen_ranker is None and for_seen.score(seen_rows).shape == (seen_rows.height,)
    with pytest.raises(ModelError, match="training devices only"):
        for_seen.score(new_rows)
    for_new = SeenUnseenRanker(features, ["prior"], cheap)
    for_new.only = "unseen"
    for_new.fit(train)
    assert for_new.seen_rankers == {}
    with pytest.raises(ModelError, match="new devices only"):
        for_new.score(seen_rows)
    bad = SeenUnseenRanker(features, ["prior"], cheap)
    bad.only = "both"
    with pytest.raises(ModelError, match="expected seen, unseen or None"):
        bad.fit(train)


def test_bad_member_lists_are_refused(features, cheap):
    with pytest.raises(ModelError, match="at least one seen member"):
        SeenUnseenRanker(features, [], cheap)
    with pytest.raises(ModelError, match="unknown member"):
        SeenUnseenRanker(features, ["gbr_rel", "nope"], cheap)
    with pytest.raises(ModelError, match="must be a cross-validated ensemble"):
        SeenUnseenRanker(features, ["gbr_rel"], "prior")
    with pytest.raises(ModelError, match="cannot nest"):
        SeenUnseenRanker(features, ["split_rel"], cheap)
    with pytest.raises(ModelError, match="no training rows"):
        SeenUnseenRanker(features, ["prior"], cheap).fit(features.frame.head(0))


def test_fixed_selection_and_model_file_give_the_same_scores(features, cheap, tmp_path):
    persist = pytest.importorskip("zmlx_pipeline.models.persist")
    train, test = features.frame.filter(~HELD_DEVICE), features.frame
    ranker = SeenUnseenRanker(features, ["prior"], cheap).fit(train)
    selection = ranker.selection()
    # seen members without a selection of their own (prior) add nothing to it
    assert set(selection) == {"unseen", "seen"} and "weights_unseen" in selection["unseen"] and selection["seen"] == {}
    again = SeenUnseenRanker(features, ["prior"], cheap)
    again.fixed = selection
    again.fit(train)
    assert again.unseen_ranker.inner_scores == {"devices": None, "shapes": None}  # no inner CV ran
    assert np.allclose(again.score(test), ranker.score(test))
    persist.save_model(ranker, tmp_path / "m.zmodel")
    assert np.allclose(persist.load_model_file(tmp_path / "m.zmodel").score(test), ranker.score(test))


def test_split_rel_recovers_the_best_config_of_a_held_out_shape(features):
    train, test = features.frame.filter(~HELD_SHAPE), features.frame.filter(HELD_SHAPE)
    ranker = make_ranker(features, "split_rel")
    ranker.only = "seen"  # every test device is a training device: the ensemble is not needed
    scores = ranker.fit(train).score(test)
    assert ranker.unseen_ranker is None
    got = picks(test, scores)
    assert got["TG"].to_list() == [256] * got.height, got
    assert regret1(test, scores) < 1.01


def test_evaluation_folds_fit_only_the_part_they_score(features, cheap, monkeypatch):
    monkeypatch.setitem(MODEL_VARIANTS, "cheap_split",
                        lambda f: SeenUnseenRanker(f, ["prior"], cheap, name="cheap_split"))
    for split in ("shapes", "devices"):
        per_case = evaluate_kernel(features, split, ks=(1,), models=["cheap_split"], baselines=False)
        assert per_case.height == features.frame.select("device_id", "shape_key").n_unique()
        assert (per_case["r1"] >= 1.0).all()
    # a fold given a fixed selection (train's held-out folds) still fits only what it scores
    selection = SeenUnseenRanker(features, ["prior"], cheap).fit(features.frame).selection()
    per_case = evaluate_kernel(features, "shapes", ks=(1,), models=["cheap_split"], baselines=False,
                               fixed={"cheap_split": selection})
    assert per_case.height > 0
    assert case_regrets(features.frame, np.zeros(features.frame.height), ks=(1,)).height == per_case.height


def test_top_weighting_needs_the_relative_target_and_sane_parameters(features):
    from zmlx_pipeline.models.rankers.pipeline import PipelineRanker, boosting_regressor

    with pytest.raises(ModelError, match="needs target log_rel"):
        PipelineRanker(features, boosting_regressor(), target="log_time", top_weight=4.0)
    with pytest.raises(ModelError, match="top_weight must be"):
        PipelineRanker(features, boosting_regressor(), target="log_rel", top_weight=-1.0)
    with pytest.raises(ModelError, match="top_weight must be"):
        PipelineRanker(features, boosting_regressor(), target="log_rel", top_weight=1.0, top_scale=0.0)


def test_top_weighting_changes_the_fit_and_gbr_rel_stays_unweighted(features):
    train = features.frame.filter(~HELD_SHAPE)
    plain = make_ranker(features, "gbr_rel").fit(train)
    top = make_ranker(features, "gbr_rel_top").fit(train)
    assert plain.top_weight == 0.0 and top.top_weight == 4.0
    test = features.frame.filter(HELD_SHAPE)
    assert not np.allclose(plain.score(test), top.score(test))  # the weights reached the estimator
    # each case's fastest configs still come first on a held-out shape
    assert regret1(test, top.score(test)) < 1.02
