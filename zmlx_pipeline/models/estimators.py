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
- `ensemble` (the default): mean of `prior` (which device is like which) and `gbr_shared`
  (how configs and shapes interact), each made relative to its best in the case.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np
import polars as pl
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import ExtraTreesRegressor, HistGradientBoostingRegressor, RandomForestRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder

from zmlx_pipeline.models.features import CASE, KernelFeatures, device_distances

CLIP_LOG_REL = math.log(4.0)  # configs 4x slower than the case's best are all just "bad"
VENDOR_PENALTY = 2.0          # in units of the normalised spec distance
PRIOR_TAU = 0.5               # similarity kernel width: weight = exp(-distance / tau)
PRIOR_NEIGHBOURS = 8          # training cases that vote for each test case
_SHAPE_WEIGHT = 1.0           # distance per unit of log2 shape dimension
_DTYPE_PENALTY = 1.0


class ModelError(ValueError):
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


def predict_distinct(pipeline: Pipeline, X: pl.DataFrame) -> np.ndarray:
    """pipeline.predict(X), computed once per distinct feature row (rows of devices whose features a
    model does not see repeat; prediction time grows with rows)."""
    if X.height < 10_000:
        return pipeline.predict(X)
    groups = X.with_row_index("_i").group_by(X.columns, maintain_order=True).agg(pl.col("_i"))
    if groups.height > 0.8 * X.height:
        return pipeline.predict(X)
    pred = pipeline.predict(groups.select(X.columns))
    rows = groups.select("_i", pl.Series("_p", pred, dtype=pl.Float64)).explode("_i")
    out = np.empty(X.height, dtype=float)
    out[rows["_i"].to_numpy()] = rows["_p"].to_numpy()
    return out


class PipelineRanker(Ranker):
    """A scikit-learn Pipeline regressing log time, or the clipped per-case normalised log time."""

    def __init__(self, features: KernelFeatures, estimator, target: str = "log_time",
                 clip: float | None = None, name: str = "pipeline") -> None:
        super().__init__(features)
        if target not in ("log_time", "log_rel"):
            raise ModelError(f"unknown target {target!r}; expected log_time or log_rel")
        self.pipeline = make_pipeline(features, estimator)
        self.target = target
        self.clip = clip
        self.name = name

    def fit(self, train: pl.DataFrame) -> "PipelineRanker":
        if train.is_empty():
            raise ModelError(f"{self.features.kernel}: no training rows")
        train = fit_sample(train)
        y = train[self.target].to_numpy()
        if self.clip is not None:
            y = np.minimum(y, self.clip)
        self.pipeline.fit(train.select(self.features.features), y)
        return self

    def score(self, test: pl.DataFrame) -> np.ndarray:
        return predict_distinct(self.pipeline, test.select(self.features.features))


class PriorRanker(Ranker):
    """Config-only prior: similarity-weighted mean log(time / best) of each config over training cases."""

    def __init__(self, features: KernelFeatures, vendor_penalty: float = VENDOR_PENALTY,
                 tau: float = PRIOR_TAU, neighbours: int = PRIOR_NEIGHBOURS, uniform: bool = False,
                 name: str = "prior") -> None:
        super().__init__(features)
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
        dims = [f"shape_log2_{d}" for d in self.features.shape_dims]
        return frame.group_by(CASE).agg([pl.col(c).first() for c in dims])

    def fit(self, train: pl.DataFrame) -> "PriorRanker":
        if train.is_empty():
            raise ModelError(f"{self.features.kernel}: no training rows")
        self._train = train.select(*CASE, "config_key", pl.col("log_rel").clip(upper_bound=CLIP_LOG_REL))
        self._train_cases = self._cases(train)
        return self

    def score(self, test: pl.DataFrame) -> np.ndarray:
        dims = [f"shape_log2_{d}" for d in self.features.shape_dims]
        tc = self._cases(test)
        rc = self._train_cases.rename({c: "_train_" + c for c in (*CASE, *dims)})
        pairs = tc.join(rc, how="cross").filter(pl.col("kernel") == pl.col("_train_kernel"))
        pairs = pairs.join(self._device_distance, left_on=["device_id", "_train_device_id"],
                           right_on=["device_id", "_train_device"], how="left")
        shape_d = (pl.sum_horizontal([(pl.col(c) - pl.col("_train_" + c)) ** 2 for c in dims]).sqrt()
                   if dims else pl.lit(0.0))
        dist = (pl.col("_ddist").fill_null(0.0) + _SHAPE_WEIGHT * shape_d
                + _DTYPE_PENALTY * (pl.col("dtype") != pl.col("_train_dtype")).cast(pl.Float64))
        pairs = pairs.with_columns(dist.alias("_dist"))
        pairs = pairs.with_columns(pl.col("_dist").rank("ordinal").over(CASE).alias("_nn")).filter(
            pl.col("_nn") <= self.neighbours)
        weight = pl.lit(1.0) if self.uniform else (-(pl.col("_dist") - pl.col("_dist").min().over(CASE))
                                                   / self.tau).exp()
        pairs = pairs.with_columns(weight.alias("_w")).select(
            *CASE, *[pl.col("_train_" + c).alias("_t_" + c) for c in CASE], "_w")
        votes = pairs.join(self._train.rename({c: "_t_" + c for c in CASE}), on=[f"_t_{c}" for c in CASE])
        prior = votes.group_by([*CASE, "config_key"]).agg(
            ((pl.col("_w") * pl.col("log_rel")).sum() / pl.col("_w").sum()).alias("_prior"))
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


def _gbr(random_state: int = 0) -> HistGradientBoostingRegressor:
    return HistGradientBoostingRegressor(max_iter=200, learning_rate=0.1, max_leaf_nodes=31,
                                         early_stopping=False, random_state=random_state)


def _forest(cls, random_state: int = 0):
    return cls(n_estimators=60, min_samples_leaf=3, max_features=0.5, max_samples=0.3, n_jobs=-1,
               random_state=random_state, **({"bootstrap": True} if cls is ExtraTreesRegressor else {}))


def shared_features(features: KernelFeatures) -> KernelFeatures:
    """The features of a model shared across devices: config, shape and ratio columns plus the vendor.

    Without the finer device specs a tree model cannot memorise the few training devices;
    what tells one device from another is left to the prior it is ensembled with.
    """
    numeric = tuple(c for c in features.numeric
                    if c.startswith(("cfg_", "ratio_", "shape_")) or c == "dtype_bytes")
    numeric = tuple(c for c in numeric if c not in _DEVICE_RELATIVE)
    return replace(features, numeric=numeric,
                   categorical=tuple(c for c in features.categorical if c in ("dev_vendor", "dev_backend")
                                     or c.startswith("cfg_")))


_DEVICE_RELATIVE = ("cfg_log2_threads_per_simd", "cfg_log2_threads_per_max", "cfg_log2_threads_per_default",
                    "cfg_simd_aligned")


MODEL_VARIANTS: dict[str, Callable[[KernelFeatures], Ranker]] = {
    "gbr": lambda f: PipelineRanker(f, _gbr(), target="log_time", name="gbr"),
    "gbr_rel": lambda f: PipelineRanker(f, _gbr(), target="log_rel", clip=CLIP_LOG_REL, name="gbr_rel"),
    "rf_rel": lambda f: PipelineRanker(f, _forest(RandomForestRegressor), target="log_rel", clip=CLIP_LOG_REL,
                                       name="rf_rel"),
    "et_rel": lambda f: PipelineRanker(f, _forest(ExtraTreesRegressor), target="log_rel", clip=CLIP_LOG_REL,
                                       name="et_rel"),
    "gbr_shared": lambda f: PipelineRanker(shared_features(f), _gbr(), target="log_rel", clip=CLIP_LOG_REL,
                                           name="gbr_shared"),
    "et_shared": lambda f: PipelineRanker(shared_features(f), _forest(ExtraTreesRegressor), target="log_rel",
                                          clip=CLIP_LOG_REL, name="et_shared"),
    "prior": lambda f: PriorRanker(f, name="prior"),
    "prior_uniform": lambda f: PriorRanker(f, uniform=True, vendor_penalty=0.0, name="prior_uniform"),
    "ensemble": lambda f: EnsembleRanker(f, [PriorRanker(f), MODEL_VARIANTS["gbr_shared"](f)], name="ensemble"),
}
DEFAULT_MODEL = "ensemble"


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
