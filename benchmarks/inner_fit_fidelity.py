"""Does the inner selection choose the same with lighter fits? Every selection `train` makes, made twice.

    python benchmarks/inner_fit_fidelity.py --db STORE [--settings half,quarter] [--kernels K,...]
                                           [--contexts final,folds] [--jobs N] [--json FILE]

The default ranker chooses its settings by inner folds inside the training rows: ensemble weights and
hedging for a seen device by holding out training shapes (`ensemble`'s shapes selection), and for a new
device the weights, the design and the guard's lead and hedges by leaving training devices out
(`unseen_unanimous`'s devices selection). Those inner folds fit the boosting members hundreds of times;
they only rank weight vectors against each other. This runs each selection `train` makes (the final fit
on all rows, and the fit of every outer fold of both splits: all inside training rows, no outer test row
is read) with the members fitted in full and as each lighter setting of `variants.INNER_FITS`, and prints
per setting:

- how often each part of the choice is the same: weights and hedging, design, the guard's lead and hedges;
- what the lighter choice costs on the full fits' own inner folds: the mean inner log regret (the loss
  the selection minimises) of the lighter setting's weights minus that of the full setting's, and for the
  design the full folds' loss of the lighter design minus that of the full one (0 where they agree);
- the CPU seconds of the selections (fit cache cleared before each).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RANKER = {"devices": "unseen_unanimous", "shapes": "ensemble"}  # the default's two selections
_FEATURES: dict = {}


def _load(db: str, kernels) -> None:
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.models.evaluate import kernel_features_of

    with Store(db, read_only=True) as store:
        _FEATURES.update(kernel_features_of(store, kernels))


def tasks(features: dict, contexts, splits=("devices", "shapes")) -> list[tuple[str, str, str]]:
    """(kernel, context, split): the final fit's two selections and each outer fold's own."""
    from zmlx_pipeline.models.folds import fold_plan

    out = []
    for kernel, f in sorted(features.items(), key=lambda kv: -kv[1].frame.height):
        for split in splits:
            if "final" in contexts:
                out.append((kernel, "final", split))
            if "folds" in contexts:
                out += [(kernel, f"{split}:{i}", split) for i in fold_plan(f, split)]
    return out


def _select(features, name: str, setting: str, train, split: str):
    """A selection with the inner members of `setting` (INNER_FITS name, `@seed` for another row sample)."""
    from zmlx_pipeline.models.rankers.base import clear_fit_cache
    from zmlx_pipeline.models.variants import INNER_FITS, make_ranker

    clear_fit_cache()
    ranker = make_ranker(features, name)
    fits, _, seed = setting.partition("@")
    ranker.inner_fits = {split: dict(INNER_FITS[fits])}
    ranker.inner_seed = int(seed or 0)
    t0 = time.process_time()
    weights, hedge, loss, policy = ranker._select(train, split)
    return ranker, {"weights": weights, "hedge": bool(hedge), "loss": loss, "policy": policy,
                    "cpu_s": time.process_time() - t0}


def run_task(task, settings) -> dict:
    """One selection, full and lighter: what each chose, and the lighter choices' cost on the full folds."""
    from zmlx_pipeline.models.folds import fold_rows, folds
    from zmlx_pipeline.models.pool import fit_threads

    kernel, context, split = task
    f = _FEATURES[kernel]
    if context == "final":
        train = f.frame
    else:
        _, train_filter, test_filter = folds(f.frame, split)[int(context.split(":")[1])]
        train = fold_rows(f.frame, split, train_filter, test_filter)[0]
    name = RANKER[split]
    out = {"kernel": kernel, "context": context, "split": split, "settings": {}}
    with fit_threads():
        light = {s: _select(f, name, s, train, split)[1] for s in settings}
        full_ranker, full = _select(f, name, "full", train, split)
        if full["loss"] is None:
            return {**out, "folds": 0}
        own = full_ranker.candidate_loss(train, split, full["weights"], full["hedge"])
        out["full"] = _summary(full)
        for s, sel in light.items():
            cost = full_ranker.candidate_loss(train, split, sel["weights"], sel["hedge"]) - own
            design_cost = 0.0
            inner = full["policy"].get("inner", {})
            a, b = sel["policy"].get("design"), full["policy"].get("design")
            if a != b and f"design[{a}]" in inner:
                design_cost = inner[f"design[{a}]"] - inner[f"design[{b}]"]
            out["settings"][s] = {**_summary(sel), "weights_cost": cost, "design_cost": design_cost,
                                  "same_weights": sel["weights"] == full["weights"] and sel["hedge"] == full["hedge"],
                                  "same_design": a == b,
                                  "same_guard": (_guard(sel["policy"]) == _guard(full["policy"]))}
    return {**out, "folds": 1}


def _guard(policy: dict) -> tuple:
    return policy.get("mode"), policy.get("baseline"), tuple(policy.get("hedges") or ())


def _summary(sel: dict) -> dict:
    return {"weights": sel["weights"], "hedge": sel["hedge"], "design": sel["policy"].get("design"),
            "guard": list(_guard(sel["policy"])), "cpu_s": round(sel["cpu_s"], 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--settings", default="full@1,full@2,half,quarter",
                    help="settings of variants.INNER_FITS to compare with `full`; NAME@SEED: another seed of the inner "
                         "fits' row sample (full@1: the selection's own noise)")
    ap.add_argument("--kernels", default=None, help="comma-separated (default: every kernel)")
    ap.add_argument("--contexts", default="final,folds", help="final (the fit on all rows), folds (every outer fold)")
    ap.add_argument("--splits", default="devices,shapes", help="the selections: devices (new device), shapes (seen)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    settings = args.settings.split(",")
    kernels = args.kernels.split(",") if args.kernels else None
    _load(args.db, kernels)
    work = tasks(_FEATURES, args.contexts.split(","), args.splits.split(","))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),  # polars' threads: no fork
                             initializer=_load, initargs=(args.db, kernels)) as pool:
        results = [r for r in pool.map(run_task, work, [settings] * len(work)) if r["folds"]]
    wall = time.perf_counter() - t0
    print(f"{len(results)} selections of {len(_FEATURES)} kernels, {wall:.0f} s wall, jobs {args.jobs}")
    print("cost = the full fits' mean inner log regret of the lighter choice minus that of the full choice")
    header = ("setting", "split", "selections", "same weights", "same design", "same guard",
              "weights cost mean", "weights cost max", "design cost max", "cpu s", "cpu vs full")
    rows = []
    for s in settings:
        for split in ("devices", "shapes", "all"):
            part = [r for r in results if split in ("all", r["split"])]
            if not part:
                continue
            sel = [r["settings"][s] for r in part]
            cpu, cpu_full = sum(x["cpu_s"] for x in sel), sum(r["full"]["cpu_s"] for r in part)
            rows.append((s, split, len(sel), sum(x["same_weights"] for x in sel), sum(x["same_design"] for x in sel),
                         sum(x["same_guard"] for x in sel), f"{sum(x['weights_cost'] for x in sel) / len(sel):.5f}",
                         f"{max(x['weights_cost'] for x in sel):.5f}", f"{max(x['design_cost'] for x in sel):.5f}",
                         f"{cpu:.0f}", f"{cpu / cpu_full:.2f}"))
    widths = [max(len(str(v)) for v in col) for col in zip(header, *rows)]
    for line in (header, *rows):
        print("  ".join(str(v).ljust(w) for v, w in zip(line, widths)))
    worst = sorted(((r["settings"][s]["weights_cost"] + r["settings"][s]["design_cost"], s, r["kernel"], r["context"],
                     r["split"]) for r in results for s in settings), reverse=True)[:8]
    print("largest costs (weights + design, log):")
    for cost, s, kernel, context, split in worst:
        print(f"  {s:8s} {kernel:20s} {context:12s} {split:8s} {cost:.5f} ({math.exp(cost):.4f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": settings, "wall_s": wall, "selections": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
