"""judged_scores' bootstrap: the interval brackets the figure and the paired share says which method is lower."""

from __future__ import annotations

import math

import polars as pl
import pytest
from bench_scripts import load as load_script


def load():
    return load_script("judged_scores")


def cases(method, regrets, device="d0"):
    return pl.DataFrame({"device_id": [device] * len(regrets), "kernel": ["k"] * len(regrets),
                         "dtype": ["float32"] * len(regrets), "shape_key": [f"s{i}" for i in range(len(regrets))],
                         "method": [method] * len(regrets), "r1": regrets})


def test_interval_brackets_the_geometric_mean_and_narrows_with_agreement():
    js = load()
    spread = [1.0, 1.0, 1.02, 1.05, 1.2, 1.0, 1.01, 1.1]
    frame = pl.concat([cases("model", spread), cases("flat", [1.03] * 8)])
    geo = math.exp(sum(math.log(r) for r in spread) / len(spread))
    wide = js.bootstrap(frame, "model", None, 1)
    assert wide["lo"] < geo < wide["hi"] and wide["beats"] is None
    flat = js.bootstrap(frame, "flat", None, 1)
    assert flat["lo"] == pytest.approx(1.03) and flat["hi"] == pytest.approx(1.03)


def test_paired_share_is_by_case_and_skips_cases_a_baseline_has_no_opinion_on():
    js = load()
    model = cases("model", [1.10, 1.00, 1.30, 1.00])
    always_worse = cases("base", [1.20, 1.01, 1.40, 1.02])  # worse on every case, though the model varies a lot
    assert js.bootstrap(pl.concat([model, always_worse]), "model", "base", 1)["beats"] == 1.0
    always_better = cases("base", [1.05, 1.00, 1.25, 1.00])
    assert js.bootstrap(pl.concat([model, always_better]), "model", "base", 1)["beats"] == 0.0
    partial = cases("base", [None, None, 2.0, None])  # an opinion on one case only: compared there
    assert js.bootstrap(pl.concat([model, partial]), "model", "base", 1)["beats"] == 1.0


def test_devices_filter_and_an_absent_method():
    js = load()
    frame = pl.concat([cases("model", [1.0, 1.0], "a"), cases("model", [1.5, 1.5], "b")])
    only_a = js.bootstrap(frame, "model", None, 1, devices=["a"])
    assert only_a["hi"] == pytest.approx(1.0)
    assert js.bootstrap(frame, "nope", None, 1) == {"lo": None, "hi": None, "beats": None}
