"""Per-kernel models that rank a kernel's configs for one (device, kernel, dtype, shape) case.

Every model is a `Ranker`: fit on a kernel's feature frame (features.KernelFeatures.frame),
then `score` test rows; lower is better and scores compare within a case. The learned ones
are one scikit-learn `Pipeline(ColumnTransformer(...), estimator)` each, so training and
prediction cannot drift apart. Variants (MODEL_VARIANTS):

- `gbr`: HistGradientBoostingRegressor on log time, every feature (the plain model);
- `gbr_rel`, `rf_rel`, `et_rel`: gradient boosting / random forest / extra trees, every
  feature, on the per-case normalised target log(time / best time of the case), clipped at
  4x: a ranking target that spends no capacity on how slow the bad configs are;
- `gbr_shared`, `et_shared`: the same target from config, shape and ratio features and the
  device vendor only: what holds across the devices of a vendor;
- `prior`: no fitting, a config-only prior: each config's mean log(time / best) over the
  nearest training cases, weighted by how close each case's device (normalised spec
  distance, plus a penalty across vendors), shape and dtype are; `prior_uniform` weighs the
  training cases alike;
- `prior_shared`: mean of `prior` and `gbr_shared` (the first default);
- `transfer`, `transfer_et`: kNN over devices: one config model per training device
  (boosting with rows near each case's best weighted up / extra trees), their predictions
  averaged with weights by spec similarity to the test device;
- `simd_aligned`: a rule, no fitting: launch groups that fill whole SIMD groups first;
- `gbr_med`: `gbr_shared` plus the launch geometry (features.py's geo_*), on log(time / case
  median), clipped at 4x;
- `prior_rank_uniform`: `prior_uniform` averaging each config's rank in its case (rank_pct)
  instead of its log(time / best): a device whose bad configs are 100x slow weighs no more
  than one where they are 1.2x;
- `transfer_geo`: `transfer` whose per-device models also see the launch geometry relative
  to the device (blocks per core, wave quantisation), which moves with the test device;
- launch geometry a kernel declares (KernelSpec.tiles: matmul's tiles, waves over the cores,
  tile waste; features.py's geo_*) is in `gbr_shared`'s and `transfer`'s features by default
  (shared_features); geometry inferred from Kernel Tuner names only in the `*_geo`/`gbr_med` variants;
- `ensemble` (the default): `prior`, `transfer`, `gbr_shared` and `simd_aligned` weighted,
  and its top k hedged with `prior`, `transfer` and `prior_uniform`, as cross-validation on
  the training rows alone decides: leaving training devices out for devices never measured,
  holding out training shapes for seen devices (CVEnsembleRanker);
- `ensemble_light`: the same with `gbr_shared_light` (50 trees, not 200) and `transfer_light`
  (20 trees per device, not 60): under half the fitting time, picks that move a little either way
  (notes/learning.md, "Training and evaluation time").
- `split_rel`: a different model for the devices seen in training (the mean of `gbr_rel`,
  `gbr_rel_clip2`, clipped at 2x, and `gbr_rel_top`, each case's fastest configs weighted up) and
  for new devices (`ensemble`, its unseen setting only): SeenUnseenRanker;
- `baseline_<name>`: one of evaluate's baselines (models/baselines.py) as a ranker (BaselineRanker);
- `robust`: `ensemble` whose nested inner selection may also let a baseline lead (only when the inner
  folds hold enough cases and the baseline wins most of them) and interleaves the best baselines into
  its top k where the inner folds say so (CVEnsembleRanker's guards; notes/ranker-selection.md);
- `stacked`: the ensemble with `baseline_other_device_best` and `baseline_common_top10` as weighted members;
- `gbr_shared_top`: `gbr_shared` with each case's fastest configs weighted up (a ranking objective on
  relative time); `rank_guarded`: it alone, guarded as `robust` is;

The default was chosen by the scores of evaluate.py (leave-one-device-out on the Kernel Tuner
files, both splits on our H100/H200 data); its weights are never fitted on the rows it is
scored on (in evaluate.py the inner folds lie inside the outer training rows). Rankers keep
only data (numbers, strings, frames, arrays, sklearn objects and other rankers) so
models/persist.py can store them without pickles.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np
import polars as pl
from sklearn.base import clone
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import ExtraTreesRegressor, HistGradientBoostingRegressor, RandomForestRegressor
from sklearn.neighbors import KDTree
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.models import baselines as _baselines
from zmlx_pipeline.models.derived import SHARED_ONLY_PREFIX
from zmlx_pipeline.models.features import CASE, DISTANCE_SPECS, TARGETS, KernelFeatures, device_distances

CLIP_LOG_REL = math.log(4.0)  # configs 4x slower than the case's best are all just "bad"
VENDOR_PENALTY = 2.0          # in units of the normalised spec distance
PRIOR_TAU = 0.5               # similarity kernel width: weight = exp(-distance / tau)
PRIOR_NEIGHBOURS = 8          # training cases that vote for each test case
TRANSFER_DEVICE_ROWS = 8_000  # rows each per-device model of DeviceTransferRanker sees at most
_SHAPE_WEIGHT = 1.0           # distance per unit of log2 shape dimension
_DTYPE_PENALTY = 1.0


class ModelError(ZmlxPipelineError, ValueError):
    "A model could not be built, trained or applied"


def make_pipeline(features: KernelFeatures, estimator) -> Pipeline:
    """Features and estimator in one Pipeline: numeric columns as is, categorical ones one-hot."""
    transformers = [("num", "passthrough", list(features.numeric))]
    if features.categorical:
        transformers.append(("cat", OneHotEncoder(handle_unknown="ignore", sparse_output=False),
                             list(features.categorical)))
    return Pipeline([("features", ColumnTransformer(transformers)), ("model", estimator)])


def relative_to_case(frame: pl.DataFrame, scores: np.ndarray) -> np.ndarray:
    """Scores minus the lowest score of their case (case columns taken from `frame`)."""
    out = frame.select(CASE).with_columns(pl.Series("_s", np.asarray(scores, dtype=float)))
    return out.select(pl.col("_s") - pl.col("_s").min().over(CASE)).to_series().to_numpy()


class Ranker(ABC):
    """Orders a kernel's configs within each case: fit on training rows, score test rows."""

    name = "ranker"

    def __init__(self, features: KernelFeatures) -> None:
        self.features = features

    @abstractmethod
    def fit(self, train: pl.DataFrame) -> "Ranker":
        """Learn from feature-frame rows (ok measurements only)."""

    @abstractmethod
    def score(self, test: pl.DataFrame) -> np.ndarray:
        """One score per row, lower is better; NaN where the model has nothing to say."""

    def to_state(self) -> dict:
        """The fitted ranker's attributes, for models/persist.py: plain values, KernelFeatures, polars
        frames, numpy arrays, sklearn objects and other rankers (anything else is refused there)."""
        return dict(vars(self))

    @classmethod
    def from_state(cls, state: dict) -> "Ranker":
        """A ranker from to_state()'s attributes, without __init__ or fit (nothing is recomputed)."""
        ranker = cls.__new__(cls)
        ranker.__dict__.update(state)
        return ranker



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


MAX_FIT_ROWS = 50_000  # rows one scikit-learn fit sees at most (fit time grows with rows; see fit_sample)
FIT_SAMPLE_TOP = 8     # ... always including each case's fastest configs


def fit_sample(train: pl.DataFrame, max_rows: int = MAX_FIT_ROWS, top: int = FIT_SAMPLE_TOP,
               seed: int = 0) -> pl.DataFrame:
    """At most about `max_rows` training rows: every case's `top` fastest configs, then a uniform
    random share (fixed seed) of the other rows. Fewer rows pass through unchanged.

    A learned fit costs time in proportion to its rows (about 2.5 s per 50k rows on one core for
    the 200-tree boosting models), so on a 1M-row store each fit is capped: the ranking is decided
    among the fast configs, which are all kept; the slow ones only need to be seen to be slow.
    """
    if train.height <= max_rows:
        return train
    rank = pl.col("log_time").rank("ordinal").over(CASE)
    ranked = train.with_columns((rank <= top).alias("_top"))
    n_top = int(ranked["_top"].sum())
    share = max(max_rows - n_top, 0) / max(train.height - n_top, 1)
    draw = pl.Series("_u", np.random.default_rng(seed).random(train.height))
    return ranked.with_columns(draw).filter(pl.col("_top") | (pl.col("_u") < share)).drop("_top", "_u")


def distinct_rows(X: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray | None]:
    """X's distinct rows (in order of first appearance) and each row's index among them; (X, None) when
    deduplicating would not pay (under 10,000 rows, or over 80% of them distinct)."""
    if X.height < 10_000:
        return X, None
    groups = X.with_row_index("_i").group_by(X.columns, maintain_order=True).agg(pl.col("_i"))
    if groups.height > 0.8 * X.height:
        return X, None
    rows = groups.select("_i", pl.int_range(0, pl.len(), dtype=pl.Int64).alias("_g")).explode("_i")
    inverse = np.empty(X.height, dtype=np.int64)
    inverse[rows["_i"].to_numpy()] = rows["_g"].to_numpy()
    return groups.select(X.columns), inverse


def predict_distinct(pipeline: Pipeline, X: pl.DataFrame,
                     distinct: tuple[pl.DataFrame, np.ndarray | None] | None = None) -> np.ndarray:
    """pipeline.predict(X), computed once per distinct feature row (rows of devices whose features a
    model does not see repeat; prediction time grows with rows). `distinct`: distinct_rows(X), when
    several pipelines predict on the same X (DeviceTransferRanker: one per training device)."""
    unique, inverse = distinct if distinct is not None else distinct_rows(X)
    pred = np.asarray(pipeline.predict(unique), dtype=float)
    return pred if inverse is None else pred[inverse]


def top_weights(log_rel: np.ndarray, top_weight: float, top_scale: float) -> np.ndarray:
    """Row weights 1 + top_weight * exp(-log_rel / top_scale): each case's fastest configs count up to
    (1 + top_weight) times (a ranking-loss surrogate: the order at the top is what a pick needs)."""
    return 1.0 + top_weight * np.exp(-log_rel / top_scale)


FIT_CACHE_SIZE = 256  # fitted pipelines kept by fit_cached (per process; a few MB each at most)
_FIT_CACHE: "OrderedDict[str, Pipeline]" = OrderedDict()


def _fit_key(pipeline: Pipeline, X: pl.DataFrame, y: np.ndarray, weight: np.ndarray | None) -> str:
    """A digest of everything a pipeline's fit depends on: its steps' parameters, the feature columns in
    order, the rows (in order), the target and the sample weights."""
    h = hashlib.sha256()
    for name, step in pipeline.steps:
        params = step.get_params(deep=False)
        h.update(f"{name}|{type(step).__name__}|".encode())
        h.update(repr(sorted((k, repr(v)) for k, v in params.items())).encode())
    h.update(repr(list(X.schema.items())).encode())
    h.update(X.height.to_bytes(8, "little"))
    if X.width:
        for seed in (0, 1):  # 128 bits per row
            h.update(X.hash_rows(seed=seed).to_numpy().tobytes())
    h.update(np.ascontiguousarray(y, dtype="<f8").tobytes())
    h.update(b"-" if weight is None else np.ascontiguousarray(weight, dtype="<f8").tobytes())
    return h.hexdigest()


def fit_cached(pipeline: Pipeline, X: pl.DataFrame, y: np.ndarray, weight: np.ndarray | None = None) -> Pipeline:
    """A fitted copy of `pipeline` on (X, y, weight); the same fit asked again returns the same fitted
    object (never refit: callers only predict with it).

    The ensemble's inner folds and the evaluation's outer folds fit many models on identical rows
    (a per-device `transfer` model sees only its device's rows, which leaving another device out does
    not change), and a fit is deterministic: this only skips repeated work, results are unchanged.
    """
    key = _fit_key(pipeline, X, y, weight)
    hit = _FIT_CACHE.get(key)
    if hit is not None:
        _FIT_CACHE.move_to_end(key)
        return hit
    fitted = clone(pipeline)
    if weight is None:
        fitted.fit(X, y)
    else:
        fitted.fit(X, y, model__sample_weight=weight)
    _FIT_CACHE[key] = fitted
    while len(_FIT_CACHE) > FIT_CACHE_SIZE:
        _FIT_CACHE.popitem(last=False)
    return fitted


def clear_fit_cache() -> None:
    """Forget every cached fit (fit_cached)."""
    _FIT_CACHE.clear()


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


class PriorRanker(Ranker):
    """Config-only prior: similarity-weighted mean log(time / best) of each config over training cases."""

    def __init__(self, features: KernelFeatures, vendor_penalty: float = VENDOR_PENALTY,
                 tau: float = PRIOR_TAU, neighbours: int = PRIOR_NEIGHBOURS, uniform: bool = False,
                 target: str = "log_rel", name: str = "prior") -> None:
        super().__init__(features)
        if target not in ("log_rel", "rank_pct"):
            raise ModelError(f"unknown prior target {target!r}; expected log_rel or rank_pct")
        self.target = target
        self.vendor_penalty = vendor_penalty
        self.tau = tau
        self.neighbours = neighbours
        self.uniform = uniform
        self.name = name
        ids, dist = device_distances(features.devices, vendor_penalty=vendor_penalty) \
            if features.devices is not None and not features.devices.is_empty() else ([], np.zeros((0, 0)))
        self._device_distance = pl.DataFrame({
            "device_id": [a for a in ids for _ in ids],
            "_train_device": [b for _ in ids for b in ids],
            "_ddist": dist.reshape(-1).tolist(),
        }, schema={"device_id": pl.String, "_train_device": pl.String, "_ddist": pl.Float64})

    def _cases(self, frame: pl.DataFrame) -> pl.DataFrame:
        # in the frame's order: the KD-tree's choice among equally near shapes follows the order of its
        # points, and polars' group_by order without maintain_order changes from call to call
        dims = [f"shape_log2_{d}" for d in self.features.shape_dims]
        return frame.group_by(CASE, maintain_order=True).agg([pl.col(c).first() for c in dims])

    def fit(self, train: pl.DataFrame) -> "PriorRanker":
        if train.is_empty():
            raise ModelError(f"{self.features.kernel}: no training rows")
        value = (pl.col("rank_pct") if getattr(self, "target", "log_rel") == "rank_pct"
                 else pl.col("log_rel").clip(upper_bound=CLIP_LOG_REL))
        self._train = train.select(*CASE, "config_key", value.alias("_v"))
        self._train_cases = self._cases(train)
        return self

    def _neighbours(self, tc: pl.DataFrame) -> pl.DataFrame:
        """Each test case's `neighbours` nearest training cases: CASE, the neighbour's _t_ CASE, _dist.

        Device and dtype terms are constant within a (kernel, device, dtype) group of training
        cases, so the nearest cases overall are among each group's nearest shapes: one KD-tree
        query per group, never a cross join (the cost grows with cases, not cases squared).
        """
        dims = [f"shape_log2_{d}" for d in self.features.shape_dims]
        queries = {key[0]: (q.select(CASE), q.select(dims).to_numpy() if dims else None)
                   for key, q in tc.partition_by("kernel", as_dict=True).items()}  # the same for every group
        parts = []
        for key, group in self._train_cases.partition_by(["kernel", "device_id", "dtype"], as_dict=True).items():
            if key[0] not in queries:
                continue
            query, points = queries[key[0]]
            k = min(self.neighbours, group.height)
            if dims:
                dist, idx = KDTree(group.select(dims).to_numpy()).query(points, k=k)
            else:
                dist, idx = np.zeros((query.height, k)), np.tile(np.arange(k), (query.height, 1))
            found = group.select([pl.col(c).alias("_t_" + c) for c in CASE])[idx.reshape(-1)]
            parts.append(pl.concat([query[np.repeat(np.arange(query.height), k)], found,
                                    pl.DataFrame({"_sd": dist.reshape(-1)})], how="horizontal"))
        if not parts:
            return pl.DataFrame(schema={**{c: pl.String for c in CASE}, **{"_t_" + c: pl.String for c in CASE},
                                        "_dist": pl.Float64})
        pairs = pl.concat(parts).join(self._device_distance, left_on=["device_id", "_t_device_id"],
                                      right_on=["device_id", "_train_device"], how="left")
        dist = (pl.col("_ddist").fill_null(0.0) + _SHAPE_WEIGHT * pl.col("_sd")
                + _DTYPE_PENALTY * (pl.col("dtype") != pl.col("_t_dtype")).cast(pl.Float64))
        pairs = pairs.with_columns(dist.alias("_dist")).sort([*CASE, "_dist", "_t_device_id", "_t_dtype", "_t_shape_key"])
        return pairs.group_by(CASE, maintain_order=True).head(self.neighbours).select(
            *CASE, *["_t_" + c for c in CASE], "_dist")

    def score(self, test: pl.DataFrame) -> np.ndarray:
        pairs = self._neighbours(self._cases(test))
        weight = pl.lit(1.0) if self.uniform else (-(pl.col("_dist") - pl.col("_dist").min().over(CASE))
                                                   / self.tau).exp()
        pairs = pairs.with_columns(weight.alias("_w")).select(*CASE, *["_t_" + c for c in CASE], "_w")
        train = self._train if "_v" in self._train.columns else self._train.rename({"log_rel": "_v"})  # older files
        votes = pairs.join(train.rename({c: "_t_" + c for c in CASE}), on=[f"_t_{c}" for c in CASE])
        prior = votes.group_by([*CASE, "config_key"]).agg(
            ((pl.col("_w") * pl.col("_v")).sum() / pl.col("_w").sum()).alias("_prior"))
        scored = test.select(*CASE, "config_key").join(prior, on=[*CASE, "config_key"], how="left",
                                                       maintain_order="left")
        # a config no neighbour measured goes after every config one did
        return scored.select(pl.col("_prior").fill_null(CLIP_LOG_REL + 1.0)).to_series().to_numpy()


class EnsembleRanker(Ranker):
    """Mean of its members' scores, each made relative to its best in the case."""

    def __init__(self, features: KernelFeatures, members: Sequence[Ranker], weights: Sequence[float] | None = None,
                 name: str = "ensemble") -> None:
        super().__init__(features)
        if not members:
            raise ModelError("an ensemble needs members")
        self.members = list(members)
        self.weights = list(weights) if weights is not None else [1.0] * len(self.members)
        self.name = name

    def fit(self, train: pl.DataFrame) -> "EnsembleRanker":
        for m in self.members:
            m.fit(train)
        return self

    def score(self, test: pl.DataFrame) -> np.ndarray:
        total = sum(w * relative_to_case(test, m.score(test)) for m, w in zip(self.members, self.weights))
        return total / sum(self.weights)


def spec_distances(test_specs: np.ndarray, train_specs: np.ndarray, test_vendor: Sequence[str],
                   train_vendor: Sequence[str], vendor_penalty: float = VENDOR_PENALTY) -> np.ndarray:
    """Device distance (test x train): RMS of log2 specs z-scored over the training devices, plus a
    penalty across vendors. Specs all training devices share carry no distance (nothing to learn
    from them); only the training devices set the scale, so any new device can be placed."""
    mean, std = train_specs.mean(axis=0), train_specs.std(axis=0)
    keep = std > 0
    if keep.any():
        a = (test_specs[:, keep] - mean[keep]) / std[keep]
        b = (train_specs[:, keep] - mean[keep]) / std[keep]
        dist = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).mean(axis=-1))
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


class DeviceTransferRanker(Ranker):
    """kNN over devices: one config model per training device, averaged by spec similarity.

    Each training device gets its own Pipeline on config, shape and ratio features, fit on the
    clipped log(time / case best) with rows near the case's best weighted up (a ranking-loss
    surrogate: the order at the top is what a pick needs). A test row's score is the mean of
    the device models' predictions (each relative to its best in the case), weighted
    exp(-distance / tau) by how close each training device's specs are to the row's device, so
    a seen device mostly follows its own model and a new one its nearest neighbours.
    """

    def __init__(self, features: KernelFeatures, estimator: str = "gbr", tau: float = PRIOR_TAU,
                 vendor_penalty: float = VENDOR_PENALTY, top_weight: float = 4.0, top_scale: float = 0.1,
                 device_rows: int = TRANSFER_DEVICE_ROWS, geometry: bool | None = None, name: str = "transfer") -> None:
        super().__init__(features)
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
        return self

    def device_weights(self, test: pl.DataFrame) -> tuple[list[str], np.ndarray]:
        """The test frame's devices and their weights over the training devices (rows sum to 1)."""
        devices = _device_table(test)
        specs = devices.select(self.spec_columns).to_numpy().astype(float)
        dist = spec_distances(specs, self.device_specs, devices["_vendor"].to_list(), self.device_vendors,
                              self.vendor_penalty)
        w = np.exp(-(dist - dist.min(axis=1, keepdims=True)) / self.tau)
        return devices["device_id"].to_list(), w / w.sum(axis=1, keepdims=True)

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


class AlignmentRanker(Ranker):
    """Device-aware rule, no fitting: launch groups that fill whole SIMD groups (threads a multiple
    of the device's SIMD width) before those that leave lanes idle; one order for kernels without
    thread parameters. An ensemble member whose weight the inner cross-validation decides."""

    def __init__(self, features: KernelFeatures, name: str = "simd_aligned") -> None:
        super().__init__(features)
        self.name = name

    def fit(self, train: pl.DataFrame) -> "AlignmentRanker":
        return self

    def score(self, test: pl.DataFrame) -> np.ndarray:
        if "cfg_simd_aligned" not in test.columns:
            return np.zeros(test.height)
        return 1.0 - test["cfg_simd_aligned"].fill_null(1.0).to_numpy().astype(float)


def _positions_in_runs(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sorted codes: each element's 0-based position within its run of equal codes, and the runs' starts."""
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    return np.arange(codes.size) - np.repeat(starts, np.diff(np.r_[starts, codes.size])), starts


class _FoldRegret:
    """Per fold of the inner selection: the mean over cases of the mean over ks of log(best time among
    the top k by score / best time), for many score vectors on one frame. Ranks by score, ties by
    config_key (as evaluate.case_regrets).

    Everything that does not depend on the scores is built once per fold: the rows sorted by case then
    config (so a stable sort by score keeps ties in config order), each case's run of rows, each row's
    position in its run and each case's best time. A score vector then costs two stable argsorts."""

    def __init__(self, frame: pl.DataFrame, ks: Sequence[int]) -> None:
        keys = frame.select(pl.concat_str([pl.col(c) for c in CASE], separator="\x1f")).to_series().to_numpy()
        case = np.unique(keys, return_inverse=True)[1].reshape(-1)
        config = np.unique(frame["config_key"].to_numpy(), return_inverse=True)[1].reshape(-1)
        median = frame["median_us"].to_numpy().astype(float)
        small = np.int16 if case.size == 0 or case.max() < np.iinfo(np.int16).max else np.int64
        self.ks = list(ks)
        self._by_config = np.lexsort((config, case))  # rows by case, then config
        self._by_row = np.argsort(case, kind="stable")  # rows by case, then row order
        self._case = case[self._by_config].astype(small)  # the same runs in either order
        self._median = median[self._by_config]
        position, self._starts = _positions_in_runs(self._case)
        self._top = {k: position < k for k in self.ks}
        self._position = position + 1.0
        self._best = np.minimum.reduceat(self._median, self._starts) if case.size else np.zeros(0)
        self.cases = int(self._starts.size)

    def _order(self, scores: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Indices into `rows` ordering them by case, then score (NaN last), ties as `rows` has them."""
        by_score = np.argsort(np.asarray(scores, dtype=float)[rows], kind="stable")
        return by_score[np.argsort(self._case[by_score], kind="stable")]

    def ranks(self, scores: np.ndarray) -> np.ndarray:
        """Each row's ordinal rank (1 = lowest score) in its case, ties in row order (interleave's ranks)."""
        out = np.empty(self._by_row.size, dtype=float)
        out[self._by_row[self._order(scores, self._by_row)]] = self._position
        return out

    def mean(self, scores: np.ndarray, ks: Sequence[int] | None = None) -> float:
        """Mean over cases of the mean over `ks` (default: the fold's) of log regret@k."""
        ks = self.ks if ks is None else list(ks)
        median = self._median[self._order(scores, self._by_config)]
        total = np.zeros(self._starts.size)
        for k in ks:
            top = self._top[k] if k in self._top else self._position <= k
            total += np.log(np.minimum.reduceat(np.where(top, median, np.inf), self._starts) / self._best)
        return float((total / len(ks)).mean())


def _first_min(values: np.ndarray) -> int:
    """Index of the lowest value; an earlier one wins within 1e-12 (equal weights, the model alone come first)."""
    values = np.asarray(values, dtype=float)
    return int(np.flatnonzero(values <= values.min() + 1e-12)[0])


def weight_grid(n: int, step: float) -> list[tuple[float, ...]]:
    """Every weight vector on the simplex with the given step, equal weights first (they win ties)."""
    m = round(1.0 / step)
    grid = [tuple(c / m for c in combo) for combo in itertools.product(range(m + 1), repeat=n) if sum(combo) == m]
    equal = tuple([1.0 / n] * n)
    return [equal] + [w for w in grid if not np.allclose(w, equal)]


# rows an inner fold of CVEnsembleRanker scores at most: above every inner fold of the committed data
# (the largest, one Kernel Tuner dedispersion device, holds 11k rows), so only bigger stores are thinned
INNER_TEST_ROWS = 30_000
# a guard baseline leads a robust ranker only when its nested inner log regret@1 is this much lower (1%)
GUARD_MARGIN = math.log(1.01)
GUARD_MIN_CASES = 30  # ... and only when its inner folds held this many cases in all


def sample_cases(frame: pl.DataFrame, cases: int, seed: int = 0) -> pl.DataFrame:
    """The rows of at most `cases` cases of the frame (a fixed random choice; all when fewer)."""
    keys = frame.select(CASE).unique().sort(CASE)
    if keys.height <= cases:
        return frame
    keep = keys[np.sort(np.random.default_rng(seed).choice(keys.height, cases, replace=False))]
    return frame.join(keep, on=list(CASE), how="semi", maintain_order="left")


def interleave_ranks(ranks: Sequence[np.ndarray]) -> np.ndarray:
    """interleave() from each list's ordinal ranks within the cases (_FoldRegret.ranks)."""
    n = len(ranks)
    return ((np.column_stack(ranks) - 1.0) * n + np.arange(n)[None, :]).min(axis=1)


def interleave(frame: pl.DataFrame, lists: Sequence[np.ndarray]) -> np.ndarray:
    """Scores that merge several rankings of each case round-robin: the first list's best, then
    each other list's best, then every list's second, ... (a config already placed keeps its
    first place). A top k drawn from several hypotheses, not k near-copies of one pick."""
    n = len(lists)
    ranks = frame.select(CASE).with_columns([pl.Series(f"_l{j}", np.asarray(v, dtype=float)) for j, v in enumerate(lists)])
    ranks = ranks.select([pl.col(f"_l{j}").rank("ordinal").over(CASE).cast(pl.Float64) for j in range(n)]).to_numpy()
    return interleave_ranks(list(ranks.T))


class CVEnsembleRanker(Ranker):
    """Weighted mean of member rankers, the weights chosen by cross-validation inside `fit`.

    Two settings, each picked by the mean log regret@1 and @5 over inner folds of the training
    rows only (equal weights and no hedging win ties): `weights_unseen`/`hedge_unseen` by
    leaving one training device out (ranking for a device never measured), `weights_seen`/
    `hedge_seen` by holding out training shapes (a seen device, a new shape). A test row uses
    the setting of its kind. The weights come from a simplex grid; hedging interleaves the
    weighted mean's ranking with each `hedges` ranker's own (see `interleave`), so the top k
    covers several hypotheses of what the new device or shape is like. Inner fits see at most
    `inner_rows` rows (every case's fastest configs kept) and inner folds score at most
    `inner_cases` cases and `inner_test_rows` rows (every case kept, with its fastest configs),
    which bounds their cost on big stores. With `only` ("seen" or "unseen") fit chooses just that
    setting, for a caller whose test rows are all of one kind (evaluate.py's folds). The final fit fits
    only the members and hedges the chosen setting(s) use (`needed`: a member of weight 0 that no
    hedging reads is left out; scores are unchanged).
    """

    # class-level defaults, for rankers restored by from_state() from model files saved before these
    # attributes existed (from_state skips __init__)
    inner_test_rows: int = INNER_TEST_ROWS
    fixed: dict | None = None
    only: str | None = None
    guards_seen: tuple = ()
    guards_unseen: tuple = ()
    policy_seen: dict = {"mode": "model", "baseline": None}
    policy_unseen: dict = {"mode": "model", "baseline": None}
    guard_rankers: dict = {}

    def __init__(self, features: KernelFeatures, members: Sequence[str], hedges: Sequence[str] = (),
                 step: float = 0.25, inner_rows: int = 6_000, inner_cases: int = 120,
                 inner_test_rows: int = INNER_TEST_ROWS, max_device_folds: int = 3,
                 shape_folds: int = 2, ks: Sequence[int] = (1, 5), guards_seen: Sequence[str] = (),
                 guards_unseen: Sequence[str] = (), name: str = "ensemble") -> None:
        super().__init__(features)
        if not members:
            raise ModelError("an ensemble needs members")
        unknown = [m for m in (*members, *hedges) if m not in MODEL_VARIANTS]
        if unknown:
            raise ModelError(f"unknown ensemble member(s) {', '.join(unknown)}")
        self.member_names = list(members)
        self.hedge_names = list(hedges)
        self.step = step
        self.inner_rows = inner_rows
        self.inner_cases = inner_cases
        self.inner_test_rows = inner_test_rows
        self.max_device_folds = max_device_folds
        self.shape_folds = shape_folds
        self.ks = list(ks)
        self.name = name
        unknown = [b for b in (*guards_seen, *guards_unseen) if b not in _baselines.BASELINES]
        if unknown:
            raise ModelError(f"unknown baseline(s) {', '.join(unknown)}")
        # baselines the nested selection may fall back to, or interleave with, per kind of test device
        self.guards_seen, self.guards_unseen = tuple(guards_seen), tuple(guards_unseen)
        self.policy_seen = {"mode": "model", "baseline": None}
        self.policy_unseen = {"mode": "model", "baseline": None}
        self.guard_rankers: dict[str, Ranker] = {}
        self.rankers: dict[str, Ranker] = {}
        equal = [1.0 / len(self.member_names)] * len(self.member_names)
        self.weights_seen, self.weights_unseen = list(equal), list(equal)
        self.hedge_seen = self.hedge_unseen = False
        self.train_devices: list[str] = []
        self.inner_scores: dict = {}
        self.fixed: dict | None = None  # selection() of another fit: skip the inner cross-validation
        # "seen" or "unseen": fit() chooses only that setting (its score() is then refused rows of the
        # other kind); evaluate.py sets it for a fold whose test devices are all seen, or all unseen
        self.only: str | None = None

    def _inner_folds(self, train: pl.DataFrame, split: str) -> list[tuple[pl.DataFrame, pl.DataFrame]]:
        """(inner training rows, inner test rows) per inner fold, all inside `train`: training devices left
        out one at a time (`devices`), or training shapes held out (`shapes`)."""
        if split == "devices":
            devices = sorted(train["device_id"].unique().to_list())
            if len(devices) < 2:
                return []
            if len(devices) > self.max_device_folds:
                devices = [devices[i] for i in np.linspace(0, len(devices) - 1, self.max_device_folds).round().astype(int)]
            return [(train.filter(pl.col("device_id") != d), train.filter(pl.col("device_id") == d)) for d in devices]
        shapes = sorted(train["shape_key"].unique().to_list())
        if len(shapes) < 2:
            return []
        n = min(self.shape_folds, len(shapes))
        folds = []
        for i in range(n):
            held = pl.col("shape_key").is_in(shapes[i::n])
            inner_train, inner_test = train.filter(~held), train.filter(held)
            inner_test = inner_test.filter(pl.col("device_id").is_in(inner_train["device_id"].unique().to_list()))
            if not inner_test.is_empty():
                folds.append((inner_train, inner_test))
        return folds

    def _names(self) -> list[str]:
        return list(dict.fromkeys([*self.member_names, *self.hedge_names]))

    def _total(self, frame: pl.DataFrame, scores: dict[str, np.ndarray], weights: Sequence[float]) -> np.ndarray:
        total = sum(w * scores[m] for m, w in zip(self.member_names, weights) if w)
        return np.asarray(total, dtype=float) if not np.isscalar(total) else np.zeros(frame.height)

    def _combine(self, frame: pl.DataFrame, scores: dict[str, np.ndarray], weights: Sequence[float],
                 hedge: bool) -> np.ndarray:
        total = self._total(frame, scores, weights)
        if not hedge or not self.hedge_names:
            return total
        return interleave(frame, [total, *[scores[h] for h in self.hedge_names]])

    def _select(self, train: pl.DataFrame, split: str) -> tuple[list[float], bool, float | None, dict]:
        """The grid weights and hedging with the lowest mean inner log regret, that regret (None: no folds)
        and the policy: the weighted model alone, or one of the setting's guard baselines alone, first, or
        after the model (see `_apply_policy`)."""
        equal = [1.0 / len(self.member_names)] * len(self.member_names)
        keep = {"mode": "model", "baseline": None}
        folds = self._inner_folds(train, split)
        if not folds:
            return equal, False, None, keep
        guards = [b for b in (self.guards_unseen if split == "devices" else self.guards_seen)
                  if b in _baselines.baseline_names(self.features)]
        per_fold = []
        for inner_train, inner_test in folds:
            sample = fit_sample(inner_train, max_rows=self.inner_rows)
            # at most inner_cases cases, and of a case with thousands of configs its fastest ones and a
            # share of the rest (fit_sample: every case is kept; the loss needs each case's best only)
            inner_test = fit_sample(sample_cases(inner_test, self.inner_cases),
                                    max_rows=self.inner_test_rows)
            scores = {m: relative_to_case(inner_test, make_ranker(self.features, m).fit(sample).score(inner_test))
                      for m in self._names()}
            regret = _FoldRegret(inner_test, self.ks)
            hedged = [regret.ranks(scores[h]) for h in self.hedge_names]  # the same for every weight vector
            # a baseline reads up to MAX_FIT_ROWS inner training rows (every case's fastest configs kept): all of
            # them on the committed data, a bounded group-by on a big store
            base_train = fit_sample(inner_train) if guards else inner_train
            base = {b: regret.ranks(BaselineRanker(self.features, b).fit(base_train).score(inner_test))
                    for b in guards}
            per_fold.append((inner_test, scores, regret, hedged, base))

        def combined(t, s, w, hedge, regret, hedged):  # _combine, with the hedges' ranks computed once
            total = self._total(t, s, w)
            return interleave_ranks([regret.ranks(total), *hedged]) if hedge else total

        candidates = [(list(w), hedge) for hedge in ([False, True] if self.hedge_names else [False])
                      for w in weight_grid(len(self.member_names), self.step)]
        loss = np.array([[regret.mean(combined(t, s, w, hedge, regret, hedged)) for t, s, regret, hedged, _ in per_fold]
                         for w, hedge in candidates])  # candidates x folds
        best = _first_min(loss.mean(axis=1))
        weights, hedge = candidates[best]
        if not guards:
            return weights, hedge, float(loss[best].mean()), keep
        # Nested: each inner fold is scored by the candidate the OTHER inner folds choose, so the model's
        # figures carry the cost of its own selection, as a baseline's do (it has none to make).
        first, last = min(self.ks), max(self.ks)
        model_k, base_k, ranks = {first: [], last: []}, {}, []
        for f, (t, s, regret, hedged, base) in enumerate(per_fold):
            others = [g for g in range(len(per_fold)) if g != f]
            c = _first_min(loss[:, others].mean(axis=1)) if others else 0
            model_ranks = regret.ranks(combined(t, s, *candidates[c], regret, hedged))
            ranks.append(model_ranks)
            for k in (first, last):
                model_k[k].append(regret.mean(model_ranks, [k]))
                for b, r in base.items():
                    base_k.setdefault(b, {first: [], last: []})[k].append(regret.mean(r, [k]))
        policy = self._guard_policy(per_fold, ranks, model_k, base_k, first, last)
        return weights, hedge, float(loss[best].mean()), policy

    def _guard_policy(self, per_fold, ranks, model_k, base_k, first, last) -> dict:
        """Which ranking leads and which baselines the top k interleaves, from nested inner regrets.

        The lead: the model, unless the inner folds hold at least GUARD_MIN_CASES cases and a baseline's
        inner regret@first is lower by GUARD_MARGIN (in log) on the mean and in every inner fold (a kernel
        measured at one shape per device gives one case per inner fold: too few to overrule the model).
        The hedge: the top k interleaves the lead with the one or two baselines of lowest inner
        regret@last (the model too, when a baseline leads), whichever of none, one or two gives the
        lowest inner regret@last (more hedging wins ties: it costs no regret@1).
        """
        folds = len(per_fold)
        cases = sum(regret.cases for _, _, regret, _, _ in per_fold)
        lead = None
        gains = {b: np.mean(model_k[first]) - np.mean(v[first]) for b, v in base_k.items()}
        best = max(gains, key=lambda b: (gains[b], -list(gains).index(b)))
        wins = sum(m > x for m, x in zip(model_k[first], base_k[best][first]))
        if cases >= GUARD_MIN_CASES and gains[best] > GUARD_MARGIN and wins == folds:
            lead = best
        by_last = sorted((b for b in base_k if b != lead), key=lambda b: (np.mean(base_k[b][last]), list(base_k).index(b)))
        hedges = [[], *([by_last[:1]] if by_last else []), *([by_last[:2]] if len(by_last) > 1 else [])]
        if lead is not None:
            hedges = [["model", *h] for h in hedges]
        losses = []
        for names in hedges:
            mixed = []
            for (t, s, regret, hedged, base), model_ranks in zip(per_fold, ranks):
                lists = [model_ranks if lead is None else base[lead]]
                lists += [model_ranks if n == "model" else base[n] for n in names]
                mixed.append(regret.mean(interleave_ranks(lists) if len(lists) > 1 else lists[0], [last]))
            losses.append(float(np.mean(mixed)))
        pick = max(i for i, v in enumerate(losses) if v <= min(losses) + 1e-12)
        inner = {f"model@{first}": float(np.mean(model_k[first])), f"model@{last}": float(np.mean(model_k[last])),
                 **{f"{b}@{k}": float(np.mean(v[k])) for b, v in base_k.items() for k in (first, last)},
                 **{f"hedge[{','.join(h)}]@{last}": v for h, v in zip(hedges, losses)}}
        return {"mode": "model" if lead is None else "baseline", "baseline": lead, "hedges": hedges[pick],
                "inner": inner}

    def _apply_policy(self, frame: pl.DataFrame, total: np.ndarray, policy: dict) -> np.ndarray:
        """The model's scores under a policy: the lead (the model, or baseline `baseline` when mode is
        `baseline`), its ranking interleaved with the rankings of `hedges` (baselines, or "model")."""
        lead = total if policy.get("mode", "model") == "model" else self.guard_rankers[policy["baseline"]].score(frame)
        hedges = policy.get("hedges") or []
        if not hedges:
            return lead
        return interleave(frame, [lead, *[total if h == "model" else self.guard_rankers[h].score(frame) for h in hedges]])

    def selection(self) -> dict:
        """The fitted weights and hedging: set them as `fixed` on an unfitted ensemble and its fit skips the
        inner cross-validation (train.py's held-out scoring refits one per fold at the cost of its members)."""
        return {"weights_seen": list(self.weights_seen), "hedge_seen": bool(self.hedge_seen),
                "weights_unseen": list(self.weights_unseen), "hedge_unseen": bool(self.hedge_unseen),
                "policy_seen": dict(self.policy_seen), "policy_unseen": dict(self.policy_unseen)}

    def fit(self, train: pl.DataFrame) -> "CVEnsembleRanker":
        if train.is_empty():
            raise ModelError(f"{self.features.kernel}: no training rows")
        fixed = self.fixed
        if fixed:
            self.weights_seen, self.hedge_seen = list(fixed["weights_seen"]), fixed["hedge_seen"]
            self.weights_unseen, self.hedge_unseen = list(fixed["weights_unseen"]), fixed["hedge_unseen"]
            self.policy_seen = dict(fixed.get("policy_seen") or {"mode": "model", "baseline": None})
            self.policy_unseen = dict(fixed.get("policy_unseen") or {"mode": "model", "baseline": None})
            self.inner_scores = {"devices": None, "shapes": None}
        else:
            only = self.only
            if only not in (None, "seen", "unseen"):
                raise ModelError(f"ensemble setting {only!r}: expected seen, unseen or None")
            equal = [1.0 / len(self.member_names)] * len(self.member_names)
            keep = {"mode": "model", "baseline": None}
            self.weights_unseen, self.hedge_unseen, loss_unseen, self.policy_unseen = (
                self._select(train, "devices") if only != "seen" else (list(equal), False, None, keep))
            self.weights_seen, self.hedge_seen, loss_seen, self.policy_seen = (
                self._select(train, "shapes") if only != "unseen" else (list(equal), False, None, dict(keep)))
            self.inner_scores = {"devices": loss_unseen, "shapes": loss_seen}
        self.rankers = {m: make_ranker(self.features, m).fit(train) for m in self.needed()}
        used = {b for p in self._policies() for b in [p.get("baseline"), *(p.get("hedges") or [])]
                if b is not None and b != "model"}
        self.guard_rankers = {b: BaselineRanker(self.features, b).fit(train) for b in sorted(used)}
        self.train_devices = sorted(train["device_id"].unique().to_list())
        return self

    def _policies(self) -> list[dict]:
        """The policies of the settings fitted (both, or `only`'s)."""
        only = None if self.fixed else self.only
        return [p for p, kind in ((self.policy_seen, "seen"), (self.policy_unseen, "unseen")) if only in (None, kind)]

    def _used(self, weights: Sequence[float], hedge: bool) -> set[str]:
        """The members a setting's scores read: those of nonzero weight, and the hedges when it hedges."""
        return {m for m, w in zip(self.member_names, weights) if w} | (set(self.hedge_names) if hedge else set())

    def needed(self) -> list[str]:
        """The members and hedges the fitted settings use (of both, or of `only`'s): fit fits only these.
        A member of weight 0 that no hedge needs would be fitted and scored for nothing; leaving it out
        changes no score (`_total` skips zero weights)."""
        used: set[str] = set()
        if self.only != "unseen":
            used |= self._used(self.weights_seen, self.hedge_seen)
        if self.only != "seen":
            used |= self._used(self.weights_unseen, self.hedge_unseen)
        return [m for m in self._names() if m in used]

    def score(self, test: pl.DataFrame) -> np.ndarray:
        seen = test["device_id"].is_in(self.train_devices).to_numpy()
        only = None if self.fixed else self.only
        if (only == "seen" and not seen.all()) or (only == "unseen" and seen.any()):
            raise ModelError(f"{self.features.kernel}: this ensemble chose its weights for "
                             f"{only} devices only; refit it without `only` to score other devices")
        for mask, weights, hedge, kind in ((seen, self.weights_seen, self.hedge_seen, "seen"),
                                           (~seen, self.weights_unseen, self.hedge_unseen, "unseen")):
            missing = sorted(self._used(weights, hedge) - set(self.rankers)) if mask.any() else []
            if missing:  # fitted with `only` (and `fixed`) for the other kind of device
                raise ModelError(f"{self.features.kernel}: this ensemble did not fit {', '.join(missing)}, "
                                 f"which its {kind}-device setting needs; refit it without `only`")
        scores = {m: relative_to_case(test, r.score(test)) for m, r in self.rankers.items()}
        out = np.zeros(test.height)
        for mask, weights, hedge, policy in ((seen, self.weights_seen, self.hedge_seen, self.policy_seen),
                                             (~seen, self.weights_unseen, self.hedge_unseen, self.policy_unseen)):
            if mask.any():
                part = test.filter(pl.Series(mask))
                total = self._combine(part, {m: v[mask] for m, v in scores.items()}, weights, hedge)
                out[mask] = self._apply_policy(part, total, policy)
        return out


class SeenUnseenRanker(Ranker):
    """One model for the devices seen in training, another for new ones.

    Rows of a device the ranker was trained on are scored by the mean of the `seen` members' scores,
    each made relative to its best in the case (no selection: a fixed choice); rows of any other
    device by the `unseen` variant, a CVEnsembleRanker that chooses its own weights by leaving
    training devices out (only its unseen setting is fitted). The seen members see every feature,
    the device specs included, so on a measured device they learn its own order of the configs; on a
    new device such a model extrapolates from a handful of training devices, which the ensemble's
    similarity-weighted members do better (notes/learning.md).

    Like CVEnsembleRanker it takes `only` ("seen" or "unseen": fit just that part, and refuse rows of
    the other kind) and `fixed` (selection() of another fit: the unseen ensemble skips its inner
    cross-validation).
    """

    fixed: dict | None = None
    only: str | None = None

    def __init__(self, features: KernelFeatures, seen: Sequence[str], unseen: str = "ensemble",
                 name: str = "split") -> None:
        super().__init__(features)
        if not seen:
            raise ModelError("a seen/unseen ranker needs at least one seen member")
        unknown = [m for m in (*seen, unseen) if m not in MODEL_VARIANTS]
        if unknown:
            raise ModelError(f"unknown member(s) {', '.join(unknown)}")
        if any(isinstance(make_ranker(features, m), SeenUnseenRanker) for m in seen):
            raise ModelError("a seen/unseen ranker cannot nest another")
        if not isinstance(make_ranker(features, unseen), CVEnsembleRanker):
            raise ModelError(f"the unseen model {unseen!r} must be a cross-validated ensemble")
        self.seen_names = list(seen)
        self.unseen_name = unseen
        self.name = name
        self.seen_rankers: dict[str, Ranker] = {}
        self.unseen_ranker: Ranker | None = None
        self.train_devices: list[str] = []

    def fit(self, train: pl.DataFrame) -> "SeenUnseenRanker":
        if train.is_empty():
            raise ModelError(f"{self.features.kernel}: no training rows")
        only = self.only
        if only not in (None, "seen", "unseen"):
            raise ModelError(f"setting {only!r}: expected seen, unseen or None")
        self.train_devices = sorted(train["device_id"].unique().to_list())
        self.seen_rankers = {}
        for m in ([] if only == "unseen" else self.seen_names):
            ranker = make_ranker(self.features, m)
            if hasattr(ranker, "only"):  # an ensemble member: only its seen setting is read here
                fixed = (self.fixed or {}).get("seen", {}).get(m)
                if fixed:
                    ranker.fixed = fixed
                else:
                    ranker.only = "seen"
            self.seen_rankers[m] = ranker.fit(train)
        self.unseen_ranker = None
        if only != "seen":
            ranker = make_ranker(self.features, self.unseen_name)
            if self.fixed and self.fixed.get("unseen"):
                ranker.fixed = self.fixed["unseen"]
            else:
                ranker.only = "unseen"
            self.unseen_ranker = ranker.fit(train)
        return self

    def selection(self) -> dict:
        """The ensembles' selections, unseen and seen members' (set as `fixed` on an unfitted one to skip their inner CV)."""
        selection = getattr(self.unseen_ranker, "selection", None)
        seen = {m: r.selection() for m, r in self.seen_rankers.items() if callable(getattr(r, "selection", None))}
        return {"unseen": selection() if callable(selection) else None, "seen": seen}

    def score(self, test: pl.DataFrame) -> np.ndarray:
        seen = test["device_id"].is_in(self.train_devices).to_numpy()
        if seen.any() and not self.seen_rankers:
            raise ModelError(f"{self.features.kernel}: fitted for new devices only; refit without `only` "
                             "to score a training device")
        if (~seen).any() and self.unseen_ranker is None:
            raise ModelError(f"{self.features.kernel}: fitted for training devices only; refit without "
                             "`only` to score a new device")
        out = np.zeros(test.height)
        if seen.any():
            part = test.filter(pl.Series(seen))
            out[seen] = sum(relative_to_case(part, r.score(part)) for r in self.seen_rankers.values()) \
                / len(self.seen_rankers)
        if (~seen).any():
            out[~seen] = self.unseen_ranker.score(test.filter(pl.Series(~seen)))
        return out


def boosting_regressor(random_state: int = 0, max_iter: int = 200, learning_rate: float = 0.1) -> HistGradientBoostingRegressor:
    """The gradient-boosting regressor of the `gbr*` members (200 trees of 31 leaves, no early stopping):
    public, since the benchmarks time this very model as the machine's speed."""
    return HistGradientBoostingRegressor(max_iter=max_iter, learning_rate=learning_rate, max_leaf_nodes=31,
                                         early_stopping=False, random_state=random_state)


def _forest(cls, random_state: int = 0):
    return cls(n_estimators=60, min_samples_leaf=3, max_features=0.5, max_samples=0.3, n_jobs=-1,
               random_state=random_state, **({"bootstrap": True} if cls is ExtraTreesRegressor else {}))


def _device_gbr() -> HistGradientBoostingRegressor:
    """The per-device config model of `transfer`: small boosting (one device's rows are few)."""
    return HistGradientBoostingRegressor(max_iter=60, learning_rate=0.15, max_leaf_nodes=31,
                                         early_stopping=False, random_state=0)


def _device_et() -> ExtraTreesRegressor:
    """The per-device config model of `transfer_et`: extra trees, smoother near the optimum."""
    return ExtraTreesRegressor(n_estimators=40, min_samples_leaf=2, max_features=0.7, n_jobs=1, random_state=0)


def _device_gbr_light() -> HistGradientBoostingRegressor:
    """`transfer_light`'s per-device model: a third of `transfer`'s trees, each a larger step."""
    return HistGradientBoostingRegressor(max_iter=20, learning_rate=0.4, max_leaf_nodes=31,
                                         early_stopping=False, random_state=0)


# estimators of DeviceTransferRanker by name (rankers store the name, never the function)
_ESTIMATORS: dict[str, Callable[[], object]] = {"gbr": _device_gbr, "et": _device_et, "gbr_light": _device_gbr_light}


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


MODEL_VARIANTS: dict[str, Callable[[KernelFeatures], Ranker]] = {
    "gbr": lambda f: PipelineRanker(f, boosting_regressor(), target="log_time", name="gbr"),
    "gbr_rel": lambda f: PipelineRanker(f, boosting_regressor(), target="log_rel", clip=CLIP_LOG_REL, name="gbr_rel"),
    "rf_rel": lambda f: PipelineRanker(f, _forest(RandomForestRegressor), target="log_rel", clip=CLIP_LOG_REL,
                                       name="rf_rel"),
    "et_rel": lambda f: PipelineRanker(f, _forest(ExtraTreesRegressor), target="log_rel", clip=CLIP_LOG_REL,
                                       name="et_rel"),
    "gbr_shared": lambda f: PipelineRanker(shared_features(f), boosting_regressor(), target="log_rel", clip=CLIP_LOG_REL,
                                           name="gbr_shared"),
    "et_shared": lambda f: PipelineRanker(shared_features(f), _forest(ExtraTreesRegressor), target="log_rel",
                                          clip=CLIP_LOG_REL, name="et_shared"),
    "prior": lambda f: PriorRanker(f, name="prior"),
    "prior_uniform": lambda f: PriorRanker(f, uniform=True, vendor_penalty=0.0, name="prior_uniform"),
    "prior_shared": lambda f: EnsembleRanker(f, [PriorRanker(f), MODEL_VARIANTS["gbr_shared"](f)],
                                             name="prior_shared"),
    "transfer": lambda f: DeviceTransferRanker(f, "gbr", name="transfer"),
    "transfer_et": lambda f: DeviceTransferRanker(f, "et", top_weight=0.0, name="transfer_et"),
    "transfer_geo": lambda f: DeviceTransferRanker(f, "gbr", geometry=True, name="transfer_geo"),
    "simd_aligned": lambda f: AlignmentRanker(f, name="simd_aligned"),
    "gbr_med": lambda f: PipelineRanker(shared_features(f, geometry=True), boosting_regressor(), target="log_med",
                                        clip=CLIP_LOG_REL, name="gbr_med"),
    "prior_rank_uniform": lambda f: PriorRanker(f, uniform=True, vendor_penalty=0.0, target="rank_pct",
                                                name="prior_rank_uniform"),
    "ensemble": lambda f: CVEnsembleRanker(f, ENSEMBLE_MEMBERS, ENSEMBLE_HEDGES, name="ensemble"),
    # the ensemble with a quarter / a third of the boosting trees (the cost of its fits; notes/learning.md)
    "gbr_shared_light": lambda f: PipelineRanker(shared_features(f), boosting_regressor(max_iter=50, learning_rate=0.3),
                                                 target="log_rel", clip=CLIP_LOG_REL, name="gbr_shared_light"),
    "transfer_light": lambda f: DeviceTransferRanker(f, "gbr_light", name="transfer_light"),
    "ensemble_light": lambda f: CVEnsembleRanker(f, ("prior", "transfer_light", "gbr_shared_light", "simd_aligned"),
                                                 ("prior", "transfer_light", "prior_uniform"), name="ensemble_light"),
    # gbr_rel clipped at 2x (not 4x), and gbr_rel with each case's fast configs weighted up (as `transfer`)
    "gbr_rel_clip2": lambda f: PipelineRanker(f, boosting_regressor(), target="log_rel", clip=math.log(2.0), name="gbr_rel_clip2"),
    "gbr_rel_top": lambda f: PipelineRanker(f, boosting_regressor(), target="log_rel", clip=CLIP_LOG_REL, top_weight=4.0,
                                            top_scale=0.1, name="gbr_rel_top"),
    # the three gbr_rel variants averaged for the devices seen in training, the ensemble for new ones
    # (notes/learning.md, "gbr_rel for seen devices")
    "split_rel": lambda f: SeenUnseenRanker(f, SPLIT_REL_SEEN, "ensemble", name="split_rel"),
    # a ranking objective on relative time: log(time / case best), each case's fastest configs weighted up
    "gbr_shared_top": lambda f: PipelineRanker(shared_features(f), boosting_regressor(), target="log_rel",
                                               clip=CLIP_LOG_REL, top_weight=4.0, top_scale=0.1, name="gbr_shared_top"),
    # the ensemble whose nested selection may fall back to a baseline or interleave one with its top k
    "ensemble_guarded": lambda f: CVEnsembleRanker(f, ENSEMBLE_MEMBERS, ENSEMBLE_HEDGES, max_device_folds=4,
                                                   guards_seen=GUARDS_SEEN, guards_unseen=GUARDS_UNSEEN,
                                                   name="ensemble_guarded"),
    # the default: the ensemble for the devices seen in training (its seen setting), and for new devices the
    # ranking objective guarded by the baselines (notes/ranker-selection.md)
    "robust": lambda f: SeenUnseenRanker(f, ("ensemble",), "rank_guarded", name="robust"),
    # stacking: baselines as weighted members of the ensemble
    "stacked": lambda f: CVEnsembleRanker(f, STACKED_MEMBERS, ENSEMBLE_HEDGES, max_device_folds=4, name="stacked"),
    # the ranking objective alone, guarded as `robust` is
    "rank_guarded": lambda f: CVEnsembleRanker(f, ("gbr_shared_top",), (), max_device_folds=4, guards_seen=GUARDS_SEEN,
                                               guards_unseen=GUARDS_UNSEEN, name="rank_guarded"),
    **{f"baseline_{b}": (lambda b: lambda f: BaselineRanker(f, b))(b) for b in _baselines.BASELINES},
}
ENSEMBLE_MEMBERS = ("prior", "transfer", "gbr_shared", "simd_aligned")  # weighted by inner CV
ENSEMBLE_HEDGES = ("prior", "transfer", "prior_uniform")     # rankings its top k may interleave
SPLIT_REL_SEEN = ("gbr_rel", "gbr_rel_clip2", "gbr_rel_top")  # split_rel's members for seen devices
# the baselines `robust` may fall back to or interleave with, for a seen device (new shape) and a new device
GUARDS_SEEN = ("nearest_shape", "most_common_best")
GUARDS_UNSEEN = ("other_device_best", "most_common_best", "common_top10", "chip_default")
STACKED_MEMBERS = ("prior", "transfer", "gbr_shared", "baseline_other_device_best", "baseline_common_top10")
DEFAULT_MODEL = "robust"


def make_ranker(features: KernelFeatures, model: str = DEFAULT_MODEL) -> Ranker:
    """An unfitted ranker of the named variant for one kernel."""
    try:
        factory = MODEL_VARIANTS[model]
    except KeyError:
        raise ModelError(f"unknown model {model!r}; expected one of {', '.join(MODEL_VARIANTS)}") from None
    return factory(features)


def fit_kernel_model(features: KernelFeatures, model: str = DEFAULT_MODEL) -> Ranker:
    """A ranker of the named variant trained on all of a kernel's measurements."""
    return make_ranker(features, model).fit(features.frame)
