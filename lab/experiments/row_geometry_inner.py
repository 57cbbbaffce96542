"""Would the row kernels gain from declaring their launch geometry? Decided inside the training rows only.

    python row_geometry_inner.py --db STORE --split shapes|devices --out DIR [--jobs N] [--kernels K,...]
    python row_geometry_inner.py --summarise DIR

The row kernels (rmsnorm, add_rmsnorm, layernorm, softmax: one threadgroup per ROWS rows; topk_gating: per
TOKENS tokens) declare no `tiles`, so the models see no launch geometry relative to the device's cores
(blocks per SM, waves, last-wave fill), which is what sets an SM-limited device apart from its whole chip.
Variant `rows` declares it (`TileAxes(grid={rows: (ROWS,)}, threads=(TG,))`); `default` does not.

Nested: for every outer fold of the split (the folds evaluate and train score), the outer test rows are
dropped and the default model (`robust`) is scored by the same split's folds *inside* the outer training rows,
once per variant. No outer test row is read. Each (kernel, variant, outer fold, inner fold) is one task,
written as one Parquet file of per-case regrets, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import multiprocessing
import dataclasses
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import polars as pl

from zmlx_pipeline.data.store import Store
from zmlx_pipeline.kernels.spec import TileAxes
from zmlx_pipeline.models.evaluate import _score_fold
from zmlx_pipeline.models.features import devices_frame, kernel_features, measurements_frame
from zmlx_pipeline.models.folds import fold_rows, folds

ROW_TILES = {
    "rmsnorm": TileAxes(grid={"rows": ("ROWS",)}, threads=("TG",)),
    "add_rmsnorm": TileAxes(grid={"rows": ("ROWS",)}, threads=("TG",)),
    "layernorm": TileAxes(grid={"rows": ("ROWS",)}, threads=("TG",)),
    "softmax": TileAxes(grid={"rows": ("ROWS",)}, threads=("TG",)),
    "topk_gating": TileAxes(grid={"tokens": ("TOKENS",)}, threads=("TG",)),
}
VARIANTS = ("default", "rows")
KS = (1, 3, 5)
MODEL = "robust"

_FEATURES: dict = {}


def _features(db: str, kernel: str, variant: str):
    key = (kernel, variant)
    if key not in _FEATURES:
        store = Store(db, read_only=True)
        try:
            m, d = measurements_frame(store, [kernel]), devices_frame(store)
        finally:
            store.close()
        _FEATURES[key] = kernel_features(m, d, kernel, tiles=ROW_TILES[kernel] if variant == "rows" else None)
    return _FEATURES[key]


def _inner(features, split: str, outer: int):
    """The kernel's features cut to outer fold `outer`'s training rows."""
    _, train_filter, test_filter = folds(features.frame, split)[outer]
    train, _ = fold_rows(features.frame, split, train_filter, test_filter)
    return dataclasses.replace(features, frame=train,
                               devices=features.devices.filter(pl.col("device_id").is_in(train["device_id"].unique().to_list())))


def _task(db: str, kernel: str, variant: str, split: str, outer: int, inner: int, out: str) -> str:
    sub = _inner(_features(db, kernel, variant), split, outer)
    frames, seconds = _score_fold(sub, inner, split, KS, (MODEL,), False)
    per_case = pl.concat(frames).with_columns(pl.lit(kernel).alias("kernel_"), pl.lit(variant).alias("variant"),
                                              pl.lit(outer).alias("outer"), pl.lit(inner).alias("inner"),
                                              pl.lit(seconds).alias("seconds"))
    per_case.write_parquet(out)
    return out


def plan(db: str, split: str, kernels) -> list[tuple]:
    tasks = []
    for kernel in kernels:
        f = _features(db, kernel, "default")
        for outer in range(len(folds(f.frame, split))):
            n_inner = len(folds(_inner(f, split, outer).frame, split))
            for variant in VARIANTS:
                for inner in range(n_inner):
                    tasks.append((kernel, variant, outer, inner))
    return tasks


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kernels = args.kernels.split(",") if args.kernels else list(ROW_TILES)
    tasks = [t for t in plan(args.db, args.split, kernels)
             if not (out / f"{args.split}-{t[0]}-{t[1]}-{t[2]}-{t[3]}.parquet").exists()]
    print(f"{len(tasks)} tasks to run", flush=True)
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:  # polars forbids fork
        futures = [pool.submit(_task, args.db, k, v, args.split, o, i,
                               str(out / f"{args.split}-{k}-{v}-{o}-{i}.parquet")) for k, v, o, i in tasks]
        for n, f in enumerate(as_completed(futures), 1):
            print(f"done {n}/{len(futures)} {Path(f.result()).name}", flush=True)


def summarise(directory: str) -> None:
    """Per split and kernel: inner cases and geometric mean regret@k of each variant, pooled over outer folds."""
    for split in sorted({p.name.split("-")[0] for p in Path(directory).glob("*.parquet")}):
        part = pl.concat([pl.read_parquet(p) for p in sorted(Path(directory).glob(f"{split}-*.parquet"))])
        print(f"split {split}: inner folds inside each outer fold's training rows, model {MODEL}")
        print(f"{'kernel':12} {'cases':>6} " + " ".join(f"{v + '@' + str(k):>12}" for v in VARIANTS for k in KS)
              + "   rows better @1 in outer folds")
        totals = {v: {k: [] for k in KS} for v in VARIANTS}
        for kernel in sorted(part["kernel_"].unique().to_list()):
            sub = part.filter(pl.col("kernel_") == kernel)
            cells, cases = [], None
            for v in VARIANTS:
                s = sub.filter(pl.col("variant") == v)
                cases = s.height
                for k in KS:
                    logs = np.log(s[f"r{k}"].to_numpy())
                    totals[v][k].append(logs)
                    cells.append(f"{np.exp(logs.mean()):12.4f}")
            wins = []
            for o in sorted(sub["outer"].unique().to_list()):
                g = {v: np.log(sub.filter((pl.col("variant") == v) & (pl.col("outer") == o))["r1"].to_numpy()).mean()
                     for v in VARIANTS}
                wins.append(g["rows"] < g["default"])
            print(f"{kernel:12} {cases:6d} " + " ".join(cells) + f"   {sum(wins)}/{len(wins)}")
        pooled = " ".join(f"{np.exp(np.concatenate(totals[v][k]).mean()):12.4f}" for v in VARIANTS for k in KS)
        print(f"{'all':12} {'':6} {pooled}\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db")
    p.add_argument("--split", choices=("shapes", "devices"))
    p.add_argument("--out")
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    p.add_argument("--kernels")
    p.add_argument("--summarise")
    args = p.parse_args()
    if args.summarise:
        summarise(args.summarise)
    elif args.db and args.split and args.out:
        run(args)
    else:
        p.error("give --db, --split and --out, or --summarise DIR")


if __name__ == "__main__":
    sys.exit(main())
