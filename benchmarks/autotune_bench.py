"""GPU benchmark: the pruned autotuner against timing the whole legal config space, on shapes the model never saw.

    python benchmarks/autotune_bench.py [--bundle DIR_OR_URL] [--kernels rmsnorm,softmax,...] [--shapes 24]
                                        [--dtype float16] [--warmup 3] [--iters 10] [--budget 1800] [--out FILE]

For each unseen shape (dims drawn log-uniformly inside the kernel's grid, never a shape of its
shape grids nor of the shards in data/), every legal config is checked and timed the way collect
does it (worker processes compile in parallel and take turns on the GPU; collect's timing
settings): that is the exhaustive table. Then the runtime autotuner (`zmlx_pipeline.runtime.tune`,
cache off) times only its pruned candidates from the bundle, in this one process, as a kernel
wrapper would. Reported per shape and in total: configs timed by each, wall time of each, and the
regret of the pruned pick (its exhaustive time / the exhaustive best; the pruned run's own timings
are reported too).

The noise ceiling: with --repeat (default), the whole space is timed a second time in new
processes, and the second pass's best is scored against the first pass like a pick. A tuner
cannot be expected to beat that on shapes whose configs tie within the timing noise.
Exits with status 2 and a one-line message when this machine has no Metal or CUDA backend.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_KERNELS = ("rmsnorm", "add_rmsnorm", "layernorm", "softmax", "swiglu", "moe_combine", "topk_gating", "matmul")
#: dims that must stay multiples of this (vector widths and tiles need them); others are free
ALIGN = {"cols": 256, "hidden": 256, "N": 128, "K": 128}
#: dims drawn from their grid's own values (model parameters such as MoE expert count and top-k)
FROM_GRID = ("experts", "k")


def training_shapes(kernel: str, spec) -> set[tuple]:
    """Every shape of the kernel's grids and of the committed shards (any device): the shapes to avoid."""
    dims = spec.shape_grid.dims
    seen = {tuple(s[d] for d in dims) for p in spec.shape_grid.presets for s in spec.shape_grid.shapes(p)}
    try:
        import polars as pl

        for shard in sorted((ROOT / "data").glob("*.parquet")):
            frame = pl.read_parquet(shard, columns=["kernel", "shape"]).filter(pl.col("kernel") == kernel)
            for text in frame["shape"].unique().to_list():
                s = json.loads(text)
                seen.add(tuple(s[d] for d in dims))
    except Exception:  # noqa: BLE001 - no shards readable: the grids alone
        pass
    return seen


def unseen_shapes(spec, n: int, dtype: str, limits, rng: random.Random) -> list[dict]:
    dims = spec.shape_grid.dims
    grid = [s for p in spec.shape_grid.presets for s in spec.shape_grid.shapes(p)]
    avoid = training_shapes(spec.name, spec)
    out: list[dict] = []
    tries = 0
    while len(out) < n and tries < 10_000:
        tries += 1
        shape = {}
        if any(d in FROM_GRID for d in dims):
            base = rng.choice(grid)
            shape.update({d: base[d] for d in dims if d in FROM_GRID})
        for d in dims:
            if d in shape:
                continue
            lo, hi = min(s[d] for s in grid), max(s[d] for s in grid)
            v = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
            a = ALIGN.get(d, 1)
            shape[d] = max(a, v // a * a)
        key = tuple(shape[d] for d in dims)
        if key in avoid or any(key == tuple(s[d] for d in dims) for s in out):
            continue
        if len(spec.legal_configs(shape, dtype, limits)) >= 5:
            out.append(shape)
    return out


def case_id(kernel: str, shape: dict) -> tuple[str, str]:
    return kernel, json.dumps({k: int(v) for k, v in shape.items()}, sort_keys=True)


def exhaustive(plan, dtype: str, limits, backend: str, jobs: int, device_row) -> dict:
    """{case_id: {config json: median us or None}} for every legal config, timed as collect times."""
    from zmlx_pipeline.pipeline.collect import GpuMeasurer, Task, TimingSettings
    from zmlx_pipeline.pipeline.parallel import measure_in_workers

    settings = TimingSettings()
    if device_row and device_row.get("l2_bytes"):
        settings.rotate_bytes = 2 * int(device_row["l2_bytes"])
    tasks = [Task(spec, dtype, shape, cfg) for spec, shape in plan for cfg in spec.legal_configs(shape, dtype, limits)]
    if backend == "cuda" and jobs > 1:
        results = measure_in_workers(tasks, {spec.name: spec.name for spec, _ in plan}, backend, settings, jobs)
    else:
        measurer = GpuMeasurer(backend, settings)
        results = ((t, measurer(t)) for t in tasks)
    out: dict = {}
    for task, outcome in results:
        cell = out.setdefault(case_id(task.spec.name, dict(task.shape)), {})
        cell[json.dumps(dict(task.config), sort_keys=True)] = (
            outcome.timing.median_us if outcome.status == "ok" and outcome.timing else None)
    return out


def within(regrets, tol: float = 1.02):
    """Share of regrets within `tol` of the best (None when there are none)."""
    return (sum(1 for g in regrets if g <= tol + 1e-12) / len(regrets)) if regrets else None


#: the exhaustive best's time, in the buckets `zmlx-pipeline noise` reports
BUCKETS = ((10.0, "<10 us"), (50.0, "10-50 us"), (float("inf"), ">=50 us"))


def by_bucket(rows) -> dict:
    groups: dict = {}
    for r in rows:
        name = next(label for edge, label in BUCKETS if r["best_us"] < edge)
        groups.setdefault(name, []).append((r["regret"], r["repeat_regret"]))
    return groups


#: stands in for a tune() result with --no-tune: nothing timed, no pick
NO_TUNE = type("NoTune", (), {"config": None, "timed": (), "source": None, "median_us": None})()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=None, help="bundle dir, publish dir or URL (default: the shipped one)")
    parser.add_argument("--kernels", default=",".join(DEFAULT_KERNELS))
    parser.add_argument("--shapes", type=int, default=24, help="unseen shapes in all (spread over the kernels)")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--budget", type=float, default=1800.0, help="stop starting new shapes after this many seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON result here")
    parser.add_argument("--jobs", type=int, default=16, help="worker processes for the exhaustive timing (CUDA)")
    parser.add_argument("--no-repeat", dest="repeat", action="store_false",
                        help="skip the second exhaustive pass (the noise ceiling)")
    parser.add_argument("--no-tune", dest="tune", action="store_false",
                        help="only the two exhaustive passes (the noise ceiling), no autotuner")
    args = parser.parse_args()

    from zmlx_pipeline.data.detect import detect_backend, detect_device

    backend = detect_backend()
    if backend not in ("metal", "cuda"):
        print(f"autotune_bench: no Metal or CUDA backend on this machine (MLX runs on the {backend}); "
              "it times kernels on a GPU: run it on Apple silicon or an NVIDIA machine with mlx[cuda13]",
              file=sys.stderr)
        return 2
    from zmlx_pipeline.kernels import harness
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.kernels.spec import Limits
    from zmlx_pipeline.runtime import load_bundle, predicted_config, tune
    from zmlx_pipeline.runtime.autotune import MAX_FRACTION, harness_measure

    device = detect_device()
    bundle = load_bundle(args.bundle or ROOT / "zmlx_pipeline" / "runtime" / "default_bundle", strict=True)
    if device.device_id not in bundle.tables:
        print(f"note: {device.device_id} has no table in bundle {bundle.bundle_id}: candidates are catalog defaults",
              file=sys.stderr)
    limits = Limits.from_device_row(device.spec.as_row() if device.spec else None)
    rng = random.Random(args.seed)
    kernels = [k for k in args.kernels.split(",") if k]
    per_kernel = max(1, math.ceil(args.shapes / len(kernels)))
    plan = []
    for name in kernels:
        spec = get_kernel(name)
        plan += [(spec, s) for s in unseen_shapes(spec, per_kernel, args.dtype, limits, rng)]
    rng.shuffle(plan)
    print(f"{device.device_id} ({backend}), bundle {bundle.bundle_id}: {len(plan)} unseen shapes, {args.dtype}",
          file=sys.stderr)

    t0 = time.perf_counter()
    first = exhaustive(plan, args.dtype, limits, backend, args.jobs, device.row)
    ex_wall = time.perf_counter() - t0
    second = exhaustive(plan, args.dtype, limits, backend, args.jobs, device.row) if args.repeat else {}
    print(f"exhaustive: {sum(len(v) for v in first.values())} configs timed in {ex_wall:.1f} s "
          f"({args.jobs} workers){'; timed again for the noise ceiling' if args.repeat else ''}", file=sys.stderr)

    rows = []
    start_all = time.perf_counter()
    for spec, shape in plan:
        if time.perf_counter() - start_all > args.budget:
            print("budget reached: stopping", file=sys.stderr)
            break
        key = case_id(spec.name, shape)
        legal = spec.legal_configs(shape, args.dtype, limits)
        ok = {k: v for k, v in first.get(key, {}).items() if v is not None}
        if not ok:
            continue
        best_key = min(ok, key=ok.get)
        pruned_measure = harness_measure(args.warmup, args.iters)
        t0 = time.perf_counter()
        try:
            result = NO_TUNE if not args.tune else tune(spec, shape, args.dtype, device=device.device_id, measure=pruned_measure, use_cache=False,
                          warmup=args.warmup, iters=args.iters)
        except harness.GpuUnhealthy as exc:
            print(f"GPU stopped answering ({exc}): stopping", file=sys.stderr)
            break
        pr_wall = time.perf_counter() - t0
        pick_key = json.dumps(result.config, sort_keys=True) if result.config else None
        pick_time = ok.get(pick_key) if pick_key else None
        again = {k: v for k, v in second.get(key, {}).items() if v is not None}
        again_best = min(again, key=again.get) if again else None
        pred = predicted_config(spec.name, shape, args.dtype, device.device_id)
        row = {
            "kernel": spec.name, "shape": shape, "legal": len(legal), "exhaustive_ok": len(ok),
            "exhaustive_timed": len(legal),
            "best": json.loads(best_key), "best_us": ok[best_key],
            "pruned_timed": len(result.timed), "pruned_wall_s": round(pr_wall, 3), "pick": result.config,
            "pick_source": result.source, "pick_us_exhaustive": pick_time,
            "pick_us_own": result.median_us,
            "regret": (pick_time / ok[best_key]) if pick_time else None,
            "repeat_best": json.loads(again_best) if again_best else None,
            "repeat_regret": (ok[again_best] / ok[best_key]) if again_best in ok else None,
            "evidence": pred.evidence,
        }
        rows.append(row)
        print(f"{spec.name:12s} {json.dumps(shape):40s} timed {row['pruned_timed']:3d}/{row['exhaustive_timed']:3d} "
              f"best {row['best_us']:.1f}us regret {row['regret'] if row['regret'] is None else round(row['regret'], 4)} "
              f"(repeat {row['repeat_regret'] if row['repeat_regret'] is None else round(row['repeat_regret'], 4)}) "
              f"wall {row['pruned_wall_s']:.2f}s", file=sys.stderr)

    regrets = [r["regret"] for r in rows if r["regret"] is not None]
    repeats = [r["repeat_regret"] for r in rows if r["repeat_regret"] is not None]
    summary = {
        "device": device.device_id, "backend": backend, "bundle": bundle.bundle_id, "dtype": args.dtype,
        "shapes": len(rows), "max_fraction": MAX_FRACTION,
        "pruned_timed": sum(r["pruned_timed"] for r in rows),
        "exhaustive_timed": sum(r["exhaustive_timed"] for r in rows),
        "timed_fraction": (sum(r["pruned_timed"] for r in rows) / max(1, sum(r["exhaustive_timed"] for r in rows))),
        "max_shape_fraction": max((r["pruned_timed"] / r["exhaustive_timed"] for r in rows), default=None),
        "pruned_wall_s": round(sum(r["pruned_wall_s"] for r in rows), 2),
        "exhaustive_wall_s": round(ex_wall, 2), "exhaustive_jobs": args.jobs,
        "within_2pct": within(regrets),
        "repeat_within_2pct": within(repeats),
        "by_best_time": {name: {"shapes": len(g), "within_2pct": within([r for r, _ in g if r is not None]),
                                "repeat_within_2pct": within([x for _, x in g if x is not None])}
                         for name, g in by_bucket(rows).items()},
        "regret_geomean": math.exp(statistics.mean(math.log(g) for g in regrets)) if regrets else None,
        "regret_max": max(regrets, default=None),
        "picks_without_exhaustive_time": sum(1 for r in rows if r["regret"] is None),
    }
    out = {"summary": summary, "rows": rows}
    text = json.dumps(out, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    s = summary
    within_text = "n/a" if s["within_2pct"] is None else f"{s['within_2pct']:.1%}"
    per_shape = "n/a" if s["max_shape_fraction"] is None else f"{s['max_shape_fraction']:.1%}"
    print(f"\n{s['shapes']} unseen shapes on {s['device']}: pruned timed {s['pruned_timed']} of "
          f"{s['exhaustive_timed']} configs ({s['timed_fraction']:.1%}; per shape at most {per_shape}); "
          f"wall {s['pruned_wall_s']} s (one process) vs {s['exhaustive_wall_s']} s ({args.jobs} workers); "
          f"picks within 2%: {within_text}; second exhaustive pass within 2%: "
          f"{'n/a' if s['repeat_within_2pct'] is None else format(s['repeat_within_2pct'], '.1%')}; "
          f"regret geomean {s['regret_geomean']}, max {s['regret_max']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
