"""Device transfer: one config model per training device, averaged by how close each device's specs are."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import numpy as np
import polars as pl
from sklearn.ensemble import HistGradientBoostingRegressor

from zmlx_pipeline.models.derived import SHARED_ONLY_PREFIX
from zmlx_pipeline.models.features import CASE, DISTANCE_SPECS, KernelFeatures
from zmlx_pipeline.models.rankers.base import (
    CLIP_LOG_REL,
    PRIOR_TAU,
    VENDOR_PENALTY,
    ModelError,
    Ranker,
    distinct_rows,
    fit_cached,
    fit_sample,
    make_pipeline,
    predict_distinct,
    relative_to_case,
    top_weights,
)
from zmlx_pipeline.models.rankers.pipeline import shared_features

TRANSFER_DEVICE_ROWS = 8_000  # rows each per-device model of DeviceTransferRanker sees at most
# The weights of the core-count column in the device distance among which `transfer_cores` chooses by leaving
# one training device out (1: every spec column counts the same). A chip's own core-limited runs (MPS on
# NVIDIA, binned Apple chips) differ from it in core count alone, so equal weights put them nearest, though
# launch configs may follow the core count more than the memory figures. Not the default: on `data/` it costs a
# left-out H100's rmsnorm more than its interval (notes/learning.md, "Core count in the device distance").
CORE_WEIGHTS = (1.0, 4.0, 16.0)
EQUAL_WEIGHTS = (1.0,)
CORE_COLUMN = "dev_log2_gpu_cores"
SELECT_CASES = 40  # cases of each training device the choice of core weight scores, at most
SELECT_KS = (1, 5)


def spec_distances(test_specs: np.ndarray, train_specs: np.ndarray, test_vendor: Sequence[str],
                   train_vendor: Sequence[str], vendor_penalty: float = VENDOR_PENALTY,
                   column_weights: np.ndarray | None = None) -> np.ndarray:
    """Device distance (test x train): weighted RMS of log2 specs z-scored over the training devices
    (`column_weights`, one per spec column; None: equal), plus a penalty across vendors. Specs all training
    devices share carry no distance (nothing to learn from them); only the training devices set the scale,
    so any new device can be placed."""
    mean, std = train_specs.mean(axis=0), train_specs.std(axis=0)
    keep = std > 0
    if keep.any():
        a = (test_specs[:, keep] - mean[keep]) / std[keep]
        b = (train_specs[:, keep] - mean[keep]) / std[keep]
        squares = (a[:, None, :] - b[None, :, :]) ** 2
        if column_weights is None:
            dist = np.sqrt(squares.mean(axis=-1))
        else:
            w = np.asarray(column_weights, dtype=float)[keep]
            dist = np.sqrt((w * squares).sum(axis=-1) / w.sum())
    else:
        dist = np.zeros((len(test_specs), len(train_specs)))
    vendor = np.asarray(test_vendor, dtype=object)[:, None] != np.asarray(train_vendor, dtype=object)[None, :]
    return dist + vendor_penalty * vendor


def _device_table(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per device of a feature frame: its log2 distance specs and vendor."""
    cols = [f"dev_log2_{c}" for c in DISTANCE_SPECS if f"dev_log2_{c}" in frame.columns]
    vendor = pl.col("dev_vendor").first() if "dev_vendor" in frame.columns else pl.lit("unknown")
    return frame.group_by("device_id").agg(*[pl.col(c).first().fill_null(0.0) for c in cols],
                                           vendor.alias("_vendor")).sort("device_id")


def transfer_features(features: KernelFeatures, geometry: bool | None = None) -> KernelFeatures:
    """The features of one device's config model: config, shape and ratio columns (no device columns;
    with `geometry`, the launch geometry relative to the device, which moves with the test device;
    None: the geometry a kernel declares, see shared_features), less the declared features a kernel
    keeps out of per-device models (Feature.per_device False)."""
    shared = shared_features(features, geometry=geometry)
    return replace(shared, numeric=tuple(c for c in shared.numeric if not c.startswith(SHARED_ONLY_PREFIX)),
                   categorical=tuple(c for c in shared.categorical if not c.startswith("dev_")))


def _device_gbr() -> HistGradientBoostingRegressor:
    """The per-device config model of `transfer`: small boosting (one device's rows are few)."""
    return HistGradientBoostingRegressor(max_iter=60, learning_rate=0.15, max_leaf_nodes=31,
                                         early_stopping=False, random_state=0)


def _device_gbr_light() -> HistGradientBoostingRegressor:
    """`transfer_light`'s per-device model: a third of `transfer`'s trees, each a larger step."""
    return HistGradientBoostingRegressor(max_iter=20, learning_rate=0.4, max_leaf_nodes=31,
                                         early_stopping=False, random_state=0)


def _device_gbr_half() -> HistGradientBoostingRegressor:
    """`transfer_half`'s per-device model: half of `transfer`'s trees, each twice the step."""
    return HistGradientBoostingRegressor(max_iter=30, learning_rate=0.3, max_leaf_nodes=31,
                                         early_stopping=False, random_state=0)


# estimators of DeviceTransferRanker by name (rankers store the name, never the function)
_ESTIMATORS: dict[str, Callable[[], object]] = {"gbr": _device_gbr, "gbr_light": _device_gbr_light,
                                                "gbr_half": _device_gbr_half}


class DeviceTransferRanker(Ranker):
    """kNN over devices: one config model per training device, averaged by spec similarity.

    Each training device gets its own Pipeline on config, shape and ratio features, fit on the
    clipped log(time / case best) with rows near the case's best weighted up (a ranking-loss
    surrogate: the order at the top is what a pick needs). A test row's score is the mean of
    the device models' predictions (each relative to its best in the case), weighted
    exp(-distance / tau) by how close each training device's specs are to the row's device, so
    a seen device mostly follows its own model and a new one its nearest neighbours.
    """

    # class-level default for rankers restored by from_state() from model files saved before the choice
    core_weight: float = 1.0

    def __init__(self, features: KernelFeatures, estimator: str = "gbr", tau: float = PRIOR_TAU,
                 vendor_penalty: float = VENDOR_PENALTY, top_weight: float = 4.0, top_scale: float = 0.1,
                 device_rows: int = TRANSFER_DEVICE_ROWS, geometry: bool | None = None,
                 core_weights: Sequence[float] = EQUAL_WEIGHTS, name: str = "transfer") -> None:
        super().__init__(features)
        if not core_weights or any(not np.isfinite(w) or w <= 0 for w in core_weights):
            raise ModelError(f"core weights must be finite and above 0, not {tuple(core_weights)}")
        self.core_weights = tuple(float(w) for w in core_weights)
        self.core_weight = self.core_weights[0]
        if estimator not in _ESTIMATORS:
            raise ModelError(f"unknown estimator {estimator!r}; expected one of {', '.join(_ESTIMATORS)}")
        self.estimator = estimator
        self.tau = tau
        self.vendor_penalty = vendor_penalty
        self.top_weight = top_weight
        self.top_scale = top_scale
        self.device_rows = device_rows
        self.geometry = geometry
        self.name = name

    def fit(self, train: pl.DataFrame) -> "DeviceTransferRanker":
        if train.is_empty():
            raise ModelError(f"{self.features.kernel}: no training rows")
        own = transfer_features(self.features, getattr(self, "geometry", False))
        devices = _device_table(train)
        self.device_ids = devices["device_id"].to_list()
        self.device_specs = devices.drop("device_id", "_vendor").to_numpy().astype(float)
        self.device_vendors = devices["_vendor"].to_list()
        self.spec_columns = [c for c in devices.columns if c not in ("device_id", "_vendor")]
        self.pipelines = []
        for device_id in self.device_ids:
            rows = fit_sample(train.filter(pl.col("device_id") == device_id), max_rows=self.device_rows)
            log_rel = rows["log_rel"].to_numpy()
            pipeline = fit_cached(make_pipeline(own, _ESTIMATORS[self.estimator]()), rows.select(own.features),
                                  np.minimum(log_rel, CLIP_LOG_REL),
                                  top_weights(log_rel, self.top_weight, self.top_scale))
            self.pipelines.append(pipeline)
        self.core_weight = self._choose_core_weight(train, own)
        return self

    def _column_weights(self, core_weight: float) -> np.ndarray | None:
        """Per spec column, its weight in the distance (None: all equal, the distance as it always was)."""
        if core_weight == 1.0:
            return None
        return np.array([core_weight if c == CORE_COLUMN else 1.0 for c in self.spec_columns])

    def _weights(self, specs: np.ndarray, vendors: Sequence[str], sources: Sequence[int], core_weight: float) -> np.ndarray:
        """Weights (test devices x `sources`, rows sum to 1) of the training devices `sources`."""
        dist = spec_distances(specs, self.device_specs[list(sources)], vendors,
                              [self.device_vendors[j] for j in sources], self.vendor_penalty,
                              self._column_weights(core_weight))
        w = np.exp(-(dist - dist.min(axis=1, keepdims=True)) / self.tau)
        return w / w.sum(axis=1, keepdims=True)

    def _choose_core_weight(self, train: pl.DataFrame, own: KernelFeatures) -> float:
        """The core weight of lowest mean log regret@1 and @5 when each training device is ranked from the
        others' models (leave one training device out; no refit: a device's model sees its rows only); the
        first of `core_weights` on ties, and with fewer than 3 training devices, where one source is left."""
        if len(self.core_weights) < 2 or len(self.device_ids) < 3 or CORE_COLUMN not in self.spec_columns:
            return self.core_weights[0]
        losses = np.zeros(len(self.core_weights))
        for i, device_id in enumerate(self.device_ids):
            rows = train.filter(pl.col("device_id") == device_id)
            cases = rows.select(CASE).unique(maintain_order=True)
            if cases.height > SELECT_CASES:
                cases = cases.sample(SELECT_CASES, seed=0)
                rows = rows.join(cases, on=list(CASE), how="semi", maintain_order="left")
            X = rows.select(own.features)
            distinct = distinct_rows(X)
            sources = [j for j in range(len(self.device_ids)) if j != i]
            preds = np.stack([relative_to_case(rows, predict_distinct(self.pipelines[j], X, distinct)) for j in sources])
            specs = self.device_specs[i:i + 1]
            for c, core_weight in enumerate(self.core_weights):
                w = self._weights(specs, [self.device_vendors[i]], sources, core_weight)[0]
                losses[c] += _log_regret(rows, w @ preds, SELECT_KS)
        return self.core_weights[_first_min(losses)]

    def device_weights(self, test: pl.DataFrame) -> tuple[list[str], np.ndarray]:
        """The test frame's devices and their weights over the training devices (rows sum to 1)."""
        devices = _device_table(test)
        specs = devices.select(self.spec_columns).to_numpy().astype(float)
        return devices["device_id"].to_list(), self._weights(specs, devices["_vendor"].to_list(),
                                                             range(len(self.device_ids)), self.core_weight)

    def score(self, test: pl.DataFrame) -> np.ndarray:
        own = transfer_features(self.features, getattr(self, "geometry", False))
        ids, weights = self.device_weights(test)
        row_weights = test.select("device_id").join(
            pl.DataFrame({"device_id": ids, "_i": list(range(len(ids)))}, schema={"device_id": pl.String, "_i": pl.Int64}),
            on="device_id", how="left", maintain_order="left")["_i"].to_numpy()
        X = test.select(own.features)
        distinct = distinct_rows(X)  # once for every device's pipeline (they all see the same columns)
        total = np.zeros(test.height)
        for j, pipeline in enumerate(self.pipelines):
            total += weights[row_weights, j] * relative_to_case(test, predict_distinct(pipeline, X, distinct))
        return total


def _first_min(values: np.ndarray) -> int:
    """The index of the lowest value, the first of ties within 1e-12."""
    return int(np.flatnonzero(values <= values.min() + 1e-12)[0])


def _log_regret(rows: pl.DataFrame, scores: np.ndarray, ks: Sequence[int]) -> float:
    """Mean over `ks` of the mean over cases of log(time of the best of the k lowest-scored configs / case best)."""
    ranked = rows.select(*CASE, "log_rel").with_columns(pl.Series("_score", scores, dtype=pl.Float64)).with_columns(
        _rank=pl.col("_score").rank("ordinal").over(list(CASE)))
    return float(np.mean([ranked.filter(pl.col("_rank") <= k).group_by(CASE).agg(pl.col("log_rel").min())
                          ["log_rel"].mean() for k in ks]))
