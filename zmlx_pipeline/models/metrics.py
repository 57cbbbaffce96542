"""Scores of a ranking on held-out cases: regret@k per case, its summaries, the pruning k and the
noise-aware (tied) regret.

A case is one (device, kernel, dtype, shape); a method ranks the case's measured-ok configs.
regret@k = measured time of the best of the method's top k / measured best time of the case;
per (kernel, method, k) we report the geometric mean, the 95th percentile, the share of cases
within 2% of the best (`hit_2pct`) and the number of cases, per device and pooled (device None).

Pruning: per kernel, the smallest k whose top k holds a config within 2% of the case's
best in at least 95% of held-out cases (`prune_k`, from each case's `hit_rank`).

Noise-aware score, reported next to the plain regret (never instead of it): a pick whose
measured time is inside the repeat noise of the case's best is a tie, not a loss.
`regret_tied@k = max(1, regret@k / (1 + band))`: 1.0 when the pick is within the band of
the best, else its regret with the band taken off (continuous at the band's edge). The band
of a case is the median of max(a, b) / min(a, b) - 1 over the store's repeat pairs (one
config timed in two processes, `repeats` table) of the case's device in the time bucket of
the case's best (the buckets of `zmlx-pipeline noise`: < 10, 10-50, 50-200, 200-1000,
>= 1000 us); with fewer than MIN_PAIRS pairs there, all devices' pairs of that bucket
("pooled"), then the nearest bucket with enough pooled pairs ("pooled-nearest"); only a
store without any repeat uses FALLBACK_BAND (2%, the plain hit margin) and says "fallback".
Rows carry `regret_tied_geomean`, `hit_tied` (share of cases inside the band), `tied_band`
(median band of the row's cases) and `tied_band_source`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import polars as pl

from zmlx_pipeline.data.noise_buckets import bucket_index, bucket_label
from zmlx_pipeline.models.features import CASE

PRUNE_SHARE = 0.95
HIT_WITHIN = 1.02
# the tie band (noise-aware regret) is taken per time bucket of `zmlx-pipeline noise` (data/noise_buckets.py)
MIN_PAIRS = 20  # repeat pairs a (device, bucket) needs for its own band; fewer: pooled over devices
FALLBACK_BAND = HIT_WITHIN - 1.0  # only for a store with no repeat at all: the plain 2% hit margin


def case_regrets(frame: pl.DataFrame, scores: np.ndarray, ks: Sequence[int]) -> pl.DataFrame:
    """Per case: regret@k for each k (columns r1, r3, ...), from scores of the case's rows.

    Also `hit_rank`: the rank of the method's first config within 2% of the case's best,
    `configs`, the case's configs, and `pick_key`, the method's first config. Ranks by score, ties by
    config_key; cases whose scores are all NaN/null are dropped.
    """
    df = frame.select(*CASE, "config_key", "median_us").with_columns(
        pl.Series("_score", np.asarray(scores, dtype=float)).fill_nan(None))
    df = df.with_columns(pl.col("_score").is_not_null().any().over(CASE).alias("_scored")).filter("_scored")
    if df.is_empty():
        return pl.DataFrame(schema={**{c: pl.String for c in CASE}, **{f"r{k}": pl.Float64 for k in ks},
                                    "hit_rank": pl.Int64, "configs": pl.Int64, "pick_key": pl.String})
    df = df.sort([*CASE, "_score", "config_key"], nulls_last=True).with_columns(
        pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over(CASE).alias("_rank"))
    best = pl.col("median_us").min()
    return df.group_by(CASE, maintain_order=True).agg(
        [(pl.col("median_us").filter(pl.col("_rank") <= k).min() / best).alias(f"r{k}") for k in ks]
        + [pl.col("_rank").filter(pl.col("median_us") <= best * (HIT_WITHIN + 1e-12)).min().alias("hit_rank"),
           pl.len().cast(pl.Int64).alias("configs"), pl.col("config_key").first().alias("pick_key")]).sort(CASE)


def prune_k(hit_ranks: Sequence[int], share: float = PRUNE_SHARE) -> int | None:
    """The smallest k whose top k is within 2% of the best in at least `share` of the cases (None: no case)."""
    ranks = np.sort(np.asarray([r for r in hit_ranks if r is not None], dtype=np.int64))
    if ranks.size == 0:
        return None
    return int(ranks[math.ceil(share * ranks.size - 1e-9) - 1])


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
# noise-aware (tied) regret


@dataclass(frozen=True)
class NoiseBands:
    """Tie bands from repeat pairs: per (device, bucket) and pooled per bucket, (band, pairs).

    band = median of max(a, b) / min(a, b) - 1 over the pairs (a pick/best ratio is max/min by
    construction, so the band is on the same scale). Build with `noise_bands(store)` or
    `from_pairs`; no pairs at all means every case gets FALLBACK_BAND, marked "fallback".
    """

    by_device: dict = field(default_factory=dict)  # (device_id, bucket) -> (band, pairs)
    pooled: dict = field(default_factory=dict)     # bucket -> (band, pairs)
    pairs: int = 0
    min_pairs: int = MIN_PAIRS

    @classmethod
    def from_pairs(cls, pairs: Iterable[dict], min_pairs: int = MIN_PAIRS) -> NoiseBands:
        """Bands from rows {device_id, median_us (first timing, sets the bucket), repeat_us}."""
        spreads: dict = {}
        count = 0
        for p in pairs:
            a, b = p["median_us"], p["repeat_us"]
            if not a or not b or a <= 0 or b <= 0:
                continue
            bucket = bucket_index(a)
            spread = max(a, b) / min(a, b) - 1.0
            spreads.setdefault((p["device_id"], bucket), []).append(spread)
            spreads.setdefault((None, bucket), []).append(spread)
            count += 1
        stat = {key: (float(np.median(v)), len(v)) for key, v in spreads.items()}
        return cls(by_device={k: v for k, v in stat.items() if k[0] is not None},
                   pooled={k[1]: v for k, v in stat.items() if k[0] is None}, pairs=count, min_pairs=min_pairs)

    @property
    def fallback(self) -> bool:
        """True when the store had no repeat pair: every band is FALLBACK_BAND."""
        return self.pairs == 0

    def band(self, device_id: str, best_us: float) -> tuple[float, str]:
        """(band, source) for a case of this device whose best runs `best_us`; source is device,
        pooled, pooled-nearest or fallback."""
        if self.fallback:
            return FALLBACK_BAND, "fallback"
        bucket = bucket_index(best_us)
        own = self.by_device.get((device_id, bucket))
        if own and own[1] >= self.min_pairs:
            return own[0], "device"
        pooled = self.pooled.get(bucket)
        if pooled and pooled[1] >= self.min_pairs:
            return pooled[0], "pooled"
        enough = [b for b, (_, n) in self.pooled.items() if n >= self.min_pairs] or list(self.pooled)
        nearest = min(enough, key=lambda b: (abs(b - bucket), -b))  # a tie goes to the slower, quieter bucket
        return self.pooled[nearest][0], "pooled-nearest"

    def table(self) -> list[dict]:
        """Every measured band: {device (None = pooled), bucket, band, pairs, enough_pairs (at least min_pairs)}."""
        entries = [(None, b, v) for b, v in sorted(self.pooled.items())]
        entries += [(d, b, v) for (d, b), v in sorted(self.by_device.items())]
        return [{"device": d, "bucket": bucket_label(b), "band": band, "pairs": n, "enough_pairs": n >= self.min_pairs}
                for d, b, (band, n) in entries]

    def summary(self) -> dict:
        """What the JSON output says about the bands."""
        return {"statistic": "median of max/min - 1 over repeat pairs, per device and time bucket",
                "fallback": self.fallback, "fallback_band": FALLBACK_BAND if self.fallback else None,
                "pairs": self.pairs, "min_pairs": self.min_pairs, "bands": self.table()}


def noise_bands(store, min_pairs: int = MIN_PAIRS) -> NoiseBands:
    """The tie bands of a store's repeat pairs (its `repeats` table)."""
    return NoiseBands.from_pairs(store.repeat_pairs(), min_pairs)


def tied_regrets(per_case: pl.DataFrame, frame: pl.DataFrame, bands: NoiseBands, ks: Sequence[int]) -> pl.DataFrame:
    """per_case (from case_regrets/evaluate_kernel) with best_us, band, band_source and
    tied{k} = max(1, r{k} / (1 + band)) for each k: the noise-aware regret."""
    best = frame.group_by(CASE).agg(pl.col("median_us").min().alias("best_us"))
    keys = best.select("device_id", "best_us").unique()
    looked = [bands.band(d, us) for d, us in keys.iter_rows()]
    keys = keys.with_columns(pl.Series("band", [b for b, _ in looked], dtype=pl.Float64),
                             pl.Series("band_source", [s for _, s in looked], dtype=pl.String))
    best = best.join(keys, on=["device_id", "best_us"], how="left")
    out = per_case.join(best, on=list(CASE), how="left", maintain_order="left")
    band = 1.0 + pl.col("band")
    return out.with_columns([  # a null regret stays null (max_horizontal would make it 1.0)
        pl.when(pl.col(f"r{k}").is_null()).then(None).otherwise(pl.max_horizontal(pl.lit(1.0), pl.col(f"r{k}") / band))
        .alias(f"tied{k}") for k in ks])


def summarize_tied(tied: Sequence[float], bands: Sequence[float], sources: Sequence[str]) -> dict:
    """Geometric mean of tied regrets, share inside the band, median band and the band sources of the cases."""
    keep = [(t, b, s) for t, b, s in zip(tied, bands, sources) if t is not None and not math.isnan(t)]
    if not keep:
        return {"regret_tied_geomean": None, "hit_tied": None, "tied_band": None, "tied_band_source": None}
    values = np.asarray([t for t, _, _ in keep], dtype=float)
    return {
        "regret_tied_geomean": float(np.exp(np.log(values).mean())),
        "hit_tied": float((values <= 1.0 + 1e-12).mean()),
        "tied_band": float(np.median([b for _, b, _ in keep])),
        "tied_band_source": "+".join(sorted({s for _, _, s in keep})),
    }


def regret_rows(per_case: pl.DataFrame, kernel: str, ks: Sequence[int], methods: Iterable[str],
                labels: dict[str, str] | None = None) -> list[dict]:
    """Flat rows {kernel, device (None = pooled), method, k, regret_geomean, regret_p95, hit_2pct, cases}
    then, from tied_regrets' columns (None without them), regret_tied_geomean, hit_tied, tied_band and
    tied_band_source.

    `labels` renames methods in the rows (the CLI calls its one model "model").
    """
    labels = labels or {}
    rows = []

    def scores(part: pl.DataFrame, k: int) -> dict:
        plain = summarize(part[f"r{k}"].to_list())
        if f"tied{k}" not in part.columns:
            return {**plain, **summarize_tied([], [], [])}
        return {**plain, **summarize_tied(part[f"tied{k}"].to_list(), part["band"].to_list(),
                                          part["band_source"].to_list())}

    for method in methods:
        mine = per_case.filter(pl.col("method") == method)
        devices = sorted(mine["device_id"].unique().to_list())
        label = labels.get(method, method)
        for k in ks:
            rows.append({"kernel": kernel, "device": None, "method": label, "k": int(k), **scores(mine, k)})
            for d in devices:
                rows.append({"kernel": kernel, "device": d, "method": label, "k": int(k),
                             **scores(mine.filter(pl.col("device_id") == d), k)})
    return rows
