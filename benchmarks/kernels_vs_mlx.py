"""Kernels worth tuning: each built-in kernel's best config at its largest shapes next to MLX's own op.

Run on a GPU machine (CUDA or Metal MLX):

    python benchmarks/kernels_vs_mlx.py [--kernels rmsnorm,...] [--dtypes float16,...]
        [--shapes 1] [--configs 24] [--db STORE [--top 1]] [--rounds 1] [--json OUT.json]

For each kernel, dtype and one of its largest shapes (by bytes moved) it checks and times a spread
of legal configs (or, with --db, takes the best config already measured in that store for the same
device, kernel version, dtype and shape, and re-times it here), times MLX's op on the same inputs,
and measures two ceilings once: copy bandwidth (a large `x + 1`, bytes read + written) and
`mx.matmul` throughput. Memory-bound kernels are judged by the fraction of copy bandwidth, matmul
by its fraction of `mx.matmul`. Prints a table last; --json writes every figure.

With --rounds R > 1, the best config and MLX's op are then timed again, alternately, R more times:
`rounds_vs_mlx` is the median over rounds of our time / MLX's time in that round, so one slow
moment on either side does not decide the verdict (single timings differ by several percent).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from zmlx_pipeline.data.detect import detect_backend
from zmlx_pipeline.core.keys import mapping_key
from zmlx_pipeline.kernels.harness import (
    Launcher,
    input_sets,
    measure,
    mx_dtype,
    rotate_bytes_for,
)
from zmlx_pipeline.kernels.registry import builtin_kernels, get_kernel
from zmlx_pipeline.kernels.spec import DTYPE_BYTES, Limits, spread
from zmlx_pipeline.kernels.timing import time_launches


def copy_bandwidth_gbps(n_bytes: int = 1 << 30) -> float:
    """Bytes read plus written per second by a large elementwise copy (`x + 1` on float32)."""
    import mlx.core as mx

    xs = [mx.random.normal((n_bytes // 4,)) for _ in range(2)]
    mx.eval(xs)
    t = time_launches(lambda i: xs[i % 2] + 1.0, samples=10, target_sample_s=5e-3)
    return 2 * n_bytes / (t.median_us * 1e-6) / 1e9


def matmul_tflops(dtype: str, n: int = 8192) -> float:
    """mx.matmul throughput on an n x n x n product."""
    import mlx.core as mx

    a = mx.random.normal((n, n)).astype(mx_dtype(dtype))
    b = mx.random.normal((n, n)).astype(mx_dtype(dtype))
    mx.eval(a, b)
    t = time_launches(lambda i: a @ b, samples=10, target_sample_s=5e-3)
    return 2.0 * n ** 3 / (t.median_us * 1e-6) / 1e12


def largest_shapes(spec, count: int) -> list[dict]:
    shapes = list(spec.shape_grid.shapes("full"))
    shapes.sort(key=lambda s: spec.bytes_moved(s, 2), reverse=True)
    return shapes[:count]


def best_from_store(db: str, device_id: str, spec, dtype: str, shape: dict, top: int = 1) -> list[dict]:
    from zmlx_pipeline.data.store import Store

    with Store(db, read_only=True) as store:
        rows = store.measurements(device=device_id, kernel=spec.name, kernel_version=spec.version,
                                  dtype=dtype, status="ok")
    key = mapping_key(shape)
    rows = [r for r in rows if r["shape_key"] == key]
    return [r["config"] for r in sorted(rows, key=lambda r: r["median_us"])[:top]]


def best_by(ok: list, param: str) -> dict:
    """The fastest config and its median time for each value of one parameter (values as strings)."""
    best: dict = {}
    for config, o in ok:
        key = str(config.get(param))
        if key not in best or o.timing.median_us < best[key]["us"]:
            best[key] = {"config": config, "us": o.timing.median_us}
    return dict(sorted(best.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default=",".join(s.name for s in builtin_kernels()))
    ap.add_argument("--dtypes", default="float16,bfloat16,float32")
    ap.add_argument("--shapes", type=int, default=1, help="largest shapes per kernel")
    ap.add_argument("--configs", type=int, default=24, help="configs per shape (spread over the legal ones)")
    ap.add_argument("--db", help="take the best config measured in this store instead of sweeping")
    ap.add_argument("--top", type=int, default=1, help="with --db: re-time this many of the best stored configs")
    ap.add_argument("--rounds", type=int, default=1, help="time the best config and MLX's op alternately this many times")
    ap.add_argument("--by", help="also report the best config for each value of this parameter")
    ap.add_argument("--json", dest="json_out", help="write every figure here")
    args = ap.parse_args(argv)

    backend = detect_backend()
    if backend not in ("cuda", "metal"):
        print(f"no GPU backend in this MLX (backend: {backend}); run on a CUDA or Apple GPU", file=sys.stderr)
        return 2
    import mlx.core as mx

    from zmlx_pipeline.data.detect import detect_device

    device = detect_device()
    limits = Limits.from_device_row(device.row)
    rotate = rotate_bytes_for(device.row) or 2 * 50_000_000  # a 50 MB L2 where the catalog has none
    specs = [get_kernel(k) for k in args.kernels.split(",")]
    dtypes = args.dtypes.split(",")

    plan = []  # (spec, dtype, shape, [configs])
    for spec in specs:
        for shape in largest_shapes(spec, args.shapes):
            for dtype in dtypes:
                if args.db:
                    configs = best_from_store(args.db, device.device_id, spec, dtype, shape, args.top)
                else:
                    configs = spread(spec.legal_configs(shape, dtype, limits), args.configs)
                plan.append((spec, dtype, shape, configs))

    bw = copy_bandwidth_gbps()
    peak = {d: matmul_tflops(d) for d in dtypes} if any(s.name == "matmul" for s in specs) else {}
    print(f"device {device.device_id}: copy {bw:.0f} GB/s; mx.matmul "
          + ", ".join(f"{d} {v:.0f} TFLOP/s" for d, v in peak.items())
          + "", flush=True)

    rows = []
    launchers: dict[str, Launcher] = {}
    for spec, dtype, shape, configs in plan:
        launcher = launchers.setdefault(spec.name, Launcher(spec, backend))
        sets = input_sets(spec, shape, dtype, seed=1, rotate_bytes=rotate)
        results = []
        first = []
        for config in configs:
            t = time.perf_counter()
            o = measure(launcher, config, shape, dtype, seed=11, inputs=sets)
            first.append(time.perf_counter() - t)
            results.append((config, o))
        ok = [(c, o) for c, o in results if o.status == "ok"]
        failed = {o.status for _, o in results if o.status != "ok"}
        mlx_t = time_launches(lambda i: spec.mlx_op(sets[i % len(sets)], shape)) if spec.mlx_op else None
        row = {"kernel": spec.name, "dtype": dtype, "shape": shape, "configs": len(configs),
               "ok": len(ok), "failed": sorted(failed), "mlx_us": mlx_t.median_us if mlx_t else None,
               "measure_s_mean": sum(first) / max(1, len(first))}
        if ok:
            config, o = min(ok, key=lambda co: co[1].timing.median_us)
            us = o.timing.median_us
            nbytes = spec.bytes_moved(shape, DTYPE_BYTES[dtype])
            row.update(best_config=config, best_us=us, gbps=nbytes / (us * 1e-6) / 1e9)
            row["pct_copy_bw"] = 100 * row["gbps"] / bw
            if spec.name == "matmul":
                row["tflops"] = spec.flops(shape) / (us * 1e-6) / 1e12
                row["pct_mx_matmul"] = 100 * row["tflops"] / peak[dtype]
            if mlx_t:
                row["vs_mlx"] = us / mlx_t.median_us
            if args.by:
                row["best_by"] = best_by(ok, args.by)
            if mlx_t and args.rounds > 1:
                ratios = []
                for _ in range(args.rounds):
                    again = measure(launcher, config, shape, dtype, seed=11, inputs=sets)
                    base = time_launches(lambda i: spec.mlx_op(sets[i % len(sets)], shape))
                    if again.status == "ok":
                        ratios.append(again.timing.median_us / base.median_us)
                row["rounds"] = ratios
                row["rounds_vs_mlx"] = sorted(ratios)[len(ratios) // 2] if ratios else None
        rows.append(row)
        print(json.dumps(row), flush=True)
        mx.clear_cache()

    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"device": device.device_id, "copy_gbps": bw, "mx_matmul_tflops": peak,
                       "rows": rows}, fh, indent=1)
    print(f"\n{'kernel':12} {'dtype':9} {'shape':34} {'best us':>9} {'MLX us':>9} {'x MLX':>6} {'rounds':>6} {'GB/s':>6} {'%copy':>6} {'%mm':>5}  best config")
    for r in rows:
        shape = ",".join(f"{k}={v}" for k, v in r["shape"].items())
        f = lambda k, fmt: format(r[k], fmt) if r.get(k) is not None else "-"  # noqa: E731
        print(f"{r['kernel']:12} {r['dtype']:9} {shape:34} {f('best_us', '9.1f')} {f('mlx_us', '9.1f')} "
              f"{f('vs_mlx', '6.2f')} {f('rounds_vs_mlx', '6.2f')} {f('gbps', '6.0f')} {f('pct_copy_bw', '6.1f')} {f('pct_mx_matmul', '5.1f')}  "
              f"{r.get('best_config', r['failed'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
