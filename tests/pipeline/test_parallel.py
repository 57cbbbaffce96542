"""Parallel measuring: the split over workers, the protocol, the budget stop and a broken GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zmlx_pipeline.kernels.harness import GpuUnhealthy
from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.pipeline.collect import Task, TimingSettings
from zmlx_pipeline.pipeline.parallel import case_key, measure_in_workers, partition

FAKE = (str(Path(__file__).with_name("fake_worker.py")),)


def _tasks(n_configs=6, shapes=(64, 256), dtypes=("float16", "float32")):
    spec = get_kernel("rmsnorm")
    configs = [{"TG": tg, "VEC": 1, "ROWS": 1} for tg in (32, 64, 128, 256, 512, 1024)[:n_configs]]
    return [Task(spec, d, {"rows": r, "cols": 4096}, c) for d in dtypes for r in shapes for c in configs]


def test_partition_covers_every_task_once_and_times_each_case_in_one_worker():
    tasks = _tasks()
    shares = partition(tasks, 3)
    flat = sorted(i for s in shares for i in s)
    assert flat == list(range(len(tasks)))
    owner = {}
    for w, share in enumerate(shares):
        for i in share:
            # processes dispatch at different speeds: a case's configs are compared, so one process times them
            assert owner.setdefault(case_key(tasks[i]), w) == w
    # two (kernel, dtype) groups: two workers, even though three were offered
    assert len(shares) == 2


def test_partition_balances_whole_groups_by_compiles():
    spec_a, spec_b = get_kernel("rmsnorm"), get_kernel("softmax")
    big = [Task(spec_a, "float16", {"rows": 64, "cols": 4096}, {"TG": tg, "VEC": v, "ROWS": 1})
           for tg in (32, 64, 128, 256) for v in (1, 2)]  # 8 compiles
    small = [Task(spec_b, d, {"rows": 64, "cols": 4096}, {"TG": 32, "VEC": v, "ROWS": 1})
             for d in ("float16", "float32") for v in (1, 2)]  # two groups of 2 compiles
    tasks = big + small
    shares = partition(tasks, 2)
    loads = sorted(len({(tasks[i].spec.name, tasks[i].dtype, tasks[i].config["TG"], tasks[i].config["VEC"])
                        for i in share}) for share in shares)
    assert loads == [4, 8]  # the big group alone, the two small ones together


def test_partition_keeps_shape_major_order_within_a_worker():
    tasks = _tasks()
    for share in partition(tasks, 2):
        assert share == sorted(share)


def test_workers_return_every_result_once_one_worker_at_a_time():
    tasks = _tasks()
    got = list(measure_in_workers(tasks, {"rmsnorm": "rmsnorm"}, "cuda", TimingSettings(), 3, worker=FAKE))
    assert len(got) == len(tasks)
    assert sorted(id(t) for t, _ in got) == sorted(id(t) for t in tasks)
    for task, outcome in got:
        assert outcome.status == "ok"
        assert outcome.timing.median_us == 10.0 + tasks.index(task)


def test_deadline_stops_early_and_leaves_the_rest():
    tasks = _tasks()
    ticks = iter(range(1000))
    got = list(measure_in_workers(tasks, {"rmsnorm": "rmsnorm"}, "cuda", TimingSettings(), 2,
                                  deadline=5, clock=lambda: next(ticks), worker=FAKE))
    assert 0 < len(got) < len(tasks)


def test_the_case_in_progress_is_finished_past_the_deadline():
    tasks = _tasks()  # cases of 6 configs each
    ticks = iter(range(1000))
    # past the deadline after the second result: the first case still gets all six of its configs
    got = list(measure_in_workers(tasks, {"rmsnorm": "rmsnorm"}, "cuda", TimingSettings(), 1,
                                  deadline=3, clock=lambda: next(ticks), worker=FAKE))
    assert len(got) == 6
    assert {case_key(t) for t, _ in got} == {case_key(tasks[0])}


def test_a_broken_gpu_in_a_worker_raises_after_the_results_before_it(monkeypatch):
    tasks = _tasks()
    monkeypatch.setenv("FAKE_FATAL", "3")
    got = []
    with pytest.raises(GpuUnhealthy):
        for item in measure_in_workers(tasks, {"rmsnorm": "rmsnorm"}, "cuda", TimingSettings(), 1, worker=FAKE):
            got.append(item)
    assert [tasks.index(t) for t, _ in got] == [0, 1, 2]
