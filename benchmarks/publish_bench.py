"""Publish's tables as the main job builds them (no held-out scoring), this checkout against a baseline commit,
in one run, and whether both bundles hold the same content.

    python benchmarks/publish_bench.py --store STORE [--baseline REV] [--kernel K] [--work DIR] [--json]

STORE is a store with registered models (`zmlx-pipeline run`, or `ingest` then `train`); each code publishes
from its own copy of it (and its models/ folder) in a fresh process, `publish(..., evaluate=False)` as `run`
calls it: the tables, profiles and replayed pruning k of every kernel, without the regret on left-out devices
that a standalone `publish` scores first (benchmarks/stage_times.py --stages publish times that command). Printed
per code: wall and CPU seconds (the process and its workers) and the load average before it; then the ratios,
and tools/compare_bundles.py's verdict on the two bundles (`identical`, across bundle schemas).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from stage_times import checkout  # noqa: E402

_PUBLISH = """
import json, sys
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.publish import publish
kernels = sys.argv[3].split(",") if sys.argv[3] else None
with Store(sys.argv[1]) as store:
    out = publish(store, sys.argv[2], kernels=kernels, evaluate=False, record=False,
                  progress=lambda m: print(m, file=sys.stderr, flush=True))
print(json.dumps({"path": str(out["path"])}))
"""


def time_publish(code: Path, store: Path, out: Path, kernel: str | None) -> dict:
    """Publish with `code` first on the path; wall and CPU seconds (workers included) and the bundle's path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(code), os.environ.get("PYTHONPATH")) if p)}
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PUBLISH, str(store), str(out), kernel or ""], cwd=code, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    path = json.loads(done.stdout)["path"] if done.returncode == 0 else None
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_before": round(load, 1), "exit": done.returncode,
            "path": path, "error": None if done.returncode == 0 else done.stderr.strip().splitlines()[-1:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="a store with registered models")
    parser.add_argument("--baseline", metavar="REV", help="also publish with the code of this commit")
    parser.add_argument("--kernel", default=None, help="comma-separated kernels (default: every kernel)")
    parser.add_argument("--work", type=Path, default=None, help="keep stores and bundles here (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    top = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="publish-bench-"))
    top.mkdir(parents=True, exist_ok=True)
    codes = {"this": ROOT}
    if args.baseline:
        codes["baseline"] = checkout(args.baseline, top / "baseline-code")
    rows = {}
    try:
        for name, code in codes.items():
            work = top / name
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            shutil.copy(args.store, work / "store.duckdb")
            if (args.store.parent / "models").is_dir():
                shutil.copytree(args.store.parent / "models", work / "models")
            print(f"publish (tables) with {name} code ...", file=sys.stderr, flush=True)
            rows[name] = time_publish(code, work / "store.duckdb", work / "published", args.kernel)
            print(f"  {rows[name]['wall_s']} s wall, {rows[name]['cpu_s']} s CPU, exit {rows[name]['exit']}",
                  file=sys.stderr, flush=True)
        verdict = None
        if args.baseline and all(r["path"] for r in rows.values()):
            done = subprocess.run([sys.executable, str(ROOT / "tools" / "compare_bundles.py"), rows["baseline"]["path"],
                                   rows["this"]["path"]], capture_output=True, text=True)
            verdict = done.stdout.strip() or done.stderr.strip()
    finally:
        if not args.work:
            shutil.rmtree(top, ignore_errors=True)
    if args.json:
        print(json.dumps({"rows": rows, "same_content": verdict}, indent=2))
        return 0
    print(f"{'code':9} {'wall s':>8} {'CPU s':>8} {'load':>5} {'exit':>4}")
    for name, r in rows.items():
        print(f"{name:9} {r['wall_s']:8.1f} {r['cpu_s']:8.1f} {r['load_before']:5.1f} {r['exit']:>4}")
    if args.baseline and rows["this"]["exit"] == 0 and rows["baseline"]["exit"] == 0:
        print(f"\nbaseline ({args.baseline}) / this checkout: wall {rows['baseline']['wall_s'] / rows['this']['wall_s']:.2f}x"
              f"  CPU {rows['baseline']['cpu_s'] / max(0.1, rows['this']['cpu_s']):.2f}x")
        print(f"bundles: {verdict}")
    return 0 if rows["this"]["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
