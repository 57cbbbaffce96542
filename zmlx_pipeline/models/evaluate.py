"""Scores on data a model did not train on: regret@k per case, splits and baselines.

A case is one (device, kernel, dtype, shape); every method ranks the case's measured-ok
configs (what the runtime would choose among). regret@k = measured time of the best of the
method's top k / measured best time of the case; per (kernel, method, k) we report the
geometric mean, the 95th percentile, the share of cases within 2% of the best (`hit_2pct`)
and the number of cases, per device and pooled (device None).

Splits:
- `shapes`: held-out shapes on seen devices: each kernel's shapes in up to 5 folds (2 for a
  kernel of over LARGE_KERNEL_CASES = 500 cases); a fold's shapes are unseen on every device while
  training, its cases scored on devices seen in training (a kernel measured at one shape has
  no such case);
- `devices` (alias `lodo`): leave one device out: every case of the device is scored by
  methods trained on the other devices.

Baselines, built from the same training rows only:
- `chip_default`: the config whose threadgroup is closest to the device's catalog default
  threadgroup (ties broken by `common_top10`); kernels with no threadgroup parameter get
  `common_top10` instead: configs by how often they are in a training case's top 10;
- `seed_candidates`: the seed autotuner (Hmbown/ZMLX's device profiles): its three
  threadgroup candidates of the device (SEED_PROFILES: Apple base chips 64/128/256, Pro and
  Max 128/256/512, Ultra and M4 Max 256/512/1024, any other device the seed's fallback
  64/128/256), its default threadgroup first; the kernel's other parameters at the values of
  the `common_top10` leader. Its top 3 is what the seed times; kernels without thread
  parameters have no such baseline. The threadgroup of a config is the product of its thread
  parameters (TG, or block_size_x * block_size_y ... for imported kernels);
- `most_common_best`: the config most often best on that device in training (over all
  training devices when the device has none, as under `devices`);
- `nearest_shape`: the measured ranking of the nearest training shape on that device (log2
  dims); none under `devices`;
- `other_device_best`: the measured ranking of the most similar other device (normalised
  spec distance) on the same shape and dtype in training; none under `shapes`.
A method with nothing to say about a case does not score it (its `cases` count says so).

Pruning: per kernel, the smallest k whose top k holds a config within 2% of the case's
best in at least 95% of held-out cases (`prune_k`, from each case's `hit_rank`).

Noise-aware score, reported next to the plain regret (never instead of it): a pick whose
measured time is inside the repeat noise of the case's best is a tie, not a loss.
`regret_tied@k = max(1, regret@k / (1 + band))`: 1.0 when the pick is within the band of
the best, else its regret with the band taken off (continuous at the band's edge). The band
of a case is the median of max(a, b) / min(a, b) - 1 over the store's repeat pairs (one
config timed in two processes, `repeats` table) of the case's device in the time bucket of
the case's best (the buckets of `zmlx-pipeline noise`: < 10, 10-50, 50-200, 200-1000,
>= 1000 us); with fewer than MIN_PAIRS pairs there, all devices' pairs of that bucket
("pooled"), then the nearest bucket with enough pooled pairs ("pooled-nearest"); only a
store without any repeat uses FALLBACK_BAND (2%, the plain hit margin) and says "fallback".
Rows carry `regret_tied_geomean`, `hit_tied` (share of cases inside the band), `tied_band`
(median band of the row's cases) and `tied_band_source`.
"""

from __future__ import annotations

import contextlib
import io
import math
import multiprocessing
import os
import pickle
import re
import shutil
import signal
import tempfile
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import polars as pl

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.data.noise_buckets import bucket_index, bucket_label
from zmlx_pipeline.models.baselines import (  # noqa: F401  (re-exported: evaluate's baselines live there)
    BASELINES,
    SEED_FALLBACK,
    SEED_PROFILES,
    _from_source_case,
    baseline_names,
    baseline_scores,
    seed_threadgroups,
)
from zmlx_pipeline.models.estimators import DEFAULT_MODEL, MODEL_VARIANTS, make_ranker
from zmlx_pipeline.models.features import (
    CASE,
    KernelFeatures,
    build_features,
    devices_frame,
    measurements_frame,
)

SPLITS = ("shapes", "devices")
SPLIT_ALIASES = {"lodo": "devices"}
PROTOCOLS = ("nested", "fixed")
# the after-the-fact floor of the devices split: not a method one could use (it picks with the test device's times)
ORACLE = "oracle_device"
FLOORS = {ORACLE: "after the fact: for each left-out device, the one other device whose measured ranking "
                  "(same shape and dtype) gives the lowest regret on it, chosen per k with the left-out "
                  "device's own times; a floor for what copying one device can reach, not a method"}
PRUNE_SHARE = 0.95
HIT_WITHIN = 1.02
SHAPE_FOLDS = 5
# A kernel of more cases than this is held out in SHAPE_FOLDS_LARGE shape folds: fewer fits, and each fold's
# model still trains on over 250 cases, more than any fold of the committed data does (its largest kernels
# have 204 cases, 163 of them in a fold's training). Every case is still scored once; the committed data
# keeps 5 folds.
LARGE_KERNEL_CASES = 500
SHAPE_FOLDS_LARGE = 2
PARALLEL_MIN_ROWS = 20_000  # less work (rows over all kernels) runs in this process: workers take seconds to start
# the tie band (noise-aware regret) is taken per time bucket of `zmlx-pipeline noise` (data/noise_buckets.py)
MIN_PAIRS = 20  # repeat pairs a (device, bucket) needs for its own band; fewer: pooled over devices
FALLBACK_BAND = HIT_WITHIN - 1.0  # only for a store with no repeat at all: the plain 2% hit margin


class EvaluationError(ZmlxPipelineError, ValueError):
    "The evaluation cannot be run as asked"


def fit_threads():
    """A context limiting scikit-learn's OpenMP threads to one for the fits in this process, as in a worker.

    Parallelism comes from worker processes (--jobs); OpenMP threads inside a fit only cost time here: the
    fits are capped at estimators.MAX_FIT_ROWS rows, and on 2 cores a 200-tree fit of 50,000 rows took 1.1 s on one
    thread and 5.2 s on two (`train -j 1` on the committed data: 91 s against 241 s).
    """
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="openmp")


# ------------------------------------------------------------------------------------------
# worker processes


def default_jobs() -> int:
    """Worker processes by default: the CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check_jobs(jobs: int | None) -> int:
    """`jobs` as a count of worker processes (None: default_jobs()); EvaluationError below 1."""
    if jobs is None:
        return default_jobs()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise EvaluationError(f"jobs must be a whole number of at least 1, not {jobs!r}")
    return jobs


class _FramePickler(pickle.Pickler):
    """Pickles a task's result without the kernel's feature frame (rankers refer to it): the other side
    puts its own copy of the same frame back (_FrameUnpickler)."""

    def __init__(self, file, frame: pl.DataFrame) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._frame = frame

    def persistent_id(self, obj):
        return "frame" if obj is self._frame else None


class _FrameUnpickler(pickle.Unpickler):
    def __init__(self, file, frame: pl.DataFrame) -> None:
        super().__init__(file)
        self._frame = frame

    def persistent_load(self, pid):
        if pid != "frame":
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self._frame


_WORKER_FRAMES: dict[str, pl.DataFrame] = {}
POOL_PREFIX = "zmlx-pool-"  # + the parent's pid + "-": a pool folder whose process is gone is swept
_PARENT_POLL_S = 0.5


def _worker_init(parent: int) -> None:
    """In a new worker: leave Ctrl-C to the parent (KernelPool stops its workers when the parent is
    interrupted) and exit once the parent is gone. A worker waits on the task queue, whose pipe it holds
    open itself, so without this a killed parent's workers would live on and hold its memory and output."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="zmlx-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def sweep_pool_folders(base: str | Path | None = None) -> list[Path]:
    """Removes the pool folders (KernelPool's Arrow copies of the feature frames, hundreds of MB on a big
    store) that killed processes left in `base` (default: the temp folder); returns them. POSIX only: it
    asks whether the owner is alive with signal 0, which on Windows would end the process."""
    if os.name != "posix":
        return []
    swept = []
    for path in Path(base or tempfile.gettempdir()).glob(f"{POOL_PREFIX}*-*"):
        match = re.fullmatch(rf"{POOL_PREFIX}(\d+)-.+", path.name)
        if match and path.is_dir() and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            swept.append(path)
    return swept


def _ready() -> None:
    """A worker's first task: nothing, once its imports are done (KernelPool starts its workers with it)."""


def _worker_call(meta: KernelFeatures, path: str, fn: Callable, args: tuple) -> bytes:
    """In a worker: fn(features, *args) on the kernel's frame (read memory-mapped once per worker), pickled."""
    frame = _WORKER_FRAMES.get(path)
    if frame is None:
        while len(_WORKER_FRAMES) >= 2:
            _WORKER_FRAMES.pop(next(iter(_WORKER_FRAMES)))
        frame = _WORKER_FRAMES[path] = pl.read_ipc(path)
    result = fn(replace(meta, frame=frame), *args)
    buf = io.BytesIO()
    _FramePickler(buf, frame).dump(result)
    return buf.getvalue()


class _WakingFuture(Future):
    """A Future whose result() waits in short naps, so that Ctrl-C and SIGTERM reach the waiting main thread
    within _WAKE_S. A wait without a timeout was seen to sleep through them until a task ended (Python runs
    signal handlers in the main thread; the signal may land on one of the pool's threads)."""

    def result(self, timeout=None):
        if timeout is not None:
            return super().result(timeout)
        while True:
            try:
                return super().result(_WAKE_S)
            except TimeoutError:
                if self.done():  # the task itself raised TimeoutError
                    raise


_WAKE_S = 0.25


class KernelPool:
    """Runs independent per-kernel tasks `fn(features, *args)` (folds, fits) in `jobs` worker processes,
    or in this process when jobs is 1 or the kernels hold under PARALLEL_MIN_ROWS rows in all.

    Workers are spawned (not forked: polars' threads) with one OpenMP thread each, read each kernel's
    frame from a memory-mapped Arrow file written once, and send results back without that frame. Each
    task is deterministic and fits on one OpenMP thread wherever it runs (fit_threads), so the results do
    not depend on `jobs`. `fn` must be a module-level function. Use as a context manager; `submit` returns a Future.
    A script that uses workers needs the usual `if __name__ == "__main__":` guard (a spawned worker
    imports the main module; the CLI and `python -m zmlx_pipeline` are safe).

    Stopping: when the with-block ends in an exception (Ctrl-C included), the workers are terminated
    rather than waited for; workers ignore Ctrl-C themselves and exit when their parent dies (even by
    SIGKILL), and a pool's folder left by a killed process is removed by the next pool that starts.
    """

    def __init__(self, features: dict[str, KernelFeatures] | None, jobs: int | None = None,
                 rows: int | None = None) -> None:
        """`features` None: given later (attach), and `rows` (the store's ok measurements of those kernels)
        decides whether to use workers; they start with the block, so their start overlaps the features'."""
        self.features = features
        self.jobs = check_jobs(jobs)
        if rows is None:
            rows = sum(f.frame.height for f in (features or {}).values())
        self.parallel = self.jobs > 1 and rows >= PARALLEL_MIN_ROWS
        self._executor: ProcessPoolExecutor | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._refs: dict[str, tuple[KernelFeatures, str]] = {}
        self._saved_env: dict[str, str | None] = {}

    def __enter__(self) -> "KernelPool":
        if self.parallel:
            sweep_pool_folders()
            self._tmp = tempfile.TemporaryDirectory(prefix=f"{POOL_PREFIX}{os.getpid()}-")
            env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                   "POLARS_MAX_THREADS": str(max(1, default_jobs() // self.jobs))}
            self._saved_env = {k: os.environ.get(k) for k in env}
            os.environ.update(env)  # what the spawned workers start with
            self._executor = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_worker_init, initargs=(os.getpid(),))
            for _ in range(self.jobs):  # start every worker now (each imports the models package, about 1.5 s)
                self._executor.submit(_ready)
        return self

    def attach(self, features: dict[str, KernelFeatures]) -> None:
        """The kernels' features, for a pool made without them."""
        self.features = features

    def _stop_workers(self) -> None:
        """Terminates the workers: their results are no longer wanted, and a fit runs for seconds."""
        stop = getattr(self._executor, "terminate_workers", None)  # Python 3.14
        if stop is not None:
            stop()
            return
        for process in list((getattr(self._executor, "_processes", None) or {}).values()):
            if process.is_alive():
                process.terminate()

    def __exit__(self, exc_type, *exc) -> None:
        try:
            if self._executor is not None:
                if exc_type is not None:
                    self._stop_workers()
                self._executor.shutdown(wait=True, cancel_futures=True)
        finally:
            self._executor = None
            for k, v in self._saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            self._saved_env = {}
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None
            self._refs = {}

    def _ref(self, kernel: str) -> tuple[KernelFeatures, str]:
        if kernel not in self._refs:
            f = self.features[kernel]
            path = Path(self._tmp.name) / f"{len(self._refs)}.arrow"
            f.frame.write_ipc(path, compression="uncompressed")
            self._refs[kernel] = (replace(f, frame=None), str(path))
        return self._refs[kernel]

    def submit(self, kernel: str, fn: Callable, *args) -> Future:
        """fn(the kernel's features, *args), in a worker or (not parallel) right here."""
        if not self.parallel:
            done: Future = Future()
            try:
                done.set_result(fn(self.features[kernel], *args))
            except BaseException as exc:  # re-raised by .result(), as a worker's would be
                done.set_exception(exc)
            return done
        meta, path = self._ref(kernel)
        inner = self._executor.submit(_worker_call, meta, path, fn, args)
        outer: Future = _WakingFuture()
        frame = self.features[kernel].frame

        def unpack(f: Future) -> None:
            try:
                outer.set_result(_FrameUnpickler(io.BytesIO(f.result()), frame).load())
            except BaseException as exc:
                outer.set_exception(exc)

        inner.add_done_callback(unpack)
        return outer


# ------------------------------------------------------------------------------------------
# regret


def case_regrets(frame: pl.DataFrame, scores: np.ndarray, ks: Sequence[int]) -> pl.DataFrame:
    """Per case: regret@k for each k (columns r1, r3, ...), from scores of the case's rows.

    Also `hit_rank`: the rank of the method's first config within 2% of the case's best, and
    `configs`, the case's configs. Ranks by score, ties by config_key; cases whose scores are
    all NaN/null are dropped.
    """
    df = frame.select(*CASE, "config_key", "median_us").with_columns(
        pl.Series("_score", np.asarray(scores, dtype=float)).fill_nan(None))
    df = df.with_columns(pl.col("_score").is_not_null().any().over(CASE).alias("_scored")).filter("_scored")
    if df.is_empty():
        return pl.DataFrame(schema={**{c: pl.String for c in CASE}, **{f"r{k}": pl.Float64 for k in ks},
                                    "hit_rank": pl.Int64, "configs": pl.Int64})
    df = df.sort([*CASE, "_score", "config_key"], nulls_last=True).with_columns(
        pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over(CASE).alias("_rank"))
    best = pl.col("median_us").min()
    return df.group_by(CASE, maintain_order=True).agg(
        [(pl.col("median_us").filter(pl.col("_rank") <= k).min() / best).alias(f"r{k}") for k in ks]
        + [pl.col("_rank").filter(pl.col("median_us") <= best * (HIT_WITHIN + 1e-12)).min().alias("hit_rank"),
           pl.len().cast(pl.Int64).alias("configs")]).sort(CASE)


def prune_k(hit_ranks: Sequence[int], share: float = PRUNE_SHARE) -> int | None:
    """The smallest k whose top k is within 2% of the best in at least `share` of the cases (None: no case)."""
    ranks = np.sort(np.asarray([r for r in hit_ranks if r is not None], dtype=np.int64))
    if ranks.size == 0:
        return None
    return int(ranks[math.ceil(share * ranks.size - 1e-9) - 1])


def summarize(regrets: Sequence[float]) -> dict:
    """Geometric mean, 95th percentile (linear), share within 2%, and count of regrets."""
    values = np.asarray([r for r in regrets if r is not None and not math.isnan(r)], dtype=float)
    if values.size == 0:
        return {"regret_geomean": None, "regret_p95": None, "hit_2pct": None, "cases": 0}
    return {
        "regret_geomean": float(np.exp(np.log(values).mean())),
        "regret_p95": float(np.quantile(values, 0.95)),
        "hit_2pct": float((values <= HIT_WITHIN + 1e-12).mean()),
        "cases": int(values.size),
    }


# ------------------------------------------------------------------------------------------
# noise-aware (tied) regret


@dataclass(frozen=True)
class NoiseBands:
    """Tie bands from repeat pairs: per (device, bucket) and pooled per bucket, (band, pairs).

    band = median of max(a, b) / min(a, b) - 1 over the pairs (a pick/best ratio is max/min by
    construction, so the band is on the same scale). Build with `noise_bands(store)` or
    `from_pairs`; no pairs at all means every case gets FALLBACK_BAND, marked "fallback".
    """

    by_device: dict = field(default_factory=dict)  # (device_id, bucket) -> (band, pairs)
    pooled: dict = field(default_factory=dict)     # bucket -> (band, pairs)
    pairs: int = 0
    min_pairs: int = MIN_PAIRS

    @classmethod
    def from_pairs(cls, pairs: Iterable[dict], min_pairs: int = MIN_PAIRS) -> NoiseBands:
        """Bands from rows {device_id, median_us (first timing, sets the bucket), repeat_us}."""
        spreads: dict = {}
        count = 0
        for p in pairs:
            a, b = p["median_us"], p["repeat_us"]
            if not a or not b or a <= 0 or b <= 0:
                continue
            bucket = bucket_index(a)
            spread = max(a, b) / min(a, b) - 1.0
            spreads.setdefault((p["device_id"], bucket), []).append(spread)
            spreads.setdefault((None, bucket), []).append(spread)
            count += 1
        stat = {key: (float(np.median(v)), len(v)) for key, v in spreads.items()}
        return cls(by_device={k: v for k, v in stat.items() if k[0] is not None},
                   pooled={k[1]: v for k, v in stat.items() if k[0] is None}, pairs=count, min_pairs=min_pairs)

    @property
    def fallback(self) -> bool:
        """True when the store had no repeat pair: every band is FALLBACK_BAND."""
        return self.pairs == 0

    def band(self, device_id: str, best_us: float) -> tuple[float, str]:
        """(band, source) for a case of this device whose best runs `best_us`; source is device,
        pooled, pooled-nearest or fallback."""
        if self.fallback:
            return FALLBACK_BAND, "fallback"
        bucket = bucket_index(best_us)
        own = self.by_device.get((device_id, bucket))
        if own and own[1] >= self.min_pairs:
            return own[0], "device"
        pooled = self.pooled.get(bucket)
        if pooled and pooled[1] >= self.min_pairs:
            return pooled[0], "pooled"
        enough = [b for b, (_, n) in self.pooled.items() if n >= self.min_pairs] or list(self.pooled)
        nearest = min(enough, key=lambda b: (abs(b - bucket), -b))  # a tie goes to the slower, quieter bucket
        return self.pooled[nearest][0], "pooled-nearest"

    def table(self) -> list[dict]:
        """Every measured band: {device (None = pooled), bucket, band, pairs, enough_pairs (at least min_pairs)}."""
        entries = [(None, b, v) for b, v in sorted(self.pooled.items())]
        entries += [(d, b, v) for (d, b), v in sorted(self.by_device.items())]
        return [{"device": d, "bucket": bucket_label(b), "band": band, "pairs": n, "enough_pairs": n >= self.min_pairs}
                for d, b, (band, n) in entries]

    def summary(self) -> dict:
        """What the JSON output says about the bands."""
        return {"statistic": "median of max/min - 1 over repeat pairs, per device and time bucket",
                "fallback": self.fallback, "fallback_band": FALLBACK_BAND if self.fallback else None,
                "pairs": self.pairs, "min_pairs": self.min_pairs, "bands": self.table()}


def noise_bands(store, min_pairs: int = MIN_PAIRS) -> NoiseBands:
    """The tie bands of a store's repeat pairs (its `repeats` table)."""
    return NoiseBands.from_pairs(store.repeat_pairs(), min_pairs)


def tied_regrets(per_case: pl.DataFrame, frame: pl.DataFrame, bands: NoiseBands, ks: Sequence[int]) -> pl.DataFrame:
    """per_case (from case_regrets/evaluate_kernel) with best_us, band, band_source and
    tied{k} = max(1, r{k} / (1 + band)) for each k: the noise-aware regret."""
    best = frame.group_by(CASE).agg(pl.col("median_us").min().alias("best_us"))
    keys = best.select("device_id", "best_us").unique()
    looked = [bands.band(d, us) for d, us in keys.iter_rows()]
    keys = keys.with_columns(pl.Series("band", [b for b, _ in looked], dtype=pl.Float64),
                             pl.Series("band_source", [s for _, s in looked], dtype=pl.String))
    best = best.join(keys, on=["device_id", "best_us"], how="left")
    out = per_case.join(best, on=list(CASE), how="left", maintain_order="left")
    band = 1.0 + pl.col("band")
    return out.with_columns([  # a null regret stays null (max_horizontal would make it 1.0)
        pl.when(pl.col(f"r{k}").is_null()).then(None).otherwise(pl.max_horizontal(pl.lit(1.0), pl.col(f"r{k}") / band))
        .alias(f"tied{k}") for k in ks])


def summarize_tied(tied: Sequence[float], bands: Sequence[float], sources: Sequence[str]) -> dict:
    """Geometric mean of tied regrets, share inside the band, median band and the band sources of the cases."""
    keep = [(t, b, s) for t, b, s in zip(tied, bands, sources) if t is not None and not math.isnan(t)]
    if not keep:
        return {"regret_tied_geomean": None, "hit_tied": None, "tied_band": None, "tied_band_source": None}
    values = np.asarray([t for t, _, _ in keep], dtype=float)
    return {
        "regret_tied_geomean": float(np.exp(np.log(values).mean())),
        "hit_tied": float((values <= 1.0 + 1e-12).mean()),
        "tied_band": float(np.median([b for _, b, _ in keep])),
        "tied_band_source": "+".join(sorted({s for _, _, s in keep})),
    }


# ------------------------------------------------------------------------------------------
# splits


def canonical_split(split: str) -> str:
    """The split's name (`lodo` is `devices`); EvaluationError for an unknown one."""
    split = SPLIT_ALIASES.get(split, split)
    if split not in SPLITS:
        raise EvaluationError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    return split


def shape_folds(frame: pl.DataFrame) -> int:
    """The shape folds of a kernel: SHAPE_FOLDS, or SHAPE_FOLDS_LARGE for a kernel of more than
    LARGE_KERNEL_CASES cases (each fold's model still trains on half of them or more)."""
    cases = frame.select([c for c in CASE if c in frame.columns]).n_unique()
    return SHAPE_FOLDS_LARGE if cases > LARGE_KERNEL_CASES else SHAPE_FOLDS


def folds(frame: pl.DataFrame, split: str) -> list[tuple[str, pl.Expr, pl.Expr]]:
    """(name, training-row filter, test-row filter) per fold of one kernel's frame."""
    split = canonical_split(split)
    if split == "devices":
        devices = sorted(frame["device_id"].unique().to_list())
        if len(devices) < 2:
            return []
        return [(d, pl.col("device_id") != d, pl.col("device_id") == d) for d in devices]
    if split == "shapes":
        shapes = sorted(frame["shape_key"].unique().to_list())
        if len(shapes) < 2:
            return []
        n = min(shape_folds(frame), len(shapes))
        out = []
        for i in range(n):
            held = shapes[i::n]
            test = pl.col("shape_key").is_in(held)
            out.append((f"shapes-{i}", ~test, test))
        return out


# ------------------------------------------------------------------------------------------
# evaluation


def oracle_device(features: KernelFeatures, ks: Sequence[int]) -> pl.DataFrame:
    """Per-case regrets of the after-the-fact floor of the devices split (ORACLE), method column ORACLE.

    For each left-out device, every other device's measured ranking of the same (kernel, dtype, shape) is
    scored on the left-out device's cases; per k the other device with the lowest mean log regret@k wins
    (among those covering the most cases). hit_rank and configs are those of the smallest k's winner.
    """
    ks = tuple(ks)
    frame, parts = features.frame, []
    for name, train_filter, test_filter in folds(frame, "devices"):
        train, test = _fold_rows(frame, "devices", train_filter, test_filter)
        per_source = {}
        for src in sorted(train["device_id"].unique().to_list()):
            mapping = test.select(CASE).unique().with_columns(
                pl.lit(src).alias("_src_device_id"), *[pl.col(c).alias(f"_src_{c}") for c in CASE if c != "device_id"])
            mapping = mapping.select(*CASE, *[f"_src_{c}" for c in CASE])
            scores = _from_source_case(train.filter(pl.col("device_id") == src), test, mapping)
            # a case the source did not measure: all its rows get _LAST (one _src_ key, no _v), so drop it
            known = test.select(CASE).with_columns(scores.alias("_s")).with_columns(
                (pl.col("_s") < 1e8).any().over(CASE).alias("_k"))["_k"].to_numpy()
            regrets = case_regrets(test, np.where(known, scores.to_numpy(), np.nan), ks)
            if not regrets.is_empty():
                per_source[src] = regrets
        if not per_source:
            continue
        most = max(r.height for r in per_source.values())
        full = {s: r for s, r in per_source.items() if r.height == most}
        chosen = {k: min(full, key=lambda s: (full[s][f"r{k}"].log().mean(), s)) for k in ks}
        first = full[chosen[min(ks)]]
        out = first.select(*CASE, "hit_rank", "configs")
        for k in ks:
            out = out.join(full[chosen[k]].select(*CASE, f"r{k}"), on=list(CASE), how="left", maintain_order="left")
        parts.append(out.select(*CASE, *[f"r{k}" for k in ks], "hit_rank", "configs").with_columns(
            pl.lit(ORACLE).alias("method"), pl.lit(name).alias("fold")))
    return pl.concat(parts) if parts else gather_folds([], ks)


def check_protocol(protocol: str | None, split: str) -> str:
    """The protocol's name (None: `nested`); EvaluationError for an unknown one.

    `nested`: each outer fold's model makes every choice (ensemble weights, hedging, fallback to a
    baseline) by inner folds inside that fold's training rows, so the held-out shapes or the left-out
    device are never seen by any choice. `fixed`: the choices of one fit on every row are kept for
    every fold (what train's held-out pruning does): cheaper, but the choices saw the test rows.
    """
    protocol = "nested" if protocol is None else protocol
    if protocol not in PROTOCOLS:
        raise EvaluationError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    return protocol


def fixed_selections(features: KernelFeatures, models: Sequence[str]) -> dict | None:
    """The `fixed` protocol's settings: each model's selection() from one fit on every row of the kernel
    (None where a model has nothing to select)."""
    out = {}
    with fit_threads():
        for model in models:
            ranker = make_ranker(features, model)
            selection = getattr(ranker, "selection", None)
            if callable(selection):
                out[model] = ranker.fit(features.frame).selection()
    return out or None


def evaluate_kernel(
    features: KernelFeatures,
    split: str,
    ks: Sequence[int] = (1, 3, 5),
    models: Sequence[str] = (DEFAULT_MODEL,),
    baselines: bool = True,
    enough_cases: int | None = None,
    fixed: dict | None = None,
    pool: KernelPool | None = None,
) -> pl.DataFrame:
    """Per-case regrets of each model and baseline on one kernel: columns CASE, r{k}, hit_rank, configs, method, fold.

    With `enough_cases`, folds stop once that many cases are scored (folds interleave the shapes,
    so the first ones are a spread sample); by default every fold is scored. `fixed` maps a model
    to settings set as its rankers' `fixed` (CVEnsembleRanker.selection: no inner selection per
    fold). `pool` runs the folds in its workers (default: here, one after the other).
    """
    return gather_folds(submit_kernel(features, split, ks, models, baselines, enough_cases, fixed, pool), ks)


def fold_plan(features: KernelFeatures, split: str, enough_cases: int | None = None) -> list[int]:
    """The folds of a kernel that get scored: those with training and test rows, until `enough_cases`
    cases are (None: all)."""
    split = canonical_split(split)
    plan, scored = [], 0
    for i, (_, train_filter, test_filter) in enumerate(folds(features.frame, split)):
        if enough_cases is not None and scored >= enough_cases:
            break
        train, test = _fold_rows(features.frame, split, train_filter, test_filter)
        if train.is_empty() or test.is_empty():
            continue
        plan.append(i)
        scored += test.select(CASE).n_unique()
    return plan


def submit_kernel(features: KernelFeatures, split: str, ks: Sequence[int] = (1, 3, 5),
                  models: Sequence[str] = (DEFAULT_MODEL,), baselines: bool = True,
                  enough_cases: int | None = None, fixed: dict | None = None,
                  pool: KernelPool | None = None, together: bool = False) -> list[Future]:
    """One future per scored fold of the kernel (fold_plan), each of _score_fold's (per-method frames, seconds).

    `together`: in a pool of workers, all the kernel's folds are one task (one future with every fold's
    frames), so they run in one worker and share its fit cache: leaving one device out leaves the other
    devices' rows as they are, so a per-device `transfer` model, and an inner fold's fits on the same
    devices, are made once per kernel rather than once per worker that scores one of its folds."""
    split = canonical_split(split)
    plan = fold_plan(features, split, enough_cases)
    args = (split, tuple(ks), tuple(models), baselines, fixed)
    if pool is None:
        pool = KernelPool({features.kernel: features}, jobs=1)
    if together and pool.parallel and len(plan) > 1:
        return [pool.submit(features.kernel, _score_folds, tuple(plan), *args)]
    return [pool.submit(features.kernel, _score_fold, i, *args) for i in plan]


def _score_folds(features: KernelFeatures, indices: Sequence[int], *args) -> tuple[list[pl.DataFrame], float]:
    """_score_fold of several folds, one after the other in one process: their frames and seconds together."""
    parts, seconds = [], 0.0
    for i in indices:
        frames, s = _score_fold(features, i, *args)
        parts += frames
        seconds += s
    return parts, seconds


def gather_folds(futures: Sequence[Future], ks: Sequence[int]) -> pl.DataFrame:
    """The per-case rows of submitted folds, in fold order."""
    parts = [part for f in futures for part in f.result()[0]]
    if not parts:
        return pl.DataFrame(schema={**{c: pl.String for c in CASE}, **{f"r{k}": pl.Float64 for k in ks},
                                    "hit_rank": pl.Int64, "configs": pl.Int64, "method": pl.String,
                                    "fold": pl.String})
    return pl.concat(parts)


def _fold_rows(frame: pl.DataFrame, split: str, train_filter: pl.Expr,
               test_filter: pl.Expr) -> tuple[pl.DataFrame, pl.DataFrame]:
    train = frame.filter(train_filter)
    test = frame.filter(test_filter)
    if split == "shapes":
        test = test.filter(pl.col("device_id").is_in(train["device_id"].unique().to_list()))
    return train, test


def _score_fold(features: KernelFeatures, index: int, split: str, ks: Sequence[int], models: Sequence[str],
                baselines: bool, fixed: dict | None = None) -> tuple[list[pl.DataFrame], float]:
    """Fold `index` of a kernel: every model and baseline fitted on its training rows, regrets on its test
    rows (one frame per method), and the seconds it took."""
    start = time.perf_counter()
    frame = features.frame
    name, train_filter, test_filter = folds(frame, split)[index]
    train, test = _fold_rows(frame, split, train_filter, test_filter)
    seen = test["device_id"].is_in(train["device_id"].unique().to_list())
    scores: dict[str, np.ndarray] = {}
    with fit_threads():
        for model in models:
            ranker = make_ranker(features, model)
            if fixed and fixed.get(model):
                ranker.fixed = fixed[model]
            if hasattr(ranker, "only"):  # an ensemble fits only the setting this fold's test rows use
                ranker.only = "seen" if seen.all() else "unseen" if not seen.any() else None
            scores[model] = ranker.fit(train).score(test)
        if baselines:
            scores.update({k: v.to_numpy() for k, v in baseline_scores(features, train, test).items()})
    return [case_regrets(test, s, ks).with_columns(pl.lit(method).alias("method"), pl.lit(name).alias("fold"))
            for method, s in scores.items()], time.perf_counter() - start


def regret_rows(per_case: pl.DataFrame, kernel: str, ks: Sequence[int], methods: Iterable[str],
                labels: dict[str, str] | None = None) -> list[dict]:
    """Flat rows {kernel, device (None = pooled), method, k, regret_geomean, regret_p95, hit_2pct, cases}
    then, from tied_regrets' columns (None without them), regret_tied_geomean, hit_tied, tied_band and
    tied_band_source.

    `labels` renames methods in the rows (the CLI calls its one model "model").
    """
    labels = labels or {}
    rows = []

    def scores(part: pl.DataFrame, k: int) -> dict:
        plain = summarize(part[f"r{k}"].to_list())
        if f"tied{k}" not in part.columns:
            return {**plain, **summarize_tied([], [], [])}
        return {**plain, **summarize_tied(part[f"tied{k}"].to_list(), part["band"].to_list(),
                                          part["band_source"].to_list())}

    for method in methods:
        mine = per_case.filter(pl.col("method") == method)
        devices = sorted(mine["device_id"].unique().to_list())
        label = labels.get(method, method)
        for k in ks:
            rows.append({"kernel": kernel, "device": None, "method": label, "k": int(k), **scores(mine, k)})
            for d in devices:
                rows.append({"kernel": kernel, "device": d, "method": label, "k": int(k),
                             **scores(mine.filter(pl.col("device_id") == d), k)})
    return rows


def evaluate_features(
    features: dict[str, KernelFeatures],
    split: str,
    ks: Sequence[int] = (1, 3, 5),
    models: Sequence[str] = (DEFAULT_MODEL,),
    baselines: bool = True,
    label_model: bool = False,
    noise: NoiseBands | None = None,
    jobs: int | None = None,
    pool: KernelPool | None = None,
    protocol: str | None = None,
    oracle: bool = True,
) -> dict:
    """evaluate() on prepared feature frames (one per kernel); `noise` gives the tie bands
    (None: no repeats known, so the fallback band, and the result says so); `jobs` worker
    processes score the folds (KernelPool, which checks it; None: one per CPU, 1: in this process),
    or an entered `pool` does (its features are set to these)."""
    split = canonical_split(split)
    ks = tuple(int(k) for k in ks)
    if not ks or min(ks) < 1:
        raise EvaluationError("k must be at least 1")
    models = tuple(models)
    unknown = [m for m in models if m not in MODEL_VARIANTS]
    if unknown:
        raise EvaluationError(f"unknown model {unknown[0]!r}; expected one of {', '.join(MODEL_VARIANTS)}")
    if not models and not baselines:
        raise EvaluationError("nothing to evaluate: name a model or keep the baselines")
    labels = {models[0]: "model"} if label_model and len(models) == 1 else {}
    noise = noise if noise is not None else NoiseBands()
    protocol = check_protocol(protocol, split)
    oracle = oracle and baselines and split == "devices"
    rows = []
    with (KernelPool(features, jobs) if pool is None else contextlib.nullcontext(pool)) as pool:
        pool.attach(features)
        # every kernel's folds at once, the largest kernels first (the longest tasks start first); under
        # left-out devices a kernel's folds run in one worker, sharing its fits (submit_kernel's `together`)
        order = sorted(features, key=lambda k: -features[k].frame.height)
        together = split == "devices" and len(features) >= 2 * pool.jobs
        fixed = {k: fixed_selections(features[k], models) for k in order} if protocol == "fixed" else {}
        futures = {k: submit_kernel(features[k], split, ks, models, baselines, fixed=fixed.get(k), pool=pool,
                                    together=together) for k in order}
        for kernel, f in features.items():
            per_case = gather_folds(futures[kernel], ks)
            if oracle:
                per_case = pl.concat([per_case, oracle_device(f, ks)])
            per_case = tied_regrets(per_case, f.frame, noise, ks)
            methods = list(models) + (baseline_names(f) if baselines else []) + ([ORACLE] if oracle else [])
            rows += regret_rows(per_case, kernel, ks, methods, labels)
    return {"split": split, "ks": list(ks), "models": list(models), "protocol": protocol, "results": rows,
            "floors": {m: d for m, d in FLOORS.items() if oracle}, "noise": noise.summary()}


def evaluate(store, split: str, kernels=None, ks: Sequence[int] = (1, 3, 5),
             models: Sequence[str] = (DEFAULT_MODEL,), baselines: bool = True, label_model: bool = False,
             jobs: int | None = None, protocol: str | None = None, oracle: bool = True) -> dict:
    """Regret@k of the model(s) and the baselines on a split (`shapes` or `devices`) of the store's ok measurements.

    Returns {"split", "ks", "models", "results", "noise"}: results are flat dicts {kernel, device
    (None when pooled), method, k, regret_geomean, regret_p95, hit_2pct, cases, regret_tied_geomean,
    hit_tied, tied_band, tied_band_source}; a model's method is its variant name, or "model" with
    `label_model` and one model (the CLI's contract); "noise" describes the tie bands (the store's
    repeats, or the fallback). `jobs`: worker processes for the folds (None: one per CPU; 1: none).
    `protocol` (check_protocol): `nested` (default) or `fixed`. Under `devices` the results also hold the
    after-the-fact floor ORACLE (`oracle`, with the baselines), and "floors" says what it is.
    """
    split = canonical_split(split)
    check_protocol(protocol, split)
    jobs = check_jobs(jobs)  # before the features are read, which takes a while on a big store
    with KernelPool(None, jobs, rows=ok_rows(store, kernels)) as pool:  # workers start while the features are read
        features = kernel_features_of(store, kernels)
        return evaluate_features(features, split, ks, models, baselines, label_model, noise=noise_bands(store),
                                 pool=pool, protocol=protocol, oracle=oracle)


def ok_rows(store, kernels=None, devices=None) -> int:
    """The store's ok measurements of these kernels on these devices (None: all): what decides, before the
    features are built, whether a KernelPool uses workers."""
    kernels = None if kernels is None else set([kernels] if isinstance(kernels, str) else kernels)
    devices = None if devices is None else set([devices] if isinstance(devices, str) else devices)
    return sum(r["by_status"].get("ok", 0) for r in store.summary()
               if (kernels is None or r["kernel"] in kernels) and (devices is None or r["device"] in devices))


def kernel_features_of(store, kernels=None, devices=None) -> dict[str, KernelFeatures]:
    """The store's feature frames (of some kernels, measured on some devices), with one-line errors for
    an empty store or a kernel it has no ok measurement of."""
    wanted = None if kernels is None else ([kernels] if isinstance(kernels, str) else list(kernels))
    devices = None if devices is None else ([devices] if isinstance(devices, str) else list(devices))
    specs = devices_frame(store)  # first: completes any pending result before the Arrow read
    measurements = measurements_frame(store, wanted, device=devices)
    known = set(measurements["kernel"].unique().to_list())
    missing = sorted(set(wanted or ()) - known)
    if not known or missing:
        have = sorted({r["kernel"] for r in store.summary() if r["by_status"].get("ok")
                       and (not devices or r["device"] in devices)})
        where = f" on device(s) {', '.join(devices)}" if devices else ""
        if not have:
            raise EvaluationError(f"the store has no ok measurements{where}: run `zmlx-pipeline run`, `import` or "
                                  "`collect` first, or pass another --db")
        raise EvaluationError(f"no ok measurements of kernel(s) {', '.join(missing)}{where}; "
                              f"the store has {', '.join(have)}")
    return build_features(measurements, specs, wanted)
