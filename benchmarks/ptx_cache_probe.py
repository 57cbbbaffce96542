"""Does MLX's PTX disk cache serve our custom kernels across processes? (CUDA only)

    python benchmarks/ptx_cache_probe.py [--kernel softmax] [--configs 8] [--dtype float16]

Compiles the first --configs legal configs of a kernel in a fresh process with an empty
MLX_PTX_CACHE_DIR, then again in a second fresh process on the same directory, and prints the
seconds each spent and the files the cache holds. A second pass many times faster than the first
would mean that a collect could compile every kernel once over all its jobs and let the grouped
timing workers (pipeline/parallel.py) load them from the cache. With MLX 0.32.4 (mlx-cuda-13) on an
H200 it does not: the cache directory stays empty and the second pass compiles again (16.6 s, then
14.4 s for 12 softmax configs), so custom kernels are compiled in every process that launches them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
import mlx.core as mx
from zmlx_pipeline.kernels.harness import Launcher, mx_dtype
from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.spec import Limits
kernel, n, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spec = get_kernel(kernel)
shape = spec.shape_grid.shapes("smoke")[0]
configs = spec.legal_configs(shape, dtype, Limits())[:n]
launcher = Launcher(spec, "cuda")
inputs = spec.make_inputs(shape, mx_dtype(dtype), mx.random.key(0))
mx.eval(inputs)
start = time.perf_counter()
for c in configs:
    mx.eval(launcher(inputs, c, shape, dtype))
mx.synchronize()
print(json.dumps({"configs": len(configs), "seconds": time.perf_counter() - start}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="softmax")
    parser.add_argument("--configs", type=int, default=8)
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "MLX_PTX_CACHE_DIR": cache}
        for attempt in ("first process (empty cache)", "second process (same cache)"):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", CHILD, args.kernel, str(args.configs), args.dtype],
                                 env=env, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                sys.exit(f"probe failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
            got = json.loads(out.stdout.strip().splitlines()[-1])
            files = sorted(os.listdir(cache))
            print(f"{attempt}: {got['configs']} configs compiled and launched in {got['seconds']:.2f} s "
                  f"(process {time.perf_counter() - t0:.1f} s); cache holds {len(files)} files "
                  f"({sum(f.endswith('.ptx') for f in files)} .ptx)")


if __name__ == "__main__":
    main()
