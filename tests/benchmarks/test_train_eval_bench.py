"""train_eval_bench's memory figures: a stage's own peak, not its parent's, and its workers' peaks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from bench_scripts import load as load_script, script_path


PATH = script_path("train_eval_bench")

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")

# a process that holds about 200 MiB, touched, for a second
HOLD = "import numpy as np, time; a = np.ones(200 * 2**20 // 8); time.sleep(1.0)"
PEAK = ("import json, sys; sys.path.insert(0, {root!r}); import importlib.util as u; "
        "s = u.spec_from_file_location('b', {path!r}); m = u.module_from_spec(s); s.loader.exec_module(m); "
        "import resource; print(json.dumps([m._status_kib('self', 'VmHWM'), "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))")


def load():
    return load_script("train_eval_bench")


def test_a_stage_started_by_a_big_parent_reports_its_own_peak():
    big = np.ones(300 * 2**20 // 8)  # the parent holds 300 MiB, as the bench after building the 1M store
    code = PEAK.format(root=str(PATH.parents[1]), path=str(PATH))
    own_kib, maxrss_kib = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                                    text=True, check=True).stdout)
    assert big.sum() > 0
    assert maxrss_kib > 300 * 1024        # what the bench used to report: the parent's peak
    assert own_kib < 200 * 1024           # the child's own (python + numpy, well under 200 MiB)


def test_sampler_sees_a_workers_peak_and_the_total():
    bench = load()
    with bench.MemorySampler(interval=0.05) as sampler:
        proc = subprocess.Popen([sys.executable, "-c", HOLD])
        while proc.poll() is None:
            time.sleep(0.05)
    assert proc.returncode == 0
    assert 200 * 1024 <= sampler.worker_peak_kib < 600 * 1024
    assert sampler.total_peak_kib >= sampler.worker_peak_kib


def test_descendants_include_grandchildren_and_not_self():
    bench = load()
    proc = subprocess.Popen([sys.executable, "-c",
                             "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(2)'])"])
    try:
        deadline = time.time() + 10
        found = []
        while time.time() < deadline:
            found = bench._descendants(proc.pid)
            if found:
                break
            time.sleep(0.05)
        assert len(found) == 1                   # the grandchild, seen from the child
        assert proc.pid in bench._descendants(os.getpid())
        assert os.getpid() not in bench._descendants(os.getpid())
    finally:
        proc.wait()


def test_machine_speed_times_the_same_fit_on_one_core(monkeypatch):
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_info

    from zmlx_pipeline.models.estimators import boosting_regressor

    bench = load()
    seen = []
    real_fit = HistGradientBoostingRegressor.fit

    def fit(self, X, y, *args, **kwargs):
        seen.append(([p["num_threads"] for p in threadpool_info() if p["user_api"] == "openmp"], X.sum(), self.get_params()))
        return real_fit(self, X, y, *args, **kwargs)

    monkeypatch.setattr(HistGradientBoostingRegressor, "fit", fit)
    out = bench.machine_speed(rows=2_000, trees=5, repeats=2)
    assert len(seen) == 2
    assert all(threads and set(threads) == {1} for threads, _, _ in seen)   # one core, whatever the machine has
    assert seen[0][1] == seen[1][1]                                          # the same data every time
    # the very model the stages fit (estimators.boosting_regressor), not a look-alike
    assert all(params == boosting_regressor(max_iter=5).get_params() for _, _, params in seen)
    assert out["rows"] == 2_000 and out["trees"] == 5 and out["repeats"] == 2 and out["fit_s"] > 0
