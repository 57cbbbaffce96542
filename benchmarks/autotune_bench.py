"""GPU benchmark: the pruned autotuner against timing the whole legal config space, on shapes the model never saw.

    python benchmarks/autotune_bench.py [--bundle DIR_OR_URL] [--kernels rmsnorm,softmax,...] [--shapes 24]
                                        [--dtype float16] [--warmup 3] [--iters 10] [--budget 1800] [--jobs 16]
                                        [--h2h-rounds 7] [--no-h2h] [--no-repeat] [--no-tune] [--no-warm]
                                        [--out FILE_OR_DIR]

For each unseen shape (dims drawn log-uniformly inside the kernel's grid, never a shape of its
shape grids nor of the shards in data/), every legal config is checked and timed the way collect
does it (worker processes compile in parallel and take turns on the GPU; collect's timing
settings): that is the exhaustive table. Then the runtime autotuner (`zmlx_pipeline.runtime.tune`,
cache off) times only its pruned candidates from the bundle, in this one process, as a kernel
wrapper would. Reported per shape and in total: configs timed by each, wall time of each, and the
regret of the pruned pick, scored two ways, side by side:

- table regret: the pick's time in the exhaustive table / the table's best. Under ~50 us many
  configs of a shape tie within the timing noise (10-20% between processes), so the table's
  minimum is the luckiest draw of many noisy ties (winner's curse): it is biased low, and a pick
  that is truly as fast still scores badly.
- head-to-head regret: when the pick differs from the table's best, this process (after the
  tuner has run on every shape) times the two interleaved, --h2h-rounds rounds, alternating which goes first, each
  measurement taken exactly as collect takes it (GpuMeasurer, collect's TimingSettings, inputs
  rotated over twice the L2; each config is compiled and checked once before the rounds, as
  collect's workers compile before timing). The regret is the median over rounds of pick time /
  best time in that round: both sides see the same process, clocks and moment, and neither was
  selected as a minimum. A pick equal to the best scores exactly 1.0 and nothing is timed. A failed
  measurement gives None, never a number.

First calls: each shape's tune() wall time is what a new shape costs on its first call. The tuner
phase starts with an empty compiled-kernel cache (kernels/compiled.py; the exhaustive passes use a
cache of their own), so it is the cold figure: every candidate compiled (in parallel, through
NVRTC) before it is timed. Then (unless --no-warm) a new process tunes the same shapes again on
the cache the first pass filled: the warm figure, a new process on a machine that compiled these
kernels before. Reported per shape (pruned_wall_s cold, warm_wall_s) and as median, p90 and max,
next to the picks' regret.

The noise ceiling: with --repeat (default), the whole space is timed a second time in new
processes, and the second pass's best is scored against the first pass's best like a pick, both
ways (table and head to head). A tuner cannot be expected to beat that on shapes whose configs
tie within the timing noise. Scores are also grouped by the exhaustive best's time, in the
buckets of `zmlx-pipeline noise` (zmlx_pipeline/data/noise_buckets.py).
Exits with status 2 and a one-line message when this machine has no Metal or CUDA backend.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_KERNELS = ("rmsnorm", "add_rmsnorm", "layernorm", "softmax", "swiglu", "moe_combine", "topk_gating", "matmul")
#: dims that must stay multiples of this (vector widths and tiles need them); others are free
ALIGN = {"cols": 256, "hidden": 256, "N": 128, "K": 128}
#: dims drawn from their grid's own values (model parameters such as MoE expert count and top-k)
FROM_GRID = ("experts", "k")
#: a pick within this factor of the best counts as found (the 2% the autotuner is held to)
TOLERANCE = 1.02

#: one head-to-head round: (challenger us or None, best us or None, whether the challenger went first)
Round = tuple[float | None, float | None, bool]


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
    except Exception:  # noqa: BLE001, S110 - no shards readable: the grids alone
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
            v = round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
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


def config_key(config: dict) -> str:
    """A config as the exhaustive table keys it (canonical JSON)."""
    return json.dumps({k: int(v) for k, v in dict(config).items()}, sort_keys=True)


def collect_settings(device_row, timer: str = "auto"):
    """Collect's timing settings for this device: its defaults, inputs rotated over twice the L2 (as collect
    does), and `timer` (--timer) for every measurement here, exhaustive and pruned alike."""
    from zmlx_pipeline.kernels.harness import rotate_bytes_for
    from zmlx_pipeline.pipeline.collect import TimingSettings

    return TimingSettings(rotate_bytes=rotate_bytes_for(device_row), timer=timer)


def exhaustive(plan, dtype: str, limits, backend: str, jobs: int, settings) -> tuple[dict, int]:
    """({case_id: {config json: median us or None}} for every legal config, timed as collect times with
    `settings` (collect_settings); processes used)."""
    from zmlx_pipeline.pipeline.collect import GpuMeasurer, Task
    from zmlx_pipeline.pipeline.parallel import measure_in_workers, partition

    tasks = [Task(spec, dtype, shape, cfg) for spec, shape in plan for cfg in spec.legal_configs(shape, dtype, limits)]
    if backend == "cuda" and jobs > 1:
        workers = len(partition(tasks, jobs))  # whole (kernel, dtype) groups: at most one worker per kernel here
        results = measure_in_workers(tasks, {spec.name: spec.name for spec, _ in plan}, backend, settings, jobs)
    else:
        workers = 1
        measurer = GpuMeasurer(backend, settings)
        results = ((t, measurer(t)) for t in tasks)
    out: dict = {}
    for task, outcome in results:
        cell = out.setdefault(case_id(task.spec.name, dict(task.shape)), {})
        cell[config_key(task.config)] = (
            outcome.timing.median_us if outcome.status == "ok" and outcome.timing else None)
    return out, workers


# ------------------------------------------------------------------------------------------
# head to head: two configs of one case, interleaved in this process


def head_to_head(measure: Callable, challenger, best, rounds: int) -> list[Round]:
    """Time `challenger` and `best` (two collect Tasks of one case) `rounds` times, alternating which goes first.

    `measure(task)` returns a harness Outcome (collect's GpuMeasurer); a side that is not ok is None.
    Each side is measured once before the rounds and that result dropped: it compiles the config
    (collect's workers also compile everything before timing), so no round follows a compile.
    """
    measure(challenger)
    measure(best)
    out: list[Round] = []
    for r in range(rounds):
        challenger_first = r % 2 == 0
        times = {}
        for side, task in ((("c", challenger), ("b", best)) if challenger_first else (("b", best), ("c", challenger))):
            outcome = measure(task)
            times[side] = outcome.timing.median_us if outcome.status == "ok" and outcome.timing else None
        out.append((times["c"], times["b"], challenger_first))
    return out


def h2h_regret(rounds: Sequence[Round]) -> float | None:
    """Median over rounds of challenger time / best time in that round; rounds missing a side are left out.

    None when no round has both sides (never a made-up ratio).
    """
    ratios = [c / b for c, b, *_ in rounds if c is not None and b is not None and c > 0 and b > 0]
    return statistics.median(ratios) if ratios else None


def within(regrets, tol: float = TOLERANCE):
    """Share of regrets within `tol` of the best (None when there are none)."""
    return (sum(1 for g in regrets if g <= tol + 1e-12) / len(regrets)) if regrets else None


def geomean(values) -> float | None:
    values = list(values)
    return math.exp(statistics.mean(math.log(v) for v in values)) if values else None


def by_bucket(rows) -> dict[str, list[dict]]:
    """Rows grouped by their exhaustive best time, in the noise buckets (bucket order, empty ones left out)."""
    from zmlx_pipeline.data.noise_buckets import bucket_index, bucket_label

    groups: dict[int, list[dict]] = {}
    for r in rows:
        groups.setdefault(bucket_index(r["best_us"]), []).append(r)
    return {bucket_label(i): groups[i] for i in sorted(groups)}


# ------------------------------------------------------------------------------------------
# one row per shape, and the summary


def score_shape(kernel: str, shape: dict, legal: int, first: dict, second: dict, tuned,
                pruned_wall_s: float, evidence: str | None,
                h2h: Callable[[dict, dict], list[Round]] | None) -> dict | None:
    """One shape's row, or None when the first exhaustive pass has no ok config.

    `first`/`second`: the two passes' {config json: us or None}; `tuned`: the tune() result, or None
    with --no-tune; `h2h(challenger, best)` times a pair head to head, None when that is off. The pick
    and the second pass's best are each scored against the first pass's best, by the table and head
    to head; a pair is timed once even when both ask for it.
    """
    ok = {k: v for k, v in first.items() if v is not None}
    if not ok:
        return None
    best_key = min(ok, key=ok.get)
    again = {k: v for k, v in second.items() if v is not None}
    again_best = min(again, key=again.get) if again else None
    pick_key = config_key(tuned.config) if tuned is not None and tuned.config else None
    timed_pairs: dict[str, list[Round]] = {}

    def versus(challenger: str | None, name: str) -> tuple[float | None, list[dict]]:
        if h2h is None or challenger is None:
            return None, []
        if challenger == best_key:
            return 1.0, []
        if challenger not in timed_pairs:
            timed_pairs[challenger] = h2h(json.loads(challenger), json.loads(best_key))
        rounds = timed_pairs[challenger]
        return h2h_regret(rounds), [{"first": name if c_first else "best", f"{name}_us": c, "best_us": b}
                                    for c, b, c_first in rounds]

    pick_us = ok.get(pick_key) if pick_key else None
    h2h_pick, h2h_rounds = versus(pick_key, "pick")
    h2h_again, h2h_again_rounds = versus(again_best, "repeat_best")
    return {
        "kernel": kernel, "shape": shape, "legal": legal, "exhaustive_ok": len(ok), "exhaustive_timed": legal,
        "best": json.loads(best_key), "best_us": ok[best_key],
        "pruned_timed": len(tuned.timed) if tuned is not None else 0, "pruned_wall_s": round(pruned_wall_s, 3),
        "pick": tuned.config if tuned is not None else None,
        "pick_source": tuned.source if tuned is not None else None,
        "pick_us_exhaustive": pick_us,
        "pick_us_own": tuned.median_us if tuned is not None else None,
        "regret": (pick_us / ok[best_key]) if pick_us else None,
        "h2h_regret": h2h_pick, "h2h_rounds": h2h_rounds,
        "repeat_best": json.loads(again_best) if again_best else None,
        "repeat_regret": (ok[again_best] / ok[best_key]) if again_best in ok else None,
        "repeat_h2h_regret": h2h_again, "repeat_h2h_rounds": h2h_again_rounds,
        "evidence": evidence,
        # every legal config's first-pass time and what the tuner timed (in order, with its own times), so
        # another bundle's candidates can be replayed on these very shapes without a GPU
        "exhaustive_us": {k: (round(v, 4) if v is not None else None) for k, v in first.items()},
        "pruned": [{"config": config_key(t["config"]), "status": t["status"], "median_us": t["median_us"]}
                   for t in (tuned.timed if tuned is not None else [])],
    }


#: the four scores of a row: (row field, summary prefix)
SCORES = (("regret", ""), ("h2h_regret", "h2h_"), ("repeat_regret", "repeat_"), ("repeat_h2h_regret", "repeat_h2h_"))


def scores(rows: Sequence[dict]) -> dict:
    """For each score: shapes that have it, the share within 2%, the geomean and the max (None where none has it)."""
    out: dict = {}
    for field, prefix in SCORES:
        values = [r[field] for r in rows if r.get(field) is not None]
        out[f"{prefix}scored"] = len(values)
        out[f"{prefix}within_2pct"] = within(values)
        out[f"{prefix}regret_geomean"] = geomean(values)
        out[f"{prefix}regret_max"] = max(values, default=None)
    return out


def summarize(rows: Sequence[dict]) -> dict:
    """The totals of the rows: configs timed by each side, wall time of the pruned runs, and every score,
    in all and by the exhaustive best's time. Rows whose score is None do not count for that score."""
    pruned = sum(r["pruned_timed"] for r in rows)
    whole = sum(r["exhaustive_timed"] for r in rows)
    return {
        "shapes": len(rows),
        "pruned_timed": pruned,
        "exhaustive_timed": whole,
        "timed_fraction": pruned / whole if whole else None,
        "max_shape_fraction": max((r["pruned_timed"] / r["exhaustive_timed"] for r in rows if r["exhaustive_timed"]),
                                  default=None),
        "pruned_wall_s": round(sum(r["pruned_wall_s"] for r in rows), 2),
        "first_call_cold_s": wall_stats([r["pruned_wall_s"] for r in rows]),
        "first_call_warm_s": wall_stats([r.get("warm_wall_s") for r in rows]),
        "h2h_wall_s": round(sum(r.get("h2h_wall_s") or 0.0 for r in rows), 2),
        "h2h_timed_shapes": sum(1 for r in rows if r["h2h_rounds"] or r["repeat_h2h_rounds"]),
        **scores(rows),
        "picks_without_exhaustive_time": sum(1 for r in rows if r["pick"] is not None and r["regret"] is None),
        "by_best_time": {label: {"shapes": len(group), **scores(group)} for label, group in by_bucket(rows).items()},
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def summary_line(s: dict) -> str:
    """The closing one-line summary: both scores (table and head to head) for the picks and for the repeat pass."""
    return (f"{s['shapes']} unseen shapes on {s.get('device', '?')}: pruned timed {s['pruned_timed']} of "
            f"{s['exhaustive_timed']} configs ({_pct(s['timed_fraction'])}; per shape at most "
            f"{_pct(s['max_shape_fraction'])}); wall {s['pruned_wall_s']} s (one process) vs "
            f"{s.get('exhaustive_wall_s', '?')} s ({s.get('exhaustive_workers', '?')} workers); "
            f"picks within 2%: table {_pct(s['within_2pct'])} of {s['scored']}, head-to-head "
            f"{_pct(s['h2h_within_2pct'])} of {s['h2h_scored']}; second exhaustive pass within 2%: table "
            f"{_pct(s['repeat_within_2pct'])} of {s['repeat_scored']}, head-to-head "
            f"{_pct(s['repeat_h2h_within_2pct'])} of {s['repeat_h2h_scored']}; pick regret geomean table "
            f"{_num(s['regret_geomean'])}, head-to-head {_num(s['h2h_regret_geomean'])}; max table "
            f"{_num(s['regret_max'])}, head-to-head {_num(s['h2h_regret_max'])}; first call per new shape "
            f"(s, median/p90/max) cold {_walls(s.get('first_call_cold_s'))}, warm {_walls(s.get('first_call_warm_s'))}")


def _walls(w: dict | None) -> str:
    if not w or w.get("median") is None:
        return "n/a"
    return f"{w['median']}/{w['p90']}/{w['max']}"


def write_json(path: Path, obj: dict) -> None:
    """Write atomically, so a run stopped mid-way leaves the last complete snapshot."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=None, help="bundle dir, publish dir or URL (default: the shipped one)")
    parser.add_argument("--kernels", default=",".join(DEFAULT_KERNELS))
    parser.add_argument("--shapes", type=_positive_int, default=24,
                        help="unseen shapes in all (spread over the kernels; at least 20 for a useful hit rate)")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up launches per candidate in the pruned tuner")
    parser.add_argument("--iters", type=int, default=10, help="timed samples per candidate in the pruned tuner")
    parser.add_argument("--timer", default="auto", choices=("auto", "gpu", "chain"),
                        help="how every config is timed, exhaustive and pruned alike (see `collect --timer`)")
    parser.add_argument("--budget", type=float, default=1800.0,
                        help="stop starting new shapes after this many seconds, in the tuner phase and again in the "
                             "head-to-head phase (each phase gets this much)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the JSON result here (rewritten after every shape); a folder gets "
                             "autotune_bench-<device>-<time>.json inside it")
    parser.add_argument("--no-warm", dest="warm", action="store_false",
                        help="skip the warm-cache pass (a new process tuning the same shapes again)")
    parser.add_argument("--jobs", type=_positive_int, default=16,
                        help="worker processes for the exhaustive timing (CUDA; at most one per kernel and dtype)")
    parser.add_argument("--h2h-rounds", type=_positive_int, default=7,
                        help="head-to-head rounds per pair (interleaved, alternating which goes first)")
    parser.add_argument("--no-h2h", dest="h2h", action="store_false",
                        help="skip the head-to-head confirmation (only the table regret is scored)")
    parser.add_argument("--no-repeat", dest="repeat", action="store_false",
                        help="skip the second exhaustive pass (the noise ceiling)")
    parser.add_argument("--no-tune", dest="tune", action="store_false",
                        help="only the two exhaustive passes (the noise ceiling), no autotuner")
    args = parser.parse_args(argv)
    if args.out is not None and not args.out.is_dir() and not args.out.resolve().parent.is_dir():
        parser.error(f"--out {args.out}: its folder does not exist (create it first)")
    return args


def wall_stats(values: Sequence[float]) -> dict:
    """Median, p90 and max of per-shape wall times (None when there are none)."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return {"median": None, "p90": None, "max": None}
    return {"median": round(statistics.median(v), 3), "p90": round(v[min(len(v) - 1, math.ceil(0.9 * len(v)) - 1)], 3),
            "max": round(v[-1], 3)}


def tune_walls(cases: Sequence[tuple[str, dict]], dtype: str, device: str, warmup: int, iters: int,
               rotate_bytes: int, timer: str) -> list[float | None]:
    """tune() wall time of each (kernel, shape) in this process (cache off), in order; None where it failed."""
    from zmlx_pipeline.runtime import tune
    from zmlx_pipeline.runtime.tuner import harness_measure

    out: list[float | None] = []
    for kernel, shape in cases:
        t0 = time.perf_counter()
        try:
            tune(kernel, shape, dtype, device=device, use_cache=False, warmup=warmup, iters=iters,
                 measure=harness_measure(warmup, iters, rotate_bytes=rotate_bytes, timer=timer))
            out.append(round(time.perf_counter() - t0, 3))
        except Exception:  # noqa: BLE001 - a failed tune has no first-call time
            out.append(None)
    return out


def warm_pass(cases: Sequence[tuple[str, dict]], args, device: str, rotate_bytes: int) -> list[float | None]:
    """tune_walls in a new process on this process's compiled-kernel cache (the warm first calls)."""
    import subprocess
    import tempfile

    job = {"cases": [list(c) for c in cases], "dtype": args.dtype, "device": device, "warmup": args.warmup,
           "iters": args.iters, "rotate_bytes": rotate_bytes, "timer": args.timer}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(job, fh)
    try:
        out = subprocess.run([sys.executable, __file__, "--warm-child", fh.name], capture_output=True, text=True,
                             check=False, env=dict(os.environ))
    finally:
        os.unlink(fh.name)
    if out.returncode != 0:
        print(f"warm pass failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}", file=sys.stderr)
        return [None] * len(cases)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _warm_child(path: str) -> int:
    with open(path) as fh:
        job = json.load(fh)
    walls = tune_walls([tuple(c) for c in job["cases"]], job["dtype"], job["device"], job["warmup"], job["iters"],
                       job["rotate_bytes"], job["timer"])
    print(json.dumps(walls))
    return 0


def _ptx_cache(prefix: str) -> str:
    """Point this process (and the workers it starts) at a new empty compiled-kernel cache."""
    import tempfile

    from zmlx_pipeline.kernels import compiled
    from zmlx_pipeline.kernels.ptx_cache import ENV

    path = tempfile.mkdtemp(prefix=prefix)
    os.environ[ENV] = path
    compiled._PROCESS_COMPILER, compiled._UNAVAILABLE = None, None
    return path


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--warm-child"]:
        return _warm_child(argv[1])
    args = parse_args(argv)

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
    from zmlx_pipeline.pipeline.collect import GpuMeasurer, Task
    from zmlx_pipeline.runtime import load_bundle, predicted_config, tune
    from zmlx_pipeline.runtime.tuner import MAX_FRACTION, harness_measure

    device = detect_device()
    if args.out is not None and args.out.is_dir():
        args.out = args.out / f"autotune_bench-{device.device_id}-{time.strftime('%Y%m%dT%H%M%S')}.json"
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

    _ptx_cache("zmlx-ptx-exhaustive-")  # the exhaustive passes must not warm the tuner's cache
    t0 = time.perf_counter()
    settings = collect_settings(device.row, args.timer)
    first, workers = exhaustive(plan, args.dtype, limits, backend, args.jobs, settings)
    ex_wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    second = exhaustive(plan, args.dtype, limits, backend, args.jobs, settings)[0] if args.repeat else {}
    repeat_wall = time.perf_counter() - t0 if args.repeat else None
    print(f"exhaustive: {sum(len(v) for v in first.values())} configs timed in {ex_wall:.1f} s ({workers} workers)"
          f"{f'; timed again for the noise ceiling in {repeat_wall:.1f} s' if args.repeat else ''}", file=sys.stderr)

    header = {
        "device": device.device_id, "backend": backend, "bundle": bundle.bundle_id, "dtype": args.dtype,
        "max_fraction": MAX_FRACTION, "exhaustive_wall_s": round(ex_wall, 2),
        "exhaustive_repeat_wall_s": None if repeat_wall is None else round(repeat_wall, 2),
        "exhaustive_jobs": args.jobs, "exhaustive_workers": workers,
        "h2h": args.h2h, "h2h_rounds": args.h2h_rounds if args.h2h else None,
    }
    rows: list[dict] = []
    cases: list[tuple] = []  # (spec, shape, tune result or None, its wall time), one per row
    stopped = "finished"

    def score(spec, shape, tuned, pr_wall: float, h2h) -> dict | None:
        key = case_id(spec.name, shape)
        return score_shape(spec.name, shape, len(spec.legal_configs(shape, args.dtype, limits)), first.get(key, {}),
                           second.get(key, {}), tuned, pr_wall,
                           predicted_config(spec.name, shape, args.dtype, device.device_id).evidence, h2h)

    def snapshot(phase: str) -> None:
        if args.out:
            write_json(args.out, {"summary": {**header, **summarize(rows), "stopped": phase}, "rows": rows})

    # the tuner, shape by shape; the head-to-head comes after it, so that configs compiled for a
    # head-to-head cannot shorten a later shape's tuning wall time
    _ptx_cache("zmlx-ptx-tune-")  # cold: the first calls compile every candidate
    start = time.perf_counter()
    for spec, shape in plan:
        if time.perf_counter() - start > args.budget:
            print("budget reached: no more shapes tuned", file=sys.stderr)
            stopped = "budget"
            break
        if not any(v is not None for v in first.get(case_id(spec.name, shape), {}).values()):
            continue
        t0 = time.perf_counter()
        try:
            tuned = None if not args.tune else tune(
                spec, shape, args.dtype, device=device.device_id, use_cache=False,
                measure=harness_measure(args.warmup, args.iters, rotate_bytes=settings.rotate_bytes,
                                        timer=args.timer),
                warmup=args.warmup, iters=args.iters)
        except harness.GpuUnhealthy as exc:
            print(f"GPU stopped answering ({exc}): stopping", file=sys.stderr)
            stopped = "gpu_unhealthy"
            break
        pr_wall = time.perf_counter() - t0
        row = score(spec, shape, tuned, pr_wall, None)
        if row is None:
            continue
        row["h2h_wall_s"] = None
        rows.append(row)
        cases.append((spec, shape, tuned, pr_wall))
        print(f"{spec.name:12s} {json.dumps(shape):40s} timed {row['pruned_timed']:3d}/{row['exhaustive_timed']:3d} "
              f"best {row['best_us']:.1f}us table regret {_num(row['regret'])} "
              f"(repeat {_num(row['repeat_regret'])}) wall {row['pruned_wall_s']:.2f}s", file=sys.stderr)
        snapshot("tuning")

    if args.tune and args.warm and cases and stopped != "gpu_unhealthy":
        from zmlx_pipeline.kernels import compiled

        comp = compiled.process_compiler()
        header["compiled_path"] = "precompiled" if comp is not None else f"cuda_kernel ({compiled.unavailable_reason()})"
        warm = warm_pass([(spec.name, shape) for spec, shape, _, _ in cases], args, device.device_id,
                         settings.rotate_bytes)
        for row, w in zip(rows, warm):
            row["warm_wall_s"] = w
        print(f"first call per new shape, cold cache: {wall_stats([r['pruned_wall_s'] for r in rows])}; "
              f"warm cache (new process): {wall_stats(warm)}", file=sys.stderr)
        snapshot("warm")

    if args.h2h and stopped != "gpu_unhealthy":
        pair_measurer = GpuMeasurer(backend, collect_settings(device.row, args.timer))
        print(f"head to head: {len(cases)} shapes, {args.h2h_rounds} rounds per pair", file=sys.stderr)
        start = time.perf_counter()
        for i, (spec, shape, tuned, pr_wall) in enumerate(cases):
            if time.perf_counter() - start > args.budget:
                print("budget reached: no more head-to-heads", file=sys.stderr)
                stopped = "budget"
                break

            def pair(challenger: dict, best: dict, spec=spec, shape=shape) -> list[Round]:
                return head_to_head(pair_measurer, Task(spec, args.dtype, shape, challenger),
                                    Task(spec, args.dtype, shape, best), args.h2h_rounds)

            t0 = time.perf_counter()
            try:
                row = score(spec, shape, tuned, pr_wall, pair)
            except harness.GpuUnhealthy as exc:
                print(f"GPU stopped answering in the head-to-head ({exc}): stopping", file=sys.stderr)
                stopped = "gpu_unhealthy"
                break
            row["h2h_wall_s"] = round(time.perf_counter() - t0, 3)
            rows[i] = {**row, "warm_wall_s": rows[i].get("warm_wall_s")}
            print(f"{spec.name:12s} {json.dumps(shape):40s} best {row['best_us']:.1f}us regret table "
                  f"{_num(row['regret'])} head-to-head {_num(row['h2h_regret'])} (repeat table "
                  f"{_num(row['repeat_regret'])} head-to-head {_num(row['repeat_h2h_regret'])}) "
                  f"{row['h2h_wall_s']:.2f}s", file=sys.stderr)
            snapshot("head_to_head")

    summary = {**header, **summarize(rows), "stopped": stopped}
    out = {"summary": summary, "rows": rows}
    if args.out:
        write_json(args.out, out)
    print(json.dumps(out, indent=2))
    print("\n" + summary_line(summary), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
