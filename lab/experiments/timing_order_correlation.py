"""Per case, the rank correlation between a config's place in the timing order (measured_at) and its time:
do configs timed later in a case read faster (swiglu)?

    python lab/experiments/timing_order_correlation.py [STORE]   (default /work/bench/committed.duckdb)
"""
import sys

import duckdb
import polars as pl

from zmlx_pipeline.models.features import CASE

pl.Config.set_tbl_rows(100)
con = duckdb.connect(sys.argv[1] if len(sys.argv) > 1 else "/work/bench/committed.duckdb", read_only=True)
d = con.sql("select device_id, kernel, dtype, shape_key, median_us, measured_at from measurements "
            "where status = 'ok' and kernel not like '%_milo' and kernel != 'matmul'").pl()
d = d.with_columns(best=pl.col("median_us").min().over(list(CASE)), order=pl.col("measured_at").rank().over(list(CASE)),
                   n=pl.len().over(list(CASE))).with_columns(pos=(pl.col("order") - 1) / (pl.col("n") - 1))
r = d.group_by(list(CASE)).agg(rho=pl.corr("pos", "median_us", method="spearman"), best=pl.col("best").first())
print(r.with_columns(small=pl.col("best") < 3).group_by("device_id", "kernel", "small")
      .agg(pl.len().alias("cases"), pl.col("rho").mean()).sort("kernel", "device_id", "small"))
