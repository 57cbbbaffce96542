"""Replay the pruned autotuner of one or more bundles on the shapes of earlier GPU benchmark runs, without a GPU.

    python benchmarks/autotune_replay.py --bundle DIR [--bundle DIR ...] RESULT.json [RESULT.json ...]

`benchmarks/autotune_bench.py` keeps, per unseen shape, every legal config's time from its exhaustive
pass (`exhaustive_us`). For each bundle this takes the configs its tuner would time on that shape
(`runtime.tuner.pruned_candidates`: the bundle's ranking, capped at a fifth of the legal configs) and
scores them against that table: a hit when one of them is within 2% of the table's best, and the
regret of the fastest of them. It is the table score of a tuner whose own timings agree with the
exhaustive pass; head-to-head scores need the GPU. Bundles compared on the same rows are paired.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WITHIN = 1.02


def replay_rows(rows: list[dict], device: str, dtype: str) -> list[dict]:
    """Each row with `exhaustive_us` scored with the active bundle's pruned candidates."""
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.runtime.tuner import pruned_candidates

    def items(config: dict) -> tuple:  # a config's identity, whatever JSON spelling the bench wrote
        return tuple(sorted((k, int(v)) for k, v in config.items()))

    out = []
    for row in rows:
        table = {items(json.loads(k)): v for k, v in (row.get("exhaustive_us") or {}).items()}
        ok = {k: v for k, v in table.items() if v is not None}
        if not ok:
            continue
        best = min(ok.values())
        legal = [dict(k) for k in table]
        spec = get_kernel(row["kernel"])
        cands, _ = pruned_candidates(spec, row["shape"], dtype, legal, device=device)
        times = [ok.get(items(c)) for c in cands]
        fastest = min((t for t in times if t is not None), default=None)
        out.append({"kernel": row["kernel"], "shape": row["shape"], "legal": len(legal), "timed": len(cands),
                    "regret": fastest / best if fastest else None,
                    "hit": fastest is not None and fastest <= WITHIN * best,
                    # the lookup's own answer, untimed: what predicted_config launches
                    "first_regret": times[0] / best if times and times[0] else None})
    return out


def summarize(scored: list[dict]) -> dict:
    regrets = [r["regret"] for r in scored if r["regret"]]
    firsts = [r["first_regret"] for r in scored if r.get("first_regret")]
    return {"shapes": len(scored), "hits": sum(r["hit"] for r in scored),
            "first_regret_geomean": math.exp(sum(math.log(x) for x in firsts) / len(firsts)) if firsts else None,
            "first_hits": sum(1 for x in firsts if x <= WITHIN),
            "hit_share": sum(r["hit"] for r in scored) / len(scored) if scored else None,
            "timed": sum(r["timed"] for r in scored), "legal": sum(r["legal"] for r in scored),
            "regret_geomean": math.exp(sum(math.log(x) for x in regrets) / len(regrets)) if regrets else None,
            "misses": [(r["kernel"], r["shape"], round(r["regret"], 3) if r["regret"] else None)
                       for r in scored if not r["hit"]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="autotune_bench.py JSON files with exhaustive_us")
    parser.add_argument("--bundle", action="append", required=True, help="bundle dir (repeat to compare)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    from zmlx_pipeline.runtime import load_bundle
    from zmlx_pipeline.runtime.lookup import clear_cache

    runs = []
    for path in args.results:
        data = json.loads(path.read_text())
        rows = [r for r in data["rows"] if r.get("exhaustive_us")]
        if not rows:
            print(f"{path}: no exhaustive_us (run before the bench kept them); skipped", file=sys.stderr)
            continue
        runs.append((path, data["summary"]["device"], data["summary"]["dtype"], rows))
    if not runs:
        print("no result file holds exhaustive times", file=sys.stderr)
        return 2
    report = []
    for bundle in args.bundle:
        load_bundle(bundle, strict=True)
        clear_cache()
        scored = [s for path, device, dtype, rows in runs for s in replay_rows(rows, device, dtype)]
        report.append({"bundle": bundle, **summarize(scored)})
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for r in report:
        print(f"{r['bundle']}: {r['hits']} of {r['shapes']} within 2% ({100 * r['hit_share']:.1f}%), timed "
              f"{r['timed']} of {r['legal']} ({100 * r['timed'] / r['legal']:.1f}%), regret geomean "
              f"{r['regret_geomean']:.4f}; untimed first candidate: {r['first_hits']} within 2%, regret geomean "
              f"{r['first_regret_geomean']:.4f}")
        for kernel, shape, regret in r["misses"]:
            print(f"    miss: {kernel} {json.dumps(shape)} {regret}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
