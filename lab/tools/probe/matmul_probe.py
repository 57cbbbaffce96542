"""Matmul probe (GPU): time chosen configs of the matmul body, also outside the collected space, next to mx.matmul.

    python probe/matmul_probe.py --configs '[{"TG":256,...}]' [--dtype float16] [--shape M,N,K] [--rounds 5]
        [--wgmma-check] [--json OUT]

Not part of the package: a kernel-development tool. Each config is checked against the reference and
timed with host-timed chains, alternately with mx.matmul, --rounds times; prints the median ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())


def wgmma_check() -> str:
    """Whether NVRTC in this MLX build assembles a Hopper-only instruction (wgmma needs sm_90a)."""
    import mlx.core as mx

    src = r"""
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  out[i] = inp[i] + 1.0f;
"""
    k = mx.fast.cuda_kernel(name="wgmma_probe", input_names=["inp"], output_names=["out"], source=src)
    x = mx.zeros((128,), dtype=mx.float32)
    try:
        (y,) = k(inputs=[x], grid=(128, 1, 1), threadgroup=(128, 1, 1), output_shapes=[(128,)], output_dtypes=[mx.float32])
        mx.eval(y)
        return f"ok ({float(y.sum())})"
    except Exception as exc:  # noqa: BLE001
        return "failed: " + str(exc)[:600]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", required=True)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--shape", default="2048,14336,4096")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--wgmma-check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    import mlx.core as mx

    from zmlx_pipeline.kernels.harness import Launcher, input_sets, measure
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.kernels.timing import time_launches

    if args.wgmma_check:
        print("wgmma:", wgmma_check(), flush=True)
    spec = get_kernel("matmul")
    m, n, k = (int(v) for v in args.shape.split(","))
    shape = {"M": m, "N": n, "K": k}
    configs = json.loads(args.configs)
    launcher = Launcher(spec, "cuda")
    sets = input_sets(spec, shape, args.dtype, seed=1, rotate_bytes=100_000_000)
    flops = spec.flops(shape)
    rows = []
    for c in configs:
        t0 = time.perf_counter()
        o = measure(launcher, c, shape, args.dtype, seed=11, inputs=sets)
        row = {"config": c, "status": o.status, "error": o.error, "first_s": round(time.perf_counter() - t0, 1)}
        if o.status == "ok":
            ratios = []
            for _ in range(args.rounds):
                again = measure(launcher, c, shape, args.dtype, seed=11, inputs=sets)
                base = time_launches(lambda i: mx.matmul(*sets[i % len(sets)]))
                ratios.append(again.timing.median_us / base.median_us)
            ratios.sort()
            row.update(us=o.timing.median_us, tflops=flops / o.timing.median_us / 1e6,
                       ratio_median=ratios[len(ratios) // 2], ratios=[round(r, 3) for r in ratios],
                       pct_mx=100 / ratios[len(ratios) // 2])
        rows.append(row)
        print(json.dumps(row), flush=True)
        mx.clear_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"shape": shape, "dtype": args.dtype, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
