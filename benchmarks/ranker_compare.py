"""Ranker variants side by side, each against the best baseline, per kernel and per left-out device.

    python benchmarks/ranker_compare.py --db STORE [--models ensemble,robust,...] [--split devices,shapes]
                                        [--kernels K,...] [--one-shape [--shape-seed N]] [--jobs N] [--json FILE]

For each split (evaluate.py's folds, nested protocol: every choice a variant makes is made inside the
fold's training rows) it prints, per kernel, each variant's regret@1 and @5 (geometric mean over the
cases; shapes: the H100 and H200 cases, @1 and @3, as judged_scores.py), the best baseline at the same k,
and under `devices` the after-the-fact floor (evaluate.ORACLE) and the spread over left-out devices
(the lowest and highest per-device regret@1 of the variant). A last line per variant counts the kernels
where it is at or below the best baseline at both k.

--one-shape keeps one shape per kernel (of the shapes measured on the most devices, the middle one of their
sorted keys, or with --shape-seed N one of them drawn at random) and
drops the kernels measured on one device only: our data in the regime of the public Kernel Tuner files (one
problem size measured on a few devices), to check a variant there on kernels it was not developed on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

JUDGED_SHAPE_DEVICES = ("nvidia-h100-sxm", "nvidia-h200")


def one_shape(features: dict, seed: int | None = None) -> dict:
    """Each kernel's frame cut to one shape (of the shapes measured on the most devices, the middle of their
    sorted keys, or with `seed` one drawn at random; kernels on fewer than 3 devices dropped)."""
    import random
    from dataclasses import replace

    import polars as pl

    out = {}
    for kernel, f in features.items():
        counts = f.frame.group_by("shape_key").agg(pl.col("device_id").n_unique().alias("n"))
        shapes = sorted(counts.filter(pl.col("n") == counts["n"].max())["shape_key"].to_list())
        pick = shapes[len(shapes) // 2] if seed is None else random.Random(f"{seed}:{kernel}").choice(shapes)
        frame = f.frame.filter(pl.col("shape_key") == pick)
        if frame["device_id"].n_unique() >= 3:
            out[kernel] = replace(f, frame=frame)
    return out


def summarise(per_case, methods, ks, devices=None) -> dict:
    """{method: {k: geometric mean}} over the per-case rows (of some devices)."""
    import polars as pl

    if devices is not None:
        per_case = per_case.filter(pl.col("device_id").is_in(list(devices)))
    out = per_case.filter(pl.col("method").is_in(list(methods))).group_by("method").agg(
        pl.len().alias("cases"), *[pl.col(f"r{k}").log().mean().exp().alias(f"r{k}") for k in ks])
    return {r["method"]: r for r in out.to_dicts()}


def main() -> int:
    import polars as pl

    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.models.baselines import baseline_names
    from zmlx_pipeline.models.evaluate import ORACLE, gather_folds, kernel_features_of, oracle_device, submit_kernel
    from zmlx_pipeline.models.pool import KernelPool

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--models", default="ensemble,robust,stacked,gbr_shared_top,rank_guarded")
    ap.add_argument("--split", default="devices,shapes")
    ap.add_argument("--kernels", default=None, help="comma-separated (default: every kernel)")
    ap.add_argument("--one-shape", action="store_true", help="one shape per kernel (see the docstring)")
    ap.add_argument("--shape-seed", type=int, default=None,
                    help="with --one-shape: draw each kernel's shape at random with this seed (default: the middle one)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    models = tuple(args.models.split(","))
    with Store(args.db, read_only=True) as store:
        features = kernel_features_of(store, args.kernels.split(",") if args.kernels else None)
    if args.one_shape:
        features = one_shape(features, args.shape_seed)
    report: dict = {"models": list(models), "one_shape": args.one_shape, "shape_seed": args.shape_seed, "splits": {}}
    for split in args.split.split(","):
        ks = (1, 5) if split == "devices" else (1, 3)
        t0 = time.perf_counter()
        with KernelPool(features, args.jobs) as pool:
            order = sorted(features, key=lambda k: -features[k].frame.height)
            futures = {k: submit_kernel(features[k], split, ks, models, True, pool=pool, together=split == "devices")
                       for k in order}
            per_kernel = {k: gather_folds(futures[k], ks) for k in order}
        print(f"\n{split} ({time.perf_counter() - t0:.0f} s){' one shape per kernel' if args.one_shape else ''}")
        rows, wins = [], {m: 0 for m in models}
        for kernel in sorted(per_kernel):
            per_case = per_kernel[kernel]
            if per_case.is_empty():
                continue
            if split == "devices":
                per_case = pl.concat([per_case, oracle_device(features[kernel], ks)])
            ours = any(d in JUDGED_SHAPE_DEVICES for d in per_case["device_id"].unique().to_list())
            devices = JUDGED_SHAPE_DEVICES if split == "shapes" and ours else None
            bases = baseline_names(features[kernel])
            scores = summarise(per_case, (*models, *bases, ORACLE), ks, devices)
            known = {b: v for b, v in scores.items() if b in bases and v[f"r{ks[0]}"] is not None}
            best = {k: min(known.items(), key=lambda kv: kv[1][f"r{k}"]) for k in ks}
            row = {"kernel": kernel, "cases": scores[models[0]]["cases"],
                   "best_baseline": {k: [best[k][0], round(best[k][1][f"r{k}"], 4)] for k in ks}}
            if ORACLE in scores:
                row["oracle"] = {k: round(scores[ORACLE][f"r{k}"], 4) for k in ks}
            print(f"  {kernel:18s} cases {row['cases']:4d}  best baseline "
                  + "  ".join(f"@{k} {best[k][1][f'r{k}']:.4f} ({best[k][0]})" for k in ks)
                  + ("  oracle " + "  ".join(f"@{k} {row['oracle'][k]:.4f}" for k in ks) if "oracle" in row else ""))
            for m in models:
                mine = scores[m]
                ok = all(mine[f"r{k}"] <= best[k][1][f"r{k}"] + 1e-12 for k in ks)
                wins[m] += ok
                per_device = per_case.filter(pl.col("method") == m).group_by("device_id").agg(
                    pl.col(f"r{ks[0]}").log().mean().exp().alias("r"))["r"]
                spread = f"  per device @{ks[0]} {per_device.min():.4f}-{per_device.max():.4f}" if split == "devices" else ""
                print(f"    {m:16s} " + "  ".join(f"@{k} {mine[f'r{k}']:.4f}" for k in ks)
                      + f"  {'<=' if ok else '> '} best baseline{spread}")
                row[m] = {k: round(mine[f"r{k}"], 4) for k in ks}
                if split == "devices":
                    row[m]["device_range"] = [round(per_device.min(), 4), round(per_device.max(), 4)]
            rows.append(row)
        print("  at or below the best baseline at both k: "
              + ", ".join(f"{m} {wins[m]}/{len(rows)}" for m in models))
        report["splits"][split] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
