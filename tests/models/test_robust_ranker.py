"""The guarded ranker (`robust`): its nested selection falls back to a baseline that beats the model on the
training devices, keeps the model where it is as good, and never sees the device it is tested on."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.models import baselines, variants
from zmlx_pipeline.models.cv_ensemble import CVEnsembleRanker
from zmlx_pipeline.models.rankers.base import ModelError
from zmlx_pipeline.models.rankers.baseline import BaselineRanker
from zmlx_pipeline.models.variants import make_ranker
from zmlx_pipeline.models.evaluate import case_regrets, evaluate_kernel
from zmlx_pipeline.models.features import store_features
from zmlx_pipeline.models.persist import load_model_file, save_model

DEVICES = ("nvidia-rtx-a4000", "nvidia-rtx-a5000", "nvidia-rtx-a6000", "nvidia-a40", "nvidia-a100-pcie-40gb")
# every device ranks the configs alike, and the fastest threadgroup (24) fills no whole SIMD group of 32
PENALTY = {24: 1.0, 32: 1.3, 64: 1.25, 128: 1.4, 256: 1.6}


def _fill(store, make_measurement, shapes):
    for device_id in DEVICES:
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
    store.record([
        make_measurement(device_id=d, kernel="k", dtype="float32", shape={"rows": rows, "cols": 1024},
                         config={"TG": tg}, median_us=(5.0 + rows / (i + 1)) * pen)
        for i, d in enumerate(DEVICES) for rows in shapes for tg, pen in PENALTY.items()])
    return store_features(store)["k"]


@pytest.fixture
def same_order(store, make_measurement):
    """5 devices x 8 shapes: the other devices' measured ranking is always right, the SIMD rule always wrong."""
    return _fill(store, make_measurement, shapes=(1, 2, 4, 8, 16, 32, 64, 128))


def _guarded(f, member: str) -> CVEnsembleRanker:
    return CVEnsembleRanker(f, (member,), (), max_device_folds=4, guards_unseen=("other_device_best", "chip_default"),
                            name="guarded")


def _left_out(f, device):
    return f.frame.filter(pl.col("device_id") != device), f.frame.filter(pl.col("device_id") == device)


def test_a_baseline_that_beats_the_model_on_every_training_device_leads(same_order):
    train, test = _left_out(same_order, DEVICES[0])
    alone = make_ranker(same_order, "simd_aligned").fit(train)
    assert case_regrets(test, alone.score(test), ks=(1,))["r1"].min() == pytest.approx(1.25)  # TG 64 first
    ranker = _guarded(same_order, "simd_aligned")
    ranker.only = "unseen"
    ranker.fit(train)
    assert ranker.policy_unseen["mode"] == "baseline" and ranker.policy_unseen["baseline"] == "other_device_best"
    assert case_regrets(test, ranker.score(test), ks=(1,))["r1"].to_list() == [1.0] * 8


def test_the_model_keeps_the_lead_where_it_is_as_good(same_order):
    train, _ = _left_out(same_order, DEVICES[0])
    ranker = _guarded(same_order, "prior")  # the prior learns the common order: a tie with the baseline
    ranker.only = "unseen"
    ranker.fit(train)
    assert ranker.policy_unseen["mode"] == "model" and ranker.policy_unseen["baseline"] is None


def test_too_few_inner_cases_never_overrule_the_model(store, make_measurement):
    """One shape per device (as a Kernel Tuner file): 4 inner cases are too few for a baseline to lead."""
    f = _fill(store, make_measurement, shapes=(64,))
    ranker = _guarded(f, "simd_aligned")
    ranker.only = "unseen"
    ranker.fit(_left_out(f, DEVICES[0])[0])
    assert ranker.policy_unseen["mode"] == "model"
    assert ranker.policy_unseen["inner"]["model@1"] > ranker.policy_unseen["inner"]["other_device_best@1"]


def test_the_hedged_top_k_holds_the_baselines_pick(same_order):
    """Hedged, the model's top 2 holds its own pick and the baseline's: regret@2 is the baseline's."""
    train, test = _left_out(same_order, DEVICES[1])
    ranker = _guarded(same_order, "simd_aligned")
    ranker.fit(train)
    ranker.policy_unseen = {"mode": "model", "baseline": None, "hedges": ["other_device_best"]}
    ranker.guard_rankers = {"other_device_best": BaselineRanker(same_order, "other_device_best").fit(train)}
    got = case_regrets(test, ranker.score(test), ks=(1, 2))
    assert got["r1"].min() == pytest.approx(1.25) and got["r2"].to_list() == [1.0] * 8


def test_the_nested_protocol_never_shows_the_test_device_to_a_choice(same_order, monkeypatch):
    """Spy on every inner split the selection makes while the devices split scores each left-out device."""
    seen: list[tuple[set, set]] = []
    inner = CVEnsembleRanker._inner_folds

    def spy(self, train, split):
        out = inner(self, train, split)
        seen.append((set(train["device_id"].unique()), {d for a, b in out for d in (*a["device_id"], *b["device_id"])}))
        return out

    monkeypatch.setattr(CVEnsembleRanker, "_inner_folds", spy)
    per_case = evaluate_kernel(same_order, "devices", ks=(1,), models=("robust",), baselines=False)
    assert per_case["device_id"].n_unique() == len(DEVICES)
    assert len(seen) == len(DEVICES)  # one selection per left-out device (only its unseen setting)
    for outer_train, inner_devices in seen:
        missing = set(DEVICES) - outer_train
        assert len(missing) == 1 and inner_devices <= outer_train and not (inner_devices & missing)


def test_robust_ranker_round_trips_through_a_model_file(same_order, tmp_path):
    train, test = _left_out(same_order, DEVICES[2])
    ranker = _guarded(same_order, "simd_aligned").fit(train)
    assert ranker.guard_rankers  # the baseline it leads with is kept, with the rows it reads
    path = tmp_path / "m.zip"
    save_model(ranker, path)
    loaded = load_model_file(path)
    np.testing.assert_array_equal(loaded.score(test), ranker.score(test))
    assert loaded.selection() == ranker.selection()


def test_unknown_guard_is_refused(same_order):
    with pytest.raises(ModelError, match="unknown baseline"):
        CVEnsembleRanker(same_order, ("prior",), guards_unseen=("no_such",))
    assert set(variants.GUARDS_UNSEEN) <= set(baselines.BASELINES)


def test_robust_scores_held_out_shapes_as_the_ensemble_does(same_order):
    """On a seen device `robust` is the ensemble's seen setting: the held-out-shapes regrets are the same."""
    got = {m: evaluate_kernel(same_order, "shapes", ks=(1, 3), models=(m,), baselines=False).drop("method")
           for m in ("robust", "ensemble")}
    assert got["robust"].height == 8 * len(DEVICES)
    assert got["robust"].equals(got["ensemble"])
