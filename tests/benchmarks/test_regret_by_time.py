"""regret_by_time's buckets are the noise command's (data/noise_buckets.py), edges included."""

from __future__ import annotations


import polars as pl

from zmlx_pipeline.data.noise_buckets import bucket_index, bucket_label
from bench_scripts import load as load_script


def load():
    return load_script("regret_by_time")


def test_bucket_expression_matches_bucket_index_at_and_between_edges():
    times = [0.5, 9.999, 10.0, 49.0, 50.0, 199.9, 200.0, 999.0, 1000.0, 5e4]
    got = pl.DataFrame({"best_us": times}).select(load().bucket_expr())["best_us"].to_list()
    assert got == [bucket_label(bucket_index(t)) for t in times]
    assert got[2] == "10-50 us" and got[-2] == ">= 1000 us"
