"""GPU probe: do inputs of 8 bytes or fewer (MLX CUDA's managed small pool) make a kernel's time noisy?

    python benchmarks/small_pool_probe.py [--cases CASES] [--configs N] [--rounds R] [--out FILE]

MLX's CUDA allocator serves allocations of at most 8 bytes from a pool of managed (unified) memory.
moe_combine's router weights w [tokens, k] at one token are k * dtype bytes: 4-8 bytes for k <= 4 in
16-bit and k = 2 in float32, exactly the cases whose configs read 1.6-18 us at random in the committed
data and in benchmarks/order_probe.py. Per case, this times the first N legal configs R rounds over,
each round with fresh input sets, in two variants, interleaved:

  raw       the kernel's own make_inputs (a small input lands in the pool), as collect timed before;
  resident  harness.make_inputs (device_resident: a small input becomes a view into a larger buffer).

Prints per variant and config the median over rounds and max/min over rounds (gpu timer, us).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.getcwd())

from order_probe import parse_case  # noqa: E402 - this folder is on sys.path when run as a script

DEFAULT_CASES = (
    "moe_combine:tokens=1,k=2,hidden=4096:float16",
    "moe_combine:tokens=1,k=2,hidden=4096:float32",
    "moe_combine:tokens=1,k=4,hidden=2880:bfloat16",
    "moe_combine:tokens=1,k=8,hidden=2048:float16",  # w is 16 bytes: never in the pool (control)
)


def main() -> int:
    import mlx.core as mx

    from zmlx_pipeline.data.detect import detect_device
    from zmlx_pipeline.kernels import harness
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.kernels.spec import Limits

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="|".join(DEFAULT_CASES), help="KERNEL:DIM=V,...:DTYPE cases joined by |")
    ap.add_argument("--configs", type=int, default=8, help="the first N legal configs of each case")
    ap.add_argument("--rounds", type=int, default=4, help="timings of each config per variant, fresh inputs each")
    ap.add_argument("--out", default=None, help="write every timing as JSON here")
    args = ap.parse_args()

    device = detect_device()
    rotate = harness.rotate_bytes_for(device.row)
    limits = Limits.from_device_row(device.row)
    print(f"device {device.device_id}, timer gpu, rotate {rotate} bytes, small pool <= {harness.SMALL_POOL_BYTES} bytes",
          flush=True)
    makers = {"raw": lambda spec, shape, dtype, key: list(spec.make_inputs(shape, harness.mx_dtype(dtype), key)),
              "resident": harness.make_inputs}
    results = []
    for text in args.cases.split("|"):
        kernel, shape, dtype = parse_case(text)
        spec = get_kernel(kernel)
        launcher = harness.Launcher(spec, device.backend)
        configs = list(spec.legal_configs(shape, dtype, limits))[: args.configs]
        small = [a.nbytes for a in spec.make_inputs(shape, harness.mx_dtype(dtype), mx.random.key(0))]
        times = {v: {json.dumps(c, sort_keys=True): [] for c in configs} for v in makers}
        for r in range(args.rounds):
            for variant, make in makers.items():
                n = harness.input_set_count(spec, shape, dtype, rotate)
                sets = [make(spec, shape, dtype, mx.random.key(1000 * r + 7919 * (i + 1))) for i in range(n)]
                mx.eval(sets)
                for c in configs:
                    out = harness.measure(launcher, c, shape, dtype, timer="gpu", inputs=sets)
                    times[variant][json.dumps(c, sort_keys=True)].append(
                        out.timing.median_us if out.timing else float("nan"))
        print(f"\n{text}  input bytes {small}  (us: median over {args.rounds} rounds, max/min)")
        print(f"  {'config':36s} " + "".join(f"{v:>22s}" for v in makers))
        for c in configs:
            key = json.dumps(c, sort_keys=True)
            cells = []
            for v in makers:
                ts = times[v][key]
                cells.append(f"{statistics.median(ts):9.3f} {max(ts) / min(ts):6.2f}x".rjust(22))
            print(f"  {key:36s} " + "".join(cells), flush=True)
        for v in makers:
            spreads = [max(ts) / min(ts) for ts in times[v].values()]
            best = min(min(ts) for ts in times[v].values())
            print(f"  {v:9s} best {best:.3f} us, max/min over rounds: median {statistics.median(spreads):.2f}x, "
                  f"worst {max(spreads):.2f}x", flush=True)
        results.append({"case": text, "input_bytes": small, "times": times})
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
