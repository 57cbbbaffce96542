"""Scores on data a model did not train on: regret@k per case, splits and baselines.

A case is one (device, kernel, dtype, shape); every method ranks the case's measured-ok
configs (what the runtime would choose among). regret@k = measured time of the best of the
method's top k / measured best time of the case; per (kernel, method, k) we report the
geometric mean, the 95th percentile, the share of cases within 2% of the best (`hit_2pct`)
and the number of cases, per device and pooled (device None).

Splits:
- `shapes`: held-out shapes on seen devices: each kernel's shapes in up to 5 folds; a fold's
  shapes are unseen on every device while training, its cases scored on devices seen in
  training (a kernel measured at one shape has no such case);
- `lodo`: leave one device out: every case of the device is scored by methods trained on
  the other devices.

Baselines, built from the same training rows only:
- `chip_default`: the config whose threadgroup is closest to the device's catalog default
  threadgroup (ties broken by `common_top10`); kernels with no threadgroup parameter get
  `common_top10` instead: configs by how often they are in a training case's top 10;
- `most_common_best`: the config most often best on that device in training (over all
  training devices when the device has none, as under `lodo`);
- `nearest_shape`: the measured ranking of the nearest training shape on that device (log2
  dims); none under `lodo`;
- `other_device_best`: the measured ranking of the most similar other device (normalised
  spec distance) on the same shape and dtype in training; none under `shapes`.
A method with nothing to say about a case does not score it (its `cases` count says so).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import polars as pl

from zmlx_pipeline.models.estimators import DEFAULT_MODEL, make_ranker
from zmlx_pipeline.models.features import CASE, KernelFeatures, device_distances, store_features

SPLITS = ("shapes", "lodo")
BASELINES = ("chip_default", "common_top10", "most_common_best", "nearest_shape", "other_device_best")
HIT_WITHIN = 1.02
SHAPE_FOLDS = 5
_TOP = 10
_LAST = 1e9  # score of a config a baseline knows nothing about: after every config it knows


class EvaluationError(ValueError):
    "The evaluation cannot be run as asked"


# ------------------------------------------------------------------------------------------
# regret


def case_regrets(frame: pl.DataFrame, scores: np.ndarray, ks: Sequence[int]) -> pl.DataFrame:
    """Per case: regret@k for each k (columns r1, r3, ...), from scores of the case's rows.

    Ranks by score, ties by config_key; cases whose scores are all NaN/null are dropped.
    """
    df = frame.select(*CASE, "config_key", "median_us").with_columns(
        pl.Series("_score", np.asarray(scores, dtype=float)).fill_nan(None))
    df = df.with_columns(pl.col("_score").is_not_null().any().over(CASE).alias("_scored")).filter("_scored")
    if df.is_empty():
        return pl.DataFrame(schema={**{c: pl.String for c in CASE}, **{f"r{k}": pl.Float64 for k in ks}})
    df = df.sort([*CASE, "_score", "config_key"], nulls_last=True).with_columns(
        pl.int_range(1, pl.len() + 1).over(CASE).alias("_rank"))
    return df.group_by(CASE, maintain_order=True).agg(
        [(pl.col("median_us").filter(pl.col("_rank") <= k).min() / pl.col("median_us").min()).alias(f"r{k}")
         for k in ks]).sort(CASE)


def summarize(regrets: Sequence[float]) -> dict:
    """Geometric mean, 95th percentile (linear), share within 2%, and count of regrets."""
    values = np.asarray([r for r in regrets if r is not None and not math.isnan(r)], dtype=float)
    if values.size == 0:
        return {"regret_geomean": None, "regret_p95": None, "hit_2pct": None, "cases": 0}
    return {
        "regret_geomean": float(np.exp(np.log(values).mean())),
        "regret_p95": float(np.quantile(values, 0.95)),
        "hit_2pct": float((values <= HIT_WITHIN + 1e-12).mean()),
        "cases": int(values.size),
    }


# ------------------------------------------------------------------------------------------
# splits


def folds(frame: pl.DataFrame, split: str) -> list[tuple[str, pl.Expr, pl.Expr]]:
    """(name, training-row filter, test-row filter) per fold of one kernel's frame."""
    if split == "lodo":
        devices = sorted(frame["device_id"].unique().to_list())
        if len(devices) < 2:
            return []
        return [(d, pl.col("device_id") != d, pl.col("device_id") == d) for d in devices]
    if split == "shapes":
        shapes = sorted(frame["shape_key"].unique().to_list())
        if len(shapes) < 2:
            return []
        n = min(SHAPE_FOLDS, len(shapes))
        out = []
        for i in range(n):
            held = shapes[i::n]
            test = pl.col("shape_key").is_in(held)
            out.append((f"shapes-{i}", ~test, test))
        return out
    raise EvaluationError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")


# ------------------------------------------------------------------------------------------
# baselines: each returns one score per test row (lower is better, null = no opinion)


def _common_top10(train: pl.DataFrame, test: pl.DataFrame) -> pl.Series:
    """Configs by how often they are in a training case's top 10 (then by mean log_rel)."""
    top = train.with_columns(pl.col("log_time").rank("ordinal").over(CASE).alias("_r"))
    stats = top.group_by("config_key").agg((pl.col("_r") <= _TOP).sum().alias("_n"),
                                           pl.col("log_rel").mean().alias("_m"))
    order = stats.sort(["_n", "_m", "config_key"], descending=[True, False, False]).with_columns(
        pl.int_range(0, pl.len()).cast(pl.Float64).alias("_pos"))
    return test.select("config_key").join(order.select("config_key", "_pos"), on="config_key", how="left",
                                          maintain_order="left")["_pos"].fill_null(_LAST)


def _chip_default(features: KernelFeatures, train: pl.DataFrame, test: pl.DataFrame) -> pl.Series:
    """Threadgroup closest to the catalog default (log2 distance), then common_top10."""
    tie = _common_top10(train, test)
    gap = test["cfg_log2_threads_per_default"].abs()
    return gap * _LAST + tie


def _most_common_best(train: pl.DataFrame, test: pl.DataFrame) -> pl.Series:
    """Per device: configs by how often they are best in its training cases (pooled if it has none)."""
    best = train.with_columns(pl.col("log_time").rank("ordinal").over(CASE).alias("_r"))

    def order(keys: list[str]) -> pl.DataFrame:
        """Position of each config within `keys` groups: most often best first, then lowest mean log_rel."""
        stats = best.group_by([*keys, "config_key"]).agg((pl.col("_r") == 1).sum().alias("_n"),
                                                         pl.col("log_rel").mean().alias("_m"))
        stats = stats.sort([*keys, "_n", "_m", "config_key"], descending=[*([False] * len(keys)), True, False, False])
        pos = pl.int_range(0, pl.len())
        return stats.with_columns((pos.over(keys) if keys else pos).cast(pl.Float64).alias("_pos"))

    per_device = order(["device_id"]).select("device_id", "config_key", pl.col("_pos").alias("_dev"))
    pooled = order([]).select("config_key", pl.col("_pos").alias("_all"))
    seen = set(train["device_id"].unique().to_list())
    out = test.select("device_id", "config_key").join(per_device, on=["device_id", "config_key"], how="left",
                                                      maintain_order="left")
    out = out.join(pooled, on="config_key", how="left", maintain_order="left")
    return out.select(
        pl.when(pl.col("device_id").is_in(list(seen))).then(pl.col("_dev")).otherwise(pl.col("_all"))
        .fill_null(_LAST).alias("_s"))["_s"]


def _from_source_case(train: pl.DataFrame, test: pl.DataFrame, mapping: pl.DataFrame) -> pl.Series:
    """Scores from the measured log_rel of each test case's mapped training case (mapping: CASE -> _src_*)."""
    src = train.select(*[pl.col(c).alias("_src_" + c) for c in CASE], "config_key", pl.col("log_rel").alias("_v"))
    out = test.select(*CASE, "config_key").join(mapping, on=list(CASE), how="left", maintain_order="left")
    out = out.join(src, on=[*[f"_src_{c}" for c in CASE], "config_key"], how="left", maintain_order="left")
    return out.select(pl.when(pl.col("_src_device_id").is_null()).then(None)
                      .otherwise(pl.col("_v").fill_null(_LAST)).alias("_s"))["_s"]


def _nearest_shape(features: KernelFeatures, train: pl.DataFrame, test: pl.DataFrame) -> pl.Series:
    """The measured ranking of the nearest (log2 dims) training shape on the same device and dtype."""
    dims = [f"shape_log2_{d}" for d in features.shape_dims]
    cases = lambda f: f.group_by(CASE).agg([pl.col(c).first() for c in dims])  # noqa: E731
    tc, rc = cases(test), cases(train).rename({c: "_src_" + c for c in (*CASE, *dims)})
    pairs = tc.join(rc, left_on=["device_id", "kernel", "dtype"],
                    right_on=["_src_device_id", "_src_kernel", "_src_dtype"], how="inner", coalesce=False)
    if pairs.is_empty():
        return pl.Series("_s", [None] * test.height, dtype=pl.Float64)
    dist = pl.sum_horizontal([(pl.col(c) - pl.col("_src_" + c)) ** 2 for c in dims]) if dims else pl.lit(0.0)
    mapping = pairs.with_columns(dist.alias("_d")).sort([*CASE, "_d", "_src_shape_key"]).group_by(
        CASE, maintain_order=True).first().select(*CASE, *[f"_src_{c}" for c in CASE])
    return _from_source_case(train, test, mapping)


def _other_device_best(features: KernelFeatures, train: pl.DataFrame, test: pl.DataFrame) -> pl.Series:
    """The measured ranking of the nearest other device (normalised spec distance), same shape and dtype."""
    ids, dist = device_distances(features.devices)
    ddist = pl.DataFrame({"device_id": [a for a in ids for _ in ids], "_src_device_id": [b for _ in ids for b in ids],
                          "_d": dist.reshape(-1).tolist()},
                         schema={"device_id": pl.String, "_src_device_id": pl.String, "_d": pl.Float64})
    tc = test.select(CASE).unique()
    rc = train.select(CASE).unique().rename({c: "_src_" + c for c in CASE})
    pairs = tc.join(rc, left_on=["kernel", "dtype", "shape_key"],
                    right_on=["_src_kernel", "_src_dtype", "_src_shape_key"], how="inner", coalesce=False)
    pairs = pairs.filter(pl.col("device_id") != pl.col("_src_device_id"))
    if pairs.is_empty():
        return pl.Series("_s", [None] * test.height, dtype=pl.Float64)
    mapping = pairs.join(ddist, on=["device_id", "_src_device_id"], how="left").sort(
        [*CASE, "_d", "_src_device_id"]).group_by(CASE, maintain_order=True).first().select(
        *CASE, *[f"_src_{c}" for c in CASE])
    return _from_source_case(train, test, mapping)


def baseline_scores(features: KernelFeatures, train: pl.DataFrame, test: pl.DataFrame) -> dict[str, pl.Series]:
    """Every baseline's scores for the test rows, trained on `train` (method name -> scores)."""
    first = ("chip_default", _chip_default(features, train, test)) if features.threadgroup_param \
        else ("common_top10", _common_top10(train, test))
    return {
        first[0]: first[1],
        "most_common_best": _most_common_best(train, test),
        "nearest_shape": _nearest_shape(features, train, test),
        "other_device_best": _other_device_best(features, train, test),
    }


# ------------------------------------------------------------------------------------------
# evaluation


def evaluate_kernel(
    features: KernelFeatures,
    split: str,
    ks: Sequence[int] = (1, 3, 5),
    models: Sequence[str] = (DEFAULT_MODEL,),
    baselines: bool = True,
) -> pl.DataFrame:
    """Per-case regrets of each model and baseline on one kernel: columns CASE, method, fold, r{k}."""
    frame = features.frame
    parts = []
    for name, train_filter, test_filter in folds(frame, split):
        train = frame.filter(train_filter)
        test = frame.filter(test_filter)
        if split == "shapes":
            test = test.filter(pl.col("device_id").is_in(train["device_id"].unique().to_list()))
        if train.is_empty() or test.is_empty():
            continue
        scores: dict[str, np.ndarray] = {}
        for model in models:
            scores[model] = make_ranker(features, model).fit(train).score(test)
        if baselines:
            scores.update({k: v.to_numpy() for k, v in baseline_scores(features, train, test).items()})
        for method, s in scores.items():
            parts.append(case_regrets(test, s, ks).with_columns(pl.lit(method).alias("method"),
                                                                pl.lit(name).alias("fold")))
    if not parts:
        return pl.DataFrame(schema={**{c: pl.String for c in CASE}, **{f"r{k}": pl.Float64 for k in ks},
                                    "method": pl.String, "fold": pl.String})
    return pl.concat(parts)


def regret_rows(per_case: pl.DataFrame, kernel: str, ks: Sequence[int], methods: Iterable[str]) -> list[dict]:
    """Flat rows {kernel, device (None = pooled), method, k, regret_geomean, regret_p95, hit_2pct, cases}."""
    rows = []
    for method in methods:
        mine = per_case.filter(pl.col("method") == method)
        devices = sorted(mine["device_id"].unique().to_list())
        for k in ks:
            col = f"r{k}"
            rows.append({"kernel": kernel, "device": None, "method": method, "k": int(k),
                         **summarize(mine[col].to_list())})
            for d in devices:
                rows.append({"kernel": kernel, "device": d, "method": method, "k": int(k),
                             **summarize(mine.filter(pl.col("device_id") == d)[col].to_list())})
    return rows


def evaluate_features(
    features: dict[str, KernelFeatures],
    split: str,
    ks: Sequence[int] = (1, 3, 5),
    models: Sequence[str] = (DEFAULT_MODEL,),
    baselines: bool = True,
) -> dict:
    """evaluate() on prepared feature frames (one per kernel)."""
    if split not in SPLITS:
        raise EvaluationError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    ks = tuple(int(k) for k in ks)
    if not ks or min(ks) < 1:
        raise EvaluationError("k must be at least 1")
    rows = []
    for kernel, f in features.items():
        per_case = evaluate_kernel(f, split, ks, models, baselines)
        methods = list(models)
        if baselines:
            methods += ["chip_default" if f.threadgroup_param else "common_top10",
                        "most_common_best", "nearest_shape", "other_device_best"]
        rows += regret_rows(per_case, kernel, ks, methods)
    return {"split": split, "ks": list(ks), "models": list(models), "rows": rows}


def evaluate(store, split: str, kernels=None, ks: Sequence[int] = (1, 3, 5),
             models: Sequence[str] = (DEFAULT_MODEL,), baselines: bool = True) -> dict:
    """Regret@k of the model(s) and the baselines on a split of the store's ok measurements.

    Returns {"split", "ks", "models", "rows"}: rows are flat dicts {kernel, device (None when
    pooled), method, k, regret_geomean, regret_p95, hit_2pct, cases}.
    """
    if split not in SPLITS:
        raise EvaluationError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    return evaluate_features(store_features(store, kernels), split, ks, models, baselines)
