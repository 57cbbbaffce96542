"""Held-out regret by how long the case's best config runs: where is the score lost?

    python benchmarks/regret_by_time.py --db STORE [--split shapes|devices] [--kernels a,b] [--json FILE]
                                        [--by bucket|device] [--cases FILE.parquet]

Runs the same held-out evaluation as `zmlx-pipeline evaluate` (the default model and every
baseline), then groups the per-case regrets by the measured best time of the case, in the buckets
`zmlx-pipeline noise` reports (zmlx_pipeline/data/noise_buckets.py): under 10 us MLX's dispatch
floor is about 5 us a launch, so most configs tie and repeats differ by about 20%; from 50 us up
repeats agree within about 3%. Prints one table per kernel,
with the noise-aware regret@1 (`tied@1`: a pick inside the store's repeat spread of the best is a tie;
models/metrics.py) next to the plain one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))



def bucket_expr(column: str = "best_us"):
    """A polars expression labelling each time with its noise bucket, as `bucket_index` would."""
    import polars as pl

    from zmlx_pipeline.data.noise_buckets import NOISE_BUCKETS_US, bucket_label

    expr = pl.lit(bucket_label(len(NOISE_BUCKETS_US)))
    for i in reversed(range(len(NOISE_BUCKETS_US))):  # an edge belongs to the bucket above it
        expr = pl.when(pl.col(column) < NOISE_BUCKETS_US[i]).then(pl.lit(bucket_label(i))).otherwise(expr)
    return expr.alias(column)


def main() -> int:
    import polars as pl
    from threadpoolctl import threadpool_limits

    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.models.evaluate import evaluate_kernel, kernel_features_of
    from zmlx_pipeline.models.metrics import noise_bands, tied_regrets

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--split", default="shapes", choices=("shapes", "devices"))
    ap.add_argument("--kernels", default=None, help="comma-separated (default: every kernel in the store)")
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--by", default="bucket", choices=("bucket", "device"),
                    help="group by the time bucket of the case's best, or by the case's device")
    ap.add_argument("--cases", dest="cases_out", default=None, help="also write every per-case regret to this Parquet file")
    args = ap.parse_args()
    with Store(args.db, read_only=True) as store:
        feats = kernel_features_of(store, kernels=args.kernels.split(",") if args.kernels else None)
        bands = noise_bands(store)
    if bands.fallback:
        print("tie band: FALLBACK (the store has no repeats)")
    bucket = bucket_expr()
    rows, frames = [], []
    for kernel, f in feats.items():
        with threadpool_limits(1):
            per_case = evaluate_kernel(f, args.split, ks=(1, 3), baselines=True)
        per_case = tied_regrets(per_case, f.frame, bands, ks=(1, 3)).with_columns(bucket.alias("bucket"))
        if args.by == "device":
            per_case = per_case.with_columns(pl.col("device_id").alias("bucket"))
        frames.append(per_case.with_columns(pl.lit(kernel).alias("kernel")))
        table = (per_case.group_by(["bucket", "method"])
                 .agg(pl.len().alias("cases"), pl.col("r1").log().mean().exp().alias("regret1"),
                      pl.col("r3").log().mean().exp().alias("regret3"),
                      pl.col("tied1").log().mean().exp().alias("tied1"), pl.col("band").median().alias("band"))
                 .sort(["bucket", "regret1"]))
        print(f"\n{kernel} ({args.split})")
        for r in table.iter_rows(named=True):
            print(f"  {r['bucket']:22s} {r['method']:18s} cases {r['cases']:4d}  regret@1 {r['regret1']:.3f}  "
                  f"@3 {r['regret3']:.3f}  tied@1 {r['tied1']:.3f} (band {100 * r['band']:.1f}%)")
            rows.append({"kernel": kernel, "split": args.split, **r})
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1) + "\n")
    if args.cases_out and frames:
        pl.concat(frames, how="diagonal_relaxed").write_parquet(args.cases_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
