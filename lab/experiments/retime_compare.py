"""Old against new timings of re-timed shards: per device, how many rows changed, and per re-timed case its
best and median config and the median p90/p10 before and after (the tables of notes/retime-small-compare.txt).

    python lab/experiments/retime_compare.py OLD_DIR NEW_DIR DEVICE_FILE...
    e.g. OLD_DIR = a checkout of data/ before the re-time, NEW_DIR = the shards lab/tools/device_retime.sh wrote,
    DEVICE_FILE = nvidia-h200 nvidia-h200-66sm nvidia-h200-32sm
"""
import sys

import polars as pl

pl.Config.set_tbl_rows(50); pl.Config.set_tbl_cols(20); pl.Config.set_tbl_width_chars(200)
pl.Config.set_tbl_hide_column_data_types(True); pl.Config.set_tbl_hide_dataframe_shape(True)
pl.Config.set_fmt_str_lengths(60)
KEY = ["kernel", "dtype", "shape_key", "config_key"]
old_dir, new_dir, names = sys.argv[1], sys.argv[2], sys.argv[3:]
for name in names:
    old = pl.read_parquet(f"{old_dir}/{name}.parquet")
    new = pl.read_parquet(f"{new_dir}/{name}.parquet")
    j = old.join(new, on=KEY, how="full", suffix="_new", coalesce=True)
    # a failed config has no time: eq_missing counts null == null as unchanged
    unchanged = pl.col("median_us").eq_missing(pl.col("median_us_new")) & pl.col("measured_at").eq_missing(
        pl.col("measured_at_new"))
    changed = j.filter(~unchanged)
    print(f"{new['device_id'][0]}: {changed.height} rows timed again "
          f"({changed.filter(pl.col('status').is_null()).height} of them missing before); "
          f"every other row unchanged: {j.filter(unchanged).height} of {new.height}")
    print(changed.filter(pl.col("status_new") == "ok").group_by("kernel", "dtype", "shape").agg(
        rows=pl.len(), old_best=pl.col("median_us").min(), new_best=pl.col("median_us_new").min(),
        old_med=pl.col("median_us").median(), new_med=pl.col("median_us_new").median(),
        **{"old_p90/p10": (pl.col("p90_us") / pl.col("p10_us")).median(),
           "new_p90/p10": (pl.col("p90_us_new") / pl.col("p10_us_new")).median()})
          .sort("shape", "dtype").with_columns(pl.selectors.float().round(3)))
    print()
