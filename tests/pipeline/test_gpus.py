"""Collect on several GPUs of one host: GPU selection, the split by case, one pinned worker per GPU, one store."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.data.detect import detect_device
from zmlx_pipeline.core.keys import mapping_key
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.kernels.harness import GpuUnhealthy
from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.pipeline.cli import cli
from zmlx_pipeline.pipeline.collect import CollectError, Task, TimingSettings, collect
from zmlx_pipeline.pipeline.gpus import (GpuSelectionError, measure_on_gpus, parse_gpus, partition_cases,
                                         partition_programs)
from zmlx_pipeline.pipeline.parallel import case_key

FAKE = (str(Path(__file__).with_name("fake_worker.py")),)


def _device():
    return detect_device({"device_name": "NVIDIA H200", "architecture": "sm_90"}, backend="cuda", gpu_cores=132)


@pytest.mark.parametrize("text,count,visible,want", [
    ("all", 4, "", ["0", "1", "2", "3"]),
    ("2", 4, "", ["0", "1"]),
    ("0,2,3", 4, "", ["0", "2", "3"]),
    ("3,", 4, "", ["3"]),
    ("1,0", 2, "4,7", ["7", "4"]),  # numbered as this process sees them, inside its inherited list
    ("all", 2, "GPU-aa,GPU-bb", ["GPU-aa", "GPU-bb"]),
])
def test_gpu_selection(text, count, visible, want):
    assert parse_gpus(text, count=count, visible=visible) == want


@pytest.mark.parametrize("text,count,fragment", [
    ("5", 4, "GPUs 0..3"), ("0,4", 4, "GPUs 0..3"), ("0,0", 4, "twice"), ("x", 4, "use all"),
    ("0", 4, "at least 1"), ("all", 0, "no CUDA GPU"),
])
def test_a_bad_selection_says_what_to_give(text, count, fragment):
    with pytest.raises(GpuSelectionError, match=fragment):
        parse_gpus(text, count=count, visible="")


@pytest.mark.parametrize("text", ["99999999999999999999", str(2 ** 40), "5"])
def test_a_count_above_the_hosts_gpus_is_refused_before_any_list_is_made(text):
    """Checked against the host first: a huge count is the same one line, not an overflow or a list of that size."""
    with pytest.raises(GpuSelectionError) as err:
        parse_gpus(text, count=2, visible="")
    assert str(err.value) == f"--gpus {text}: this host has GPUs 0..1"


def _tasks():
    spec = get_kernel("rmsnorm")
    configs = [{"TG": tg, "VEC": 1, "ROWS": 1} for tg in (32, 64, 128, 256)]
    return [Task(spec, d, {"rows": r, "cols": 4096}, c)
            for d in ("float16", "float32") for r in (16, 64, 256) for c in configs]


def test_cases_are_split_whole_and_balanced():
    tasks = _tasks()
    shares = partition_cases(tasks, 4)
    assert sorted(i for s in shares for i in s) == list(range(len(tasks)))
    owner = {}
    for w, share in enumerate(shares):
        assert share == sorted(share)
        for i in share:
            assert owner.setdefault(case_key(tasks[i]), w) == w
    assert sorted(len(s) for s in shares) == [4, 4, 8, 8]  # six cases of four configs over four GPUs


def test_each_program_is_compiled_by_one_worker_on_its_smallest_planned_shape():
    tasks = _tasks()
    shares = partition_cases(tasks, 3)
    programs = partition_programs(tasks, shares)
    picked = [tasks[i] for share in programs for i in share]
    keys = [(t.dtype, tuple(sorted(t.config.items()))) for t in picked]
    assert len(keys) == len(set(keys)) == 8  # 2 dtypes x 4 configs, each once over all workers
    assert all(t.shape["rows"] == 16 for t in picked)
    assert sorted(len(p) for p in programs) == [2, 3, 3]


def test_workers_load_only_after_every_worker_compiled_its_share(tmp_path, monkeypatch):
    log = tmp_path / "compile.jsonl"
    monkeypatch.setenv("FAKE_COMPILE_LOG", str(log))
    tasks = _tasks()
    got = [r for batch in measure_on_gpus(tasks, {"rmsnorm": "rmsnorm"}, "cuda", TimingSettings(timer="chain"),
                                          ["0", "1", "2"], worker=FAKE) for r in batch]
    assert len(got) == len(tasks)
    workers = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(w["gpu"] for w in workers) == ["0", "1", "2"]
    assert min(w["load_at"] for w in workers) >= max(w["compiled_at"] for w in workers)
    shared = [json.dumps(x[:2], sort_keys=True) for w in workers for x in w["share"]]
    assert len(shared) == len(set(shared)) == 8


def test_each_gpu_worker_is_pinned_and_no_task_is_timed_twice(tmp_path, monkeypatch):
    log = tmp_path / "workers.jsonl"
    monkeypatch.setenv("FAKE_LOG", str(log))
    tasks = _tasks()
    got = [r for batch in measure_on_gpus(tasks, {"rmsnorm": "rmsnorm"}, "cuda", TimingSettings(timer="chain"),
                                          ["0", "1", "2"], worker=FAKE) for r in batch]
    assert sorted(id(t) for _, t, _ in got) == sorted(id(t) for t in tasks)
    workers = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(w["gpu"] for w in workers) == ["0", "1", "2"] and all(w["gpu"] == w["job_gpu"] for w in workers)
    by_gpu = {w["gpu"]: set(w["items"]) for w in workers}
    for gpu, task, _ in got:
        assert tasks.index(task) in by_gpu[gpu]


def test_a_broken_gpu_stops_the_collect(monkeypatch):
    monkeypatch.setenv("FAKE_FATAL", "5")
    with pytest.raises(GpuUnhealthy, match="GPU"):
        list(measure_on_gpus(_tasks(), {"rmsnorm": "rmsnorm"}, "cuda", TimingSettings(timer="chain"), ["0", "1"],
                             worker=FAKE))


def test_results_that_arrive_together_are_stored_in_one_transaction(tmp_path, monkeypatch):
    """Four workers answering faster than one transaction per row: fewer transactions than rows, every row kept."""
    calls = []
    real = Store.record

    def spy(self, measurements):
        rows = list(measurements)
        calls.append(len(rows))
        time.sleep(0.02)  # a transaction on a loaded disk: results queue up behind it
        return real(self, rows)

    monkeypatch.setattr(Store, "record", spy)
    result, seen, rows, _ = _collect(tmp_path / "four.duckdb", ["0", "1", "2", "3"])
    assert len(rows) == len(seen) == result.planned == sum(calls) > 0
    assert len(calls) < len(rows) and max(calls) > 1


def test_results_measured_before_a_gpu_broke_are_stored(tmp_path, monkeypatch):
    from zmlx_pipeline.pipeline.collect import CollectError

    monkeypatch.setenv("FAKE_FATAL", "40")
    with pytest.raises(CollectError, match="results were saved"):
        _collect(tmp_path / "broken.duckdb", ["0"])
    with Store(str(tmp_path / "broken.duckdb"), read_only=True) as store:
        rows = store.measurements(kernel="rmsnorm")
    assert len(rows) == 40  # the items before the broken one, in the one worker's order


def _collect(path, gpus, **kw):
    seen = []
    with Store(str(path)) as store:
        result = collect(store, _device(), [get_kernel("rmsnorm")], dtypes=("float16", "float32"), preset="smoke",
                         settings=TimingSettings(timer="chain"), kernel_refs={"rmsnorm": "rmsnorm"}, gpus=gpus,
                         worker=FAKE, on_result=lambda t, o: seen.append((t.dtype, mapping_key(t.shape),
                                                                           mapping_key(t.config))), **kw)
        rows = store.measurements(device=result.device_id, kernel="rmsnorm")
        runs = store.runs(device=result.device_id)
    return result, seen, rows, runs


def test_a_collect_on_two_gpus_stores_the_keys_of_a_one_gpu_collect_once_each_in_a_run_per_gpu(tmp_path):
    one, seen_one, rows_one, _ = _collect(tmp_path / "one.duckdb", ["0"])
    two, seen_two, rows_two, runs = _collect(tmp_path / "two.duckdb", ["0", "1"])
    assert len(seen_two) == len(set(seen_two)) == two.planned == one.planned > 0
    assert set(seen_two) == set(seen_one)
    keys = lambda rows: sorted((r["dtype"], r["shape_key"], r["config_key"]) for r in rows)  # noqa: E731
    assert keys(rows_two) == keys(rows_one)
    assert {r["device_id"] for r in rows_two} == {two.device_id}
    assert set(two.gpu_runs) == {"0", "1"} and len(set(two.gpu_runs.values())) == 2
    assert {r["run_id"] for r in rows_two} == set(two.gpu_runs.values())
    assert sorted((r.get("settings") or {}).get("gpu") for r in runs) == ["0", "1"]
    again, seen_again, _, _ = _collect(tmp_path / "two.duckdb", ["0", "1"])
    assert again.planned == 0 and seen_again == []  # resumable: nothing left to time


def test_the_cli_refuses_gpus_without_a_cuda_gpu(tmp_path, gpu_backend):
    if gpu_backend == "cuda":
        pytest.skip("this machine has a CUDA GPU")
    out = CliRunner().invoke(cli, ["collect", "--db", str(tmp_path / "s.duckdb"), "--gpus", "2"])
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert "CUDA" in out.output and len(out.output.strip().splitlines()) == 1
    bad = CliRunner().invoke(cli, ["collect", "--db", str(tmp_path / "s.duckdb"), "--gpus", "two"])
    assert bad.exit_code == 2 and "use all, a count such as 2" in bad.output


def test_the_cli_says_how_to_get_ray_and_refuses_gpus_with_ray(tmp_path):
    import importlib.util

    db = str(tmp_path / "s.duckdb")
    both = CliRunner().invoke(cli, ["collect", "--db", db, "--gpus", "2", "--ray", "auto"])
    assert both.exit_code == 2 and "exclude each other" in both.output
    if importlib.util.find_spec("ray") is not None:
        pytest.skip("Ray is installed here")
    out = CliRunner().invoke(cli, ["collect", "--db", db, "-k", "rmsnorm", "--ray", "auto"])
    assert out.exit_code == 1 and "pip install 'zmlx-pipeline[ray]'" in out.output and "Traceback" not in out.output
