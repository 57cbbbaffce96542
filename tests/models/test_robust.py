"""models/robust.py: for a new device the ensemble's transfer and the ranking objective, one design leading as
nested leave-one-training-device-out says, or fixed a priori (the rank average, the top k hedged with the
fleet-wide winner) when the training devices hold too few cases to choose."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.models import cv_ensemble, variants
from zmlx_pipeline.models.rankers.base import ModelError
from zmlx_pipeline.models.rankers.prior import PriorRanker
from zmlx_pipeline.models.variants import MODEL_VARIANTS, make_ranker
from zmlx_pipeline.models.evaluate import case_regrets, evaluate_kernel
from zmlx_pipeline.models.features import store_features
from zmlx_pipeline.models.persist import load_model_file, save_model
from zmlx_pipeline.models.robust import TransferRankRanker, blend_ranks, unanimous_winners

DEVICES = ("nvidia-rtx-a4000", "nvidia-rtx-a5000", "nvidia-rtx-a6000", "nvidia-a40", "nvidia-a100-pcie-40gb")
# every device ranks the configs alike: threadgroup 24 first, 32 last
PENALTY = {24: 1.0, 32: 1.3, 64: 1.25, 128: 1.4, 256: 1.6}


class ReversedPrior(PriorRanker):
    """A test double for the shared ranking model: the prior's ranking upside down (the worst config first)."""

    def score(self, test: pl.DataFrame) -> np.ndarray:
        return -super().score(test)


def _fill(store, make_measurement, shapes):
    for device_id in DEVICES:
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
    store.record([
        make_measurement(device_id=d, kernel="k", dtype="float32", shape={"rows": rows, "cols": 1024},
                         config={"TG": tg}, median_us=(5.0 + rows / (i + 1)) * pen)
        for i, d in enumerate(DEVICES) for rows in shapes for tg, pen in PENALTY.items()])
    return store_features(store)["k"]


@pytest.fixture
def many_shapes(store, make_measurement):
    """5 devices x 8 shapes: leaving a training device out gives 4 inner folds of 8 cases (32: enough to choose)."""
    return _fill(store, make_measurement, shapes=(1, 2, 4, 8, 16, 32, 64, 128))


@pytest.fixture
def one_shape(store, make_measurement):
    """5 devices x 1 shape, as a public Kernel Tuner file: 4 inner cases, far too few to choose by."""
    return _fill(store, make_measurement, shapes=(64,))


@pytest.fixture
def misleading_rank(monkeypatch):
    """The shared ranking model replaced by one that always puts the slowest config first."""
    monkeypatch.setitem(MODEL_VARIANTS, "gbr_shared_top", ReversedPrior)


def _unseen(f, variant: str, device: str) -> tuple[TransferRankRanker, pl.DataFrame]:
    train, test = f.frame.filter(pl.col("device_id") != device), f.frame.filter(pl.col("device_id") == device)
    ranker = make_ranker(f, variant)
    ranker.only = "unseen"
    return ranker.fit(train), test


def test_blend_is_the_rank_sum_and_a_first_place_breaks_its_ties():
    a = np.array([1.0, 3.0, 2.0, 4.0])
    b = np.array([4.0, 2.0, 3.0, 1.0])
    order = np.argsort(blend_ranks(a, b), kind="stable")
    # every sum is 5: the two configs one design puts first come before the two both put in the middle
    assert set(order[:2]) == {0, 3} and set(order[2:]) == {1, 2}
    assert np.argsort(blend_ranks(np.array([1.0, 2.0, 3.0]), np.array([2.0, 1.0, 3.0])))[-1] == 2


def test_with_enough_inner_cases_the_design_the_training_devices_favour_leads(many_shapes, misleading_rank):
    ranker, test = _unseen(many_shapes, "unseen_hedged", DEVICES[0])
    policy = ranker.policy_unseen
    assert policy["evidence"] == "chosen" and policy["inner"]["cases"] >= cv_ensemble.GUARD_MIN_CASES
    loss = {d: policy["inner"][f"design[{d}]"] for d in ("blend", "rank", "ensemble")}
    assert loss["rank"] > max(loss["blend"], loss["ensemble"])
    # the lowest nested inner loss leads; the a priori blend wins a tie
    assert policy["design"] == ("blend" if loss["blend"] <= loss["ensemble"] else "ensemble")
    assert case_regrets(test, ranker.score(test), ks=(1,))["r1"].to_list() == [1.0] * 8


def test_with_too_few_inner_cases_the_fixed_blend_leads_and_the_fleet_winner_hedges(one_shape, misleading_rank):
    ranker, test = _unseen(one_shape, "unseen_hedged", DEVICES[1])
    policy = ranker.policy_unseen
    # the inner folds would prefer the ensemble, but 4 cases decide nothing: the a priori design stays
    assert policy["inner"]["design[ensemble]"] < policy["inner"]["design[rank]"]
    assert policy["evidence"] == "thin" and policy["design"] == "blend" and policy["mode"] == "model"
    assert policy["hedges"] == ["most_common_best"]
    got = case_regrets(test, ranker.score(test), ks=(1, 2))
    assert got["r2"].to_list() == [1.0]  # the config best on every training device is in its top 2


def test_the_hedges_never_move_the_first_pick(one_shape, misleading_rank):
    ranker, test = _unseen(one_shape, "unseen_blend", DEVICES[1])  # its hedges chosen by the inner folds
    assert ranker.policy_unseen["design"] == "blend" and ranker.policy_unseen["evidence"] == "chosen"
    hedged, _ = _unseen(one_shape, "unseen_hedged", DEVICES[1])
    blend_r1 = case_regrets(test, ranker.score(test), ks=(1,))["r1"][0]
    hedged_r1 = case_regrets(test, hedged.score(test), ks=(1,))["r1"][0]
    assert blend_r1 == hedged_r1  # hedging never moves the first pick


def test_select_picks_per_kernel_between_rank_and_ensemble(many_shapes, misleading_rank):
    ranker, _ = _unseen(many_shapes, "unseen_select", DEVICES[2])
    assert ranker.policy_unseen["design"] == "ensemble"
    assert ranker.needed() and "gbr_shared_top" not in ranker.needed()  # the rank model is not fitted for nothing
    assert set(k for k in ranker.policy_unseen["inner"] if k.startswith("design[")) == {"design[rank]", "design[ensemble]"}


def test_nested_selection_never_sees_the_left_out_device(many_shapes, monkeypatch):
    """Spy on every inner split while the devices split scores each left-out device with the default."""
    seen: list[tuple[set, set]] = []
    inner = TransferRankRanker._inner_folds

    def spy(self, train, split):
        out = inner(self, train, split)
        seen.append((set(train["device_id"].unique()), {d for a, b in out for d in (*a["device_id"], *b["device_id"])}))
        return out

    monkeypatch.setattr(TransferRankRanker, "_inner_folds", spy)
    per_case = evaluate_kernel(many_shapes, "devices", ks=(1,), models=("robust",), baselines=False)
    assert per_case["device_id"].n_unique() == len(DEVICES)
    assert len(seen) == len(DEVICES)
    for outer_train, inner_devices in seen:
        missing = set(DEVICES) - outer_train
        assert len(missing) == 1 and inner_devices <= outer_train and not (inner_devices & missing)


def test_held_out_shapes_are_the_ensembles_own(many_shapes):
    """On a device seen in training every robust variant is the ensemble's seen setting: identical regrets."""
    got = evaluate_kernel(many_shapes, "shapes", ks=(1, 3), models=("ensemble", "robust", "robust_blend"),
                          baselines=False)
    by = {m: got.filter(pl.col("method") == m).sort(["device_id", "shape_key", "dtype"]) for m in
          ("ensemble", "robust", "robust_blend")}
    for m in ("robust", "robust_blend"):
        assert by[m]["r1"].to_list() == by["ensemble"]["r1"].to_list()
        assert by[m]["r3"].to_list() == by["ensemble"]["r3"].to_list()


def test_the_default_round_trips_through_a_model_file(many_shapes, tmp_path):
    train = many_shapes.frame.filter(pl.col("device_id") != DEVICES[3])
    test = many_shapes.frame.filter(pl.col("device_id") == DEVICES[3])
    ranker = make_ranker(many_shapes, variants.DEFAULT_MODEL).fit(train)
    assert ranker.unseen_ranker.unanimous and ranker.unseen_ranker.thin_hedges == ("most_common_best",)
    path = tmp_path / "m.zip"
    save_model(ranker, path)
    loaded = load_model_file(path)
    np.testing.assert_array_equal(loaded.score(test), ranker.score(test))
    assert loaded.selection() == ranker.selection()


def test_bad_designs_are_refused(one_shape):
    with pytest.raises(ModelError, match="unknown design"):
        TransferRankRanker(one_shape, ("blend", "average"))
    with pytest.raises(ModelError, match="default design"):
        TransferRankRanker(one_shape, ("rank",), default="blend")
    with pytest.raises(ModelError, match="unknown baseline"):
        TransferRankRanker(one_shape, thin_hedges=("no_such",))


def test_where_the_training_devices_agree_their_winner_leads_only_on_thin_evidence(one_shape, many_shapes,
                                                                                   misleading_rank):
    """Every training device measured TG 24 fastest: with 4 inner cases that config goes first even though the
    (misleading) model would not put it there; with 32 inner cases the chosen design leads unchanged."""
    thin, test = _unseen(one_shape, "unseen_unanimous", DEVICES[2])
    assert thin.policy_unseen["evidence"] == "thin"
    assert thin.winners["config_key"].to_list() == test.filter(pl.col("cfg_TG") == 24)["config_key"].unique().to_list()
    assert case_regrets(test, thin.score(test), ks=(1,))["r1"].to_list() == [1.0]
    hedged, _ = _unseen(one_shape, "unseen_hedged", DEVICES[2])
    assert case_regrets(test, hedged.score(test), ks=(1,))["r1"][0] > 1.0  # the same ranker without the rule

    ample, test = _unseen(many_shapes, "unseen_unanimous", DEVICES[2])
    plain, _ = _unseen(many_shapes, "unseen_hedged", DEVICES[2])
    assert ample.policy_unseen["evidence"] == "chosen"
    np.testing.assert_array_equal(ample.score(test), plain.score(test))


def test_from_one_training_device_its_fastest_leads_and_the_top_k_is_hedged_as_on_thin_evidence(
        many_shapes, misleading_rank):
    """One measured device (a single Kernel Tuner file): no inner fold, no evidence at all. For a new device its
    measured fastest leads every case it measured, however the models rank (the shared one is made to put the
    slowest first here), and the config it measured fastest most often is among the top 2 of a shape it did not."""
    frame = many_shapes.frame.filter(pl.col("device_id").is_in(DEVICES[:2]))
    train = frame.filter((pl.col("device_id") == DEVICES[0]) & (pl.col("shape_key") != frame["shape_key"][0]))
    test = frame.filter(pl.col("device_id") == DEVICES[1])
    ranker = make_ranker(many_shapes, "unseen_unanimous")
    ranker.only = "unseen"
    ranker.fit(train)
    assert ranker.policy_unseen == {"mode": "model", "baseline": None, "hedges": ["most_common_best"],
                                    "design": "blend", "evidence": "thin", "inner": {"cases": 0}}
    regrets = case_regrets(test, ranker.score(test), ks=(1, 2))
    measured = regrets["shape_key"].is_in(train["shape_key"].unique().to_list())
    assert regrets.filter(measured)["r1"].to_list() == [1.0] * 7  # TG 24, fastest on every device
    assert regrets.filter(~measured)["r2"].to_list() == [1.0]  # the fleet-wide winner, hedged in at rank 2
    hedged = make_ranker(many_shapes, "unseen_hedged")
    hedged.only = "unseen"
    assert (case_regrets(test, hedged.fit(train).score(test), ks=(1,))["r1"] > 1.0).all()  # without the rule


def test_devices_that_disagree_have_no_winner(one_shape):
    frame = one_shape.frame
    flipped = frame.with_columns(  # one device now finds TG 32 fastest
        pl.when((pl.col("device_id") == DEVICES[0]) & (pl.col("cfg_TG") == 32)).then(0.1)
        .otherwise(pl.col("median_us")).alias("median_us"))
    assert unanimous_winners(flipped).is_empty()
    # one device alone: its own fastest per case (no model fitted on its rows can tell another device from it)
    alone = frame.filter(pl.col("device_id") == DEVICES[0])
    fastest = alone.sort("median_us").group_by(["dtype", "shape_key"]).agg(pl.col("config_key").first())
    assert unanimous_winners(alone).rows() == fastest.select("dtype", "shape_key", "config_key").sort(
        ["dtype", "shape_key"]).rows()
    assert not unanimous_winners(flipped.filter(pl.col("device_id") == DEVICES[0])).is_empty()
    assert unanimous_winners(frame).height == 1


def test_the_fast_default_fits_lighter_members_inside_its_new_device_selection_only(many_shapes, monkeypatch):
    """`robust_fast`: inside the inner leave-one-device-out folds the boosting members are fitted as
    INNER_FITS["quarter"] names them; its own members, every fit of its seen setting's inner folds, and every
    inner fit of the default `robust`, are the full variants."""
    asked: list[str] = []
    real = variants.make_ranker
    monkeypatch.setattr(variants, "make_ranker", lambda f, m=variants.DEFAULT_MODEL: asked.append(m) or real(f, m))
    light = variants.INNER_FITS["quarter"]
    full = {"gbr_shared_top", "transfer", "gbr_shared"}
    train = many_shapes.frame.filter(pl.col("device_id") != DEVICES[0])
    make_ranker(many_shapes, "unseen_unanimous_fast")._select(train, "devices")
    assert set(light.values()) <= set(asked) and not set(asked) & full
    asked.clear()
    make_ranker(many_shapes, "unseen_unanimous")._select(train, "devices")
    assert full <= set(asked) and not set(asked) & set(light.values())
    fast = make_ranker(many_shapes, "robust_fast").fit(train)
    names = {r.name for part in (fast.unseen_ranker, *fast.seen_rankers.values()) for r in part.rankers.values()}
    assert names and not names & set(light.values())
    test = many_shapes.frame.filter(pl.col("device_id") == DEVICES[0])
    assert case_regrets(test, fast.score(test), ks=(1,))["r1"].to_list() == [1.0] * 8


def test_on_thin_evidence_the_settled_selection_chooses_nothing_and_fits_nothing(one_shape, monkeypatch):
    """`unseen_settled` with 4 inner cases: equal weights, no hedging of the ensemble's own, the a priori policy, and
    not one inner fit; `unseen_unanimous` on the same rows fits members in its inner folds and chooses its weights."""
    asked: list[str] = []
    real = variants.make_ranker
    monkeypatch.setattr(variants, "make_ranker", lambda f, m=variants.DEFAULT_MODEL: asked.append(m) or real(f, m))
    train = one_shape.frame.filter(pl.col("device_id") != DEVICES[0])
    settled = make_ranker(one_shape, "unseen_settled")
    assert settled.new_device_cases(train) == (4, 4)
    weights, hedge, loss, policy = settled._select(train, "devices")
    assert asked == [] and loss is None and hedge is False
    assert weights == [0.25] * 4
    assert policy == {"mode": "model", "baseline": None, "hedges": ["most_common_best"], "design": "blend",
                      "evidence": "thin", "inner": {"cases": 4}}
    make_ranker(one_shape, "unseen_unanimous")._select(train, "devices")
    assert {"transfer", "gbr_shared", "gbr_shared_top"} <= set(asked)


def test_the_settled_ranker_still_puts_the_fleets_winner_first_on_thin_evidence(one_shape, misleading_rank):
    thin, test = _unseen(one_shape, "unseen_settled", DEVICES[2])
    assert thin.weights_unseen == [0.25] * 4 and thin.policy_unseen["evidence"] == "thin"
    assert case_regrets(test, thin.score(test), ks=(1,))["r1"].to_list() == [1.0]


def test_with_enough_inner_cases_the_settled_ranker_is_the_default_one(many_shapes):
    """32 inner cases: the settled selection is the one `unseen_unanimous` makes, and the scores are the same."""
    settled, test = _unseen(many_shapes, "unseen_settled", DEVICES[1])
    plain, _ = _unseen(many_shapes, "unseen_unanimous", DEVICES[1])
    assert settled.policy_unseen["evidence"] == "chosen"
    assert settled.selection() == plain.selection()
    np.testing.assert_array_equal(settled.score(test), plain.score(test))
