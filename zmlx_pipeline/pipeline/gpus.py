"""Collect on several GPUs of one host: one measuring process per GPU, pinned with CUDA_VISIBLE_DEVICES.

The missing tasks are split by case (kernel, dtype, shape), so every config of a case is timed by one
process on one GPU (their times are compared with each other) and no key is timed twice; cases are
dealt largest first to the GPU with the least work. Each process is a collect worker
(kernels/worker.py): it compiles its share (through the compiled-kernel cache, shared by all of
them), then measures one config at a time on its own GPU, streaming results to the parent, which
alone writes the store.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Iterator, Mapping, Sequence

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.kernels.harness import GpuUnhealthy, Outcome
from zmlx_pipeline.kernels.timing import Timing
from zmlx_pipeline.kernels.worker import shape_size
from zmlx_pipeline.pipeline.parallel import case_key, reap


#: results yielded at most at once (measure_on_gpus): one store transaction each
BATCH_MAX = 512


class GpuSelectionError(ZmlxPipelineError, ValueError):
    """--gpus named GPUs this host does not have, or could not be read"""


def visible_gpu_count() -> int:
    """CUDA devices this process may use (after CUDA_VISIBLE_DEVICES), through the driver; 0 on failure."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        if lib.cuInit(0) != 0:
            return 0
        count = ctypes.c_int()
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
    except (OSError, AttributeError):
        return 0
    return max(0, count.value)


def parse_gpus(text: str, count: int | None = None, visible: str | None = None) -> list[str]:
    """The CUDA_VISIBLE_DEVICES value of each GPU to use: 'all', a count 'N' (the first N), or indices
    '0,2,3' (a single index as '3,'), numbered as this process sees them (so within an inherited
    CUDA_VISIBLE_DEVICES, whose entries are returned)."""
    count = visible_gpu_count() if count is None else count
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    names = [v.strip() for v in visible.split(",") if v.strip()] if visible else [str(i) for i in range(count)]
    names = names[:count] if count else []
    t = text.strip().lower()
    n = 0  # a count asked for, checked against the host's GPUs before its list is made
    try:
        if t == "all":
            picked = list(range(len(names)))
        elif "," in t:
            picked = [int(p) for p in t.split(",") if p.strip()]
        else:
            n = int(t)
            if n < 1:
                raise GpuSelectionError(f"--gpus {text}: give at least 1 GPU")
            picked = []
    except ValueError as exc:
        if isinstance(exc, GpuSelectionError):
            raise
        raise GpuSelectionError(f"cannot read --gpus {text!r}: use all, a count such as 2, or indices such as 0,2,3") from None
    if not names:
        raise GpuSelectionError("no CUDA GPU visible to this process (--gpus needs the MLX CUDA backend)")
    if n:
        picked = list(range(min(n, len(names))))
    bad = [i for i in picked if not 0 <= i < len(names)]
    if bad or not picked or n > len(names):
        raise GpuSelectionError(f"--gpus {text}: this host has GPUs 0..{len(names) - 1}")
    if len(set(picked)) != len(picked):
        raise GpuSelectionError(f"--gpus {text} names a GPU twice")
    return [names[i] for i in picked]


def partition_cases(tasks: Sequence, n: int) -> list[list[int]]:
    """Indices of `tasks` per GPU: whole cases, largest first to the least-loaded share; order kept within."""
    cases: dict[tuple, list[int]] = {}
    for i, t in enumerate(tasks):
        cases.setdefault(case_key(t), []).append(i)
    loads = [0] * max(1, n)
    shares: list[list[int]] = [[] for _ in loads]
    for key in sorted(cases, key=lambda k: (-len(cases[k]), k)):
        w = loads.index(min(loads))
        loads[w] += len(cases[key])
        shares[w].extend(cases[key])
    return [sorted(s) for s in shares]


def partition_programs(tasks: Sequence, shares: Sequence[Sequence[int]]) -> list[list[int]]:
    """Indices of `tasks` each worker compiles for all: one task per distinct (kernel, dtype, config),
    dealt round-robin over the workers, so no program is compiled twice. The compiled-kernel cache
    is keyed by program, not shape, so any planned shape of a config serves; the smallest is taken."""
    first: dict[tuple, int] = {}
    for share in shares:
        for i in share:
            t = tasks[i]
            key = (t.spec.name, t.dtype, tuple(sorted(t.config.items())))
            size = shape_size(t.shape)
            if key not in first or size < shape_size(tasks[first[key]].shape):
                first[key] = i
    out: list[list[int]] = [[] for _ in shares]
    for n, key in enumerate(sorted(first, key=repr)):
        out[n % max(1, len(out))].append(first[key])
    return out


def measure_on_gpus(
    tasks: Sequence,
    kernel_refs: Mapping[str, str],
    backend: str,
    settings,
    gpus: Sequence[str],
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    worker: Sequence[str] = ("-m", "zmlx_pipeline.kernels.worker"),
) -> Iterator[list[tuple[str, object, Outcome]]]:
    """Yield lists of (gpu, task, outcome) as the per-GPU workers measure, all GPUs at once: each list holds
    the results that arrived while the caller handled the last one, so a caller storing each list in one
    transaction keeps up with every GPU. After `deadline` each worker stops when its case in progress is
    finished. Raises GpuUnhealthy when a GPU broke."""
    shares = partition_cases(tasks, len(gpus))
    compile_shares = partition_programs(tasks, [share for share in shares if share])
    lines: queue.Queue = queue.Queue()
    with tempfile.TemporaryDirectory(prefix="zmlx-gpus-") as tmp:
        procs: dict[int, subprocess.Popen] = {}
        try:
            def item(i: int) -> dict:
                return {"i": i, "ref": kernel_refs[tasks[i].spec.name], "dtype": tasks[i].dtype,
                        "shape": dict(tasks[i].shape), "config": dict(tasks[i].config)}

            for w, (gpu, share) in enumerate(zip(gpus, shares)):
                if not share:
                    continue
                job = {"backend": backend, "settings": dataclasses.asdict(settings), "gpu": gpu, "exclusive": True,
                       "compile_threads": max(1, (os.cpu_count() or 1) // len(gpus)),
                       "compile_share": [item(i) for i in compile_shares.pop(0)] if len(gpus) > 1 else [],
                       "items": [item(i) for i in share]}
                path = os.path.join(tmp, f"job{w}.json")
                with open(path, "w") as fh:
                    json.dump(job, fh)
                log = open(os.path.join(tmp, f"gpu{w}.log"), "w")
                env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
                procs[w] = subprocess.Popen([sys.executable, *worker, path], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1, env=env)
                threading.Thread(target=_pump, args=(w, procs[w], lines), daemon=True).start()
            position = [{i: at for at, i in enumerate(share)} for share in shares]
            live = set(procs)
            compiling, loading = set(procs) if len(gpus) > 1 else set(), set()

            def release_compiles() -> None:
                """Once every worker compiled its share into the cache, let them all load what they need."""
                if not compiling:
                    for v in loading & live:
                        procs[v].stdin.write("load\n")
                        procs[v].stdin.flush()
                    loading.clear()

            batch: list[tuple[str, object, Outcome]] = []
            while live:
                if batch and (lines.empty() or len(batch) >= BATCH_MAX):
                    yield batch
                    batch = []
                w, line = lines.get()
                if w not in live:
                    continue
                if line is None or line.get("done"):
                    live.discard(w)
                    compiling.discard(w)
                    release_compiles()
                    continue
                if "compiled" in line:
                    compiling.discard(w)
                    loading.add(w)
                    release_compiles()
                    continue
                if "ready" in line:
                    compiling.discard(w)  # a worker without a compile share goes straight to ready
                    release_compiles()
                    if deadline is not None and clock() > deadline:
                        _stop(procs[w])
                        live.discard(w)
                        continue
                    procs[w].stdin.write("go\n")
                    procs[w].stdin.flush()
                    continue
                if "fatal" in line:
                    if batch:  # stored before the error: what was measured is kept
                        yield batch
                        batch = []
                    raise GpuUnhealthy(f"GPU {gpus[w]}: {line['fatal']}")
                if "i" not in line:
                    continue
                t = line["timing"]
                timing = Timing(*t[:3], samples=int(t[3]), chain=int(t[4])) if t else None
                batch.append((gpus[w], tasks[line["i"]], Outcome(line["status"], timing=timing, error=line["error"])))
                if deadline is not None and clock() > deadline:
                    at = position[w][line["i"]]
                    nxt = shares[w][at + 1] if at + 1 < len(shares[w]) else None
                    if nxt is None or case_key(tasks[nxt]) != case_key(tasks[line["i"]]):
                        _stop(procs[w])
                        live.discard(w)
            if batch:
                yield batch
        finally:
            for p in procs.values():
                _stop(p)
                reap(p)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()


def _pump(w: int, proc: subprocess.Popen, out: queue.Queue) -> None:
    """Forward a worker's JSON lines to the parent's queue as (worker, line); (worker, None) at its end."""
    try:
        for raw in proc.stdout:
            try:
                out.put((w, json.loads(raw)))
            except json.JSONDecodeError:
                continue
    except (OSError, ValueError):
        pass
    out.put((w, None))
