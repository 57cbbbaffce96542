"""Time `zmlx-pipeline import` of a large Kernel Tuner cache: the file as a finished run closes it and as a stopped
run leaves it open (read entry by entry), each into a fresh store in a process of its own.

    python benchmarks/import_bench.py [--entries 100000] [--repetitions 32]

prints, per layout, the file's size, the rows stored, the wall seconds and the peak resident memory of the import.
The cache is synthetic (four parameters, every entry timed `repetitions` times) and laid out as Kernel Tuner
writes it (kernel_tuner/util.py: one entry a line).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("block_size_x", "block_size_y", "tile_size_x", "tile_size_y")


def write_cache(path: Path, entries: int, repetitions: int, closed: bool) -> None:
    """A cache of `entries` configs, closed as a finished run leaves it or open as a stopped one does."""
    rng = random.Random(0)
    head = {"schema_version": "1.1.0", "device_name": "NVIDIA RTX A4000", "kernel_name": "synthetic",
            "problem_size": [4096, 4096], "tune_params_keys": list(KEYS), "tune_params": {}, "objective": "time"}
    with path.open("w", encoding="utf-8") as out:
        out.write(json.dumps(head, indent="")[:-2] + ',\n"cache": {\n')
        for i in range(entries):
            config = dict(zip(KEYS, (i // 512 + 1, i // 16 % 32 + 1, i // 4 % 4 + 1, i % 4 + 1)))
            times = [rng.uniform(1.0, 2.0) for _ in range(repetitions)]
            entry = {**config, "time": sum(times) / len(times), "times": times, "compile_time": 800.0,
                     "verification_time": 0, "benchmark_time": 40.0, "strategy_time": 0, "framework_time": 1.0,
                     "timestamp": "2024-01-01 00:00:00+00:00"}
            key = ",".join(str(config[k]) for k in KEYS)
            out.write(f"{json.dumps(key)}: {json.dumps(entry)}" + (",\n" if not closed or i < entries - 1 else ""))
        out.write("\n}\n}" if closed else "")


def timed_import(path: Path, db: Path) -> dict:
    """Import one file in a fresh process: rows stored, wall seconds, peak resident MB of that process."""
    code = ("import json, resource, sys, time\n"
            "from zmlx_pipeline.data.importers import import_files\n"
            "from zmlx_pipeline.data.store import Store\n"
            "start = time.perf_counter()\n"
            "with Store(sys.argv[2]) as store:\n"
            "    rows = import_files(store, [sys.argv[1]])\n"
            "print(json.dumps({'rows': sum(r['added'] for r in rows), 'wall_s': time.perf_counter() - start,\n"
            "                  'peak_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))\n")
    done = subprocess.run([sys.executable, "-c", code, str(path), str(db)], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--repetitions", type=int, default=32)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for layout, closed in (("closed", True), ("left open", False)):
            path = Path(tmp) / f"A4000_{'closed' if closed else 'open'}.json"
            write_cache(path, args.entries, args.repetitions, closed)
            row = {"layout": layout, "size_mb": path.stat().st_size / 1e6,
                   **timed_import(path, Path(tmp) / f"{path.stem}.duckdb")}
            results.append(row)
            print(f"{layout:10s} {row['size_mb']:8.1f} MB  {row['rows']:8d} rows  {row['wall_s']:7.1f} s  "
                  f"peak {row['peak_mb']:7.0f} MB", flush=True)
    return results


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - started:.1f} s")
