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


def test_a_floor_is_never_the_best_baseline():
    result = {"results": [row("model", 1, 1.02, 1.01), row("most_common_best", 1, 1.05, 1.04),
                          row("oracle_device", 1, 1.001, 1.0)],
              "floors": {"oracle_device": "after the fact"}}
    (got,) = score_table(result, "devices")
    assert got["baseline"] == "most_common_best" and got["best_baseline@1"] == 1.05
    assert got["best_baseline_tied@1"] == 1.04


def test_main_job_says_each_step_with_elapsed_and_time_left(tmp_path):
    """A line as each step starts and ends (the end with an estimate of the time left), publish's own
    lines indented under its step."""
    import re
    import sys
    from pathlib import Path

    from threadpoolctl import threadpool_limits

    sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
    from bundle_fixtures import fill_toy

    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.pipeline.main_job import main_job

    with Store(tmp_path / "source.duckdb") as source:
        fill_toy(source)
        source.export_shard(tmp_path / "data" / "toy.parquet")
    lines: list[str] = []
    with Store(tmp_path / "store.duckdb") as store, threadpool_limits(limits=1):
        out = main_job(store, tmp_path / "data", tmp_path / "bundles", lookups=(), progress=lines.append)
    steps = ["ingest", "train", "evaluate shapes", "evaluate devices", "publish", "lookup"]
    starts = [m.group(1) for line in lines
              if (m := re.fullmatch(r"run: (.+) \(step (\d) of 6\), \d+:\d\d elapsed", line))]
    ends = [m for line in lines
            if (m := re.fullmatch(r"run: (.+) done in [\d.]+ s \((\d)/6\), \d+:\d\d elapsed, (about \d+:\d\d left|done)",
                                  line))]
    assert starts == steps and [m.group(1) for m in ends] == steps, lines
    assert [m.group(3) for m in ends][-1] == "done" and all(m.group(3).startswith("about") for m in ends[:-1])
    publish_at = next(i for i, line in enumerate(lines) if line.startswith("run: publish (step"))
    lookup_at = next(i for i, line in enumerate(lines) if line.startswith("run: lookup (step"))
    assert any(line.startswith("  publish: toy_scale: tables built (1/1)") for line in lines[publish_at:lookup_at])
    assert list(out["timings_s"]) == steps


def test_what_a_learning_step_refuses_names_the_data_it_learned_from(tmp_path):
    import sys
    from pathlib import Path

    import pytest

    sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
    from bundle_fixtures import fill_toy

    from zmlx_pipeline.core.errors import ZmlxPipelineError
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.models.evaluate import EvaluationError
    from zmlx_pipeline.pipeline.main_job import MainJobError, main_job

    with Store(tmp_path / "source.duckdb") as source:
        fill_toy(source)
        source.export_shard(tmp_path / "data" / "toy.parquet")
    with Store(tmp_path / "store.duckdb") as store, pytest.raises(MainJobError) as caught:
        main_job(store, tmp_path / "data", tmp_path / "bundles", kernels=["no_such_kernel"], lookups=())
    message = str(caught.value)
    assert message.startswith("no ok measurements of kernel(s) no_such_kernel")
    assert message.endswith(f"(data from {tmp_path / 'data'})") and "\n" not in message
    assert isinstance(caught.value.__cause__, EvaluationError) and isinstance(caught.value, ZmlxPipelineError)


def test_main_job_scores_equal_a_fresh_evaluation_of_each_split(tmp_path):
    """Train and both evaluations share the features and workers, and both splits are read from train's
    records: the score table is still that of evaluating each split from scratch."""
    import sys
    from pathlib import Path

    from threadpoolctl import threadpool_limits

    sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
    from bundle_fixtures import fill_toy

    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.models.evaluate import evaluate
    from zmlx_pipeline.pipeline.main_job import main_job

    with Store(tmp_path / "source.duckdb") as source:
        fill_toy(source)
        source.export_shard(tmp_path / "data" / "toy.parquet")
    with Store(tmp_path / "store.duckdb") as store, threadpool_limits(limits=1):
        out = main_job(store, tmp_path / "data", tmp_path / "bundles", lookups=())
        fresh = [row for split in ("shapes", "devices") for row in score_table(
            evaluate(store, split, ks=(1, 3, 5), label_model=True, jobs=1, refit=True), split)]
        held = {r["scores"]["prune_split"] for r in store.models()}
        recorded = {split for r in store.models() for split in ("shapes", "devices")
                    if store.heldout_count(r["model_id"], split, "nested")}
    assert out["scores"] == fresh and {r["split"] for r in fresh} == {"shapes", "devices"}
    assert held == {"shapes"}
    assert recorded == {"shapes", "devices"}  # so both tables above were read from train's records
