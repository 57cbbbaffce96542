"""The figures a ranker is chosen by, for one model variant, on a store: one table per split.

    python benchmarks/judged_scores.py --db STORE [--model NAME] [--split shapes,devices] [--jobs N] [--json FILE]

- shapes: per kernel, regret@1 and @3 (geometric mean) over the held-out-shape cases of the H100 and the H200
  together (the target: @1 <= 1.03, @3 <= 1.01, better than every baseline), and the best baseline's figures;
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


def pooled(per_case, ks, devices=None):
    """{method: {k: geometric mean regret}} over the per-case rows (of some devices)."""
    import polars as pl

    if devices is not None:
        per_case = per_case.filter(pl.col("device_id").is_in(list(devices)))
    out = per_case.group_by("method").agg(pl.len().alias("cases"),
                                          *[pl.col(f"r{k}").log().mean().exp().alias(f"r{k}") for k in ks])
    return {r["method"]: r for r in out.to_dicts()}


def bootstrap(per_case, method: str, baseline: str | None, k: int, devices=None, draws: int = 2000,
              seed: int = 0) -> dict:
    """The model's geometric-mean regret@k with a 95% interval over `draws` resamples of its cases, and the
    share of resamples in which it is below `baseline`'s (paired: a resample draws cases both methods scored,
    and both are averaged over them; None without a baseline)."""
    import numpy as np
    import polars as pl

    from zmlx_pipeline.models.features import CASE

    if devices is not None:
        per_case = per_case.filter(pl.col("device_id").is_in(list(devices)))
    keys = [c for c in CASE if c in per_case.columns]

    def logs(name, alias):
        rows = per_case.filter(pl.col("method") == name, pl.col(f"r{k}").is_not_null())
        return rows.select(*keys, pl.col(f"r{k}").log().alias(alias))

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


def main() -> int:
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.models.estimators import DEFAULT_MODEL
    from zmlx_pipeline.models.evaluate import KernelPool, gather_folds, kernel_features_of, submit_kernel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--split", default="shapes,devices")
    ap.add_argument("--kernels", default=None, help="comma-separated (default: every kernel)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--bootstrap", type=int, default=2000,
                    help="resamples of the cases for each figure's 95%% interval (0: none)")
    args = ap.parse_args()
    with Store(args.db, read_only=True) as store:
        features = kernel_features_of(store, args.kernels.split(",") if args.kernels else None)
    ks = (1, 3, 5)
    report: dict = {"model": args.model, "splits": {}}
    for split in args.split.split(","):
        t0 = time.perf_counter()
        with KernelPool(features, args.jobs) as pool:
            order = sorted(features, key=lambda k: -features[k].frame.height)
            futures = {k: submit_kernel(features[k], split, ks, (args.model,), True, pool=pool,
                                        together=split == "devices") for k in order}
            per_kernel = {k: gather_folds(futures[k], ks) for k in order}
        rows = []
        print(f"\n{split} ({time.perf_counter() - t0:.0f} s), model {args.model}")
        for kernel in sorted(per_kernel):
            per_case = per_kernel[kernel]
            if per_case.is_empty():
                continue
            imported = not any(d in JUDGED_SHAPE_DEVICES for d in per_case["device_id"].unique().to_list())
            devices = JUDGED_SHAPE_DEVICES if split == "shapes" else None
            scores = pooled(per_case, ks, devices)
            if args.model not in scores:
                continue
            show = (1, 3) if split == "shapes" else ((1, 5) if imported else (1,))
            mine = scores.pop(args.model)
            best = {k: min(scores.items(), key=lambda kv: kv[1][f"r{k}"]) if scores else (None, None) for k in show}
            row = {"kernel": kernel, "cases": mine["cases"], **{f"model_r{k}": round(mine[f"r{k}"], 4) for k in show},
                   **{f"baseline_r{k}": (best[k][0], round(best[k][1][f"r{k}"], 4)) for k in show if best[k][0]}}
            spread = {k: bootstrap(per_case, args.model, best[k][0], k, devices, args.bootstrap)
                      for k in show} if args.bootstrap else {}
            row.update({f"model_r{k}_ci95": [round(b["lo"], 4), round(b["hi"], 4)] for k, b in spread.items()
                        if b["lo"] is not None})
            row.update({f"beats_baseline_r{k}": b["beats"] for k, b in spread.items() if b["beats"] is not None})
            rows.append(row)

            def cell(k):
                b = spread.get(k) or {}
                ci = f" [95% {b['lo']:.4f}-{b['hi']:.4f}]" if b.get("lo") is not None else ""
                beats = f"; model below it in {b['beats']:.0%} of resamples" if b.get("beats") is not None else ""
                return (f"@{k} {mine[f'r{k}']:.4f}{ci} (best baseline {best[k][0]} "
                        f"{best[k][1][f'r{k}']:.4f}{beats})")

            cells = "  ".join(cell(k) for k in show if best[k][0])
            print(f"  {kernel:18s} cases {mine['cases']:4d}  {cells}")
        report["splits"][split] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
