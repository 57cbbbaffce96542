"""When train's worker tasks run: each final fit and each split's folds, per worker, and the idle tail.

    python benchmarks/train_tasks.py --db STORE [--runs N] [--jobs N] [--json FILE]

Trains the default model on a copy of STORE (its registry and model files are left alone) with every task timed
inside the worker that runs it, and prints per run the tasks in the order they started, each worker's busy
seconds and when it finished, the idle tail (the last worker's finish minus half the busy seconds of both, for
two workers: what a perfect split of the same tasks would save) and the wall time of `train_models`. Times are
of this machine under whatever else runs on it: compare orders by the idle tail, which the machine's load
moves far less than the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zmlx_pipeline.models import evaluate as _evaluate  # noqa: E402
from zmlx_pipeline.models import train as _train  # noqa: E402

# the tasks as train submits them, taken before one_run puts the timed ones in their place (a spawned worker
# imports this module afresh and gets the same)
_FIT, _FOLDS = _train._fit_task, _evaluate._score_folds
_LOG_ENV = "ZMLX_TRAIN_TASKS_LOG"


def _note(kernel: str, task: str, start: float) -> None:
    with open(os.environ[_LOG_ENV], "a", encoding="utf-8") as log:
        log.write(json.dumps({"worker": os.getpid(), "kernel": kernel, "task": task, "start": start,
                              "end": time.time()}) + "\n")


def timed_fit(features, model):
    """train._fit_task, timed in the worker."""
    start = time.time()
    out = _FIT(features, model)
    _note(features.kernel, "fit", start)
    return out


def timed_folds(features, plan, split, *args):
    """evaluate._score_folds as train submits it, timed in the worker."""
    start = time.time()
    out = _FOLDS(features, plan, split, *args)
    _note(features.kernel, split, start)
    return out


def one_run(db: Path, jobs: int | None, work: Path) -> dict:
    from zmlx_pipeline.data.store import Store

    train = _train
    copy = work / "store.duckdb"
    shutil.copy(db, copy)
    log = work / "tasks.jsonl"
    log.write_text("")
    os.environ[_LOG_ENV] = str(log)  # the spawned workers inherit it
    train._fit_task, train._score_folds = timed_fit, timed_folds
    try:
        with Store(copy) as store:
            start = time.time()
            train.train_models(store, models_dir=work / "models", jobs=jobs)
            wall = time.time() - start
    finally:
        train._fit_task, train._score_folds = _FIT, _FOLDS
    tasks = sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda t: t["start"])
    workers = {}
    for t in tasks:
        w = workers.setdefault(t["worker"], {"busy": 0.0, "end": 0.0})
        w["busy"] += t["end"] - t["start"]
        w["end"] = max(w["end"], t["end"] - start)
    busy = sum(w["busy"] for w in workers.values())
    last = max(w["end"] for w in workers.values())
    return {"wall_s": round(wall, 1), "busy_s": round(busy, 1), "last_end_s": round(last, 1),
            "idle_tail_s": round(last - busy / max(len(workers), 1), 1),
            "workers": [{"busy_s": round(w["busy"], 1), "end_s": round(w["end"], 1)} for w in workers.values()],
            "tasks": [{"kernel": t["kernel"], "task": t["task"], "start_s": round(t["start"] - start, 1),
                       "seconds": round(t["end"] - t["start"], 1)} for t in tasks],
            "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, type=Path, help="a store with measurements (copied; left unchanged)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=None, help="worker processes (default: one per CPU)")
    ap.add_argument("--json", type=Path, default=None, help="also write every run's figures here")
    args = ap.parse_args()
    if not args.db.is_file():
        print(f"error: no store at {args.db}", file=sys.stderr)
        return 1
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="train-tasks-") as work:
            run = one_run(args.db, args.jobs, Path(work))
        runs.append(run)
        print(f"run {i + 1}: wall {run['wall_s']} s, busy {run['busy_s']} s, last task ended at {run['last_end_s']} s, "
              f"idle tail {run['idle_tail_s']} s, load {run['load']:.2f}")
        for w in run["workers"]:
            print(f"  worker: busy {w['busy_s']} s, done at {w['end_s']} s")
        print("  tasks by start: " + ", ".join(f"{t['kernel']} {t['task']} {t['seconds']}" for t in run["tasks"]))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
