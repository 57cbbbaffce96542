"""Score configs the model never saw measured: feature rows for (device, dtype, shape, config) candidates.

A trained ranker scores rows of its kernel's feature frame. To rank the configs of a shape or a
device that was never measured, the candidate rows go through the same `kernel_features` as
the training rows, together with a few anchor rows taken from training (every training shape
once, every training config once): the columns that depend on the data (a log2 column for a
parameter that varies, ratios for dims that vary) then exist exactly as in training. Anchors
carry a marked device id and are dropped afterwards.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Iterable, Mapping

import numpy as np
import polars as pl

from zmlx_pipeline.core.keys import canonical_json, mapping_key
from zmlx_pipeline.models.features import CASE, KernelFeatures, devices_frame, kernel_features

_ANCHOR = "\x00anchor:"
_STAMP = datetime(2000, 1, 1)
_MEASUREMENT_COLUMNS = ("device_id", "kernel", "kernel_version", "dtype", "shape_key", "shape", "config_key",
                        "config", "status", "median_us", "extra", "measured_at")


def all_devices_frame(store) -> pl.DataFrame:
    """Spec columns of every catalog device plus every store device (the store's row wins for an id in both)."""
    from zmlx_pipeline.data.catalog import load_catalog

    stored = devices_frame(store)
    cols = stored.columns
    catalog_rows = []
    for spec in load_catalog():
        row = spec.as_row()
        row["device_id"] = row.pop("id")
        catalog_rows.append({c: row.get(c) for c in cols})
    catalog = pl.DataFrame(catalog_rows, schema=stored.schema, orient="row")
    catalog = catalog.filter(~pl.col("device_id").is_in(stored["device_id"].to_list()))
    return pl.concat([stored, catalog], how="vertical")


def _anchors(features: KernelFeatures) -> pl.DataFrame:
    """One training row per distinct shape and per distinct config (fewer rows, same variation)."""
    f = features.frame
    picked = pl.concat([f.unique("shape_key", keep="first", maintain_order=True),
                        f.unique("config_key", keep="first", maintain_order=True)]).unique(
        ["device_id", "dtype", "shape_key", "config_key"], maintain_order=True)
    return picked.select(
        (pl.lit(_ANCHOR) + pl.col("device_id")).alias("device_id"), "kernel", "kernel_version", "dtype",
        "shape_key", "shape", "config_key", "config", pl.lit("ok").alias("status"),
        pl.col("median_us"), pl.lit(None, dtype=pl.String).alias("extra"), pl.lit(_STAMP).alias("measured_at"))


def candidate_rows(features: KernelFeatures, cases: Iterable[tuple[str, str, Mapping[str, int], list[dict]]]) -> pl.DataFrame:
    """Measurement-like rows for (device, dtype, shape, configs) cases, ready for kernel_features."""
    cols: dict[str, list] = {c: [] for c in ("device_id", "dtype", "shape_key", "shape", "config_key", "config")}
    # keyed by the config's items: the legal-config lists of different shapes hold equal configs as
    # distinct dicts, and hashing a tuple is far cheaper than the JSON and sha256 of the key
    config_cache: dict[tuple, tuple[str, str]] = {}
    for device_id, dtype, shape, configs in cases:
        skey, sjson = mapping_key(shape), canonical_json(dict(shape))
        for cfg in configs:
            items = tuple(cfg.items())
            cached = config_cache.get(items)
            if cached is None:
                cached = config_cache[items] = (mapping_key(cfg), canonical_json(cfg))
            cols["device_id"].append(device_id)
            cols["dtype"].append(dtype)
            cols["shape_key"].append(skey)
            cols["shape"].append(sjson)
            cols["config_key"].append(cached[0])
            cols["config"].append(cached[1])
    frame = pl.DataFrame(cols, schema={c: pl.String for c in cols})
    return frame.with_columns(
        pl.lit(features.kernel).alias("kernel"), pl.lit(features.kernel_version).alias("kernel_version"),
        pl.lit("ok").alias("status"), pl.lit(1.0).alias("median_us"), pl.lit(None, dtype=pl.String).alias("extra"),
        pl.lit(_STAMP).alias("measured_at"))


def featurize(features: KernelFeatures, rows: pl.DataFrame, devices: pl.DataFrame, needed: Iterable[str] = (),
              bytes_moved=None) -> pl.DataFrame:
    """The feature frame of candidate rows, with every column the kernel's models read (`needed`)."""
    anchors = _anchors(features)
    anchor_devices = devices.filter(pl.col("device_id").is_in(features.frame["device_id"].unique().to_list()))
    anchor_devices = anchor_devices.with_columns((pl.lit(_ANCHOR) + pl.col("device_id")).alias("device_id"))
    union = pl.concat([rows.select(_MEASUREMENT_COLUMNS), anchors.select(_MEASUREMENT_COLUMNS)], how="vertical")
    # no screening: the candidate rows' times are placeholders, and screening them as measurements
    # dropped every shape larger than the L2 from the published tables
    feats = kernel_features(union, pl.concat([devices, anchor_devices]), features.kernel, bytes_moved,
                            screen=False).frame
    feats = feats.filter(~pl.col("device_id").str.starts_with(_ANCHOR))
    missing = sorted({c for c in (*features.features, *needed) if c not in feats.columns})
    if missing:
        raise ValueError(f"{features.kernel}: the model reads feature(s) {', '.join(missing)} that the store's data "
                         "no longer yields: retrain with zmlx-pipeline train")
    return feats


def fast_score(ranker, feats: pl.DataFrame) -> np.ndarray:
    """ranker.score(feats), scoring each distinct feature row of a Pipeline model once.

    Many candidate rows share every feature a model reads (devices it cannot tell apart, say),
    so a PipelineRanker predicts the distinct rows only; an EnsembleRanker combines its members
    exactly as its own score does. Any other ranker is asked directly.
    """
    from zmlx_pipeline.models.estimators import EnsembleRanker, PipelineRanker, relative_to_case

    if isinstance(ranker, EnsembleRanker) and type(ranker).score is EnsembleRanker.score:
        total = sum(w * relative_to_case(feats, fast_score(m, feats)) for m, w in zip(ranker.members, ranker.weights))
        return np.asarray(total / sum(ranker.weights), dtype=float)
    if isinstance(ranker, PipelineRanker) and type(ranker).score is PipelineRanker.score:
        cols = list(ranker.features.features)
        groups = feats.select(cols).with_row_index("_i").group_by(cols, maintain_order=True).agg(pl.col("_i"))
        if groups.height < feats.height:
            pred = np.asarray(ranker.score(groups), dtype=float)
            out = np.empty(feats.height, dtype=float)
            out[groups["_i"].explode().to_numpy()] = np.repeat(pred, groups["_i"].list.len().to_numpy())
            return out
    return np.asarray(ranker.score(feats), dtype=float)


def score_rows(ranker, feats: pl.DataFrame) -> pl.DataFrame:
    """CASE + shape, config_key, config and the ranker's score (lower is better)."""
    return feats.select(*CASE, "shape", "config_key", "config").with_columns(
        pl.Series("score", fast_score(ranker, feats)).fill_nan(None))


def top_per_case(scored: pl.DataFrame, k: int) -> pl.DataFrame:
    """The k best-scored configs of each case (ties broken by config key), with the case's config count."""
    ranked = scored.sort([*CASE, "score", "config_key"], nulls_last=True).with_columns(
        pl.int_range(1, pl.len() + 1).over(CASE).alias("rank"), pl.len().over(CASE).alias("n_legal"))
    return ranked.filter(pl.col("rank") <= k)


def predict_log_time(time_model, feats: pl.DataFrame) -> np.ndarray:
    """The time model's predicted log time of each row (NaN without a time model)."""
    if time_model is None or feats.is_empty():
        return np.full(feats.height, np.nan)
    return fast_score(time_model, feats)


def config_dict(text: str) -> dict:
    return json.loads(text)
