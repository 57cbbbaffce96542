"""Wall and CPU time of `zmlx-pipeline run` (the main job), `publish` and `report` on the committed data.

    python benchmarks/stage_times.py [--baseline REV] [--stages run,publish,report] [--data DIR]
                                     [--store DB] [--kernel K] [--work DIR] [--timeout SECONDS] [--repeat N]

Each stage runs as the CLI does, in a fresh process, on a fresh store in a temporary folder: `run`
ingests the shards of --data (default: data/), trains, evaluates both splits, publishes and looks
up; `publish --to` and `report --out` then run on the store that `run` filled (its registered
models included). With --baseline REV, the code of that commit (git archive, in the temporary
folder, on PYTHONPATH) runs every stage too, each right after this checkout's, so both see the same
load; the ratios baseline / this checkout are measured in the same run. Printed per stage and
code: wall seconds, CPU seconds (user + system of the stage's process and its worker processes),
the load average before it started and when it ended, and for `run` its own per-step timings. On a machine shared
with other work, wall times grow with the load and CPU times much less: compare within one run,
through the ratios, and quote the CPU time next to the wall time. --json prints the rows as JSON.
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
STAGES = ("run", "publish", "report")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def checkout(rev: str, into: Path) -> Path:
    """The tree of commit `rev` of this repository, extracted into `into` (git archive: no .git, no worktree); a tree
    an earlier run left there (--work kept) is replaced."""
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def stage_command(stage: str, store: Path, work: Path, data: Path, kernel: str | None = None) -> list[str]:
    """The CLI command line of a stage (every one prints JSON on stdout, progress on stderr)."""
    base = [sys.executable, "-m", "zmlx_pipeline"]
    only = ["--kernel", kernel] if kernel else []
    if stage == "run":
        return [*base, "run", "--db", str(store), "--data", str(data), "--bundle-dir", str(work / "bundles"), "--json"]
    if stage == "publish":
        return [*base, "publish", "--db", str(store), "--to", str(work / "published"), *only, "--json"]
    if stage == "report":
        return [*base, "report", "--db", str(store), "--out", str(work / "report"), *only, "--json"]
    raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")


def time_stage(code: Path, stage: str, store: Path, work: Path, data: Path, timeout: float,
               kernel: str | None = None) -> dict:
    """Run one stage with `code` first on the path; its wall and CPU seconds (workers included), exit code and JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(code), os.environ.get("PYTHONPATH")) if p)}
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        done = subprocess.run(stage_command(stage, store, work, data, kernel), cwd=code, env=env, capture_output=True,
                              text=True, timeout=timeout)
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = None, "", (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) \
            else (exc.stderr or "")
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        result = json.loads(out) if rc == 0 else None
    except ValueError:
        result = None
    progress = [line for line in err.splitlines() if line.startswith("... ")]
    return {"stage": stage, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_before": round(load, 1),
            "load_after": round(os.getloadavg()[0], 1),
            "exit": rc, "progress_lines": len(progress),
            "steps_s": (result or {}).get("timings_s") if stage == "run" else None,
            "error": None if rc == 0 else (err.strip().splitlines() or ["timed out"])[-1][:300]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="REV", help="also time the code of this commit (e.g. HEAD~1, main)")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated: run, publish, report")
    parser.add_argument("--data", type=Path, default=ROOT / "data", help="the shards `run` ingests")
    parser.add_argument("--store", type=Path, default=None,
                        help="start publish and report from a copy of this store instead of running `run` first")
    parser.add_argument("--kernel", default=None, help="publish and report only this kernel")
    parser.add_argument("--work", type=Path, default=None, help="keep stores and outputs here (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before a stage is stopped")
    parser.add_argument("--repeat", type=int, default=1, help="time every stage this many times per code")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in STAGES]
    if bad:
        parser.error(f"unknown stage(s) {', '.join(bad)}; expected {', '.join(STAGES)}")
    if any(s != "run" for s in stages) and "run" not in stages and args.store is None:
        stages.insert(0, "run")  # publish and report need the store and models that run makes
    top = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="stage-times-"))
    top.mkdir(parents=True, exist_ok=True)
    codes = {"this": ROOT}
    if args.baseline:
        codes["baseline"] = checkout(args.baseline, top / "baseline-code")
    data = args.data.resolve()
    rows = []
    try:
        for r in range(args.repeat):
            works = {name: top / f"{name}-{r}" for name in codes}
            for w in works.values():
                shutil.rmtree(w, ignore_errors=True)
                w.mkdir(parents=True)
                if args.store is not None:  # the store and its model files (paths relative to its folder)
                    shutil.copy(args.store, w / "store.duckdb")
                    if (args.store.parent / "models").is_dir():
                        shutil.copytree(args.store.parent / "models", w / "models")
            for stage in stages:
                for name, code in codes.items():
                    _log(f"{stage} with {name} code ({code}) ...")
                    row = time_stage(code, stage, works[name] / "store.duckdb", works[name], data, args.timeout,
                                     args.kernel)
                    row.update(code=name, rev=args.baseline if name == "baseline" else "checkout", repeat=r)
                    rows.append(row)
                    _log(f"  {row['wall_s']} s wall, {row['cpu_s']} s CPU, exit {row['exit']}"
                         + (f": {row['error']}" if row["error"] else ""))
    finally:
        if not args.work:
            shutil.rmtree(top, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'stage':8} {'code':9} {'wall s':>8} {'CPU s':>8} {'load':>9} {'exit':>4} {'progress':>8}  steps")
    for row in rows:
        steps = ", ".join(f"{k} {v}" for k, v in (row["steps_s"] or {}).items())
        load = f"{row['load_before']:.1f}->{row['load_after']:.1f}"
        print(f"{row['stage']:8} {row['code']:9} {row['wall_s']:8.1f} {row['cpu_s']:8.1f} {load:>9} "
              f"{str(row['exit']):>4} {row['progress_lines']:8d}  {steps}")
    if args.baseline:
        print(f"\nbaseline ({args.baseline}) / this checkout, same run (above 1: this checkout is faster):")
        for stage in stages:
            mine = [x for x in rows if x["stage"] == stage and x["code"] == "this" and x["exit"] == 0]
            base = [x for x in rows if x["stage"] == stage and x["code"] == "baseline"]
            if not mine or not base:
                continue
            wall = sum(x["wall_s"] for x in base) / sum(x["wall_s"] for x in mine)
            cpu = sum(x["cpu_s"] for x in base) / max(0.1, sum(x["cpu_s"] for x in mine))
            stopped = (" (the baseline was stopped at --timeout: at least this)"
                       if any(x["exit"] is None for x in base) else "")
            print(f"  {stage:8} wall {wall:.2f}x  CPU {cpu:.2f}x{stopped}")
    return 0 if all(r["exit"] == 0 for r in rows if r["code"] == "this") else 1


if __name__ == "__main__":
    sys.exit(main())
