"""One of evaluate's baselines (models/baselines.py) as a ranker: a member or guard of the ensembles."""

from __future__ import annotations

import numpy as np
import polars as pl

from zmlx_pipeline.models import baselines as _baselines
from zmlx_pipeline.models.features import CASE, KernelFeatures
from zmlx_pipeline.models.rankers.base import ModelError, Ranker


class BaselineRanker(Ranker):
    """One of evaluate's baselines (models/baselines.py) as a ranker: it keeps the training rows the
    baseline reads and scores each case by the baseline's rank of its configs (0 = first, 1 = last).
    Where the baseline has nothing to say about a case (no other device measured its shape, no
    threadgroup parameter), the case is ranked by `common_top10`, which always has an order."""

    def __init__(self, features: KernelFeatures, baseline: str, name: str | None = None) -> None:
        super().__init__(features)
        if baseline not in _baselines.BASELINES:
            raise ModelError(f"unknown baseline {baseline!r}; expected one of {', '.join(_baselines.BASELINES)}")
        self.baseline = baseline
        self.name = name or f"baseline_{baseline}"
        self.train: pl.DataFrame | None = None

    def fit(self, train: pl.DataFrame) -> "BaselineRanker":
        if train.is_empty():
            raise ModelError(f"{self.features.kernel}: no training rows")
        keep = [c for c in train.columns if c in (*CASE, "config_key", "log_time", "log_rel")
                or c.startswith(("cfg_", "shape_log2_"))]
        self.train = train.select(keep)
        return self

    def score(self, test: pl.DataFrame) -> np.ndarray:
        if self.baseline in _baselines.baseline_names(self.features):
            raw = _baselines.baseline_scores(self.features, self.train, test, only=(self.baseline,))[self.baseline]
        else:
            raw = pl.Series("_s", [None] * test.height, dtype=pl.Float64)
        fill = _baselines.baseline_scores(self.features, self.train, test, only=("common_top10",))["common_top10"]
        ranked = test.select(CASE).with_columns(raw.cast(pl.Float64).alias("_b"), fill.cast(pl.Float64).alias("_f"))
        # a case the baseline does not know: every row null, all ordered by common_top10 instead
        key = pl.when(pl.col("_b").is_null().all().over(CASE)).then(pl.col("_f")).otherwise(pl.col("_b").fill_null(
            2 * _baselines.LAST))
        rank = (key.rank("ordinal").over(CASE) - 1) / pl.max_horizontal(pl.len().over(CASE) - 1, pl.lit(1))
        return ranked.select(rank.cast(pl.Float64).alias("_r"))["_r"].to_numpy()
