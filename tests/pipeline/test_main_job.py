"""The main job's score table: the model's plain and noise-aware regret next to the best baseline's."""

from __future__ import annotations

from zmlx_pipeline.pipeline.main_job import score_table


def row(method, k, plain, tied, device=None, source="device+pooled"):
    return {"kernel": "rmsnorm", "device": device, "method": method, "k": k, "regret_geomean": plain,
            "regret_p95": plain, "hit_2pct": 0.5, "cases": 10, "regret_tied_geomean": tied, "hit_tied": 0.7,
            "tied_band": 0.1, "tied_band_source": source}


def test_score_table_puts_the_tied_scores_next_to_the_plain_ones():
    result = {"results": [
        row("model", 1, 1.30, 1.05), row("model", 3, 1.10, 1.01), row("model", 5, 1.05, 1.0),
        row("nearest_shape", 1, 1.25, 1.08),      # best plain baseline
        row("most_common_best", 1, 1.40, 1.02),   # best tied baseline: another one
        row("model", 1, 9.0, 9.0, device="nvidia-h100-sxm"),  # per-device rows are not in the table
    ]}
    (got,) = score_table(result, "shapes")
    assert got["model@1"] == 1.30 and got["model_tied@1"] == 1.05 and got["tie_band"] == "device+pooled"
    assert (got["best_baseline@1"], got["baseline"]) == (1.25, "nearest_shape")
    assert got["best_baseline_tied@1"] == 1.02
