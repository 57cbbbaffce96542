"""List, and with --delete remove, the config each collect run timed first in each (kernel, dtype) block.

    python tools/retime_first.py --db STORE --device ID [--skip-kernel K ...] [--delete] [--json]

A collect worker times whole (kernel, dtype) groups, one worker at a time, and before harness.measure threw
away the first timing of a process that first timing read fast (benchmarks/order_probe.py: a 1.6 us swiglu
launch read as 1.22 us). The row each run measured first in each block of one (kernel, dtype), in time
order, is therefore suspect; deleting it lets the next `collect` of the same preset time exactly those
keys again, with the fixed harness. Prints the rows (and the kernels they belong to, for `collect -k`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KEY = ("device_id", "kernel", "kernel_version", "dtype", "shape_key", "config_key")


def first_in_blocks(rows: list[dict]) -> list[dict]:
    """The rows (one device's measurements, as Store.measurements gives them) that start a (kernel, dtype)
    block of their run in time order. Plain Python: the GPU machines have no polars."""
    out, last = [], {}
    for r in sorted(rows, key=lambda r: (r["run_id"], r["measured_at"])):
        if last.get(r["run_id"]) != (r["kernel"], r["dtype"]):
            out.append(r)
        last[r["run_id"]] = (r["kernel"], r["dtype"])
    return out


def parser(doc: str) -> argparse.ArgumentParser:
    """The options every retime tool takes: --db, --device, --delete, --json."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--delete", action="store_true", help="delete the rows (else only list them)")
    ap.add_argument("--json", action="store_true")
    return ap


def select_rows(db: str, device: str, select, delete: bool) -> tuple[list[dict], int]:
    """The rows `select` picks from one device's measurements, and how many were deleted (with `delete`,
    in one transaction, so that the next collect of the same preset times exactly those keys again)."""
    from zmlx_pipeline.data.store import Store

    with Store(db, read_only=not delete) as store:
        measured = store.measurements(device=device)
        if not measured:
            raise SystemExit(f"no measurements of device {device!r} in {db}")
        rows = select(measured)
        deleted = store.delete_measurements([tuple(r[c] for c in KEY) for r in rows]) if delete else 0
    return rows, deleted


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--skip-kernel", action="append", default=[], help="leave this kernel's rows alone")
    args = ap.parse_args(argv)
    rows, deleted = select_rows(args.db, args.device, lambda measured: [
        r for r in first_in_blocks(measured) if r["kernel"] not in args.skip_kernel], args.delete)
    kernels = sorted({r["kernel"] for r in rows})
    if args.json:
        print(json.dumps({"rows": [{c: r[c] for c in (*KEY, "shape", "config", "median_us")} for r in rows],
                          "kernels": kernels, "deleted": deleted}, default=str))
    else:
        for r in rows:
            shape, config = json.dumps(r["shape"], sort_keys=True), json.dumps(r["config"], sort_keys=True)
            print(f"{r['kernel']:12s} {r['dtype']:9s} {shape:42s} {config:48s} {r['median_us'] or 0:10.3f} us")
        print(f"{len(rows)} rows{f', {deleted} deleted' if args.delete else ''}; kernels: {' '.join(kernels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
