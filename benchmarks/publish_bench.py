"""Publish's tables as the main job builds them (no held-out scoring), this checkout against a baseline commit,
in one run, and whether both bundles hold the same content.

    python benchmarks/publish_bench.py --store STORE [--baseline REV] [--kernel K] [--work DIR] [--json]
                                       [--record-devices]

STORE is a store with registered models (`zmlx-pipeline run`, or `ingest` then `train`); each code publishes
from its own copy of it (and its models/ folder) in a fresh process, `publish(..., evaluate=False)` as `run`
calls it: the tables, profiles and replayed pruning k of every kernel, without the regret on left-out devices
that a standalone `publish` scores first (benchmarks/stage_times.py --stages publish times that command). Printed
per code: wall and CPU seconds (the process and its workers) and the load average before it; then the ratios,
and tools/compare_bundles.py's verdict on the two bundles (`identical`, across bundle schemas).

--record-devices first records, in a copy of STORE (WORK/source/store.duckdb, kept with --work), the held-out cases
of every kernel's newest model under the `devices` split (left-out devices, the model and every baseline), as train
records its own split's: a standalone `publish` reads its regret on left-out devices from them. Time that command on
the copy with `python benchmarks/stage_times.py --stages publish --store WORK/source/store.duckdb`.
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


_RECORD = """
import sys
from zmlx_pipeline.data.store import HELDOUT_KS, Store
from zmlx_pipeline.models.evaluate import evaluate_kernel, kernel_features_of
from zmlx_pipeline.models.heldout import record_cases
from zmlx_pipeline.models.pool import KernelPool
with Store(sys.argv[1]) as store:
    features = kernel_features_of(store)
    with KernelPool(features, None) as pool:
        for kernel, f in sorted(features.items(), key=lambda kv: -kv[1].frame.height):
            row = store.models(kernel=kernel)[0]
            per_case = evaluate_kernel(f, "devices", ks=HELDOUT_KS, models=(row["params"]["model"],), pool=pool)
            n = record_cases(store, row["model_id"], row["data_fingerprint"], "devices", per_case)
            print(f"{kernel}: {n} left-out-device cases recorded with {row['model_id']}", file=sys.stderr, flush=True)
"""


def record_devices(store: Path) -> None:
    """Record the left-out-device cases of every kernel's newest model in `store` (this checkout's code)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    subprocess.run([sys.executable, "-c", _RECORD, str(store)], cwd=ROOT, env=env, check=True)


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
    parser.add_argument("--record-devices", action="store_true",
                        help="first record the left-out-device cases of every kernel's newest model in a copy of STORE")
    args = parser.parse_args(argv)
    top = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="publish-bench-"))
    top.mkdir(parents=True, exist_ok=True)
    if args.record_devices:
        source = top / "source"
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir(parents=True)
        shutil.copy(args.store, source / "store.duckdb")
        if (args.store.parent / "models").is_dir():
            shutil.copytree(args.store.parent / "models", source / "models")
        print("recording the left-out-device cases ...", file=sys.stderr, flush=True)
        record_devices(source / "store.duckdb")
        args.store = source / "store.duckdb"
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
