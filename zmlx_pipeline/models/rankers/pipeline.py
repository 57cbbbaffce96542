"""A scikit-learn Pipeline as a ranker, its boosting regressor, and the feature set shared across devices."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
from sklearn.ensemble import HistGradientBoostingRegressor

from zmlx_pipeline.models.features import TARGETS, KernelFeatures
from zmlx_pipeline.models.rankers.base import (
    ModelError,
    Ranker,
    fit_cached,
    fit_sample,
    make_pipeline,
    predict_distinct,
    top_weights,
)


class PipelineRanker(Ranker):
    """A scikit-learn Pipeline regressing log time, or the clipped per-case normalised log time."""

    # class-level default, for rankers restored from model files saved before the attribute existed
    top_weight: float = 0.0
    top_scale: float = 0.1

    def __init__(self, features: KernelFeatures, estimator, target: str = "log_time",
                 clip: float | None = None, top_weight: float = 0.0, top_scale: float = 0.1,
                 name: str = "pipeline") -> None:
        super().__init__(features)
        if target not in TARGETS:
            raise ModelError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
        if top_weight < 0 or top_scale <= 0:
            raise ModelError(f"top_weight must be >= 0 and top_scale > 0, got {top_weight}, {top_scale}")
        if top_weight and target != "log_rel":
            raise ModelError("top_weight weighs rows by log(time / case best): it needs target log_rel")
        self.pipeline = make_pipeline(features, estimator)
        self.target = target
        self.clip = clip
        self.top_weight = top_weight
        self.top_scale = top_scale
        self.name = name

    def fit(self, train: pl.DataFrame) -> "PipelineRanker":
        if train.is_empty():
            raise ModelError(f"{self.features.kernel}: no training rows")
        train = fit_sample(train)
        y = train[self.target].to_numpy()
        weight = top_weights(y, self.top_weight, self.top_scale) if self.top_weight else None
        if self.clip is not None:
            y = np.minimum(y, self.clip)
        self.pipeline = fit_cached(self.pipeline, train.select(self.features.features), y, weight)
        return self

    def score(self, test: pl.DataFrame) -> np.ndarray:
        return predict_distinct(self.pipeline, test.select(self.features.features))


def boosting_regressor(random_state: int = 0, max_iter: int = 200, learning_rate: float = 0.1) -> HistGradientBoostingRegressor:
    """The gradient-boosting regressor of the `gbr*` members (200 trees of 31 leaves, no early stopping):
    public, since the benchmarks time this very model as the machine's speed."""
    return HistGradientBoostingRegressor(max_iter=max_iter, learning_rate=learning_rate, max_leaf_nodes=31,
                                         early_stopping=False, random_state=random_state)


def shared_features(features: KernelFeatures, geometry: bool | None = None) -> KernelFeatures:
    """The features of a model shared across devices: config, shape and ratio columns plus the vendor
    (and, with `geometry`, the launch geometry relative to the device: features.py's `geo_*`; None:
    only a geometry the kernel declares, KernelSpec.tiles, since one inferred from Kernel Tuner's
    parameter names hurt there, see notes/learning.md).

    Without the finer device specs a tree model cannot memorise the few training devices;
    what tells one device from another is left to the prior it is ensembled with.
    """
    numeric = tuple(c for c in features.numeric
                    if c.startswith(("cfg_", "ratio_", "shape_")) or c == "dtype_bytes")
    if geometry or (geometry is None and getattr(features, "geometry_declared", False)):
        numeric += tuple(getattr(features, "geometry", ()))
    numeric = tuple(c for c in numeric if c not in _DEVICE_RELATIVE)
    return replace(features, numeric=numeric,
                   categorical=tuple(c for c in features.categorical if c in ("dev_vendor", "dev_backend")
                                     or c.startswith("cfg_")))


_DEVICE_RELATIVE = ("cfg_log2_threads_per_simd", "cfg_log2_threads_per_max", "cfg_log2_threads_per_default",
                    "cfg_simd_aligned")
