"""train_eval_bench: a stage's own peak memory and its workers' peaks, the machine-speed fit, and the headline ratio
(train + evaluate shapes over one plain fit of the same rows, from the times of one run)."""

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

    from zmlx_pipeline.models.rankers.pipeline import boosting_regressor

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
    # the very model the stages fit (rankers.pipeline.boosting_regressor), not a look-alike
    assert all(params == boosting_regressor(max_iter=5).get_params() for _, _, params in seen)
    assert out["rows"] == 2_000 and out["trees"] == 5 and out["repeats"] == 2 and out["fit_s"] > 0


# ------------------------------------------------------------------------------------------
# the headline ratio: (train + evaluate-shapes) over one plain fit of the same rows, of one run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from store_fixtures import fill  # noqa: E402


class Clock:
    """A perf_counter that moves only when told: the stages' times are then known exactly."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stage_result(stage, wall, store="resampled"):
    detail = {"rows": 123, "columns": 34, "trees": 100, "matrix_s": 0.1} if stage == "reference" else {}
    return {"stage": stage, "store": store, "rows": 123, "wall_s": wall, "cpu_s": 2 * wall, "peak_rss_mib": 1.0,
            "worker_peak_rss_mib": 0.0, "total_peak_rss_mib": 1.0, "load_before": 0.0, "load_after": 0.0,
            "detail": detail}


def fake_run(monkeypatch, bench, walls):
    """main() without building stores or starting stages: each store's stages report the given walls."""
    monkeypatch.setattr(bench, "machine_speed", lambda: {"store": "machine", "stage": "calibration", "rows": 1,
                                                         "trees": 1, "repeats": 1, "fit_s": 0.5, "cpus": 2})
    monkeypatch.setattr(bench, "build_committed", lambda path, data, kt: 7)
    monkeypatch.setattr(bench, "build_resampled", lambda source, path, rows: 123)
    monkeypatch.setattr(bench, "measure", lambda db, label, rows, *a, **k: [
        stage_result(s, w, label) if w is not None else {"stage": s, "store": label, "rows": rows,
                                                         "stopped_after_s": 1.0}
        for s, w in walls[label].items()])


def test_ratio_is_each_stores_own_stage_times_over_its_reference_fit(monkeypatch, tmp_path, capsys):
    bench = load()
    walls = {"committed": {"reference": 2.0, "train": 10.0, "evaluate-shapes": 6.0, "evaluate-devices": 9.0},
             "resampled": {"reference": 40.0, "train": 70.0, "evaluate-shapes": 50.0, "evaluate-devices": 99.0}}
    fake_run(monkeypatch, bench, walls)
    out = tmp_path / "bench.json"
    bench.main(["--work", str(tmp_path / "work"), "--json", str(out), "--kernel-tuner", str(tmp_path / "none")])
    ratios = {r["store"]: r for r in json.loads(out.read_text()) if r["stage"] == "ratio"}
    assert ratios["committed"]["ratio"] == pytest.approx(16.0 / 2.0)             # its own stages, not the other store's
    assert ratios["resampled"]["ratio"] == pytest.approx(120.0 / 40.0)           # evaluate-devices is not in it
    assert ratios["resampled"]["train_evaluate_shapes_wall_s"] == 120.0
    assert ratios["resampled"]["reference_fit_s"] == 40.0 and ratios["resampled"]["target_ratio"] == 3.0
    printed = capsys.readouterr().out
    assert "resampled: train + evaluate shapes = 3.00x one plain boosting fit of the same rows" in printed
    assert "120.0 s against 40.0 s" in printed


def test_no_ratio_when_a_stage_of_it_was_stopped(monkeypatch, tmp_path, capsys):
    bench = load()
    walls = {"resampled": {"reference": 40.0, "train": 70.0, "evaluate-shapes": None, "evaluate-devices": 99.0}}
    fake_run(monkeypatch, bench, walls)
    out = tmp_path / "bench.json"
    bench.main(["--work", str(tmp_path / "work"), "--json", str(out), "--skip-committed",
                "--kernel-tuner", str(tmp_path / "none")])
    assert not [r for r in json.loads(out.read_text()) if r["stage"] == "ratio"]
    assert "resampled: ratio not measured (a stage was stopped)" in capsys.readouterr().out


def test_reference_stage_times_one_default_fit_of_every_row_on_one_thread(monkeypatch, tmp_path, make_measurement):
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_info

    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.models.evaluate import kernel_features_of

    bench = load()
    db = tmp_path / "small.duckdb"
    with Store(db) as store:
        fill(store, make_measurement)
        frames = kernel_features_of(store)
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    seen = []
    real_fit = HistGradientBoostingRegressor.fit

    def fit(self, X, y, *args, **kwargs):
        seen.append((X.shape, [p["num_threads"] for p in threadpool_info() if p["user_api"] == "openmp"],
                     self.get_params()))
        clock.now += 7.5  # the fit's time; building the matrix takes none on this clock
        return real_fit(self, X, y, *args, **kwargs)

    monkeypatch.setattr(HistGradientBoostingRegressor, "fit", fit)
    result = bench.run_stage(db, "reference")
    assert result["wall_s"] == 7.5
    rows = sum(f.frame.height for f in frames.values())
    # two kernels of two parameters and two dims: 12 parameter slots and 2 dim slots stay empty and are left out
    columns = bench.REFERENCE_COLUMNS - 2 * (bench.PARAM_SLOTS - 2) - (bench.DIM_SLOTS - 2)
    assert len(seen) == 1 and seen[0][0] == (rows, columns)
    assert set(seen[0][1]) == {1}                                           # the stages' thread limit
    assert seen[0][2] == HistGradientBoostingRegressor().get_params()        # default parameters
    assert result["detail"]["rows"] == rows and result["detail"]["columns"] == columns


def test_reference_matrix_puts_every_kernels_fields_in_the_same_columns(tmp_path, make_measurement):
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.models.evaluate import kernel_features_of

    bench = load()
    with Store(tmp_path / "small.duckdb") as store:
        fill(store, make_measurement)
        frames = kernel_features_of(store)
    X, y = bench.reference_matrix(frames)
    first = frames["k"].frame
    assert X.shape == (sum(f.frame.height for f in frames.values()), bench.REFERENCE_COLUMNS)
    assert np.allclose(y[:first.height], first["log_time"].to_numpy())
    params = 13                                   # after 11 device specs, dtype bytes and the kernel's number
    assert set(X[:first.height, 12]) == {0.0} and set(X[first.height:, 12]) == {1.0}
    assert np.allclose(X[:first.height, params], first["cfg_TG"].to_numpy())              # TG before VEC
    assert np.allclose(X[:first.height, params + 1], first["cfg_VEC"].to_numpy())
    assert np.allclose(X[:first.height, params + bench.PARAM_SLOTS], np.log2(first["cfg_TG"].to_numpy()))
    assert np.isnan(X[:, params + 2:params + bench.PARAM_SLOTS]).all()       # the slots these kernels lack
