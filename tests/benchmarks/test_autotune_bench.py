"""benchmarks/autotune_bench.py without a GPU: head-to-head rounds and ratios, within-2%, buckets, the summary, main()."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from zmlx_pipeline.data.noise_buckets import bucket_label
from zmlx_pipeline.kernels.harness import Outcome
from zmlx_pipeline.kernels.timing import Timing
from bench_scripts import load as load_script, script_path


bench = load_script("autotune_bench")


def ok(us: float) -> Outcome:
    return Outcome("ok", timing=Timing(median_us=us, p10_us=us, p90_us=us, samples=5, chain=1))


class ScriptedMeasure:
    """Answers each task from its own list of outcomes, in order, and records the call order."""

    def __init__(self, **answers):
        self.answers = {k: list(v) for k, v in answers.items()}
        self.calls: list[str] = []

    def __call__(self, task):
        self.calls.append(task)
        return self.answers[task].pop(0)


def test_head_to_head_primes_both_then_alternates_who_goes_first():
    measure = ScriptedMeasure(pick=[ok(99.0), ok(10.0), ok(11.0), ok(12.0)],
                              best=[ok(77.0), ok(10.0), ok(10.0), ok(10.0)])
    rounds = bench.head_to_head(measure, "pick", "best", 3)
    # one dropped measurement each (compiles), then pick first, best first, pick first
    assert measure.calls == ["pick", "best", "pick", "best", "best", "pick", "pick", "best"]
    assert rounds == [(10.0, 10.0, True), (11.0, 10.0, False), (12.0, 10.0, True)]
    assert bench.h2h_regret(rounds) == pytest.approx(1.1)  # median of 1.0, 1.1, 1.2; the 99/77 priming is not used


def test_head_to_head_failed_measurement_is_none_and_left_out_of_the_ratio():
    measure = ScriptedMeasure(pick=[ok(5.0), ok(5.0), Outcome("wrong_result", error="x"), ok(6.0)],
                              best=[ok(5.0), ok(4.0), ok(5.0), ok(5.0)])
    rounds = bench.head_to_head(measure, "pick", "best", 3)
    assert rounds[1] == (None, 5.0, False)
    assert bench.h2h_regret(rounds) == pytest.approx((1.25 + 1.2) / 2)  # rounds 1 and 3 only


def test_h2h_regret_median_and_none():
    assert bench.h2h_regret([(10.0, 10.0, True), (12.0, 10.0, False)]) == pytest.approx(1.1)
    assert bench.h2h_regret([(9.0, 10.0, True), (30.0, 10.0, False), (10.5, 10.0, True)]) == pytest.approx(1.05)
    assert bench.h2h_regret([(None, 10.0, True), (10.0, None, False)]) is None
    assert bench.h2h_regret([(10.0, 0.0, True), (11.0, 10.0, False)]) == pytest.approx(1.1)
    assert bench.h2h_regret([]) is None


def test_within_two_percent():
    assert bench.within([1.0, 1.02, 1.0201, 1.5]) == 0.5
    assert bench.within([1.019999]) == 1.0
    assert bench.within([]) is None


def test_by_bucket_uses_the_noise_buckets_in_order():
    rows = [{"best_us": us} for us in (1000.0, 9.99, 10.0, 49.9, 50.0, 999.9, 3.0)]
    groups = bench.by_bucket(rows)
    assert list(groups) == [bucket_label(i) for i in range(5)]
    assert list(groups) == ["0-10 us", "10-50 us", "50-200 us", "200-1000 us", ">= 1000 us"]
    assert [r["best_us"] for r in groups["0-10 us"]] == [9.99, 3.0]
    assert [r["best_us"] for r in groups["10-50 us"]] == [10.0, 49.9]  # an edge belongs to the bucket above
    assert [r["best_us"] for r in groups[">= 1000 us"]] == [1000.0]
    assert not hasattr(bench, "BUCKETS")


A, B, C = {"TG": 128, "VEC": 4}, {"TG": 256, "VEC": 4}, {"TG": 512, "VEC": 2}


def table(*pairs) -> dict:
    return {bench.config_key(c): us for c, us in pairs}


def tuned(config, timed=3):
    runs = [{"config": config, "status": "ok", "median_us": 9.8}] + \
        [{"config": {"TG": 32 * (i + 1)}, "status": "failed", "median_us": None} for i in range(timed - 1)]
    return SimpleNamespace(config=config, timed=runs, source="timed", median_us=9.8)


def test_score_shape_times_a_pair_once_and_reports_both_scores():
    calls = []

    def h2h(challenger, best):
        calls.append((challenger, best))
        return [(10.1, 10.0, True), (9.9, 10.0, False), (10.3, 10.0, True)]

    first = table((A, 10.0), (B, 10.5), (C, None))
    second = table((A, 11.0), (B, 10.2), (C, 12.0))
    row = bench.score_shape("rmsnorm", {"rows": 7, "cols": 512}, 3, first, second,
                            tuned({"VEC": 4, "TG": 256}), 1.25, "predicted", h2h)
    assert calls == [(B, A)]  # the pick and the repeat's best are the same config: timed once
    assert row["best"] == A and row["pick"] == {"VEC": 4, "TG": 256} and row["repeat_best"] == B
    assert row["regret"] == pytest.approx(1.05) and row["repeat_regret"] == pytest.approx(1.05)
    assert row["h2h_regret"] == pytest.approx(1.01) and row["repeat_h2h_regret"] == pytest.approx(1.01)
    assert row["h2h_rounds"][1] == {"first": "best", "pick_us": 9.9, "best_us": 10.0}
    assert row["repeat_h2h_rounds"][0] == {"first": "repeat_best", "repeat_best_us": 10.1, "best_us": 10.0}
    assert row["exhaustive_ok"] == 2 and row["pruned_timed"] == 3 and row["pick_us_own"] == 9.8
    # kept for replaying another bundle offline: every first-pass time, failures as None, and what was timed
    assert row["exhaustive_us"] == {bench.config_key(A): 10.0, bench.config_key(B): 10.5, bench.config_key(C): None}
    assert [p["config"] for p in row["pruned"]] == [bench.config_key(B), '{"TG": 32}', '{"TG": 64}']
    assert row["pruned"][0]["median_us"] == 9.8 and row["pruned"][1]["status"] == "failed"


def test_score_shape_pick_equal_to_best_is_exactly_one_without_timing():
    calls = []

    def h2h(challenger, best):
        calls.append(challenger)
        return [(None, None, True)]  # a pair whose every measurement failed

    row = bench.score_shape("softmax", {"rows": 3, "cols": 256}, 3, table((A, 4.0), (B, 4.1)),
                            table((A, 4.4), (B, 4.2)), tuned(A), 0.5, "measured", h2h)
    assert row["h2h_regret"] == 1.0 and row["h2h_rounds"] == []
    assert row["regret"] == 1.0
    assert calls == [B]  # only the repeat's best was timed against the best
    assert row["repeat_h2h_regret"] is None  # failed measurements: no number
    assert row["repeat_regret"] == pytest.approx(4.1 / 4.0)


def test_score_shape_without_tuner_or_head_to_head():
    row = bench.score_shape("swiglu", {"rows": 3, "cols": 256}, 2, table((A, 4.0), (B, 5.0)), table((B, 4.0)),
                            None, 0.0, None, None)
    assert row["pick"] is None and row["regret"] is None and row["pruned_timed"] == 0
    assert row["h2h_regret"] is None and row["repeat_h2h_regret"] is None  # off: not even the ties score 1.0
    assert row["repeat_regret"] == pytest.approx(1.25)
    assert bench.score_shape("swiglu", {"rows": 3}, 2, table((A, None)), {}, None, 0.0, None, None) is None


def row(best_us, regret, h2h, repeat, repeat_h2h, pick=True):
    return {"best_us": best_us, "pruned_timed": 10, "exhaustive_timed": 50, "pruned_wall_s": 2.0, "h2h_wall_s": 0.5,
            "pick": A if pick else None, "regret": regret, "h2h_regret": h2h, "repeat_regret": repeat,
            "repeat_h2h_regret": repeat_h2h, "h2h_rounds": [] if h2h in (None, 1.0) else [{}],
            "repeat_h2h_rounds": []}


def test_summarize_with_none_values():
    rows = [row(5.0, 1.30, 1.01, 1.20, 1.00),
            row(8.0, 1.10, None, None, None),
            row(80.0, 1.00, 1.00, 1.00, 1.00),
            row(300.0, None, 1.05, 1.04, 1.03)]
    s = bench.summarize(rows)
    assert s["shapes"] == 4 and s["timed_fraction"] == pytest.approx(0.2) and s["max_shape_fraction"] == 0.2
    assert s["pruned_wall_s"] == 8.0 and s["h2h_wall_s"] == 2.0 and s["h2h_timed_shapes"] == 2
    assert (s["scored"], s["within_2pct"], s["regret_max"]) == (3, pytest.approx(1 / 3), 1.30)
    assert s["regret_geomean"] == pytest.approx((1.30 * 1.10 * 1.00) ** (1 / 3))
    assert (s["h2h_scored"], s["h2h_within_2pct"], s["h2h_regret_max"]) == (3, pytest.approx(2 / 3), 1.05)
    assert s["h2h_regret_geomean"] == pytest.approx((1.01 * 1.00 * 1.05) ** (1 / 3))
    assert (s["repeat_scored"], s["repeat_within_2pct"]) == (3, pytest.approx(1 / 3))
    assert (s["repeat_h2h_scored"], s["repeat_h2h_within_2pct"]) == (3, pytest.approx(2 / 3))
    assert s["picks_without_exhaustive_time"] == 1
    assert list(s["by_best_time"]) == ["0-10 us", "50-200 us", "200-1000 us"]
    low = s["by_best_time"]["0-10 us"]
    assert low["shapes"] == 2 and low["within_2pct"] == 0.0 and low["scored"] == 2
    assert low["h2h_within_2pct"] == 1.0 and low["h2h_scored"] == 1
    assert low["repeat_h2h_within_2pct"] == 1.0 and low["repeat_within_2pct"] == 0.0
    assert low["h2h_regret_geomean"] == pytest.approx(1.01)
    line = bench.summary_line({**s, "device": "nvidia-h100-sxm", "exhaustive_wall_s": 100.0, "exhaustive_workers": 2})
    assert "picks within 2%: table 33.3% of 3, head-to-head 66.7% of 3" in line
    assert "second exhaustive pass within 2%: table 33.3% of 3, head-to-head 66.7% of 3" in line
    assert "max table 1.3000, head-to-head 1.0500" in line and "\n" not in line


def test_summarize_all_none_and_empty():
    s = bench.summarize([row(5.0, None, None, None, None, pick=False)])
    for prefix in ("", "h2h_", "repeat_", "repeat_h2h_"):
        assert s[f"{prefix}scored"] == 0
        assert s[f"{prefix}within_2pct"] is None and s[f"{prefix}regret_geomean"] is None
        assert s[f"{prefix}regret_max"] is None
    assert s["picks_without_exhaustive_time"] == 0
    line = bench.summary_line(s)
    assert "table n/a of 0, head-to-head n/a of 0" in line
    empty = bench.summarize([])
    assert empty["shapes"] == 0 and empty["timed_fraction"] is None and empty["by_best_time"] == {}
    assert bench.summary_line(empty).startswith("0 unseen shapes")


def test_defaults_and_bad_arguments(capsys, tmp_path):
    args = bench.parse_args([])
    assert args.shapes >= 20 and args.h2h and args.h2h_rounds == 7 and args.repeat and args.tune
    assert bench.parse_args(["--no-h2h", "--h2h-rounds", "3"]).h2h is False
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--h2h-rounds", "0"])
    assert exc.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # found before any GPU time is spent, not at the first write
        bench.parse_args(["--out", str(tmp_path / "missing" / "bench.json")])
    assert exc.value.code == 2 and "folder does not exist" in capsys.readouterr().err
    assert bench.parse_args(["--out", str(tmp_path / "bench.json")]).out == tmp_path / "bench.json"


def test_no_gpu_exits_2_with_one_line(monkeypatch, capsys):
    from zmlx_pipeline.data import detect

    monkeypatch.setattr(detect, "detect_backend", lambda: "cpu")
    assert bench.main(["--shapes", "24"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autotune_bench: no Metal or CUDA backend on this machine (MLX runs on the cpu)")
    assert err.count("\n") == 1


def test_help_runs_as_a_script():
    result = subprocess.run([sys.executable, str(script_path("autotune_bench")), "--help"], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0
    assert "--h2h-rounds" in result.stdout and "--no-h2h" in result.stdout


def install_doubles(monkeypatch):
    """Replace main()'s GPU parts on an H100's catalog row: exhaustive tables, tuner, measurer; returns their logs."""
    from zmlx_pipeline import runtime
    from zmlx_pipeline.data import detect
    from zmlx_pipeline.pipeline import collect

    autotune = importlib.import_module("zmlx_pipeline.runtime.tuner")

    real_detect = detect.detect_device
    monkeypatch.setattr(detect, "detect_backend", lambda: "cuda")
    monkeypatch.setattr(detect, "detect_device", lambda: real_detect(
        info={"device_name": "NVIDIA H100 80GB HBM3"}, backend="cuda", gpu_cores=132))
    passes = []

    def exhaustive(plan, dtype, limits, backend, jobs, settings):
        # pass 1: config i of a case takes 10 + i us; pass 2: configs 0 and 1 swap places
        passes.append(len(plan))
        out = {}
        for spec, shape in plan:
            legal = [bench.config_key(c) for c in spec.legal_configs(shape, dtype, limits)]
            times = {k: 10.0 + i for i, k in enumerate(legal)}
            if len(passes) == 2:
                times[legal[0]], times[legal[1]] = 11.0, 10.0
            out[bench.case_id(spec.name, shape)] = times
        return out, 2

    def tune(spec, shape, dtype, **kwargs):  # picks the table's second config, which the repeat finds best
        from zmlx_pipeline.kernels.spec import Limits

        row = real_detect(info={"device_name": "NVIDIA H100 80GB HBM3"}, backend="cuda", gpu_cores=132).row
        legal = spec.legal_configs(shape, dtype, Limits.from_device_row(row))
        return SimpleNamespace(config=legal[1], source="timed", median_us=9.5,
                               timed=[{"config": c, "status": "ok", "median_us": 9.5} for c in legal[:4]])

    made = []

    class Measurer:
        def __init__(self, backend, settings):
            self.settings, self.calls = settings, []
            made.append(self)

        def __call__(self, task):
            self.calls.append(task)
            return ok(10.0 if len(self.calls) % 2 else 10.5)

    monkeypatch.setattr(bench, "exhaustive", exhaustive)
    monkeypatch.setattr(runtime, "tune", tune)
    monkeypatch.setattr(autotune, "harness_measure", lambda warmup, iters, rotate_bytes=0, timer="chain": None)
    monkeypatch.setattr(collect, "GpuMeasurer", Measurer)
    return passes, made


def test_main_wiring_with_doubles(monkeypatch, tmp_path, capsys):
    passes, made = install_doubles(monkeypatch)
    out = tmp_path / "bench.json"
    assert bench.main(["--kernels", "rmsnorm,softmax", "--shapes", "4", "--h2h-rounds", "3", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    s, rows = result["summary"], result["rows"]
    assert passes == [4, 4] and s["shapes"] == 4 and s["stopped"] == "finished"
    assert (s["device"], s["exhaustive_workers"], s["h2h_rounds"]) == ("nvidia-h100-sxm", 2, 3)
    (measurer,) = made
    assert measurer.settings.rotate_bytes == 2 * 52428800  # collect's settings: twice the H100's L2
    assert len(measurer.calls) == 4 * (2 + 2 * 3)  # per shape one pair (pick == repeat's best), primed, 3 rounds
    for r in rows:
        assert r["regret"] == pytest.approx(11.0 / 10.0) and r["repeat_regret"] == pytest.approx(11.0 / 10.0)
        assert [x["first"] for x in r["h2h_rounds"]] == ["pick", "best", "pick"]
        # odd calls answer 10.0, even 10.5: pick first -> 10.0 vs 10.5, best first -> 10.0 vs 10.5 for the best
        assert [x["pick_us"] for x in r["h2h_rounds"]] == [10.0, 10.5, 10.0]
        assert r["h2h_regret"] == pytest.approx(10.0 / 10.5) and r["repeat_h2h_regret"] == r["h2h_regret"]
    assert s["within_2pct"] == 0.0 and s["h2h_within_2pct"] == 1.0 and s["repeat_h2h_within_2pct"] == 1.0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "picks within 2%: table 0.0% of 4, head-to-head 100.0% of 4" in last


def test_main_without_head_to_head_or_repeat(monkeypatch, capsys):
    passes, made = install_doubles(monkeypatch)
    assert bench.main(["--kernels", "softmax", "--shapes", "3", "--no-h2h", "--no-repeat"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert passes == [3] and made == []  # one exhaustive pass, nothing timed head to head
    assert result["summary"]["h2h_scored"] == 0 and result["summary"]["repeat_scored"] == 0
    for r in result["rows"]:
        assert r["h2h_regret"] is None and r["repeat_h2h_regret"] is None and r["repeat_regret"] is None
        assert r["regret"] == pytest.approx(11.0 / 10.0)


def test_first_call_wall_stats_median_p90_max():
    walls = [0.5, 0.2, 0.3, 4.0, 0.4, 0.1, 0.2, 0.3, 0.25, 0.35, None]
    assert bench.wall_stats(walls) == {"median": 0.3, "p90": 0.5, "max": 4.0}
    assert bench.wall_stats([None]) == {"median": None, "p90": None, "max": None}
