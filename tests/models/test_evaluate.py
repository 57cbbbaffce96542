"""Regret@k, splits and baselines on hand-made tables, and the model against the baselines on real data."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import zmlx_pipeline
from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.data.importers import import_files
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models.rankers.base import make_pipeline
from zmlx_pipeline.models.variants import DEFAULT_MODEL, MODEL_VARIANTS, fit_kernel_model
from zmlx_pipeline.models.baselines import baseline_scores, seed_threadgroups
from zmlx_pipeline.models.evaluate import evaluate, evaluate_kernel
from zmlx_pipeline.models.folds import LARGE_KERNEL_CASES, EvaluationError, folds
from zmlx_pipeline.models.metrics import case_regrets, prune_k, summarize
from zmlx_pipeline.models.features import store_features

DATASETS = Path(zmlx_pipeline.__file__).resolve().parents[2] / "shared/datasets/kernel-tuner"
A4000, A6000, M3 = "nvidia-rtx-a4000", "nvidia-rtx-a6000", "apple-m3-max-40c"
ROW_KEYS = ["kernel", "device", "method", "k", "regret_geomean", "regret_p95", "hit_2pct", "cases"]
TIED_KEYS = ["regret_tied_geomean", "hit_tied", "tied_band", "tied_band_source"]  # appended, never instead

# time[device][rows][TG] in microseconds
TIMES = {
    A4000: {1: {64: 10, 256: 12, 1024: 15}, 16: {64: 20, 256: 22, 1024: 30},
            256: {64: 50, 256: 45, 1024: 40}, 4096: {64: 500, 256: 440, 1024: 400}},
    A6000: {1: {64: 8, 256: 9, 1024: 12}, 16: {64: 15, 256: 14, 1024: 20},
            256: {64: 40, 256: 30, 1024: 35}, 4096: {64: 300, 256: 200, 1024: 250}},
    M3: {1: {64: 5, 256: 9, 1024: 12}, 16: {64: 10, 256: 14, 1024: 20},
         256: {64: 20, 256: 30, 1024: 35}, 4096: {64: 100, 256: 300, 1024: 200}},
}


def fill(store, make_measurement, kernel="k", param="TG") -> None:
    for device_id in TIMES:
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
    store.record([
        make_measurement(device_id=d, kernel=kernel, dtype="float32", shape={"rows": rows, "cols": 1024},
                         config={param: tg}, median_us=float(t))
        for d, by_rows in TIMES.items() for rows, by_tg in by_rows.items() for tg, t in by_tg.items()
    ])


def test_regret_of_a_pick_ten_percent_slower_is_1_10():
    frame = pl.DataFrame({"device_id": ["d"] * 3, "kernel": ["k"] * 3, "dtype": ["float32"] * 3,
                          "shape_key": ["s"] * 3, "config_key": ["a", "b", "c"], "median_us": [100.0, 110.0, 120.0]})
    got = case_regrets(frame, np.array([2.0, 0.0, 1.0]), ks=(1, 2, 3))
    assert got["r1"][0] == pytest.approx(1.10) and got["r2"][0] == pytest.approx(1.10) and got["r3"][0] == 1.0
    # ties go by config_key; a case with no scores is not counted
    assert case_regrets(frame, np.zeros(3), ks=(1,))["r1"][0] == 1.0
    assert case_regrets(frame, np.full(3, np.nan), ks=(1,)).height == 0


def test_hit_rank_and_pruning_k():
    frame = pl.DataFrame({"device_id": ["d"] * 4, "kernel": ["k"] * 4, "dtype": ["float32"] * 4,
                          "shape_key": ["s"] * 4, "config_key": ["a", "b", "c", "d"],
                          "median_us": [100.0, 101.5, 130.0, 110.0]})
    # order a-less: d (110), c (130), b (101.5, within 2%), a (100, the best)
    got = case_regrets(frame, np.array([4.0, 3.0, 2.0, 1.0]), ks=(1, 3))
    assert got["hit_rank"][0] == 3 and got["configs"][0] == 4
    assert got["r3"][0] == pytest.approx(1.015)
    # 95% of 20 cases is 19: the 19th smallest hit rank
    assert prune_k([1] * 18 + [4, 7]) == 4
    assert prune_k([1] * 19 + [7]) == 1
    assert prune_k([2, 3]) == 3 and prune_k([]) is None


def test_seed_profiles_follow_the_seed_table():
    assert seed_threadgroups("apple-m1-7c") == (128, (64, 128, 256))
    assert seed_threadgroups("apple-m3-max-40c") == (256, (128, 256, 512))
    assert seed_threadgroups("apple-m2-ultra-76c") == (256, (256, 512, 1024))
    assert seed_threadgroups("apple-m4-max-40c") == (256, (256, 512, 1024))
    # devices outside the seed's table (every non-Apple GPU, SM-limited ones, unknown ids): its fallback
    for other in ("nvidia-h200", "nvidia-h200@66sm", "no-such-gpu"):
        assert seed_threadgroups(other) == (128, (64, 128, 256))


def test_seed_candidates_time_the_three_threadgroups_first(store, make_measurement):
    """On an M3 Max the seed times TG 256, 128, 512 (with the best other parameters) before anything else."""
    store.upsert_device({**get_device(M3).as_row(), "device_id": M3, "in_catalog": True})
    times = {64: 9.0, 128: 12.0, 256: 11.0, 512: 10.0, 1024: 20.0}
    store.record([make_measurement(device_id=M3, kernel="k", dtype="float32", shape={"rows": rows, "cols": 1024},
                                   config={"TG": tg, "VEC": vec}, median_us=t * rows * (1.0 if vec == 4 else 1.5))
                  for rows in (1, 16, 256) for tg, t in times.items() for vec in (1, 4)])
    f = store_features(store)["k"]
    held = pl.col("shape_log2_rows") == 8
    train, test = f.frame.filter(~held), f.frame.filter(held)
    scores = baseline_scores(f, train, test)["seed_candidates"]
    order = test.with_columns(scores.alias("s")).sort("s")
    assert order.select("cfg_TG", "cfg_VEC").head(3).rows() == [(256.0, 4.0), (128.0, 4.0), (512.0, 4.0)]
    got = case_regrets(test, scores.to_numpy(), ks=(1, 3))
    assert got["r1"][0] == pytest.approx(11 / 9) and got["r3"][0] == pytest.approx(10 / 9)


def test_summary_statistics():
    got = summarize([1.0, 1.1, 1.21, 1.01])
    assert got["regret_geomean"] == pytest.approx(math.exp(np.log([1.0, 1.1, 1.21, 1.01]).mean()))
    assert got["regret_p95"] == pytest.approx(float(np.quantile([1.0, 1.1, 1.21, 1.01], 0.95)))
    assert got["hit_2pct"] == 0.5 and got["cases"] == 4
    assert summarize([]) == {"regret_geomean": None, "regret_p95": None, "hit_2pct": None, "cases": 0}


def _baseline_regrets(f, train, test) -> dict[str, float]:
    return {name: (case_regrets(test, s.to_numpy(), ks=(1,))["r1"].to_list() or [None])[0]
            for name, s in baseline_scores(f, train, test).items()}


def test_baselines_on_a_held_out_shape(store, make_measurement):
    fill(store, make_measurement)
    f = store_features(store)["k"]
    held = pl.col("shape_log2_rows") == 12
    train, test = f.frame.filter(~held), f.frame.filter(held & (pl.col("device_id") == A4000))
    got = _baseline_regrets(f, train, test)
    assert got["chip_default"] == pytest.approx(440 / 400)      # TG 256, the A4000's default threadgroup
    assert got["seed_candidates"] == pytest.approx(500 / 400)   # the seed's 128 (unmeasured), then 64, then 256
    assert got["most_common_best"] == pytest.approx(500 / 400)  # TG 64 was best at rows 1 and 16
    assert got["nearest_shape"] == pytest.approx(1.0)           # rows 256, where TG 1024 won
    assert got["other_device_best"] is None                     # no other device measured rows 4096 in training


def test_baselines_on_an_unseen_device(store, make_measurement):
    fill(store, make_measurement)
    f = store_features(store)["k"]
    on = pl.col("device_id") == A4000
    train, test = f.frame.filter(~on), f.frame.filter(on & (pl.col("shape_log2_rows") == 12))
    got = _baseline_regrets(f, train, test)
    assert got["other_device_best"] == pytest.approx(440 / 400)  # the A6000 (not the M3) is nearest: TG 256
    assert got["nearest_shape"] is None                          # nothing measured on the A4000
    # most common best over the training devices: TG 64 (M3 x4, A6000 x1) beats TG 256 (A6000 x3)
    assert got["most_common_best"] == pytest.approx(500 / 400)


def test_common_top10_replaces_chip_default_without_a_threadgroup_param(store, make_measurement):
    fill(store, make_measurement, kernel="k_bm", param="BM")
    f = store_features(store)["k_bm"]
    assert f.threadgroup_param is None
    on = pl.col("device_id") == A4000
    scores = baseline_scores(f, f.frame.filter(~on), f.frame.filter(on))
    assert list(scores) == ["common_top10", "most_common_best", "nearest_shape", "other_device_best"]
    # every config is in each case's top 10 here, so the order is the mean log(time / best): BM 64 first
    best = f.frame.filter(on).with_columns(scores["common_top10"].alias("s")).sort("s")["cfg_BM"][0]
    assert best == 64


def test_splits():
    frame = pl.DataFrame({"device_id": ["a", "a", "b", "b"], "shape_key": ["s1", "s2", "s1", "s3"]})
    names = [n for n, _, _ in folds(frame, "devices")]
    assert names == ["a", "b"]
    assert [n for n, _, _ in folds(frame, "lodo")] == names  # the old name still works
    shape_folds = folds(frame, "shapes")
    assert len(shape_folds) == 3
    held = [frame.filter(t)["shape_key"].unique().to_list() for _, _, t in shape_folds]
    assert sorted(s for h in held for s in h) == ["s1", "s2", "s3"]
    assert folds(frame.filter(pl.col("shape_key") == "s1"), "shapes") == []
    with pytest.raises(EvaluationError, match="unknown split 'random'"):
        folds(frame, "random")


@pytest.mark.parametrize("shapes, n_folds", [(500, 5), (501, 2)])
def test_a_kernel_of_many_cases_gets_fewer_shape_folds_and_every_case_is_still_held_out(shapes, n_folds):
    frame = pl.DataFrame({"device_id": [d for d in "ab" for _ in range(shapes)],
                          "shape_key": [f"s{i}" for _ in "ab" for i in range(shapes)]})
    assert frame.height == 2 * shapes and (frame.height > LARGE_KERNEL_CASES) == (n_folds == 2)
    shape_folds = folds(frame, "shapes")
    assert len(shape_folds) == n_folds
    held = [frame.filter(t) for _, _, t in shape_folds]
    assert sum(h.height for h in held) == frame.height  # each case in exactly one fold's test rows
    assert pl.concat(held).unique().height == frame.height
    for (_, train, test), h in zip(shape_folds, held):  # a fold's shapes are unseen in its training rows
        assert set(frame.filter(train)["shape_key"]).isdisjoint(h["shape_key"])


def test_evaluate_returns_flat_rows(store, make_measurement):
    fill(store, make_measurement)
    result = evaluate(store, "shapes", ks=(1, 3), models=("ensemble", "gbr"))
    assert result["split"] == "shapes" and result["ks"] == [1, 3]
    rows = result["results"]
    assert all(list(r) == ROW_KEYS + TIED_KEYS for r in rows)
    assert result["noise"]["fallback"] is True  # no repeats in this store: said, not hidden
    pooled = {(r["method"], r["k"]): r for r in rows if r["device"] is None}
    assert set(m for m, _ in pooled) == {"ensemble", "gbr", "chip_default", "seed_candidates", "most_common_best",
                                         "nearest_shape", "other_device_best"}
    assert pooled[("ensemble", 1)]["cases"] == 12  # 4 shapes x 3 devices, each held out once
    assert pooled[("other_device_best", 1)]["cases"] == 0 and pooled[("other_device_best", 1)]["regret_geomean"] is None
    per_device = [r for r in rows if r["device"] == M3 and r["method"] == "ensemble" and r["k"] == 3]
    assert per_device[0]["cases"] == 4 and per_device[0]["regret_geomean"] >= 1.0
    lodo = evaluate(store, "lodo", kernels=["k"], ks=(1,), models=("prior",), label_model=True)
    assert lodo["split"] == "devices"
    pooled = {r["method"]: r for r in lodo["results"] if r["device"] is None}
    assert pooled["model"]["cases"] == 12 and pooled["nearest_shape"]["cases"] == 0
    assert "prior" not in pooled  # the one model is called "model" when asked to


def test_folds_stop_once_enough_cases_are_scored(store, make_measurement):
    fill(store, make_measurement)
    f = store_features(store)["k"]
    every = evaluate_kernel(f, "shapes", ks=(1,), models=("prior",), baselines=False)
    assert sorted(every["fold"].unique().to_list()) == ["shapes-0", "shapes-1", "shapes-2", "shapes-3"]
    first = evaluate_kernel(f, "shapes", ks=(1,), models=("prior",), baselines=False, enough_cases=1)
    assert first["fold"].unique().to_list() == ["shapes-0"] and first.height == 3  # one shape on three devices
    assert first.equals(every.filter(pl.col("fold") == "shapes-0"))


def test_every_variant_fits_and_scores(store, make_measurement):
    fill(store, make_measurement)
    f = store_features(store)["k"]
    for name in MODEL_VARIANTS:
        scores = fit_kernel_model(f, name).score(f.frame)
        assert scores.shape == (f.frame.height,) and np.isfinite(scores).all(), name
    pipeline = make_pipeline(f, MODEL_VARIANTS["gbr"](f).pipeline.steps[-1][1])
    assert [name for name, _ in pipeline.steps] == ["features", "model"]


@pytest.fixture(scope="module")
def kernel_tuner_store(tmp_path_factory):
    """All ten Kernel Tuner files imported into one store (module-wide: the import takes a while)."""
    if not DATASETS.is_dir():
        pytest.skip("shared Kernel Tuner datasets not present")
    with Store(tmp_path_factory.mktemp("kt") / "kt.duckdb") as store:
        # A100_T4 names its GPU only as "A100", four catalog chips: the map says which
        device_map = Path(zmlx_pipeline.__file__).resolve().parents[1] / "benchmarks" / "kernel_tuner_device_map.json"
        rows = import_files(store, [DATASETS / "convolution_milo", DATASETS / "dedispersion_milo"], device_map=device_map)
        yield store, rows


def test_all_kernel_tuner_files_import_completely(kernel_tuner_store):
    store, rows = kernel_tuner_store
    assert len(rows) == 10
    expected = {"A6000_original.json.gz": 2442}
    for row in rows:
        name = Path(row["file"]).name
        entries = expected.get(name, 4362 if "convolution" in row["file"] else 11130)
        assert (row["rows"], row["added"]) == (entries, entries), name
        stored = store.summary(device=row["device"], kernel=row["kernel"])[0]["measurements"]
        assert stored == entries, name


def test_model_beats_every_baseline_leaving_one_device_out(kernel_tuner_store):
    store, _ = kernel_tuner_store
    result = evaluate(store, "devices", ks=(1, 5))
    pooled = {(r["kernel"], r["method"], r["k"]): r for r in result["results"] if r["device"] is None}
    for kernel in ("convolution_milo", "dedispersion_milo"):
        for k in (1, 5):
            model = pooled[(kernel, DEFAULT_MODEL, k)]
            assert model["cases"] == 5
            for baseline in ("common_top10", "seed_candidates", "most_common_best", "other_device_best"):
                other = pooled[(kernel, baseline, k)]
                assert other["cases"] == 5
                assert model["regret_geomean"] < other["regret_geomean"], (kernel, baseline, k)
            assert pooled[(kernel, "nearest_shape", k)]["cases"] == 0
    assert pooled[("dedispersion_milo", DEFAULT_MODEL, 1)]["regret_geomean"] <= 1.10
    assert pooled[("dedispersion_milo", DEFAULT_MODEL, 5)]["regret_geomean"] <= 1.05


# time[device][TG] of one shape: left out, the A4000 is ranked right only by the M3 (not by the nearer A6000)
ORACLE_TIMES = {A4000: {64: 10.0, 256: 12.0, 1024: 15.0}, A6000: {64: 13.0, 256: 11.0, 1024: 12.0},
                M3: {64: 10.5, 256: 20.0, 1024: 30.0}}


def test_oracle_device_is_the_best_single_other_device_after_the_fact(store, make_measurement):
    for device_id in ORACLE_TIMES:
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
    store.record([make_measurement(device_id=d, kernel="k", dtype="float32", shape={"rows": 64, "cols": 1024},
                                   config={"TG": tg}, median_us=t)
                  for d, by_tg in ORACLE_TIMES.items() for tg, t in by_tg.items()])
    result = evaluate(store, "devices", ks=(1, 2), models=("prior",), jobs=1)
    rows = {(r["method"], r["device"], r["k"]): r for r in result["results"]}
    # A4000: the M3's best (64) is its best; A6000: both others pick 64 (13 / 11); M3: the A4000's 64 is its best
    assert rows[("oracle_device", A4000, 1)]["regret_geomean"] == pytest.approx(1.0)
    assert rows[("oracle_device", A6000, 1)]["regret_geomean"] == pytest.approx(13 / 11)
    assert rows[("oracle_device", M3, 1)]["regret_geomean"] == pytest.approx(1.0)
    assert rows[("oracle_device", None, 1)]["regret_geomean"] == pytest.approx((13 / 11) ** (1 / 3))
    # the nearest other device (what other_device_best copies) is the A6000 for the A4000: 12 / 10
    assert rows[("other_device_best", A4000, 1)]["regret_geomean"] == pytest.approx(1.2)
    # chosen per k: at k = 2 either other device's top 2 (64, then 256) holds the A6000's best, 256
    assert rows[("oracle_device", A6000, 2)]["regret_geomean"] == pytest.approx(1.0)
    assert "oracle_device" in result["floors"] and "after the fact" in result["floors"]["oracle_device"]
    assert result["protocol"] == "nested"
    shapes = evaluate(store, "shapes", ks=(1,), models=("prior",), jobs=1)
    assert not shapes["floors"] and all(r["method"] != "oracle_device" for r in shapes["results"])


def test_unknown_protocol_is_refused(store, make_measurement):
    fill(store, make_measurement)
    with pytest.raises(EvaluationError, match="unknown protocol 'loose'; expected one of nested, fixed"):
        evaluate(store, "devices", protocol="loose", jobs=1)
