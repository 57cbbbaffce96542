"""The Ranker interface and what every learned ranker shares: the Pipeline it fits, capped and cached fits,
prediction once per distinct feature row, and scores made relative to each case's best.

Every model is a `Ranker`: fit on a kernel's feature frame (features.KernelFeatures.frame), then
`score` test rows; lower is better and scores compare within a case. Rankers keep only data
(numbers, strings, frames, arrays, sklearn objects and other rankers) so models/persist.py can
store them without pickles.
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import time
import zlib
from abc import ABC, abstractmethod
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import polars as pl
from sklearn.base import clone
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.models.features import CASE, KernelFeatures

CLIP_LOG_REL = math.log(4.0)  # configs 4x slower than the case's best are all just "bad"
VENDOR_PENALTY = 2.0          # in units of the normalised spec distance
PRIOR_TAU = 0.5               # similarity kernel width: weight = exp(-distance / tau)


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
        """One score per row, lower is better; NaN where the model has nothing to say.

        The one scoring path: evaluate's folds, train's held-out scores and publish's tables all score a
        batch of rows through it, so what is published is what was evaluated. A learned model predicts
        each distinct feature row once (predict_distinct), since rows of devices it cannot tell apart repeat."""

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
    several pipelines predict on the same X (DeviceTransferRanker: one per training device). Inside
    remembered_predictions(), rows this pipeline predicted in an earlier call are not predicted again."""
    unique, inverse = distinct if distinct is not None else distinct_rows(X)
    pred = _predict_remembered(pipeline, unique) if _REMEMBERED is not None else \
        np.asarray(pipeline.predict(unique), dtype=float)
    return pred if inverse is None else pred[inverse]


class _Predicted:
    """The rows one pipeline predicted, by their 128-bit row hash: sorted hashes and the predictions."""

    __slots__ = ("pipeline", "h0", "h1", "values")

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline  # held, so that its id names it while it is remembered
        self.h0 = np.empty(0, dtype=np.uint64)
        self.h1 = np.empty(0, dtype=np.uint64)
        self.values = np.empty(0, dtype=float)


# per pipeline id, the rows predicted while remembered_predictions() is active (None: not active)
_REMEMBERED: dict[int, _Predicted] | None = None
REMEMBERED_ROWS = 4_000_000  # rows remembered per pipeline at most (24 bytes each); more are predicted afresh
_ROW_HASHES: list = [None, None]  # the last frame hashed and its hashes: a transfer ranker's pipelines share X


@contextmanager
def remembered_predictions() -> Iterator[None]:
    """Within this block predict_distinct predicts each distinct feature row once per pipeline, across calls:
    publish scores its candidate rows in chunks of devices, and a model that does not see the device (or sees
    only its vendor) is asked the same rows in every chunk. A tree model predicts each row on its own, so the
    scores are the same bit for bit; what is remembered is dropped when the block ends."""
    global _REMEMBERED
    outer = _REMEMBERED
    _REMEMBERED = {} if outer is None else outer
    try:
        yield
    finally:
        _REMEMBERED = outer
        _ROW_HASHES[:] = [None, None]


def _row_hashes(X: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    if _ROW_HASHES[0] is not X:
        _ROW_HASHES[:] = [X, (X.hash_rows(seed=0).to_numpy(), X.hash_rows(seed=1).to_numpy())]
    return _ROW_HASHES[1]


def _predict_remembered(pipeline: Pipeline, X: pl.DataFrame) -> np.ndarray:
    """pipeline.predict(X), the rows this pipeline already predicted inside remembered_predictions() read back."""
    memo = _REMEMBERED.setdefault(id(pipeline), _Predicted(pipeline))
    if memo.pipeline is not pipeline:  # an id reused after its pipeline was freed
        memo = _REMEMBERED[id(pipeline)] = _Predicted(pipeline)
    if X.is_empty():
        return np.asarray(pipeline.predict(X), dtype=float)
    h0, h1 = _row_hashes(X)
    at = np.minimum(np.searchsorted(memo.h0, h0), max(memo.h0.size - 1, 0))
    known = (memo.h0[at] == h0) & (memo.h1[at] == h1) if memo.h0.size else np.zeros(X.height, dtype=bool)
    out = np.empty(X.height, dtype=float)
    out[known] = memo.values[at[known]]
    new = ~known
    if new.any():
        fresh = np.asarray(pipeline.predict(X.filter(pl.Series(new)) if not new.all() else X), dtype=float)
        out[new] = fresh
        if memo.h0.size + fresh.size <= REMEMBERED_ROWS:
            # keep one entry per first hash: rows whose first hashes collide are predicted each time
            n0, n1 = h0[new], h1[new]
            first = np.unique(n0, return_index=True)[1]
            taken = np.isin(n0[first], memo.h0)
            add = first[~taken]
            h0_all = np.concatenate([memo.h0, n0[add]])
            order = np.argsort(h0_all, kind="stable")
            memo.h0 = h0_all[order]
            memo.h1 = np.concatenate([memo.h1, n1[add]])[order]
            memo.values = np.concatenate([memo.values, fresh[add]])[order]
    return out


def top_weights(log_rel: np.ndarray, top_weight: float, top_scale: float) -> np.ndarray:
    """Row weights 1 + top_weight * exp(-log_rel / top_scale): each case's fastest configs count up to
    (1 + top_weight) times (a ranking-loss surrogate: the order at the top is what a pick needs)."""
    return 1.0 + top_weight * np.exp(-log_rel / top_scale)


FIT_CACHE_SIZE = 256  # fitted pipelines kept by fit_cached (per process; a few MB each at most)
_FIT_CACHE: "OrderedDict[str, Pipeline]" = OrderedDict()
# a folder the worker processes of one KernelPool share their fits through (None: this process's cache only)
_SHARED_FITS: Path | None = None
_CLAIM_WAIT_S = 0.02  # how often a process waiting for another's fit of the same rows looks for it


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
    not change), and a fit is deterministic: this only skips repeated work, results are unchanged. In a
    KernelPool's workers the fits are also shared between the workers (share_fits), so a fit one fold's task
    made serves every other task that needs it, wherever it runs.
    """
    key = _fit_key(pipeline, X, y, weight)
    hit = _FIT_CACHE.get(key)
    if hit is not None:
        _FIT_CACHE.move_to_end(key)
        return hit

    def fit() -> Pipeline:
        fitted = without_constant_columns(clone(pipeline), X)
        if weight is None:
            fitted.fit(X, y)
        else:
            fitted.fit(X, y, model__sample_weight=weight)
        return fitted

    fitted = fit() if _SHARED_FITS is None else _shared_fit(_SHARED_FITS, key, fit)
    _FIT_CACHE[key] = fitted
    while len(_FIT_CACHE) > FIT_CACHE_SIZE:
        _FIT_CACHE.popitem(last=False)
    return fitted


def without_constant_columns(pipeline: Pipeline, X: pl.DataFrame) -> Pipeline:
    """`pipeline` (unfitted, as make_pipeline builds it) reading only the columns that vary in X.

    A boosting model never splits on a column of one value, so its trees and every prediction are the same
    without it, and each tree's histograms cost less (a per-device model's rows share one device's figures).
    Column order is kept, so ties between splits break as before. Any other model, or a boosting model
    whose parameters index its columns or draw among them, is returned unchanged."""
    steps = pipeline.steps
    if (len(steps) != 2 or not isinstance(steps[0][1], ColumnTransformer)
            or not isinstance(steps[1][1], HistGradientBoostingRegressor)):
        return pipeline
    model = steps[1][1].get_params(deep=False)
    if (model.get("max_features", 1.0) != 1.0 or model.get("interaction_cst") is not None
            or model.get("monotonic_cst") is not None or model.get("categorical_features") not in ("from_dtype", None)):
        return pipeline
    columns = steps[0][1].transformers
    named = [c for _, _, cols in columns if isinstance(cols, list) for c in cols]
    if not named or len(named) != len(set(named)) or any(c not in X.columns for c in named):
        return pipeline
    distinct = X.select(pl.col(c).n_unique() for c in named).row(0, named=True)
    varying = [(name, how, [c for c in cols if distinct[c] > 1]) for name, how, cols in columns]
    varying = [t for t in varying if t[2]]
    if not varying or varying == columns:
        return pipeline
    steps[0][1].set_params(transformers=varying)
    return pipeline


def clear_fit_cache() -> None:
    """Forget every cached fit of this process (fit_cached; a shared folder keeps its own)."""
    _FIT_CACHE.clear()


def share_fits(folder: str | os.PathLike | None) -> None:
    """Share fit_cached's fits with the other processes that name the same folder (KernelPool's workers: a
    fold's fit made by one worker is read by another, never made twice); None: this process's cache only."""
    global _SHARED_FITS
    _SHARED_FITS = None if folder is None else Path(folder)
    if _SHARED_FITS is not None:
        _SHARED_FITS.mkdir(parents=True, exist_ok=True)


def _shared_fit(folder: Path, key: str, fit) -> Pipeline:
    """The fit of `key` from the shared folder, or `fit()` stored there. The process that makes a fit first
    claims it (an exclusively created file), so another that needs it meanwhile waits for it rather than
    fitting the same rows too; a claim left by a fit that raised is removed, and the next process fits."""
    done, claim = folder / f"{key}.fit", folder / f"{key}.claim"
    while True:
        try:
            return pickle.loads(zlib.decompress(done.read_bytes()))
        except FileNotFoundError:
            pass
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            time.sleep(_CLAIM_WAIT_S)
            continue
        try:
            if done.exists():  # stored between the read above and the claim
                continue
            fitted = fit()
            tmp = folder / f"{key}.{os.getpid()}.tmp"
            tmp.write_bytes(zlib.compress(pickle.dumps(fitted, protocol=pickle.HIGHEST_PROTOCOL), 1))
            os.replace(tmp, done)
            return fitted
        finally:
            os.close(fd)
            claim.unlink(missing_ok=True)
