"""List, and with --delete remove, every measurement of a case that has a kernel input of 8 bytes or fewer.

    python tools/retime_small_inputs.py --db STORE --device ID [--kernel K ...] [--delete] [--json]

MLX's CUDA allocator serves allocations of at most 8 bytes (harness.SMALL_POOL_BYTES) from a pool of
managed memory, and a kernel reading from there timed 1.6-18 us at random for a 2.9 us launch
(benchmarks/small_pool_probe.py). Such cases were collected before harness.make_inputs kept inputs out of
the pool; deleting all their rows lets the next `collect` of the same preset time them again. Input sizes
come from the kernel's own make_inputs, unevaluated (MLX builds the arrays lazily: nothing is allocated).
Rows of kernels this installation does not know (imported data) or of an older kernel version are left.
--kernel limits it to those kernels: topk_gating's `kk` input is 4-8 bytes but its contents are never
read (the kernel reads only its shape), so its cases need no new timing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KEY = ("device_id", "kernel", "kernel_version", "dtype", "shape_key", "config_key")


def small_input_cases(rows: list[dict]) -> set[tuple[str, str, str]]:
    """The (kernel, dtype, shape_key) cases of these rows with an input of 1 to SMALL_POOL_BYTES bytes."""
    import mlx.core as mx

    from zmlx_pipeline.kernels.harness import SMALL_POOL_BYTES, mx_dtype
    from zmlx_pipeline.kernels.registry import get_kernel

    specs, out, seen = {}, set(), set()
    for r in rows:
        case = (r["kernel"], r["dtype"], r["shape_key"])
        if case in seen:
            continue
        seen.add(case)
        if r["kernel"] not in specs:
            try:
                specs[r["kernel"]] = get_kernel(r["kernel"])
            except Exception:  # noqa: BLE001 - an imported kernel has no spec here
                specs[r["kernel"]] = None
        spec = specs[r["kernel"]]
        if spec is None or r["kernel_version"] != spec.version:
            continue
        sizes = [a.nbytes for a in spec.make_inputs(r["shape"], mx_dtype(r["dtype"]), mx.random.key(0))]
        if any(0 < n <= SMALL_POOL_BYTES for n in sizes):
            out.add(case)
    return out


def main(argv=None) -> int:
    from zmlx_pipeline.data.store import Store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--kernel", action="append", default=[], help="only this kernel's rows (repeatable)")
    ap.add_argument("--delete", action="store_true", help="delete the rows (else only list them)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with Store(args.db, read_only=not args.delete) as store:
        measured = store.measurements(device=args.device)
        if not measured:
            raise SystemExit(f"no measurements of device {args.device!r} in {args.db}")
        if args.kernel:
            measured = [r for r in measured if r["kernel"] in args.kernel]
        cases = small_input_cases(measured)
        rows = [r for r in measured if (r["kernel"], r["dtype"], r["shape_key"]) in cases]
        deleted = store.delete_measurements([tuple(r[c] for c in KEY) for r in rows]) if args.delete else 0
    kernels = sorted({k for k, _, _ in cases})
    if args.json:
        print(json.dumps({"cases": sorted(cases), "rows": len(rows), "kernels": kernels, "deleted": deleted}))
    else:
        for kernel, dtype, shape_key in sorted(cases):
            shape = next(r["shape"] for r in rows if (r["kernel"], r["dtype"], r["shape_key"]) == (kernel, dtype, shape_key))
            n = sum(1 for r in rows if (r["kernel"], r["dtype"], r["shape_key"]) == (kernel, dtype, shape_key))
            print(f"{kernel:12s} {dtype:9s} {json.dumps(shape, sort_keys=True):42s} {n:4d} rows")
        print(f"{len(cases)} cases, {len(rows)} rows{f', {deleted} deleted' if args.delete else ''}; "
              f"kernels: {' '.join(kernels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
