"""GPU benchmark: collect's throughput (configs checked and timed per minute) on 1, 2 and 4 GPUs of this host.

    python benchmarks/collect_bench.py [--kernels rmsnorm,softmax] [--dtypes float16] [--preset smoke]
                                       [--max-shapes 4] [--max-configs 24] [--gpus 1,2,4] [--timer auto]
                                       [--budget 120] [--out DIR]

Each GPU count (those this host has) collects the same work into a new empty store with `collect
--gpus N` (one measuring process per GPU, cases split whole), starting from an empty compiled-kernel
cache and an empty CUDA driver cache (CUDA_CACHE_PATH), so every count pays its own compiles and the
order of the counts does not matter. Prints, per count, the configs measured, the wall time
and configs per minute, and the speed-up over one GPU; writes the same as JSON to
DIR/collect_bench-<device>-<time>.json. Exits with status 2 and one line without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="rmsnorm,softmax")
    parser.add_argument("--dtypes", default="float16")
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--max-shapes", type=int, default=4, help="first N shapes of each kernel's preset")
    parser.add_argument("--max-configs", type=int, default=24, help="at most N configs per shape, evenly spread")
    parser.add_argument("--gpus", default="1,2,4", help="GPU counts to run (those above this host's count are skipped)")
    parser.add_argument("--timer", default="auto", choices=("auto", "gpu", "chain"))
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per GPU count at most")
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON result")
    args = parser.parse_args(argv)
    try:
        args.counts = sorted({int(c) for c in args.gpus.split(",") if c.strip()})
    except ValueError:
        parser.error(f"--gpus {args.gpus!r}: give counts such as 1,2,4")
    if not args.counts or min(args.counts) < 1:
        parser.error("--gpus: counts start at 1")
    return args


def throughput(measured: int, wall_s: float) -> float | None:
    """Configs per minute (None for a run that took no time)."""
    return round(measured * 60.0 / wall_s, 1) if wall_s > 0 else None


def main(argv=None) -> int:
    args = parse_args(argv)
    from zmlx_pipeline.data.detect import detect_device
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.kernels import compiled
    from zmlx_pipeline.kernels.registry import resolve
    from zmlx_pipeline.pipeline.collect import TimingSettings, collect
    from zmlx_pipeline.pipeline.gpus import parse_gpus, visible_gpu_count
    from zmlx_pipeline.kernels.ptx_cache import ENV

    device = detect_device()
    have = visible_gpu_count() if device.backend == "cuda" else 0
    if have < 1:
        print(f"collect_bench: no CUDA GPU here (MLX runs on the {device.backend}); run it on an NVIDIA machine "
              "with mlx[cuda13]", file=sys.stderr)
        return 2
    names = [k for k in args.kernels.split(",") if k]
    specs = resolve(names)
    refs = {s.name: n for s, n in zip(specs, names)}
    runs = []
    for n in [c for c in args.counts if c <= have]:
        with tempfile.TemporaryDirectory(prefix="zmlx-collect-bench-") as tmp:
            os.environ[ENV] = os.path.join(tmp, "ptx")  # every count compiles from an empty cache,
            os.environ["CUDA_CACHE_PATH"] = os.path.join(tmp, "nv")  # and the driver JITs PTX from an empty one
            compiled._PROCESS_COMPILER, compiled._UNAVAILABLE = None, None
            with Store(os.path.join(tmp, "store.duckdb")) as store:
                t0 = time.perf_counter()
                result = collect(store, device, specs, dtypes=args.dtypes.split(","), preset=args.preset,
                                 budget_s=args.budget, settings=TimingSettings(timer=args.timer), kernel_refs=refs,
                                 shapes_limit=args.max_shapes, configs_limit=args.max_configs,
                                 gpus=parse_gpus(str(n)))
                wall = time.perf_counter() - t0
        run = {"gpus": n, "planned": result.planned, "measured": result.done, "by_status": result.by_status,
               "stopped": result.stopped, "wall_s": round(wall, 2), "configs_per_min": throughput(result.done, wall)}
        runs.append(run)
        print(f"{n} GPU(s): {run['measured']}/{run['planned']} configs in {run['wall_s']} s = "
              f"{run['configs_per_min']} configs/min ({run['stopped']})", file=sys.stderr)
    base = runs[0]["configs_per_min"] if runs and runs[0]["gpus"] == 1 else None
    for run in runs:
        run["speedup_vs_1"] = round(run["configs_per_min"] / base, 2) if base and run["configs_per_min"] else None
    out = {"device": device.device_id, "gpus_on_host": have, "kernels": names, "dtypes": args.dtypes.split(","),
           "preset": args.preset, "max_shapes": args.max_shapes, "max_configs": args.max_configs,
           "timer": args.timer, "runs": runs}
    print(json.dumps(out, indent=2))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"collect_bench-{device.device_id}-{time.strftime('%Y%m%dT%H%M%S')}.json"
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
