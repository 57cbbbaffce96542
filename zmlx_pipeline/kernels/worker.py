"""A measuring worker process: compile a share of the configs, then measure them when told to.

MLX's CUDA backend compiles each (kernel, config, dtype) with NVRTC in the launching process (about
1.5 s each, and MLX 0.32 keeps no disk cache for custom kernels), so a collect spreads compiling over
worker processes, which then take turns on the GPU: the parent (pipeline/parallel.py) starts them,
waits until every one has compiled, and lets one at a time measure, so timings never overlap.

Protocol, one JSON object per line: the worker reads its job file (argv[1]), compiles, prints
{"ready": n_compiled}, waits for "go" on stdin, prints {"i": index, "status", "timing", "error"}
per item, then {"done": true}. A launch that leaves the GPU unusable prints {"fatal": message}.
A job with a "compile_share" (workers on several GPUs, pipeline/gpus.py) first compiles those items
into the shared compiled-kernel cache, prints {"compiled": n} and waits for "load": each program is
compiled by one worker for all of them, then every worker loads what it needs from the cache.
A job marked "exclusive" (one worker per GPU) settles its timer before "ready": no other worker times
on its GPU, and torch, imported in a thread while the programs compile, is then ready too.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(path: str) -> int:
    import mlx.core as mx

    from zmlx_pipeline.kernels.harness import GpuUnhealthy, Launcher, compile_decoy, make_inputs, settle
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.kernels.measure import GpuMeasurer, Task, TimingSettings

    with open(path) as fh:
        job = json.load(fh)
    timer = (job.get("settings") or {}).get("timer")
    warming = threading.Thread(target=_warm_timer, args=(timer,), daemon=True)
    warming.start()  # torch's import (about 5 s) overlaps the compiles, which release the GIL
    share = job.get("compile_share") or []
    specs = {ref: get_kernel(ref) for ref in {item["ref"] for item in [*job["items"], *share]}}
    tasks = [Task(specs[it["ref"]], it["dtype"], it["shape"], it["config"]) for it in job["items"]]
    launchers = {ref: Launcher(spec, job["backend"]) for ref, spec in specs.items()}
    by_name = {spec.name: launchers[ref] for ref, spec in specs.items()}
    if share:
        shared = [Task(specs[it["ref"]], it["dtype"], it["shape"], it["config"]) for it in share]
        _emit({"compiled": _precompile(mx, make_inputs, by_name, _smallest(shared), job.get("compile_threads"))})
        if sys.stdin.readline().strip() != "load":
            return 0

    # Compile: launch each distinct (kernel, dtype, config) once on the smallest shape it is planned
    # for; a config that fails here fails again when measured, which records why.
    smallest = _smallest(tasks)
    _precompile(mx, make_inputs, by_name, smallest, job.get("compile_threads"))
    compiled = 0
    for t in smallest.values():
        try:
            inputs = make_inputs(t.spec, t.shape, t.dtype, mx.random.key(0))
            mx.eval(by_name[t.spec.name](inputs, t.config, t.shape, t.dtype))
            compiled += 1
        except Exception:  # noqa: BLE001 - recorded when measured
            pass
    compile_decoy(job["backend"])  # timed first in this worker's turn (harness.settle): compiled now, not then
    mx.synchronize()
    if job.get("exclusive"):  # alone on this GPU: its turn is now, so the first result does not wait for it
        warming.join()
        settle(job["backend"], timer)
        mx.synchronize()
    mx.clear_cache()
    _emit({"ready": compiled})

    if sys.stdin.readline().strip() != "go":
        return 0
    measurer = GpuMeasurer(job["backend"], TimingSettings(**job["settings"]))
    measurer._launchers.update(by_name)  # reuse the compiled kernels
    for index, task in zip((it["i"] for it in job["items"]), tasks):
        try:
            outcome = measurer(task)
        except GpuUnhealthy as exc:
            _emit({"fatal": str(exc)})
            return 3
        t = outcome.timing
        _emit({"i": index, "status": outcome.status, "error": outcome.error,
               "timing": None if t is None else [t.median_us, t.p10_us, t.p90_us, t.samples, t.chain]})
    _emit({"done": True})
    return 0


def _warm_timer(timer: str | None) -> None:
    """Import torch and start CUDA for it, as the gpu timer's first use would (kernels/cupti.py)."""
    if timer != "gpu":
        return
    try:
        from zmlx_pipeline.kernels import cupti

        cupti.available()
    except Exception:  # noqa: BLE001 - the first timing reports a timer that does not work
        pass


def _smallest(tasks) -> dict:
    """The task on the smallest shape of each distinct (kernel, dtype, config): what compiling needs."""
    smallest: dict[tuple, Any] = {}
    for t in tasks:
        key = (t.spec.name, t.dtype, tuple(sorted(t.config.items())))
        if key not in smallest or shape_size(t.shape) < shape_size(smallest[key].shape):
            smallest[key] = t
    return smallest


def _precompile(mx, make_inputs, by_name, smallest: dict, threads: int | None) -> int:
    """Compile every program of `smallest` at once in threads through the compiled-kernel cache
    (kernels/compiled.py), or load it from disk; later launches then only load them. A launch
    signature depends on the dtype, not the shape, so one input set per kernel and dtype serves.
    Returns how many programs are ready (0 where the compiled path is off)."""
    ahead: dict[tuple, list] = {}
    for t in smallest.values():
        ahead.setdefault((t.spec.name, t.dtype), []).append(t)
    ready = 0
    for (name, dtype), group in ahead.items():
        try:
            small = min(group, key=lambda t: shape_size(t.shape))
            inputs = make_inputs(small.spec, small.shape, dtype, mx.random.key(0))
            ready += by_name[name].precompile([(t.config, t.shape, dtype, inputs) for t in group], threads)
        except Exception:  # noqa: BLE001 - each config is still compiled by its first launch
            pass
    return ready


def shape_size(shape) -> int:
    """The product of a shape's dims (which planned shape of a config is the smallest)."""
    n = 1
    for v in shape.values():
        n *= int(v)
    return n


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
