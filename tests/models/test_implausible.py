"""Rows faster than the device's memory allows are left out of the feature frames."""

from __future__ import annotations

import json

import polars as pl

from zmlx_pipeline.models.features import IMPLAUSIBLE_BANDWIDTH, declared_bytes_moved, drop_implausible


def _frame(rows):
    return pl.DataFrame(
        [{"shape": json.dumps({"n": n}), "dtype": "float16", "median_us": us, "memory_bandwidth_gbps": bw,
          "l2_bytes": 50_000_000, "tag": tag} for n, us, bw, tag in rows],
        schema={"shape": pl.String, "dtype": pl.String, "median_us": pl.Float64,
                "memory_bandwidth_gbps": pl.Float64, "l2_bytes": pl.Int64, "tag": pl.String},
    )


def test_a_time_beyond_the_bandwidth_is_dropped_and_the_rest_kept():
    # bytes moved = 2 bytes per element; 1e8 elements = 200 MB, beyond L2
    df = _frame([
        (100_000_000, 20.0, 3350.0, "impossible"),      # 10 TB/s on a 3.35 TB/s device
        (100_000_000, 70.0, 3350.0, "fast but real"),  # 2.9 TB/s
        (1_000_000, 0.2, 3350.0, "fits in L2"),         # 10 TB/s, but 2 MB stays in L2
        (100_000_000, 20.0, None, "unknown device bandwidth"),
    ])
    out = drop_implausible(df, lambda shape, b: shape["n"] * b)
    assert out["tag"].to_list() == ["fast but real", "fits in L2", "unknown device bandwidth"]
    assert out.columns == df.columns


def test_the_edge_is_the_stated_factor():
    bw = 1000.0
    edge_us = 200e6 / (IMPLAUSIBLE_BANDWIDTH * bw * 1e3)  # 200 MB at exactly the factor
    df = _frame([(100_000_000, edge_us * 1.01, bw, "inside"), (100_000_000, edge_us * 0.99, bw, "beyond")])
    assert drop_implausible(df, lambda shape, b: shape["n"] * b)["tag"].to_list() == ["inside"]


def test_no_model_of_bytes_keeps_everything():
    df = _frame([(100_000_000, 0.001, 3350.0, "kept")])
    assert drop_implausible(df, None).height == 1
    assert declared_bytes_moved("no_such_kernel") is None and declared_bytes_moved("pkg.mod:spec") is None
    assert declared_bytes_moved("rmsnorm") is not None
