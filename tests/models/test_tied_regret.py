"""The noise-aware regret: tie bands from a store's repeat pairs, and picks inside or outside them."""

from __future__ import annotations

import math

import polars as pl
import pytest

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.models.evaluate import evaluate, evaluate_kernel
from zmlx_pipeline.models.metrics import FALLBACK_BAND, MIN_PAIRS, NoiseBands, noise_bands, tied_regrets
from zmlx_pipeline.models.features import store_features

DEVICE = "nvidia-rtx-a4000"
TGS = [32 * i for i in range(1, 25)]  # 24 configs: enough repeat pairs per bucket for the device's own band
FAST = {"rows": 1, "cols": 1024}      # best 5 us, repeats 20% apart
SLOW = {"rows": 4096, "cols": 1024}   # best 400 us, repeats 2% apart


def fast_us(tg: int) -> float:
    """TG 32 is best (5.0), TG 64 10% slower (5.5), the rest slower still."""
    return {32: 5.0, 64: 5.5}.get(tg, 6.0 + tg / 1000)


def slow_us(tg: int) -> float:
    """The other way round: TG 64 is best (400), TG 32 10% slower (440)."""
    return {64: 400.0, 32: 440.0}.get(tg, 460.0 + tg / 10)


def pair(device, first, repeat):
    return {"device_id": device, "median_us": first, "repeat_us": repeat}


@pytest.fixture
def noisy(store, make_measurement):
    """One device, one kernel, two shapes whose best configs swap; every config repeated in a second run."""
    store.upsert_device({**get_device(DEVICE).as_row(), "device_id": DEVICE, "in_catalog": True})
    first = [make_measurement(device_id=DEVICE, kernel="k", dtype="float32", shape=shape, config={"TG": tg},
                              median_us=time(tg))
             for shape, time in ((FAST, fast_us), (SLOW, slow_us)) for tg in TGS]
    store.record(first)
    spread = {FAST["rows"]: 1.20, SLOW["rows"]: 1.02}
    store.record_repeat([make_measurement(device_id=DEVICE, kernel="k", dtype="float32", shape=m.shape,
                                          config=m.config, run_id="run-2",
                                          median_us=m.median_us * spread[m.shape["rows"]]) for m in first])
    return store


def test_bands_come_from_the_device_then_the_pooled_bucket_then_the_nearest():
    pairs = ([pair("a", 5.0, 6.5)] * MIN_PAIRS          # a, < 10 us: 30%
             + [pair("b", 5.0, 5.5)] * 3                # b, < 10 us: 10%, too few for its own band
             + [pair("b", 500.0, 510.0)] * 25)          # b, 200-1000 us: 2%
    bands = NoiseBands.from_pairs(pairs)
    assert not bands.fallback and bands.pairs == MIN_PAIRS + 28
    assert bands.band("a", 5.0) == pytest.approx((0.3, "device"))
    assert bands.band("b", 5.0) == pytest.approx((0.3, "pooled"))      # 23 pooled pairs, median 30%
    assert bands.band("b", 500.0) == pytest.approx((0.02, "device"))
    assert bands.band("a", 500.0) == pytest.approx((0.02, "pooled"))
    # buckets nobody measured: the nearest one with enough pairs, the slower one when two are as near
    assert bands.band("a", 30.0) == pytest.approx((0.3, "pooled-nearest"))    # 10-50: < 10 is nearer
    assert bands.band("a", 100.0) == pytest.approx((0.02, "pooled-nearest"))  # 50-200: 200-1000 is nearer
    assert bands.band("c", 5000.0) == pytest.approx((0.02, "pooled-nearest"))
    rows = {(r["device"], r["bucket"]): r for r in bands.table()}
    assert rows[("b", "0-10 us")]["pairs"] == 3 and not rows[("b", "0-10 us")]["enough_pairs"]
    assert rows[(None, "0-10 us")]["pairs"] == MIN_PAIRS + 3


def test_the_spread_of_a_pair_is_max_over_min_either_way_round():
    bands = NoiseBands.from_pairs([pair("a", 5.0, 6.0), pair("a", 6.0, 5.0)], min_pairs=1)
    assert bands.band("a", 5.0) == pytest.approx((0.2, "device"))


def test_no_repeats_means_the_fallback_and_says_so():
    bands = NoiseBands.from_pairs([])
    assert bands.fallback and bands.band("a", 5.0) == (FALLBACK_BAND, "fallback")
    assert bands.summary()["fallback"] is True and bands.summary()["fallback_band"] == FALLBACK_BAND


def test_buckets_are_those_of_the_noise_command():
    from zmlx_pipeline.data import noise_buckets
    from zmlx_pipeline.pipeline import collect

    assert collect.NOISE_BUCKETS_US is noise_buckets.NOISE_BUCKETS_US
    assert [noise_buckets.bucket_label(i) for i in range(5)] == ["0-10 us", "10-50 us", "50-200 us", "200-1000 us", ">= 1000 us"]


def test_a_pick_inside_the_band_is_a_tie_and_one_outside_is_not(noisy):
    """most_common_best trained on one shape picks a config 10% slower on the other: inside the 20%
    band of the fast case (tied 1.0), outside the 2% band of the slow one (tied 1.10 / 1.02)."""
    bands = noise_bands(noisy)
    assert bands.band(DEVICE, 5.0) == pytest.approx((0.2, "device"))
    assert bands.band(DEVICE, 400.0) == pytest.approx((0.02, "device"))
    f = store_features(noisy)["k"]
    per_case = evaluate_kernel(f, "shapes", ks=(1,), models=(), baselines=True)
    tied = tied_regrets(per_case, f.frame, bands, ks=(1,)).filter(pl.col("method") == "most_common_best")
    by_best = {round(r["best_us"]): r for r in tied.iter_rows(named=True)}
    assert by_best[5]["r1"] == pytest.approx(1.10) and by_best[5]["tied1"] == 1.0
    assert by_best[400]["r1"] == pytest.approx(1.10) and by_best[400]["tied1"] == pytest.approx(1.10 / 1.02)
    assert by_best[5]["band_source"] == by_best[400]["band_source"] == "device"


def test_evaluate_rows_carry_the_tied_score_next_to_the_plain_one(noisy):
    result = evaluate(noisy, "shapes", ks=(1,), models=())
    assert result["noise"]["fallback"] is False and result["noise"]["pairs"] == 2 * len(TGS)
    pooled = {r["method"]: r for r in result["results"] if r["device"] is None}
    row = pooled["most_common_best"]
    assert row["regret_geomean"] == pytest.approx(1.10) and row["hit_2pct"] == 0.0  # plain: unchanged
    assert row["regret_tied_geomean"] == pytest.approx(math.sqrt(1.10 / 1.02))
    assert row["hit_tied"] == 0.5 and row["tied_band"] == pytest.approx((0.2 + 0.02) / 2)
    assert row["tied_band_source"] == "device"
    for r in result["results"]:  # every baseline gets it; never above the plain score
        if r["cases"]:
            assert 1.0 <= r["regret_tied_geomean"] <= r["regret_geomean"] + 1e-12
            assert r["hit_tied"] >= 0.0


def test_without_repeats_the_same_picks_get_the_fallback_band(store, make_measurement):
    store.upsert_device({**get_device(DEVICE).as_row(), "device_id": DEVICE, "in_catalog": True})
    store.record([make_measurement(device_id=DEVICE, kernel="k", dtype="float32", shape=shape, config={"TG": tg},
                                   median_us=time(tg)) for shape, time in ((FAST, fast_us), (SLOW, slow_us))
                  for tg in TGS])
    result = evaluate(store, "shapes", ks=(1,), models=())
    assert result["noise"]["fallback"] is True
    row = next(r for r in result["results"] if r["device"] is None and r["method"] == "most_common_best")
    assert row["regret_tied_geomean"] == pytest.approx(1.10 / (1 + FALLBACK_BAND))
    assert row["tied_band_source"] == "fallback" and row["hit_tied"] == 0.0
