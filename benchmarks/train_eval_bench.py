"""Training and evaluation time and peak memory, on the committed data and on a 1M-row store.

    python benchmarks/train_eval_bench.py [--rows 1000000] [--model NAME] [--jobs N] [--kernel-tuner DIR] [--work DIR]

Two stores are measured:
- `committed`: the shards in data/ plus the Kernel Tuner files (../shared/datasets/kernel-tuner,
  or --kernel-tuner), imported as `zmlx-pipeline run` and `zmlx-pipeline import` would;
- `resampled`: about --rows rows made from the committed store's real rows: every
  (device, kernel, dtype, shape) case is copied R times under a new, synthetic shape (its first
  dimension times 2..R+1) and each copy's times are the real times of that case's configs times
  a random factor exp(N(0, 0.05)); failed configs stay failed. The data are NOT measurements:
  they exist only to time the code at this size.

On each store four stages run, each in a fresh Python process so that its peak memory is its
own: `reference` (below), `train` (train_models: fit, held-out folds and pruning k, save, register, every
kernel), `evaluate-shapes` and `evaluate-devices` (evaluate with the model and every baseline; a kernel whose
held-out cases train recorded under that split is read from them, models/heldout.py), each with
--jobs worker processes (default: one per CPU, as the CLI). Printed per stage: wall seconds, the
CPU seconds (user + system) of the stage's process and of its worker processes together (on a
busy shared machine the wall time grows, the CPU time much less), the peak resident memory of the
stage's process, of its largest worker and of all of them together, plus the load average while it
ran, since the machine may be shared. Memory is read from /proc (VmHWM, VmRSS), sampled every 0.2 s
for the workers: ru_maxrss would not do, since on Linux a child's ru_maxrss starts at its parent's
peak (it is carried over exec), so a stage started by a process that built the 1M store reported
that process's 3.1 GB. --stores-only builds the stores in --work and stops; --timeout stops
a stage after that many seconds and says so.

The headline figure of a store is a ratio, which carries from machine to machine where seconds do not
(the same code on the same 1M store took 116 s on one 2-core machine and 143-183 s on others): the wall
time of train plus evaluate-shapes over the wall time of one plain fit of the same rows, measured in the
same run (the `reference` stage, in its own process like the others, before them). The plain fit is a
`sklearn.ensemble.HistGradientBoostingRegressor()` with default parameters (100 trees at most, early
stopping on above 10,000 rows), under the one-OpenMP-thread limit the stages' fits run under
(pool.fit_threads; the stages spread their fits over --jobs workers), regressing log time on
`reference_matrix`: every row the stages read (each kernel's feature frame), in REFERENCE_COLUMNS = 34
columns that mean the same for every kernel: the device's 11 spec features, the dtype's bytes, the kernel
(as a number), the config's parameters in name order, raw and log2 (8 slots each, matmul's count; NaN past
a kernel's own), the shape's dims in name order (log2, 4 slots) and the shape's log2 size. The stages' own
frames hold 33-63 feature columns per kernel (about 37 per row on the committed data), so the plain fit
does about as much work per row and column as one of theirs, once. Only the fit is timed; building the
matrix is not. Target: 3x or less.

First it still times the fixed 50,000-row fit of the stages' own boosting model on one core that the
recorded runs in benchmarks/results/ print as the machine's speed: it takes seconds, and keeps new runs
comparable with those.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("train", "evaluate-shapes", "evaluate-devices")
REFERENCE = "reference"  # the plain fit of the same rows, the ratio's denominator
RATIO_STAGES = ("train", "evaluate-shapes")  # the ratio's numerator
TARGET_RATIO = 3.0
PARAM_SLOTS = 8  # config parameters per kernel, at most (matmul)
DIM_SLOTS = 4    # shape dims per kernel, at most (convolution_milo)
REFERENCE_COLUMNS = 11 + 1 + 1 + 2 * PARAM_SLOTS + DIM_SLOTS + 1


def _log(msg: str) -> None:
    print(msg, flush=True)


def machine_speed(rows: int = 50_000, trees: int = 200, repeats: int = 3) -> dict:
    """Seconds of one fixed fit of the stages' boosting model on one core (the best of `repeats`): how fast
    this machine runs the work that dominates the stages, to compare figures measured on different machines."""
    import numpy as np

    from zmlx_pipeline.models.rankers.pipeline import boosting_regressor
    from zmlx_pipeline.models.pool import fit_threads

    rng = np.random.default_rng(0)
    X = rng.random((rows, 12))
    y = np.sin(6 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.standard_normal(rows)
    best = math.inf
    with fit_threads():
        for _ in range(repeats):
            model = boosting_regressor(max_iter=trees)
            t = time.perf_counter()
            model.fit(X, y)
            best = min(best, time.perf_counter() - t)
    return {"store": "machine", "stage": "calibration", "rows": rows, "trees": trees, "repeats": repeats,
            "fit_s": round(best, 3), "cpus": os.cpu_count()}


def reference_matrix(features: dict) -> tuple:
    """(X, y) of the plain reference fit: every row of the kernels' feature frames in REFERENCE_COLUMNS
    columns that mean the same for every kernel (see the module docstring), and log time."""
    import numpy as np
    import polars as pl

    missing = pl.lit(None, dtype=pl.Float64)
    blocks, targets = [], []
    for code, kernel in enumerate(sorted(features)):
        f = features[kernel]
        devices = sorted(c for c in f.frame.columns if c.startswith("dev_log2_"))
        params = sorted(f.params)[:PARAM_SLOTS]
        dims = sorted(f.shape_dims)[:DIM_SLOTS]
        raw = [pl.col(f"cfg_{p}").cast(pl.Float64) for p in params] + [missing] * (PARAM_SLOTS - len(params))
        columns = [*(pl.col(c) for c in devices), pl.col("dtype_bytes"), pl.lit(float(code)), *raw,
                   *(pl.when(r > 0).then(r.log(2)) for r in raw),
                   *(pl.col(f"shape_log2_{d}") for d in dims), *[missing] * (DIM_SLOTS - len(dims)),
                   pl.col("shape_log2_size") if "shape_log2_size" in f.frame.columns else missing]
        if len(columns) != REFERENCE_COLUMNS:
            raise SystemExit(f"{kernel}: {len(devices)} device spec features, the reference matrix expects 11")
        blocks.append(f.frame.select([c.cast(pl.Float64).alias(f"x{i}") for i, c in enumerate(columns)])
                      .to_numpy().astype(np.float64))
        targets.append(f.frame["log_time"].to_numpy())
    return np.vstack(blocks), np.concatenate(targets)


def plain_fit(X, y) -> dict:
    """Seconds of one fit of a default HistGradientBoostingRegressor on (X, y) under the stages' thread limit
    (evaluate.fit_threads): the ratio's denominator. Columns no row fills (slots that none of the store's
    kernels has) are left out: scikit-learn cannot bin them."""
    import numpy as np
    from sklearn.ensemble import HistGradientBoostingRegressor

    from zmlx_pipeline.models.pool import fit_threads

    X = X[:, ~np.isnan(X).all(axis=0)]
    model = HistGradientBoostingRegressor()
    with fit_threads():
        t = time.perf_counter()
        model.fit(X, y)
        seconds = time.perf_counter() - t
    return {"fit_s": seconds, "trees": int(model.n_iter_), "rows": int(X.shape[0]), "columns": int(X.shape[1])}


def ratio_summary(results: list[dict], label: str) -> dict | None:
    """The headline of one store from its stage results of this run: (train + evaluate-shapes wall) over the
    reference fit's wall, with both; None when a stage of it did not finish."""
    mine = {r["stage"]: r for r in results if r.get("store") == label}
    needed = (*RATIO_STAGES, REFERENCE)
    if any("wall_s" not in mine.get(s, {}) for s in needed):
        return None
    stages = sum(mine[s]["wall_s"] for s in RATIO_STAGES)
    reference = mine[REFERENCE]["wall_s"]
    return {"store": label, "stage": "ratio", "rows": mine[REFERENCE].get("rows"),
            "train_evaluate_shapes_wall_s": round(stages, 2), "reference_fit_s": round(reference, 2),
            "ratio": round(stages / reference, 3), "target_ratio": TARGET_RATIO,
            "reference": mine[REFERENCE].get("detail")}


def build_committed(path: Path, data: Path, kernel_tuner: Path | None) -> int:
    """The committed shards plus the Kernel Tuner files in one store; returns its measurement count."""
    from zmlx_pipeline.data.importers import import_files
    from zmlx_pipeline.data.shards import ingest_shards
    from zmlx_pipeline.data.store import Store

    with Store(path) as store:
        ingest_shards(store, [data])
        if kernel_tuner is not None:
            folders = sorted(p for p in kernel_tuner.iterdir() if p.is_dir() and p.name != "search-spaces")
            # the one file that names its GPU only as "A100" (four catalog chips) is mapped to the A100 its kernel's
            # cache names, NVIDIA A100-PCIE-40GB
            import_files(store, folders, device_map=Path(__file__).with_name("kernel_tuner_device_map.json"))
        return sum(r["measurements"] for r in store.summary())


def build_resampled(source: Path, path: Path, rows: int, seed: int = 0) -> int:
    """A store of about `rows` rows resampled from `source`'s real rows (see the module docstring)."""
    import numpy as np
    import polars as pl

    from zmlx_pipeline.core.keys import canonical_json, mapping_key
    from zmlx_pipeline.data.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "real.parquet"
        with Store(source, read_only=True) as store:
            store.export_shard(shard)
        real = pl.read_parquet(shard)
        copies = max(1, math.ceil(rows / real.height))
        shapes = real.select("shape").unique()["shape"].to_list()
        rng = np.random.default_rng(seed)
        parts = []
        for r in range(copies):
            factor = r + 2
            new = {}
            for text in shapes:
                shape = json.loads(text)
                first = sorted(k for k, v in shape.items() if isinstance(v, int) and not isinstance(v, bool))
                if first:
                    shape[first[0]] = shape[first[0]] * factor
                else:
                    shape["replica"] = factor
                new[text] = (canonical_json(shape), mapping_key(shape))
            mapping = pl.DataFrame({"shape": list(new), "_shape": [v[0] for v in new.values()],
                                    "_shape_key": [v[1] for v in new.values()]})
            noise = pl.Series("_noise", np.exp(rng.normal(0.0, 0.05, real.height)))
            part = real.join(mapping, on="shape", how="left", maintain_order="left").with_columns(noise)
            part = part.with_columns(
                pl.col("_shape").alias("shape"), pl.col("_shape_key").alias("shape_key"),
                *[(pl.col(c) * pl.col("_noise")).alias(c) for c in ("median_us", "p10_us", "p90_us")],
            ).drop("_shape", "_shape_key", "_noise")
            parts.append(part)
        big = pl.concat(parts)
        out = Path(tmp) / "resampled.parquet"
        big.write_parquet(out, compression="zstd")
        with Store(path) as store:
            store.ingest_shard(out)
            return sum(r["measurements"] for r in store.summary())


def _cpu(who) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _status_kib(pid: int | str, field: str) -> int | None:
    """A memory field of /proc/PID/status in KiB (VmHWM: the process's own peak; VmRSS: now), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _descendants(root: int) -> list[int]:
    """The pids below `root` (from /proc/*/stat), Linux only; [] elsewhere."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for e in entries:
        try:
            with open(f"/proc/{e}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(e))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class MemorySampler:
    """Samples, every `interval` s while running, the peak (VmHWM) of each descendant process and the
    resident memory of this process and its descendants together (the stage's footprint)."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.worker_peak_kib = 0
        self.total_peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        me = os.getpid()
        total = _status_kib(me, "VmRSS") or 0
        for pid in _descendants(me):
            self.worker_peak_kib = max(self.worker_peak_kib, _status_kib(pid, "VmHWM") or 0)
            total += _status_kib(pid, "VmRSS") or 0
        self.total_peak_kib = max(self.total_peak_kib, total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "MemorySampler":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_stage(db: Path, stage: str, model: str | None = None, jobs: int | None = None) -> dict:
    """One stage in this process: its wall and CPU seconds (its workers' included), peak RSS and what it produced.
    The reference stage's wall time is its fit's alone (its CPU time includes building the matrix)."""
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.models.variants import DEFAULT_MODEL
    from zmlx_pipeline.models.evaluate import evaluate
    from zmlx_pipeline.models.train import train_models

    model = model or DEFAULT_MODEL

    load_before = os.getloadavg()[0]
    cpu0 = _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with MemorySampler() as sampler:
        if stage == REFERENCE:
            from zmlx_pipeline.models.evaluate import kernel_features_of

            with Store(db, read_only=True) as store:
                X, y = reference_matrix(kernel_features_of(store))
            matrix_s = time.perf_counter() - t0
            fit = plain_fit(X, y)
            detail = {"rows": fit["rows"], "columns": fit["columns"], "trees": fit["trees"],
                      "matrix_s": round(matrix_s, 2)}
        elif stage == "train":
            with Store(db) as store:
                rows = train_models(store, model=model, models_dir=db.parent / f"{db.stem}-models", jobs=jobs)
            detail = {r["kernel_filter"]: {"prune_k": r["scores"].get("prune_k"), "rows": r["params"]["rows"],
                                           "train_s": r["scores"].get("train_s")} for r in rows}
        else:
            split = stage.split("-", 1)[1]
            with Store(db, read_only=True) as store:
                result = evaluate(store, split, models=(model,), jobs=jobs)
            detail = {"result_rows": len(result["results"]), "read_from_train": sorted(result.get("reused", {}))}
        wall = fit["fit_s"] if stage == REFERENCE else time.perf_counter() - t0
    cpu = _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN) - cpu0  # workers are reaped by now
    # VmHWM is this process's own peak (ru_maxrss starts at the parent's, see the module docstring)
    peak_kib = _status_kib("self", "VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"stage": stage, "model": model, "jobs": jobs, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "peak_rss_mib": round(peak_kib / 1024, 1), "worker_peak_rss_mib": round(sampler.worker_peak_kib / 1024, 1),
            "total_peak_rss_mib": round(sampler.total_peak_kib / 1024, 1),
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2), "detail": detail}


def measure(db: Path, label: str, rows: int, model: str | None, jobs: int | None = None,
            timeout: float | None = None) -> list[dict]:
    """Every stage on one store, each in its own process (stopped after `timeout` seconds)."""
    out = []
    for stage in (REFERENCE, *STAGES):
        # its own process group, so that a stopped stage takes its worker processes with it
        proc = subprocess.Popen([sys.executable, __file__, "--stage", stage, "--db", str(db),
                                 *(["--model", model] if model else []), *(["--jobs", str(jobs)] if jobs else [])],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            _log(f"  {label:9s} {stage:16s} STOPPED after {timeout:.0f} s (--timeout)")
            out.append({"stage": stage, "store": label, "rows": rows, "stopped_after_s": timeout})
            continue
        if proc.returncode != 0:
            raise SystemExit(f"{label} {stage} failed:\n{stderr[-4000:]}")
        result = json.loads(stdout.strip().splitlines()[-1])
        result.update(store=label, rows=rows)
        _log(f"  {label:9s} {stage:16s} wall {result['wall_s']:8.2f} s  cpu {result['cpu_s']:8.2f} s  "
             f"peak {result['peak_rss_mib']:7.1f} MiB (worker {result['worker_peak_rss_mib']:.1f}, "
             f"all {result['total_peak_rss_mib']:.1f})  "
             f"load {result['load_before']:.1f}->{result['load_after']:.1f}")
        out.append(result)
    return out


def report(results: list[dict], label: str) -> list[dict]:
    """Prints a store's headline (the ratio, its two times beside it) and the stage sums; returns the ratio
    entry for the JSON output ([] when a stage it needs was stopped)."""
    mine = {r["stage"]: r for r in results if r.get("store") == label}
    summary = ratio_summary(results, label)
    if summary is None:
        _log(f"{label}: ratio not measured (a stage was stopped)")
    else:
        ref = summary["reference"]
        _log(f"{label}: train + evaluate shapes = {summary['ratio']:.2f}x one plain boosting fit of the same rows "
             f"(target: {TARGET_RATIO:g}x or less): {summary['train_evaluate_shapes_wall_s']:.1f} s against "
             f"{summary['reference_fit_s']:.1f} s (HistGradientBoostingRegressor(), one thread, {ref['rows']:,} rows x "
             f"{ref['columns']} columns, {ref['trees']} trees)")
    for name, stages in (("train + evaluate shapes", RATIO_STAGES), ("train + evaluate both splits", STAGES)):
        if all("wall_s" in mine.get(s, {}) for s in stages):
            _log(f"{label} {name}: wall {sum(mine[s]['wall_s'] for s in stages):.1f} s, "
                 f"cpu {sum(mine[s]['cpu_s'] for s in stages):.1f} s")
    return [] if summary is None else [summary]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the resampled store (about)")
    parser.add_argument("--data", type=Path, default=ROOT / "data", help="committed shards")
    parser.add_argument("--kernel-tuner", type=Path, default=ROOT.parent / "shared" / "datasets" / "kernel-tuner")
    parser.add_argument("--work", type=Path, default=None, help="where the stores go (default: a temporary folder)")
    parser.add_argument("--model", default=None, help="model variant to train and evaluate (default: the default)")
    parser.add_argument("--skip-resampled", action="store_true", help="only the committed data")
    parser.add_argument("--skip-committed", action="store_true", help="time only the resampled store")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    parser.add_argument("--jobs", "-j", type=int, default=None, help="worker processes (default: one per CPU)")
    parser.add_argument("--timeout", type=float, default=None, help="stop a stage after this many seconds")
    parser.add_argument("--stores-only", action="store_true", help="build the stores in --work and stop")
    parser.add_argument("--stage", choices=(REFERENCE, *STAGES), help=argparse.SUPPRESS)
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage:
        print(json.dumps(run_stage(args.db, args.stage, args.model, args.jobs)))
        return
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    kt = args.kernel_tuner if args.kernel_tuner.is_dir() else None
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        committed = work / "committed.duckdb"
        for p in work.glob("*.duckdb*"):
            p.unlink()
        from zmlx_pipeline.models.variants import DEFAULT_MODEL

        _log(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, OMP_NUM_THREADS="
             f"{os.environ.get('OMP_NUM_THREADS', '(unset)')}, model {args.model or DEFAULT_MODEL}, "
             f"jobs {args.jobs or 'default (one per CPU)'}")
        speed = machine_speed()
        _log(f"machine: one {speed['trees']}-tree boosting fit of {speed['rows']:,} rows on one core takes "
             f"{speed['fit_s']:.2f} s (best of {speed['repeats']})")
        t = time.perf_counter()
        n = build_committed(committed, args.data, kt)
        _log(f"committed store: {n} measurements from {args.data}"
             + (f" and the Kernel Tuner files in {kt}" if kt else " (no Kernel Tuner files found)")
             + f" ({time.perf_counter() - t:.1f} s to build)")
        results = [speed]
        if not (args.skip_committed or args.stores_only):
            results += measure(committed, "committed", n, args.model, args.jobs, args.timeout)
            results += report(results, "committed")
        if not args.skip_resampled:
            big = work / "resampled.duckdb"
            t = time.perf_counter()
            m = build_resampled(committed, big, args.rows)
            _log(f"resampled store: {m} rows generated by resampling the committed store's real rows "
                 f"(synthetic shapes, real times x exp(N(0, 0.05))) ({time.perf_counter() - t:.1f} s to build)")
            if args.stores_only:
                return
            results += measure(big, "resampled", m, args.model, args.jobs, args.timeout)
            results += report(results, "resampled")
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
