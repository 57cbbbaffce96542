"""The baselines every model is scored against, each built from training rows only.

evaluate.py reports them next to the model; the `robust` ranker (variants.py) takes them as
candidates of its nested selection, so both read these very functions. Each returns one score per
test row, lower is better, null where it has nothing to say (see evaluate.py's docstring for
what each one is).
"""

from __future__ import annotations

import polars as pl

from zmlx_pipeline.data.catalog import UnknownDevice, get_device
from zmlx_pipeline.models.features import CASE, KernelFeatures, device_distances

BASELINES = ("chip_default", "common_top10", "seed_candidates", "most_common_best", "nearest_shape",
             "other_device_best")
# The seed's device profiles: (family, variant) or variant -> (default threadgroup, candidates);
# a device outside its table (every non-Apple GPU) gets its fallback profile.
SEED_PROFILES: dict = {
    "base": (128, (64, 128, 256)), "pro": (256, (128, 256, 512)), "max": (256, (128, 256, 512)),
    "ultra": (256, (256, 512, 1024)), ("m4", "max"): (256, (256, 512, 1024)),
}
SEED_FALLBACK = (128, (64, 128, 256))
_TOP = 10
LAST = 1e9  # score of a config a baseline knows nothing about: after every config it knows
_LAST = LAST


def _common_order(train: pl.DataFrame) -> pl.DataFrame:
    """config_key -> _pos: configs by how often they are in a training case's top 10 (then by mean log_rel)."""
    top = train.with_columns(pl.col("log_time").rank("ordinal").over(CASE).alias("_r"))
    stats = top.group_by("config_key").agg((pl.col("_r") <= _TOP).sum().alias("_n"),
                                           pl.col("log_rel").mean().alias("_m"))
    return stats.sort(["_n", "_m", "config_key"], descending=[True, False, False]).with_columns(
        pl.int_range(0, pl.len()).cast(pl.Float64).alias("_pos")).select("config_key", "_pos")


def _common_top10(train: pl.DataFrame, test: pl.DataFrame) -> pl.Series:
    """Configs by how often they are in a training case's top 10 (then by mean log_rel)."""
    return test.select("config_key").join(_common_order(train), on="config_key", how="left",
                                          maintain_order="left")["_pos"].fill_null(_LAST)


def seed_threadgroups(device_id: str) -> tuple[int, tuple[int, ...]]:
    """The seed autotuner's (default threadgroup, three candidates) for a device (see SEED_PROFILES)."""
    try:
        spec = get_device(device_id.split("@")[0])  # a core-limited device keeps its chip's profile
    except (UnknownDevice, ValueError):
        return SEED_FALLBACK
    if spec.vendor != "apple":
        return SEED_FALLBACK
    return SEED_PROFILES.get((spec.family, spec.variant)) or SEED_PROFILES.get(spec.variant, SEED_FALLBACK)


def _seed_candidates(features: KernelFeatures, train: pl.DataFrame, test: pl.DataFrame) -> pl.Series:
    """The seed's candidate threadgroups of the device (default first), other params as common_top10's leader.

    Order: candidate configs before all others; among them by the common_top10 position of
    their other parameters' values, then default, smaller, larger; other configs by log2
    distance to the nearest candidate.
    """
    thread_cols = [f"cfg_{p}" for p in features.thread_params]
    rest = [f"cfg_{p}" for p in features.params if p not in features.thread_params]
    rest_key = (pl.concat_str([pl.col(c).cast(pl.String).fill_null("none") for c in rest], separator="|")
                if rest else pl.lit(""))
    configs = pl.concat([train.select("config_key", *rest, *thread_cols).unique("config_key"),
                         test.select("config_key", *rest, *thread_cols).unique("config_key")]).unique("config_key")
    threads = pl.reduce(lambda a, b: a * b, [pl.col(c).round().cast(pl.Int64) for c in thread_cols])
    configs = configs.select("config_key", rest_key.alias("_rest"), threads.alias("_threads"))
    rest_pos = configs.join(_common_order(train), on="config_key").group_by("_rest").agg(
        pl.col("_pos").min().alias("_rest_pos"))
    devices = test["device_id"].unique().to_list()
    profiles = pl.DataFrame(
        {"device_id": devices,
         "_cands": [[seed_threadgroups(d)[0]] + sorted(set(seed_threadgroups(d)[1]) - {seed_threadgroups(d)[0]})
                    for d in devices]},
        schema={"device_id": pl.String, "_cands": pl.List(pl.Int64)})
    out = test.select("device_id", "config_key").join(configs, on="config_key", how="left", maintain_order="left").join(
        profiles, on="device_id", how="left", maintain_order="left").join(
        rest_pos, on="_rest", how="left", maintain_order="left")
    cand = [pl.col("_cands").list.get(i, null_on_oob=True) for i in range(3)]
    cand_pos = pl.coalesce([pl.when(c == pl.col("_threads")).then(pl.lit(float(i))) for i, c in enumerate(cand)])
    log_t = pl.col("_threads").cast(pl.Float64).log(2)
    gap = pl.min_horizontal([(log_t - c.cast(pl.Float64).log(2)).abs() for c in cand])
    rest_score = pl.col("_rest_pos").fill_null(_LAST / 1e3)
    score = pl.when(cand_pos.is_not_null()).then(rest_score * 10 + cand_pos).otherwise(_LAST + gap * 1e6 + rest_score)
    return out.select(score.cast(pl.Float64).alias("_s"))["_s"]


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


def baseline_names(features: KernelFeatures) -> list[str]:
    """The baselines that apply to a kernel, in report order."""
    names = ["chip_default" if features.threadgroup_param else "common_top10"]
    if features.thread_params:
        names.append("seed_candidates")
    return names + ["most_common_best", "nearest_shape", "other_device_best"]


def baseline_scores(features: KernelFeatures, train: pl.DataFrame, test: pl.DataFrame,
                    only: tuple[str, ...] | None = None) -> dict[str, pl.Series]:
    """Every baseline's scores for the test rows, trained on `train` (method name -> scores); `only`: just
    these (any of BASELINES, whether or not it is one the kernel reports)."""
    make = {
        "chip_default": lambda: _chip_default(features, train, test),
        "common_top10": lambda: _common_top10(train, test),
        "seed_candidates": lambda: _seed_candidates(features, train, test),
        "most_common_best": lambda: _most_common_best(train, test),
        "nearest_shape": lambda: _nearest_shape(features, train, test),
        "other_device_best": lambda: _other_device_best(features, train, test),
    }
    return {name: make[name]() for name in (baseline_names(features) if only is None else only)}
