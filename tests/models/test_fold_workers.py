"""Speed without changed results: worker processes (jobs), the fit cache, the vectorised inner selection,
and the held-out folds that keep the final fit's ensemble selection."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from zmlx_pipeline.models import evaluate as ev, pool as pool_module
from zmlx_pipeline.models import cv_ensemble
from zmlx_pipeline.models.rankers import base as rankers_base
from zmlx_pipeline.models import transfer
from zmlx_pipeline.models import variants
from zmlx_pipeline.models.cv_ensemble import CVEnsembleRanker, _FoldRegret, interleave, interleave_ranks
from zmlx_pipeline.models.rankers.base import clear_fit_cache, fit_cached, make_pipeline
from zmlx_pipeline.models.evaluate import evaluate
from zmlx_pipeline.models.folds import EvaluationError, fold_plan, fold_rows, folds
from zmlx_pipeline.models.pool import KernelPool, check_jobs
from zmlx_pipeline.models.features import CASE, store_features
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models.train import train_models
from store_fixtures import DEVICES, fill


def _old_regret_logs(frame: pl.DataFrame, scores: np.ndarray, ks) -> float:
    """The inner selection's loss as the polars code computed it before _FoldRegret (the reference)."""
    df = frame.select(*CASE, "config_key", "median_us").with_columns(pl.Series("_s", np.asarray(scores, float)))
    df = df.sort([*CASE, "_s", "config_key"]).with_columns(pl.int_range(1, pl.len() + 1).over(CASE).alias("_r"))
    out = df.group_by(CASE).agg(
        [(pl.col("median_us").filter(pl.col("_r") <= k).min() / pl.col("median_us").min()).log().alias(f"r{k}")
         for k in ks])
    return float(out.select(pl.mean_horizontal([f"r{k}" for k in ks])).to_series().to_numpy().mean())


def test_check_jobs():
    assert check_jobs(None) >= 1 and check_jobs(3) == 3
    for bad in (0, -1, 1.5, True):
        with pytest.raises(EvaluationError, match="jobs"):
            check_jobs(bad)


def test_fold_regret_matches_the_polars_reference(store, make_measurement):
    fill(store, make_measurement, kernels=("k",))
    frame = store_features(store)["k"].frame
    rng = np.random.default_rng(0)
    regret = _FoldRegret(frame, (1, 5))
    for scores in (rng.random(frame.height), np.round(rng.random(frame.height), 1), np.zeros(frame.height)):
        assert regret.mean(scores) == pytest.approx(_old_regret_logs(frame, scores, (1, 5)), rel=1e-12, abs=1e-15)


def test_interleave_from_ranks_matches_the_polars_one(store, make_measurement):
    fill(store, make_measurement, kernels=("k",))
    frame = store_features(store)["k"].frame
    rng = np.random.default_rng(1)
    regret = _FoldRegret(frame, (1,))
    lists = [rng.random(frame.height), np.round(rng.random(frame.height), 1), np.zeros(frame.height)]
    assert np.array_equal(interleave_ranks([regret.ranks(v) for v in lists]), interleave(frame, lists))


def test_fit_cached_returns_the_same_fit_for_the_same_rows_only(store, make_measurement):
    fill(store, make_measurement, kernels=("k",))
    f = store_features(store)["k"]
    clear_fit_cache()
    X, y = f.frame.select(f.features), f.frame["log_rel"].to_numpy()
    make = lambda: make_pipeline(f, transfer._device_gbr())  # noqa: E731
    first = fit_cached(make(), X, y)
    assert fit_cached(make(), X, y) is first
    assert fit_cached(make(), X, y, np.ones(len(y))) is not first  # weights are part of the key
    other = fit_cached(make(), X, y + 1.0)
    assert other is not first
    fresh = make().fit(X, y)  # a cached fit predicts exactly as an uncached one
    assert np.array_equal(first.predict(X), fresh.predict(X))


def test_evaluate_is_the_same_in_workers_and_in_process(store, make_measurement, monkeypatch):
    fill(store, make_measurement)
    one = evaluate(store, "devices", ks=(1, 3), jobs=1)
    monkeypatch.setattr(pool_module, "PARALLEL_MIN_ROWS", 0)
    with KernelPool(store_features(store), jobs=2) as pool:
        assert pool.parallel
    two = evaluate(store, "devices", ks=(1, 3), jobs=2)
    assert two == one
    assert {r["method"] for r in one["results"]} >= {variants.DEFAULT_MODEL, "most_common_best"}


def test_a_small_store_stays_in_process(store, make_measurement):
    fill(store, make_measurement, kernels=("k",))
    with KernelPool(store_features(store), jobs=4) as pool:
        assert not pool.parallel and pool.submit("k", lambda f: f.kernel).result() == "k"


def test_a_pool_made_before_the_features_decides_by_the_stores_ok_rows(store, make_measurement, monkeypatch):
    fill(store, make_measurement)  # 2 kernels x 3 devices x 48 rows
    store.record([make_measurement(kernel="k", device_id=DEVICES[0], status="timeout", median_us=None,
                                   config={"TG": 32, "VEC": 1})])
    assert ev.ok_rows(store) == 288 and ev.ok_rows(store, "k") == 144
    assert ev.ok_rows(store, ["k"], [DEVICES[0]]) == 48 and ev.ok_rows(store, "nope") == 0
    monkeypatch.setattr(pool_module, "PARALLEL_MIN_ROWS", 145)
    assert not KernelPool(None, jobs=2, rows=ev.ok_rows(store, "k")).parallel
    with KernelPool(None, jobs=2, rows=ev.ok_rows(store)) as pool:
        assert pool.parallel and len(pool._executor._processes) == 2  # started with the block
        features = store_features(store)
        pool.attach(features)
        assert pool.submit("k2", _kernel_of).result() == "k2"


def _kernel_of(features) -> str:
    return features.kernel


def test_train_chooses_again_in_every_held_out_fold_and_scores_the_same_in_workers(
        store, make_measurement, monkeypatch):
    fill(store, make_measurement)
    calls = []
    real = CVEnsembleRanker._select
    monkeypatch.setattr(CVEnsembleRanker, "_select", lambda self, *a: calls.append(a[1]) or real(self, *a))
    one = train_models(store, jobs=1)
    # the final fits choose both settings (two per kernel); each held-out shape fold (nested, as evaluate's)
    # chooses again inside its training rows, only the seen setting its test rows use, and each left-out
    # device fold (recorded too) only the unseen setting
    folds = sum(len(fold_plan(f, "shapes")) for f in store_features(store).values())
    device_folds = sum(len(fold_plan(f, "devices")) for f in store_features(store).values())
    assert calls.count("shapes") == 2 + folds and folds >= 4
    assert calls.count("devices") == 2 + device_folds and device_folds == 2 * len(DEVICES)
    assert all(r["scores"]["prune_split"] == "shapes" and r["scores"]["prune_k"] for r in one)
    monkeypatch.setattr(pool_module, "PARALLEL_MIN_ROWS", 0)
    two = train_models(store, jobs=2)
    timing = ("fit_s", "train_s")
    for a, b in zip(one, two):
        assert {k: v for k, v in a["scores"].items() if k not in timing} == \
            {k: v for k, v in b["scores"].items() if k not in timing}
        assert a["data_fingerprint"] == b["data_fingerprint"]
        assert store.heldout_cases(a["model_id"], "shapes", "nested").drop("model_id").to_pylist() == \
            store.heldout_cases(b["model_id"], "shapes", "nested").drop("model_id").to_pylist()


def _full_fit_regrets(f, split: str) -> pl.DataFrame:
    """evaluate_kernel's ensemble rows, computed with ensembles that choose both settings (the reference)."""
    parts = []
    for name, train_filter, test_filter in folds(f.frame, split):
        train, test = fold_rows(f.frame, split, train_filter, test_filter)
        if train.is_empty() or test.is_empty():
            continue
        ranker = variants.make_ranker(f, "ensemble")
        assert ranker.only is None
        parts.append(ev.case_regrets(test, ranker.fit(train).score(test), (1, 3)).with_columns(
            pl.lit("ensemble").alias("method"), pl.lit(name).alias("fold")))
    return pl.concat(parts)


@pytest.mark.parametrize("split, setting", [("shapes", "shapes"), ("devices", "devices")])
def test_an_evaluation_fold_chooses_only_the_setting_its_test_rows_use(store, make_measurement, monkeypatch,
                                                                     split, setting):
    fill(store, make_measurement, kernels=("k",))
    f = store_features(store)["k"]
    calls = []
    real = CVEnsembleRanker._select
    monkeypatch.setattr(CVEnsembleRanker, "_select", lambda self, *a: calls.append(a[1]) or real(self, *a))
    got = ev.evaluate_kernel(f, split, ks=(1, 3), models=("ensemble",), baselines=False)
    n_folds = len(ev.fold_plan(f, split))
    # held-out shapes are scored on seen devices only: the left-out-device setting is never chosen there
    assert calls == [setting] * n_folds
    calls.clear()
    assert got.equals(_full_fit_regrets(f, split))  # the same per-case regrets as ensembles choosing both
    assert sorted(set(calls)) == ["devices", "shapes"]


def test_an_ensemble_fitted_for_seen_devices_refuses_unseen_ones(store, make_measurement):
    fill(store, make_measurement, kernels=("k",))
    f = store_features(store)["k"]
    held = pl.col("device_id") == DEVICES[0]
    train, unseen = f.frame.filter(~held), f.frame.filter(held)
    full = CVEnsembleRanker(f, ["prior", "transfer"], ["prior"]).fit(train)
    seen_only = CVEnsembleRanker(f, ["prior", "transfer"], ["prior"])
    seen_only.only = "seen"
    seen_only.fit(train)
    assert seen_only.inner_scores["devices"] is None and seen_only.inner_scores["shapes"] is not None
    assert (seen_only.weights_seen, seen_only.hedge_seen) == (full.weights_seen, full.hedge_seen)
    assert np.array_equal(seen_only.score(train), full.score(train))
    with pytest.raises(rankers_base.ModelError, match="seen devices only"):
        seen_only.score(unseen)
    seen_only.only = "neither"
    with pytest.raises(rankers_base.ModelError, match="expected seen, unseen or None"):
        seen_only.fit(train)


def test_inner_folds_thin_a_big_test_set_keeping_every_case_and_its_fastest_configs(store, make_measurement,
                                                                                   monkeypatch):
    fill(store, make_measurement, kernels=("k",))
    f = store_features(store)["k"]
    seen = []

    class Recording(_FoldRegret):
        def __init__(self, frame, ks):
            seen.append(frame)
            super().__init__(frame, ks)

    monkeypatch.setattr(cv_ensemble, "_FoldRegret", Recording)
    CVEnsembleRanker(f, ["prior", "simd_aligned"]).fit(f.frame)
    whole = list(seen)
    assert all(t.height < cv_ensemble.INNER_TEST_ROWS for t in whole)  # small stores: nothing thinned
    seen.clear()
    CVEnsembleRanker(f, ["prior", "simd_aligned"], inner_test_rows=40).fit(f.frame)
    assert len(seen) == len(whole)
    for full, thin in zip(whole, seen):
        assert thin.height < full.height
        assert thin.select(CASE).unique().sort(CASE).equals(full.select(CASE).unique().sort(CASE))
        per_case = lambda t: t.group_by(CASE).agg(pl.col("median_us").min().alias("best"),  # noqa: E731
                                                  pl.len().alias("n")).sort(CASE)
        a, b = per_case(full), per_case(thin)
        assert a["best"].to_list() == b["best"].to_list()  # every case keeps its fastest config ...
        assert (b["n"] >= a["n"].clip(upper_bound=rankers_base.FIT_SAMPLE_TOP)).all()  # ... and its top 8


def test_fits_in_this_process_use_one_openmp_thread():
    """As in a worker, for a kernel of any size: on a small machine OpenMP threads made `train -j 1` 2.6x
    slower (fit_threads)."""
    import sklearn.ensemble  # noqa: F401  (loads scikit-learn's OpenMP runtime)
    from threadpoolctl import threadpool_info

    from zmlx_pipeline.models.evaluate import fit_threads

    with fit_threads():
        openmp = [p for p in threadpool_info() if p["user_api"] == "openmp"]
        assert openmp and all(p["num_threads"] == 1 for p in openmp)


# ------------------------------------------------------------------------------------------
# stopping: a stopped or killed parent leaves no workers and no pool folder behind

_POOL_SCRIPT = '''
import os, signal, sys, time
from pathlib import Path


def sleepy(features, markers):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a task that will not stop for Ctrl-C (a long compiled call)
    Path(markers, f"{os.getpid()}.pid").write_text("")
    time.sleep(120)
    return features.kernel


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job ignores it)
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.models import evaluate as ev, pool as pool_module
    from zmlx_pipeline.pipeline.stops import terminate_as_interrupt

    pool_module.PARALLEL_MIN_ROWS = 0
    terminate_as_interrupt()
    with Store(sys.argv[1], read_only=True) as store:
        features = ev.kernel_features_of(store)
    try:
        with ev.KernelPool(features, jobs=2) as pool:
            [f.result() for f in [pool.submit(k, sleepy, sys.argv[2]) for k in features]]
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(3)
'''

posix_only = pytest.mark.skipif(os.name != "posix", reason="signals and /proc: POSIX")


def _gone(pid: int) -> bool:
    """The process has exited (a zombie that nobody reaped counts as exited; without /proc, signal 0 asks)."""
    if Path("/proc/self").exists():
        try:
            return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between open and read
            return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait(predicate, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.fixture
def busy_pool(tmp_path, make_measurement):
    """A process whose KernelPool has two workers, each in a two-minute task: (process, worker pids, temp
    folder). Its process group (the workers too) is killed afterwards, so a failed test leaves nothing."""
    db = tmp_path / "pool.duckdb"
    with Store(db) as writable:
        fill(writable, make_measurement)
    script, markers, tmp = tmp_path / "pool_script.py", tmp_path / "markers", tmp_path / "tmp"
    script.write_text(_POOL_SCRIPT)
    markers.mkdir()
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), str(db), str(markers)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    if not _wait(lambda: len(list(markers.iterdir())) == 2, 120):
        proc.kill()
        pytest.fail(f"the workers never started: {proc.communicate()}")
    yield proc, [int(p.stem) for p in markers.iterdir()], tmp
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


@posix_only
@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_a_stopped_parent_stops_its_busy_workers_and_removes_its_folder(busy_pool, how):
    proc, workers, tmp = busy_pool
    assert list(tmp.glob("zmlx-pool-*"))
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)   # the parent only, as `kill` or a scheduler does
    else:
        os.killpg(proc.pid, signal.SIGINT)  # the whole group, as Ctrl-C in a terminal does
    out, err = proc.communicate(timeout=60)  # the tasks sleep for 120 s: waiting for them would time out
    assert proc.returncode == 3 and "interrupted" in out, err
    assert _wait(lambda: all(_gone(pid) for pid in workers), 10)
    assert not list(tmp.glob("zmlx-pool-*"))


@posix_only
def test_workers_of_a_killed_parent_exit_and_the_next_pool_sweeps_its_folder(busy_pool):
    proc, workers, tmp = busy_pool
    proc.kill()
    proc.wait(timeout=10)
    assert _wait(lambda: all(_gone(pid) for pid in workers), 10)
    left = list(tmp.glob("zmlx-pool-*"))
    assert len(left) == 1  # SIGKILL: nothing in the parent could run
    assert pool_module.sweep_pool_folders(tmp) == left and not left[0].exists()


@posix_only
def test_the_sweep_keeps_the_folders_of_live_processes(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folders = {who: tmp_path / f"zmlx-pool-{pid}-abc" for who, pid in
               (("me", os.getpid()), ("parent", os.getppid()), ("dead", dead.pid))}
    for folder in folders.values():
        folder.mkdir()
        (folder / "0.arrow").write_bytes(b"x")
    (tmp_path / "zmlx-pool-notapid").mkdir()
    assert pool_module.sweep_pool_folders(tmp_path) == [folders["dead"]]
    assert folders["me"].exists() and folders["parent"].exists() and (tmp_path / "zmlx-pool-notapid").exists()


def _counting_fits(monkeypatch) -> list:
    """Spy on every scikit-learn Pipeline fit; returns the list each fit appends its row count to."""
    from sklearn.pipeline import Pipeline

    fits: list = []
    real = Pipeline.fit

    def fit(self, X, y=None, **params):
        fits.append(len(X))
        return real(self, X, y, **params)

    monkeypatch.setattr(Pipeline, "fit", fit)
    return fits


def test_a_folds_fits_are_shared_between_processes_and_only_for_the_same_rows(store, make_measurement, tmp_path,
                                                                              monkeypatch):
    fill(store, make_measurement, kernels=("k",))
    f = store_features(store)["k"]
    fits = _counting_fits(monkeypatch)
    clear_fit_cache()
    rankers_base.share_fits(tmp_path / "fits")
    try:
        first = ev._score_fold(f, 0, "devices", (1, 3), ("ensemble",), True)[0]
        made = len(fits)
        assert made > 0
        clear_fit_cache()  # as another worker process: nothing in memory, the pool's folder holds the fits
        again = ev._score_fold(f, 0, "devices", (1, 3), ("ensemble",), True)[0]
        assert len(fits) == made  # the identical fold was served from the shared fits
        assert all(a.equals(b) for a, b in zip(first, again))
        ev._score_fold(f, 1, "devices", (1, 3), ("ensemble",), True)  # other training rows: fitted
        assert len(fits) > made
        assert not list((tmp_path / "fits").glob("*.claim")) and not list((tmp_path / "fits").glob("*.tmp"))
    finally:
        rankers_base.share_fits(None)
        clear_fit_cache()
    # a fresh process naming the same folder fits nothing for fold 0
    code = ("import sys; from sklearn.pipeline import Pipeline; n = []; real = Pipeline.fit\n"
            "Pipeline.fit = lambda self, X, y=None, **p: (n.append(1), real(self, X, y, **p))[1]\n"
            "from zmlx_pipeline.data.store import Store; from zmlx_pipeline.models.features import store_features\n"
            "from zmlx_pipeline.models import evaluate as ev; from zmlx_pipeline.models.rankers.base import share_fits\n"
            "share_fits(sys.argv[2]); f = store_features(Store(sys.argv[1], read_only=True))['k']\n"
            "ev._score_fold(f, 0, 'devices', (1, 3), ('ensemble',), True); print(len(n))")
    store.close()
    out = subprocess.run([sys.executable, "-c", code, str(store.path), str(tmp_path / "fits")],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0"


def test_a_shared_fit_that_raised_leaves_no_claim_and_is_fitted_again(tmp_path):
    folder = tmp_path / "fits"
    folder.mkdir()

    def broken():
        raise ValueError("no rows")

    with pytest.raises(ValueError, match="no rows"):
        rankers_base._shared_fit(folder, "abc", broken)
    assert list(folder.iterdir()) == []
    assert rankers_base._shared_fit(folder, "abc", lambda: "fitted") == "fitted"
    assert rankers_base._shared_fit(folder, "abc", broken) == "fitted"  # stored: never fitted again
