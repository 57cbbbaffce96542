"""Worker processes for per-kernel tasks (folds, fits): KernelPool and how many workers to use.

A task is `fn(features, *args)` on one kernel's feature frame; workers read each frame from a
memory-mapped Arrow file written once and send results back without it. Every fit runs on one
OpenMP thread (fit_threads), so a task's result does not depend on where it ran.
"""

from __future__ import annotations

import io
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
from dataclasses import replace
from pathlib import Path
from typing import Callable

import polars as pl

from zmlx_pipeline.models.features import KernelFeatures
from zmlx_pipeline.models.folds import EvaluationError

PARALLEL_MIN_ROWS = 20_000  # less work (rows over all kernels) runs in this process: workers take seconds to start


def fit_threads():
    """A context limiting scikit-learn's OpenMP threads to one for the fits in this process, as in a worker.

    Parallelism comes from worker processes (--jobs); OpenMP threads inside a fit only cost time here: the
    fits are capped at rankers.base.MAX_FIT_ROWS rows, and on 2 cores a 200-tree fit of 50,000 rows took 1.1 s on one
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


def _worker_init(parent: int, fits: str | None = None) -> None:
    """In a new worker: leave Ctrl-C to the parent (KernelPool stops its workers when the parent is
    interrupted) and exit once the parent is gone. A worker waits on the task queue, whose pipe it holds
    open itself, so without this a killed parent's workers would live on and hold its memory and output.
    `fits`: the pool's folder of shared fits (rankers.base.share_fits)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if fits is not None:
        from zmlx_pipeline.models.rankers.base import share_fits

        share_fits(fits)

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
    frame from a memory-mapped Arrow file written once, share their fits through the pool's folder (a fit of
    the same rows is made once in the pool: rankers.base.share_fits), and send results back without that frame. Each
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
            # the workers share their fits: a fold's fit of the same rows (another fold's inner fold, the final
            # model's, another split's) is made once in the pool, whichever worker needs it first
            fits = str(Path(self._tmp.name) / "fits")
            self._executor = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_worker_init, initargs=(os.getpid(), fits))
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
