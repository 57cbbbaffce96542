"""Should a seen device measured at few shapes take ensemble weights of its own? Decided inside the training rows only.

    python sparse_seen_inner.py --db STORE --out DIR [--jobs N] [--kernels K,...]
    python sparse_seen_inner.py --summarise DIR

`robust` chooses one set of seen-device ensemble weights per kernel on inner folds that hold out training shapes.
`robust_sparse` chooses the same set, and for the devices measured at under half the shapes of the kernel's
best-covered device (cv_ensemble.SPARSE_SHARE: on `data/` the SM-limited runs, 4-9 shapes against 18-42) a
second set on their inner cases alone. The dense devices' weights are the same in both, by construction.

Nested, as row_geometry_inner.py: for every outer fold of the held-out-shapes split the outer test rows are
dropped and both models are scored by the shape folds *inside* the outer training rows. No outer test row is read.
Each (kernel, outer fold, inner fold) is one task scoring both models in one process (so they share their member
fits), written as one Parquet file of per-case regrets with each case's device marked sparse or not.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import polars as pl

from row_geometry_inner import _features, _inner
from zmlx_pipeline.models.cv_ensemble import SPARSE_SHARE, sparse_devices
from zmlx_pipeline.models.evaluate import _score_fold
from zmlx_pipeline.models.folds import folds

MODELS = ("robust", "robust_sparse")
KS = (1, 3, 5)
SPLIT = "shapes"
KERNELS = ("add_rmsnorm", "layernorm", "matmul", "moe_combine", "rmsnorm", "softmax", "swiglu", "topk_gating")


def _task(db: str, kernel: str, outer: int, inner: int, out: str) -> str:
    sub = _inner(_features(db, kernel, "default"), SPLIT, outer)
    sparse = sparse_devices(sub.frame, SPARSE_SHARE)
    frames, seconds = _score_fold(sub, inner, SPLIT, KS, MODELS, False)
    per_case = pl.concat(frames).with_columns(
        pl.lit(kernel).alias("kernel_"), pl.lit(outer).alias("outer"), pl.lit(inner).alias("inner"),
        pl.col("device_id").is_in(sparse).alias("sparse"), pl.lit(seconds).alias("seconds"))
    per_case.write_parquet(out)
    return out


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = []
    for kernel in (args.kernels.split(",") if args.kernels else KERNELS):
        f = _features(args.db, kernel, "default")
        for outer in range(len(folds(f.frame, SPLIT))):
            for inner in range(len(folds(_inner(f, SPLIT, outer).frame, SPLIT))):
                if not (out / f"{kernel}-{outer}-{inner}.parquet").exists():
                    tasks.append((kernel, outer, inner))
    print(f"{len(tasks)} tasks to run", flush=True)
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:  # polars forbids fork
        futures = [pool.submit(_task, args.db, k, o, i, str(out / f"{k}-{o}-{i}.parquet")) for k, o, i in tasks]
        for n, f in enumerate(as_completed(futures), 1):
            print(f"done {n}/{len(futures)} {Path(f.result()).name}", flush=True)


def summarise(directory: str) -> None:
    """Per kernel and group of devices (sparse, dense, all): inner cases and geometric mean regret@k per model,
    pooled over outer folds, and in how many outer folds robust_sparse is lower @1 on the sparse devices."""
    part = pl.concat([pl.read_parquet(p) for p in sorted(Path(directory).glob("*.parquet"))])
    head = " ".join(f"{m.replace('robust', 'r') + '@' + str(k):>11}" for m in MODELS for k in KS)
    print(f"inner shape folds inside each outer fold's training rows (split {SPLIT}); r = robust, r_sparse = robust_sparse")
    print(f"{'kernel':12} {'group':6} {'cases':>6} {head}   sparse lower @1 in outer folds")
    pooled = {g: {m: {k: [] for k in KS} for m in MODELS} for g in ("sparse", "dense", "all")}
    for kernel in sorted(part["kernel_"].unique().to_list()):
        sub = part.filter(pl.col("kernel_") == kernel)
        for group, cond in (("sparse", pl.col("sparse")), ("dense", ~pl.col("sparse")), ("all", pl.lit(True))):
            g = sub.filter(cond)
            cells, cases = [], 0
            for m in MODELS:
                s = g.filter(pl.col("method") == m)
                cases = s.height
                for k in KS:
                    logs = np.log(s[f"r{k}"].to_numpy())
                    pooled[group][m][k].append(logs)
                    cells.append(f"{np.exp(logs.mean()) if logs.size else float('nan'):11.4f}")
            wins = ""
            if group == "sparse":
                w = []
                for o in sorted(g["outer"].unique().to_list()):
                    r = {m: np.log(g.filter((pl.col("method") == m) & (pl.col("outer") == o))["r1"].to_numpy()).mean()
                         for m in MODELS}
                    w.append(r["robust_sparse"] < r["robust"] - 1e-12)
                wins = f"   {sum(w)}/{len(w)}"
            print(f"{kernel:12} {group:6} {cases:6d} " + " ".join(cells) + wins)
    for group, by_model in pooled.items():
        cells = " ".join(f"{np.exp(np.concatenate(by_model[m][k]).mean()):11.4f}" for m in MODELS for k in KS)
        print(f"{'pooled':12} {group:6} {'':6} {cells}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db")
    p.add_argument("--out")
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    p.add_argument("--kernels")
    p.add_argument("--summarise")
    args = p.parse_args()
    if args.summarise:
        summarise(args.summarise)
    elif args.db and args.out:
        run(args)
    else:
        p.error("give --db and --out, or --summarise DIR")


if __name__ == "__main__":
    sys.exit(main())
