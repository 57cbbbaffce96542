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

import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from retime_first import parser, select_rows  # noqa: E402 - the retime tools' options and store step


def small_input_cases(rows: list[dict]) -> set[tuple[str, str, str, str]]:
    """The (kernel, kernel_version, dtype, shape_key) cases of these rows, of the installed kernel version,
    with an input of 1 to SMALL_POOL_BYTES bytes."""
    import mlx.core as mx

    from zmlx_pipeline.kernels.harness import in_small_pool, mx_dtype
    from zmlx_pipeline.kernels.registry import get_kernel

    specs, out, seen = {}, set(), set()
    for r in rows:
        case = (r["kernel"], r["kernel_version"], r["dtype"], r["shape_key"])
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
        if any(in_small_pool(a) for a in spec.make_inputs(r["shape"], mx_dtype(r["dtype"]), mx.random.key(0))):
            out.add(case)
    return out


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--kernel", action="append", default=[], help="only this kernel's rows (repeatable)")
    args = ap.parse_args(argv)

    def select(measured: list[dict]) -> list[dict]:
        mine = [r for r in measured if not args.kernel or r["kernel"] in args.kernel]
        small = small_input_cases(mine)
        return [r for r in mine if (r["kernel"], r["kernel_version"], r["dtype"], r["shape_key"]) in small]

    rows, deleted = select_rows(args.db, args.device, select, args.delete)
    per_case = Counter((r["kernel"], r["dtype"], r["shape_key"]) for r in rows)
    shapes = {(r["kernel"], r["dtype"], r["shape_key"]): r["shape"] for r in rows}
    kernels = sorted({k for k, _, _ in per_case})
    if args.json:
        print(json.dumps({"cases": sorted(per_case), "rows": len(rows), "kernels": kernels, "deleted": deleted}))
    else:
        for case, n in sorted(per_case.items()):
            print(f"{case[0]:12s} {case[1]:9s} {json.dumps(shapes[case], sort_keys=True):42s} {n:4d} rows")
        print(f"{len(per_case)} cases, {len(rows)} rows{f', {deleted} deleted' if args.delete else ''}; "
              f"kernels: {' '.join(kernels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
