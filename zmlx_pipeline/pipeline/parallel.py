"""Measure tasks with worker processes that compile in parallel and time one at a time.

Compiling dominates a CUDA collect (NVRTC, about 1.5 s per kernel, config and dtype, single-threaded
in the launching process); timing must not overlap. So the tasks are split into shares of whole
(kernel, dtype) groups (so that one process times every config of a case), balanced by how many
kernels each must compile; every worker compiles its
share at once, and when all are ready, the parent lets them measure in turn. Results stream back as
they are made, so the caller records each one at once and a stop loses nothing measured.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterator, Mapping, Sequence

from zmlx_pipeline.kernels.harness import GpuUnhealthy, Outcome
from zmlx_pipeline.kernels.timing import Timing


def _compile_key(task) -> tuple:
    return (task.spec.name, task.dtype, tuple(sorted(task.config.items())))


def case_key(task) -> tuple:
    """The (kernel, dtype, shape) a task belongs to: its configs are compared with each other."""
    return (task.spec.name, task.dtype, tuple(sorted(task.shape.items())))


def partition(tasks: Sequence, jobs: int) -> list[list[int]]:
    """Indices of `tasks` per worker: whole (kernel, dtype) groups, placed largest first on the worker
    with the fewest compiles so far; within a worker, the original (shape-major) order is kept.

    A group is never split by config, although splitting would spread its compiles over more
    workers: a case's configs are compared with each other, and under about 10 us a launch's
    time is partly its process's dispatch speed, which differs by about 20% between processes.
    Every config of a case is therefore timed by one process.
    """
    groups: dict[tuple, list[int]] = {}
    compiles: dict[tuple, set] = {}
    for i, t in enumerate(tasks):
        groups.setdefault((t.spec.name, t.dtype), []).append(i)
        compiles.setdefault((t.spec.name, t.dtype), set()).add(_compile_key(t))
    order = sorted(groups, key=lambda g: len(compiles[g]), reverse=True)
    loads = [0] * max(1, min(jobs, len(groups)))
    shares: list[list[int]] = [[] for _ in loads]
    for g in order:
        w = loads.index(min(loads))
        loads[w] += len(compiles[g])
        shares[w].extend(groups[g])
    return [sorted(s) for s in shares if s]


def measure_in_workers(
    tasks: Sequence,
    kernel_refs: Mapping[str, str],
    backend: str,
    settings,
    jobs: int,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    worker: Sequence[str] = ("-m", "zmlx_pipeline.kernels.worker"),
) -> Iterator[tuple[object, Outcome]]:
    """Yield (task, outcome) as workers measure; stops at `deadline` (clock time) once the case in
    progress is finished, leaving the rest.

    Raises GpuUnhealthy when a worker reports a launch that broke the GPU.
    """
    shares = partition(tasks, jobs)
    with tempfile.TemporaryDirectory(prefix="zmlx-collect-") as tmp:
        procs = []
        try:
            for w, share in enumerate(shares):
                job = {
                    "backend": backend,
                    "settings": dataclasses.asdict(settings),
                    "compile_threads": max(1, (os.cpu_count() or 1) // len(shares)),  # NVRTC threads per worker
                    "items": [{"i": i, "ref": kernel_refs[tasks[i].spec.name], "dtype": tasks[i].dtype,
                               "shape": dict(tasks[i].shape), "config": dict(tasks[i].config)} for i in share],
                }
                path = os.path.join(tmp, f"job{w}.json")
                with open(path, "w") as fh:
                    json.dump(job, fh)
                log = open(os.path.join(tmp, f"worker{w}.log"), "w")
                procs.append(subprocess.Popen(
                    [sys.executable, *worker, path],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1,
                ))
            ready = []
            for p in procs:  # every worker compiles at once; wait for all before any timing
                line = _read_line(p)
                ready.append(line is not None and "ready" in line)
            position = [{i: at for at, i in enumerate(share)} for share in shares]
            for w, (p, ok) in enumerate(zip(procs, ready)):
                if not ok:
                    continue
                if deadline is not None and clock() > deadline:
                    break
                p.stdin.write("go\n")
                p.stdin.flush()
                while True:
                    line = _read_line(p)
                    if line is None or line.get("done"):
                        break
                    if "fatal" in line:
                        raise GpuUnhealthy(line["fatal"])
                    t = line["timing"]
                    timing = Timing(*t[:3], samples=int(t[3]), chain=int(t[4])) if t else None
                    yield tasks[line["i"]], Outcome(line["status"], timing=timing, error=line["error"])
                    if deadline is not None and clock() > deadline:
                        # finish the case in progress: its configs are compared with each other,
                        # and a process's dispatch speed differs from the next one's
                        at = position[w][line["i"]]
                        nxt = shares[w][at + 1] if at + 1 < len(shares[w]) else None
                        if nxt is None or case_key(tasks[nxt]) != case_key(tasks[line["i"]]):
                            break
                p.kill()
                if deadline is not None and clock() > deadline:
                    break
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                reap(p)


def _read_line(proc) -> dict | None:
    """The worker's next JSON line, or None at EOF (the worker died or finished)."""
    line = proc.stdout.readline()
    if not line:
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def reap(proc: subprocess.Popen) -> None:
    """Wait for a worker that was told to stop and close its pipes (a closed pipe may already be gone)."""
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:
            pass
