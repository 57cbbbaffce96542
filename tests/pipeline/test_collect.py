"""collect: resumable, budgeted, every failure a status, and kill -9 loses nothing committed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from zmlx_pipeline.core.keys import mapping_key
from zmlx_pipeline.data.detect import detect_device
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.kernels.harness import GpuUnhealthy, Outcome
from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.timing import Timing
from zmlx_pipeline.pipeline.collect import CollectError, collect, parse_duration

HERE = Path(__file__).parent
H200 = {"device_name": "NVIDIA H200", "architecture": "sm_90"}


def _device():
    return detect_device(H200, backend="cuda", gpu_cores=132)


def _ok(task):
    return Outcome("ok", timing=Timing(5.0, 4.5, 6.0, 3, 1))


def _row_keys(rows) -> list[tuple]:
    return [(r["device_id"], r["kernel"], r["kernel_version"], r["dtype"], r["shape_key"], r["config_key"]) for r in rows]


def _keys(path: Path) -> list[tuple]:
    with Store(path, read_only=True) as s:
        return _row_keys(s.measurements())


def test_second_run_measures_only_what_is_missing(store):
    spec = get_kernel("rmsnorm")
    calls = []
    ticks = iter(range(1000))
    # a clock that advances a second per reading: the budget runs out after the first measurement,
    # and the stop waits until the first case (one shape) has all its configs
    first = collect(store, _device(), [spec], dtypes=["float16"], preset="smoke", budget_s=1.5,
                    measurer=lambda t: calls.append(t) or _ok(t), clock=lambda: next(ticks))
    assert {mapping_key(t.shape) for t in calls} == {mapping_key(calls[0].shape)} and len(calls) > 1
    assert first.done == len(calls) and first.stopped == "budget" and first.remaining == first.planned - len(calls)
    second = collect(store, _device(), [spec], dtypes=["float16"], preset="smoke", measurer=_ok)
    assert second.already == len(calls)
    assert second.done == first.planned - len(calls) and second.stopped == "finished"
    third = collect(store, _device(), [spec], dtypes=["float16"], preset="smoke", measurer=_ok)
    assert third.planned == 0 and third.run_id is None


def test_failures_are_recorded_as_statuses(store):
    spec = get_kernel("rmsnorm")
    statuses = iter(["compile_error", "launch_error", "wrong_result", "timeout"])

    def measurer(task):
        s = next(statuses, "ok")
        return _ok(task) if s == "ok" else Outcome(s, error=f"fake {s}")

    res = collect(store, _device(), [spec], dtypes=["float32"], preset="smoke", measurer=measurer)
    rows = store.measurements(kernel="rmsnorm")
    by = {}
    for r in rows:
        by[r["status"]] = by.get(r["status"], 0) + 1
    assert by["compile_error"] == by["launch_error"] == by["wrong_result"] == by["timeout"] == 1
    assert res.by_status == by
    failed = [r for r in rows if r["status"] != "ok"]
    assert all(r["median_us"] is None and r["error"].startswith("fake") for r in failed)
    assert store.runs()[0]["status"] == "finished"


def test_broken_gpu_stops_the_run_and_keeps_what_was_saved(store):
    spec = get_kernel("rmsnorm")
    n = {"i": 0}

    def measurer(task):
        n["i"] += 1
        if n["i"] == 4:
            raise GpuUnhealthy("illegal memory access")
        return _ok(task)

    with pytest.raises(CollectError, match="3 results were saved"):
        collect(store, _device(), [spec], dtypes=["float32"], preset="smoke", measurer=measurer)
    assert len(store.measurements()) == 3
    assert store.runs()[0]["status"] == "failed"


def test_cpu_only_device_is_refused_without_a_measurer(store):
    cpu = detect_device({"device_name": "Intel Xeon", "architecture": "x86_64"}, backend="cpu")
    with pytest.raises(CollectError, match="no Metal or CUDA backend"):
        collect(store, cpu, [get_kernel("rmsnorm")])


def test_unknown_dtype_is_refused(store):
    with pytest.raises(CollectError, match="unknown dtype 'float64'"):
        collect(store, _device(), [get_kernel("rmsnorm")], dtypes=["float64"], measurer=_ok)


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("10m", 600), ("1.5h", 5400)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-5m", "0"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_sigkill_mid_collect_then_resume_gives_the_uninterrupted_key_set(tmp_path, subprocess_env):
    script = [sys.executable, str(HERE / "fake_collect.py")]
    full = tmp_path / "full.duckdb"
    subprocess.run(script + [str(full)], check=True, env=subprocess_env, capture_output=True, timeout=300)
    expected = _keys(full)
    assert len(expected) > 30

    killed = tmp_path / "killed.duckdb"
    proc = subprocess.Popen(script + [str(killed), "0.01"], env=subprocess_env, stdout=subprocess.PIPE, text=True)
    seen = 0
    for line in proc.stdout:
        seen += line.startswith("recorded")
        if seen == 15:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    partial = _keys(killed)
    assert 15 <= len(partial) < len(expected)
    with Store(killed, read_only=True) as s:
        assert [r["status"] for r in s.runs()] == ["running"]  # the killed run never finished

    subprocess.run(script + [str(killed)], check=True, env=subprocess_env, capture_output=True, timeout=300)
    resumed = _keys(killed)
    assert len(resumed) == len(set(resumed))  # nothing duplicated
    assert sorted(resumed) == sorted(expected)
    with Store(killed, read_only=True) as s:
        rows = s.measurements()
    # nothing half-written: every ok row carries its timings, every failed row its error
    assert all(r["median_us"] is not None and r["samples"] > 0 for r in rows if r["status"] == "ok")
    assert all(r["error"] for r in rows if r["status"] != "ok")


def test_repeat_times_a_stable_sample_once_into_the_repeats_table(store):
    from zmlx_pipeline.pipeline.collect import noise_summary, plan_repeats, repeat

    spec = get_kernel("rmsnorm")
    collect(store, _device(), [spec], preset="smoke", measurer=_ok)
    ok = store.measurements(status="ok")
    sample = plan_repeats(store, "nvidia-h200", [spec], 0.3)
    assert 0 < len(sample) < len(ok)
    assert sample == plan_repeats(store, "nvidia-h200", [spec], 0.3)  # chosen by key hash, not by chance
    slower = lambda t: Outcome("ok", timing=Timing(5.5, 5.0, 6.0, 3, 1))  # noqa: E731 - 10% slower than _ok
    result = repeat(store, _device(), [spec], fraction=0.3, measurer=slower)
    assert result.done == len(sample) and result.stopped == "finished"
    assert len(store.repeats()) == len(sample)
    again = repeat(store, _device(), [spec], fraction=0.3, measurer=slower)
    assert again.planned == 0  # a key is repeated once
    rows = {r["bucket"]: r for r in noise_summary(store)}
    assert rows["0-10 us"]["pairs"] == len(sample) and rows["0-10 us"]["median_diff"] == pytest.approx(0.1)
    assert rows["0-10 us"]["within_5pct"] == 0.0 and "> 50 us" not in rows


def test_repeat_rejects_a_fraction_out_of_range(store):
    from zmlx_pipeline.pipeline.collect import repeat

    with pytest.raises(CollectError, match="fraction"):
        repeat(store, _device(), [get_kernel("rmsnorm")], fraction=1.5, measurer=_ok)


def test_the_run_records_which_timer_measured_it(store):
    from zmlx_pipeline.pipeline.collect import TimingSettings

    spec = get_kernel("rmsnorm")
    collect(store, _device(), [spec], dtypes=["float16"], preset="smoke", measurer=_ok,
            settings=TimingSettings(timer="gpu"), shapes_limit=1)
    collect(store, _device(), [spec], dtypes=["float32"], preset="smoke", measurer=_ok,
            settings=TimingSettings(timer="chain"), shapes_limit=1)
    assert [r["settings"]["timing"] for r in store.runs()] == ["gpu-cupti", "chain-difference"]


def test_repeats_only_time_again_what_their_timer_measured(store):
    from zmlx_pipeline.pipeline.collect import TimingSettings, plan_repeats

    spec = get_kernel("rmsnorm")
    collect(store, _device(), [spec], dtypes=["float16"], preset="smoke", measurer=_ok,
            settings=TimingSettings(timer="chain"))
    collect(store, _device(), [spec], dtypes=["float32"], preset="smoke", measurer=_ok,
            settings=TimingSettings(timer="gpu"))
    every = plan_repeats(store, "nvidia-h200", [spec], 1.0)
    chain = plan_repeats(store, "nvidia-h200", [spec], 1.0, timing="chain-difference")
    gpu = plan_repeats(store, "nvidia-h200", [spec], 1.0, timing="gpu-cupti")
    assert {t.dtype for t in chain} == {"float16"} and {t.dtype for t in gpu} == {"float32"}
    assert len(chain) + len(gpu) == len(every) > 0


def test_a_case_partly_timed_by_another_timer_is_refused_and_nothing_is_recorded(store):
    from zmlx_pipeline.pipeline.collect import TimingSettings

    spec = get_kernel("rmsnorm")
    # a quick check (3 configs a shape) with the chain timer leaves every case partly measured
    collect(store, _device(), [spec], dtypes=["float16"], preset="smoke", measurer=_ok,
            settings=TimingSettings(timer="chain"), configs_limit=3, shapes_limit=1)
    before = sorted(_row_keys(store.measurements()))
    with pytest.raises(CollectError, match="chain-difference timer.*--timer chain"):
        collect(store, _device(), [spec], dtypes=["float16"], preset="smoke", measurer=_ok,
                settings=TimingSettings(timer="gpu"), shapes_limit=1)
    assert sorted(_row_keys(store.measurements())) == before and len(store.runs()) == 1
    # the same timer finishes the case
    done = collect(store, _device(), [spec], dtypes=["float16"], preset="smoke", measurer=_ok,
                   settings=TimingSettings(timer="chain"), shapes_limit=1)
    assert done.stopped == "finished" and done.done > 0


def test_untouched_cases_may_take_another_timer(store):
    from zmlx_pipeline.kernels.spec import Limits
    from zmlx_pipeline.pipeline.collect import TimingSettings, mixed_timer_cases, plan

    spec = get_kernel("rmsnorm")
    collect(store, _device(), [spec], dtypes=["float16"], preset="smoke", measurer=_ok,
            settings=TimingSettings(timer="chain"), shapes_limit=1)
    # the first shape is complete; the rest of the grid is new: nothing is mixed
    tasks, _ = plan(store, "nvidia-h200", [spec], ["float16"], "smoke", Limits.from_device_row(_device().row))
    assert tasks and mixed_timer_cases(store, "nvidia-h200", tasks, "gpu-cupti") == []
    done = collect(store, _device(), [spec], dtypes=["float16"], preset="smoke", measurer=_ok,
                   settings=TimingSettings(timer="gpu"))
    assert done.stopped == "finished" and done.done == len(tasks)


def test_a_gpu_the_catalog_lacks_is_collected_under_the_device_registered_for_it(store, tmp_path):
    """`devices add` registered the GPU under the name its backend reports: collect files its timings under that id
    and keeps the registration; at another core count (an MPS limit) it stays an unknown device, flagged, as before."""
    from device_records import record
    from zmlx_pipeline.data.registered import register_device

    register_device(store, record(tmp_path / "acme.json"))
    reported = {"device_name": "Acme X1 Accelerator", "architecture": "sm_89"}
    acme = detect_device(reported, backend="cuda", gpu_cores=20)
    assert not acme.known and acme.device_id.startswith("unknown-")
    spec = get_kernel("rmsnorm")
    result = collect(store, acme, [spec], dtypes=["float16"], preset="smoke", measurer=_ok)
    assert result.device_id == "acme-x1" and result.done > 0
    assert {m["device_id"] for m in store.measurements(kernel="rmsnorm")} == {"acme-x1"}
    assert [s.id for s in store.registered_devices()] == ["acme-x1"]  # its record kept, not the backend's report
    row = next(d for d in store.devices() if d["device_id"] == "acme-x1")
    assert row["in_catalog"] is False and row["flagged_unknown"] is False
    limited = collect(store, detect_device(reported, backend="cuda", gpu_cores=10), [spec], dtypes=["float16"],
                      preset="smoke", measurer=_ok)
    assert limited.device_id.startswith("unknown-")
    assert next(d for d in store.devices() if d["device_id"] == limited.device_id)["flagged_unknown"] is True
