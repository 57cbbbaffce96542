"""GPU probe: where does the timing noise come from? Run twice in separate processes; compare.

For a few keys it times with several methods and prints every sample, so the spread within a
process and between processes can be read side by side. Also measures the per-launch dispatch
cost of a chain of tiny launches (if a chain is CPU-bound, it times MLX's dispatch, not the GPU).
"""
import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())
import mlx.core as mx

from zmlx_pipeline.kernels.harness import Launcher, input_sets
from zmlx_pipeline.kernels.registry import get_kernel

KEYS = [
    ("softmax", {"cols": 32768, "rows": 16}, "float16", {"ROWS": 2, "TG": 1024, "VEC": 8}),
    ("rmsnorm", {"cols": 4096, "rows": 4096}, "float16", {"ROWS": 1, "TG": 256, "VEC": 8}),
    ("rmsnorm", {"cols": 16384, "rows": 4096}, "float16", {"ROWS": 1, "TG": 256, "VEC": 8}),
    ("moe_combine", {"hidden": 4096, "k": 2, "tokens": 1024}, "float16", {"ROWS": 1, "TG": 256, "VEC": 8}),
    ("add_rmsnorm", {"cols": 4096, "rows": 32768}, "bfloat16", {"ROWS": 1, "TG": 256, "VEC": 4}),
]
ROTATE = 2 * 50 * 2**20


def chain_time(launch, n, start=0):
    outs = [launch(start + i) for i in range(n)]
    t0 = time.perf_counter()
    mx.eval(outs)
    mx.synchronize()
    return time.perf_counter() - t0


def build_time(launch, n, start=0):
    """Seconds to build and eval, and how long the Python side of building the chain took."""
    t0 = time.perf_counter()
    outs = [launch(start + i) for i in range(n)]
    t1 = time.perf_counter()
    mx.eval(outs)
    mx.synchronize()
    return t1 - t0, time.perf_counter() - t1


def main():
    tag = sys.argv[1] if len(sys.argv) > 1 else "p"
    res = {"tag": tag}
    # dispatch cost: a tiny rmsnorm launch chained 1..512 times
    spec = get_kernel("rmsnorm")
    L = Launcher(spec, "cuda")
    shape, cfg = {"rows": 1, "cols": 1024}, {"ROWS": 1, "TG": 256, "VEC": 4}
    x = spec.make_inputs(shape, mx.float16, mx.random.key(1))
    mx.eval(x)
    for _ in range(20):
        chain_time(lambda i: L(x, cfg, shape, "float16"), 8)
    disp = {}
    for n in (1, 8, 64, 256, 1024):
        ts = sorted(chain_time(lambda i: L(x, cfg, shape, "float16"), n) / n * 1e6 for _ in range(7))
        disp[n] = round(ts[3], 2)
    res["dispatch_us_per_launch"] = disp
    # mx.add chain for comparison (a built-in op)
    a = mx.random.normal((1024,)).astype(mx.float16)
    mx.eval(a)
    ts = sorted(chain_time(lambda i: a + 1, 256) / 256 * 1e6 for _ in range(7))
    res["builtin_add_us_per_launch"] = round(ts[3], 2)
    print(json.dumps(res), flush=True)

    for name, shape, dt, cfg in KEYS:
        spec = get_kernel(name)
        L = Launcher(spec, "cuda")
        sets = input_sets(spec, shape, dt, 11, ROTATE)
        p = len(sets)
        launch = lambda i: L(sets[i % p], cfg, shape, dt)
        for _ in range(5):
            chain_time(launch, 1)
        one = chain_time(launch, p) / p
        out = {"key": name + str(shape) + dt, "sets": p}
        # in-process repeats of each method, spaced in time
        for rep in range(3):
            # method A: current (chain ~1 ms)
            n = max(p, int(1e-3 / one) // p * p) if one < 1e-3 else p
            a = [chain_time(launch, n, s * n) / n * 1e6 for s in range(10)]
            # method B: chain ~8 ms
            n8 = max(p, int(8e-3 / one) // p * p)
            b = [chain_time(launch, n8, s * n8) / n8 * 1e6 for s in range(10)]
            # method C: difference of chains 2n8 and n8
            c = []
            for s in range(6):
                t1 = chain_time(launch, n8)
                t2 = chain_time(launch, 2 * n8)
                c.append((t2 - t1) / n8 * 1e6)
            # build vs eval for the 8 ms chain
            bt = [build_time(launch, n8) for _ in range(3)]
            out[f"r{rep}"] = {
                "n": n, "A": [round(v, 2) for v in a], "n8": n8, "B": [round(v, 2) for v in b],
                "C": [round(v, 2) for v in c],
                "build_eval_ms": [(round(x * 1e3, 2), round(y * 1e3, 2)) for x, y in bt],
            }
            time.sleep(0.3)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
