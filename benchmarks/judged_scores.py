"""The figures a ranker is chosen by, for one model variant, on a store: one table per split.

    python benchmarks/judged_scores.py --db STORE [--model NAME] [--split shapes,devices] [--devices A,B] [--jobs N]
                                       [--json FILE]

- shapes: per kernel, regret@1 and @3 (geometric mean) over the held-out-shape cases of the H100 and the H200
  together (the target: @1 <= 1.03, @3 <= 1.01, better than every baseline), and the best baseline's figures.
  The headline figure is noise-aware: the geometric mean over the same cases of each case's regret_tied@k
  (evaluate.tied_regrets: max(1, regret@k / (1 + band)), 1.0 for a pick within the band of the best) where
  the case's best config runs under SMALL_US = 2 us, and of its plain regret@k elsewhere. Under 2 us two
  timings of one config differ by about as much as the picks do (the gpu timer's 32 ns step is 1.6-3% of the
  time), so there a pick within the measured repeat spread is a hit. The band is that spread for kernels of
  this size: evaluate's statistic (median of max/min - 1) over the store's repeat pairs whose first timing is
  under 2 us, of the case's device (with at least evaluate.MIN_PAIRS of them), else of every device; a store
  with no pair under 2 us uses the bands of all its pairs (evaluate's buckets: the first is 0-10 us, whose
  band is a third of the under-2-us one on data/), one with no pair at all evaluate's fallback. The plain
  figure is printed beside the headline, each against the best baseline by that same figure. JSON per
  kernel: model_noise_r{k} (headline), model_r{k} (plain), baseline_noise_r{k} and baseline_r{k}
  ([method, figure]), cases_under_small, ties_under_small_r{k} (those whose pick is inside the band) and
  band_under_small (their median band); the bands themselves under small_case_bands;
- devices: per kernel, regret@1 (and @5) over every left-out device's cases (our data: @1 <= 1.05; Kernel
  Tuner files: @1 <= 1.10 and @5 <= 1.05), and the best baseline at the same k.
The folds, models and baselines are evaluate.py's (submit_kernel), run in --jobs worker processes.
With --bootstrap N (default 2000; 0: off) each model figure also gets a 95% interval from resampling the
cases, and `beats` (the share of the same resamples, paired by case, in which the model's geometric mean is
below the best baseline's): how firmly a figure meets or misses its target, given this many cases.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

JUDGED_SHAPE_DEVICES = ("nvidia-h100-sxm", "nvidia-h200")
SMALL_US = 2.0  # a held-out-shape case whose best config runs faster is judged by its tied regret


def small_case_bands(pairs, min_pairs: int | None = None):
    """The tie bands of cases under SMALL_US: evaluate.NoiseBands of the repeat pairs whose first timing is
    under SMALL_US (all in its first bucket: per device with enough pairs, else pooled); of every pair when
    there is no such pair, and the fallback band when there is no pair at all."""
    from zmlx_pipeline.models.metrics import MIN_PAIRS, NoiseBands

    pairs = list(pairs)
    small = [p for p in pairs if p["median_us"] is not None and p["median_us"] < SMALL_US]
    return NoiseBands.from_pairs(small or pairs, MIN_PAIRS if min_pairs is None else min_pairs)


def band_summary(bands, pairs) -> dict:
    """bands.summary() for the JSON output, its buckets named for what small_case_bands took: the pairs under
    SMALL_US when the store has any (NoiseBands files them all in its first bucket), else every pair."""
    out = bands.summary()
    if any(p["median_us"] is not None and p["median_us"] < SMALL_US for p in pairs):
        out["statistic"] = f"median of max/min - 1 over the repeat pairs whose first timing is under {SMALL_US:g} us"
        out["bands"] = [{**b, "bucket": f"0-{SMALL_US:g} us"} for b in out["bands"]]
    return out


def noise_aware(per_case, frame, bands, ks):
    """per_case with each case's best_us, band and band_source (cases under SMALL_US only), tied{k} and the
    headline regret n{k}: tied{k} where the case's best runs under SMALL_US, r{k} elsewhere."""
    import polars as pl

    from zmlx_pipeline.models.metrics import tied_regrets

    out = tied_regrets(per_case, frame, bands, ks)
    small = pl.col("best_us") < SMALL_US
    return out.with_columns(
        small.alias("small"), pl.when(small).then(pl.col("band")).alias("band"),
        pl.when(small).then(pl.col("band_source")).alias("band_source"),
        *[pl.when(small).then(pl.col(f"tied{k}")).otherwise(pl.col(f"r{k}")).alias(f"n{k}") for k in ks])


def pooled(per_case, ks, devices=None):
    """{method: {k: geometric mean regret}} over the per-case rows (of some devices): r{k} plain and, where
    noise_aware added them, n{k} (the headline) with the cases under SMALL_US and how many were ties."""
    import polars as pl

    if devices is not None:
        per_case = per_case.filter(pl.col("device_id").is_in(list(devices)))
    columns = [c for k in ks for c in (f"r{k}", f"n{k}") if c in per_case.columns]
    extra = []
    if "small" in per_case.columns:
        extra = [pl.col("small").sum().alias("small_cases"), pl.col("band").filter(pl.col("small")).median().alias("band"),
                 *[(pl.col("small") & (pl.col(f"tied{k}") <= 1.0 + 1e-12)).sum().alias(f"small_tied{k}")
                   for k in ks if f"tied{k}" in per_case.columns]]
    out = per_case.group_by("method").agg(pl.len().alias("cases"),
                                          *[pl.col(c).log().mean().exp().alias(c) for c in columns], *extra)
    return {r["method"]: r for r in out.to_dicts()}


def bootstrap(per_case, method: str, baseline: str | None, k: int, devices=None, draws: int = 2000,
              seed: int = 0, column: str = "r") -> dict:
    """The model's geometric-mean regret@k with a 95% interval over `draws` resamples of its cases, and the
    share of resamples in which it is below `baseline`'s (paired: a resample draws cases both methods scored,
    and both are averaged over them; None without a baseline). `column`: "r" plain regret, "n" the headline."""
    import numpy as np
    import polars as pl

    from zmlx_pipeline.models.features import CASE

    if devices is not None:
        per_case = per_case.filter(pl.col("device_id").is_in(list(devices)))
    keys = [c for c in CASE if c in per_case.columns]

    def logs(name, alias):
        rows = per_case.filter(pl.col("method") == name, pl.col(f"{column}{k}").is_not_null())
        return rows.select(*keys, pl.col(f"{column}{k}").log().alias(alias))

    rng = np.random.default_rng(seed)
    mine = logs(method, "m")
    if mine.is_empty():
        return {"lo": None, "hi": None, "beats": None}
    m = mine["m"].to_numpy()
    means = m[rng.integers(0, m.size, size=(draws, m.size))].mean(axis=1)
    lo, hi = np.exp(np.percentile(means, [2.5, 97.5]))
    beats = None
    if baseline is not None:
        both = mine.join(logs(baseline, "b"), on=keys, how="inner")
        if not both.is_empty():
            draw = rng.integers(0, both.height, size=(draws, both.height))
            diff = both["m"].to_numpy() - both["b"].to_numpy()
            beats = float((diff[draw].mean(axis=1) < 0).mean())
    return {"lo": float(lo), "hi": float(hi), "beats": beats}


def kernel_row(kernel: str, per_case, model: str, split: str, ks, draws: int = 2000,
               devices=None) -> tuple[dict, str] | None:
    """One kernel's figures ({kernel, cases, model_r{k}, baseline_r{k}, ...} and its printed line) from its
    per-case rows (with noise_aware's columns under `shapes`); None when the model scored no case.

    Under `shapes` the headline is model_noise_r{k} (noise_aware's n{k}) with the plain model_r{k} beside it,
    each against the best baseline by the same figure; under `devices` only the plain figures."""
    imported = not any(d in JUDGED_SHAPE_DEVICES for d in per_case["device_id"].unique().to_list())
    devices = devices if devices is not None else (JUDGED_SHAPE_DEVICES if split == "shapes" else None)
    scores = pooled(per_case, ks, devices)
    if model not in scores:
        return None
    show = (1, 3) if split == "shapes" else ((1, 5) if imported else (1,))
    mine = scores.pop(model)
    aware = split == "shapes" and "n1" in mine
    columns = ("n", "r") if aware else ("r",)
    best = {(c, k): min(scores.items(), key=lambda kv: kv[1][f"{c}{k}"]) if scores else (None, None)
            for c in columns for k in show}
    spread = {(c, k): bootstrap(per_case, model, best[c, k][0], k, devices, draws, column=c)
              for c in columns for k in show} if draws else {}
    row = {"kernel": kernel, "cases": mine["cases"]}
    if aware:
        row.update(headline="noise_r", small_us=SMALL_US, cases_under_small=mine["small_cases"],
                   band_under_small=None if mine["band"] is None else round(mine["band"], 4),
                   **{f"ties_under_small_r{k}": mine[f"small_tied{k}"] for k in show})
    for c in columns:
        name = "noise_r" if c == "n" else "r"
        for k in show:
            row[f"model_{name}{k}"] = round(mine[f"{c}{k}"], 4)
            if best[c, k][0]:
                row[f"baseline_{name}{k}"] = (best[c, k][0], round(best[c, k][1][f"{c}{k}"], 4))
            b = spread.get((c, k)) or {}
            if b.get("lo") is not None:
                row[f"model_{name}{k}_ci95"] = [round(b["lo"], 4), round(b["hi"], 4)]
            if b.get("beats") is not None:
                row[f"beats_baseline_{name}{k}"] = b["beats"]

    def cell(c, k):
        b = spread.get((c, k)) or {}
        ci = f" [95% {b['lo']:.4f}-{b['hi']:.4f}]" if b.get("lo") is not None else ""
        beats = f"; model below it in {b['beats']:.0%} of resamples" if b.get("beats") is not None else ""
        base = best[c, k]
        return f"{mine[f'{c}{k}']:.4f}{ci} (best baseline {base[0]} {base[1][f'{c}{k}']:.4f}{beats})"

    cells = []
    for k in show:
        if not best["r", k][0]:
            continue
        cells.append(f"@{k} {cell('n', k)}, plain {cell('r', k)}" if aware else f"@{k} {cell('r', k)}")
    small = ""
    if aware:
        band = "" if mine["band"] is None else f", band {mine['band']:.1%}"
        small = f" (under {SMALL_US:g} us: {mine['small_cases']}{band})"
    return row, f"  {kernel:18s} cases {mine['cases']:4d}{small}  " + "  ".join(cells)


def main(argv: list[str] | None = None) -> int:
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.models.variants import DEFAULT_MODEL
    from zmlx_pipeline.models.evaluate import gather_folds, kernel_features_of, submit_kernel
    from zmlx_pipeline.models.pool import KernelPool

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--split", default="shapes,devices")
    ap.add_argument("--kernels", default=None, help="comma-separated (default: every kernel)")
    ap.add_argument("--devices", default=",".join(JUDGED_SHAPE_DEVICES),
                    help="comma-separated devices whose held-out-shape cases are judged (default: %(default)s)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--bootstrap", type=int, default=2000,
                    help="resamples of the cases for each figure's 95%% interval (0: none)")
    args = ap.parse_args(argv)
    with Store(args.db, read_only=True) as store:
        features = kernel_features_of(store, args.kernels.split(",") if args.kernels else None)
        pairs = store.repeat_pairs()
    bands = small_case_bands(pairs)
    ks = (1, 3, 5)
    judged = tuple(args.devices.split(","))
    report: dict = {"model": args.model, "small_us": SMALL_US, "small_case_bands": band_summary(bands, pairs),
                    "splits": {}}
    for split in args.split.split(","):
        t0 = time.perf_counter()
        with KernelPool(features, args.jobs) as pool:
            order = sorted(features, key=lambda k: -features[k].frame.height)
            futures = {k: submit_kernel(features[k], split, ks, (args.model,), True, pool=pool,
                                        together=split == "devices") for k in order}
            per_kernel = {k: gather_folds(futures[k], ks) for k in order}
        rows = []
        print(f"\n{split} ({time.perf_counter() - t0:.0f} s), model {args.model}"
              + (f"; headline: tied regret where the best config runs under {SMALL_US:g} us, else plain"
                 if split == "shapes" else ""))
        for kernel in sorted(per_kernel):
            per_case = per_kernel[kernel]
            if per_case.is_empty():
                continue
            if split == "shapes":
                per_case = noise_aware(per_case, features[kernel].frame, bands, ks)
            out = kernel_row(kernel, per_case, args.model, split, ks, args.bootstrap,
                             judged if split == "shapes" else None)
            if out is None:
                continue
            rows.append(out[0])
            print(out[1])
        report["splits"][split] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
