"""How far a second measurement of the same config (the store's `repeats`, another process) is from the first,
by the config's time, and how many of a kernel's held-out-shape cases sit under 2 us (swiglu).

    python lab/experiments/repeat_noise_by_time.py [STORE] [KERNEL]   (default /work/bench/committed.duckdb swiglu)
"""
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from judged_scores import JUDGED_SHAPE_DEVICES  # noqa: E402

from zmlx_pipeline.data.store import Store  # noqa: E402

store_path = sys.argv[1] if len(sys.argv) > 1 else "/work/bench/committed.duckdb"
kernel = sys.argv[2] if len(sys.argv) > 2 else "swiglu"
with Store(store_path, read_only=True) as store:
    pairs = pl.DataFrame([p for p in store.repeat_pairs() if p["kernel"] == kernel])
    rows = pl.DataFrame([m for m in store.measurements(kernel=kernel, status="ok")
                         if m["device_id"] in JUDGED_SHAPE_DEVICES]).select("device_id", "dtype", "shape_key", "median_us")

# difference over the faster of the two timings
diff = (pl.col("repeat_us") - pl.col("median_us")).abs() / pl.min_horizontal("repeat_us", "median_us")
bucket = (pl.when(pl.col("median_us") < 2).then(pl.lit("a: under 2 us")).when(pl.col("median_us") < 5).then(pl.lit("b: 2-5 us"))
          .when(pl.col("median_us") < 20).then(pl.lit("c: 5-20 us")).otherwise(pl.lit("d: 20 us and up")))
print(pairs.with_columns(bucket=bucket, diff=diff).group_by("device_id", "bucket")
      .agg(configs=pl.len(), median_diff=pl.col("diff").median(), p90_diff=pl.col("diff").quantile(0.9, "linear"))
      .sort("device_id", "bucket"))
cases = rows.group_by("device_id", "dtype", "shape_key").agg(best=pl.col("median_us").min())
print(cases.group_by("device_id").agg(cases=pl.len(), best_under_2us=(pl.col("best") < 2).sum(),
                                      best_under_5us=(pl.col("best") < 5).sum()).sort("device_id"))
