"""GPU probe: does the position of a config within its case change its measured time?

    python benchmarks/order_probe.py [--cases CASES] [--configs N] [--out FILE]

In the committed data the config timed first in a small case (best under ~2 us) is often its best by
13-28% (swiglu rows = 1, moe_combine tokens = 1), always the kernel's first config in enumeration
order. That is either physics (the smallest threadgroup, the most blocks) or the timing method. This
probe times one case's first N legal configs the way collect does (GpuMeasurer: the case's inputs
prepared once, then check + gpu timer per config) in four passes in one process:

  fwd      configs in enumeration order, right after the case's inputs are prepared (as collect);
  rev      the reverse order, same inputs (the last config is now timed first);
  rev-new  the reverse order again right after preparing the inputs anew (a fresh case);
  fwd2     enumeration order again, same inputs as rev-new.

A config that is fast only where it is timed first after a preparation (fwd's first, rev-new's first)
is an artefact of the method. Prints one table per case (us, median of the gpu timer's launches).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.getcwd())

DEFAULT_CASES = (
    "swiglu:rows=1,cols=11008:float16",
    "swiglu:rows=1,cols=1408:float16",
    "swiglu:rows=1,cols=14336:float16",
    "moe_combine:tokens=1,k=2,hidden=4096:float32",
    "topk_gating:tokens=1,experts=128,k=8:float16",
    "rmsnorm:rows=1,cols=4096:float16",
)


def parse_case(text: str):
    kernel, shape, dtype = text.split(":")
    return kernel, {k: int(v) for k, v in (kv.split("=") for kv in shape.split(","))}, dtype


def main() -> int:
    from zmlx_pipeline.data.detect import detect_device
    from zmlx_pipeline.core.keys import mapping_key
    from zmlx_pipeline.kernels.harness import rotate_bytes_for
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.kernels.spec import Limits
    from zmlx_pipeline.pipeline.collect import GpuMeasurer, Task, TimingSettings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="|".join(DEFAULT_CASES), help="KERNEL:DIM=V,...:DTYPE cases joined by |")
    ap.add_argument("--configs", type=int, default=8, help="the first N legal configs of each case")
    ap.add_argument("--out", default=None, help="write every timing as JSON here")
    ap.add_argument("--scenario", choices=("other-config", "re-prepare", "other-first", "mlx-op", "idle"),
                    help="in a fresh process, time A and B of the first case around one event (P: inputs prepared "
                         "again, M: a large MLX op, I: 3 s idle) and print the sequence")
    ap.add_argument("--settle", type=int, default=0,
                    help="first time the first case's first config this many times in a row, then again after "
                         "1 s idle, then its second config (how long does a fast first reading last?)")
    args = ap.parse_args()

    device = detect_device()
    settings = TimingSettings(timer="gpu", rotate_bytes=rotate_bytes_for(device.row))
    measurer = GpuMeasurer(device.backend, settings)
    limits = Limits.from_device_row(device.row)
    print(f"device {device.device_id}, timer {settings.timer}, rotate {settings.rotate_bytes} bytes", flush=True)
    results = []
    if args.scenario:
        # one scenario per process: which event ends a fast first reading of config A?
        import time

        import mlx.core as mx

        kernel, shape, dtype = parse_case(args.cases.split("|")[0])
        spec = get_kernel(kernel)
        a, b = (Task(spec, dtype, shape, c) for c in spec.legal_configs(shape, dtype, limits)[:2])
        steps = {"other-config": "AABAA", "re-prepare": "AAPAA", "other-first": "BBAA", "mlx-op": "AAMAA",
                 "idle": "AAIAA"}[args.scenario]
        seq = []
        for step in steps:
            if step == "P":
                measurer._prepared_for = None
            elif step == "M":
                mx.eval(mx.sum(mx.random.normal((64, 1024, 1024))))
            elif step == "I":
                time.sleep(3.0)
            else:
                seq.append((step, measurer(a if step == "A" else b).timing.median_us))
        print(f"scenario {args.scenario} ({steps}): " + "  ".join(f"{k}={v:.3f}" for k, v in seq), flush=True)
        return 0
    if args.settle:
        import time

        kernel, shape, dtype = parse_case(args.cases.split("|")[0])
        spec = get_kernel(kernel)
        a, b = (Task(spec, dtype, shape, c) for c in spec.legal_configs(shape, dtype, limits)[:2])
        seq = [("A", measurer(a).timing.median_us) for _ in range(args.settle)]
        time.sleep(1.0)
        seq += [("A after 1 s idle", measurer(a).timing.median_us) for _ in range(3)]
        seq += [("B", measurer(b).timing.median_us) for _ in range(3)]
        time.sleep(1.0)
        seq += [("B after 1 s idle", measurer(b).timing.median_us) for _ in range(3)]
        print(f"settle, {kernel} {shape} {dtype}: A = {a.config}, B = {b.config}")
        for label, us in seq:
            print(f"  {label:18s} {us:.3f} us")
        results.append({"settle": seq})
    for text in args.cases.split("|"):
        kernel, shape, dtype = parse_case(text)
        spec = get_kernel(kernel)
        configs = list(spec.legal_configs(shape, dtype, limits))[: args.configs]
        tasks = [Task(spec, dtype, shape, c) for c in configs]
        passes = {}
        for name, order, fresh in (("fwd", tasks, True), ("rev", tasks[::-1], False),
                                   ("rev-new", tasks[::-1], True), ("fwd2", tasks, False)):
            if fresh:
                measurer._prepared_for = None  # prepare the case's inputs again, as a new case would
                if name != "fwd":
                    settings.seed += 1
            times = {}
            for t in order:
                out = measurer(t)
                times[mapping_key(t.config)] = out.timing.median_us if out.timing else None
            passes[name] = times
        print(f"\n{text}  (us; * = timed first in that pass)")
        print(f"  {'config':40s} " + " ".join(f"{p:>9s}" for p in passes))
        for i, c in enumerate(configs):
            key = mapping_key(c)
            cells = []
            for p, times in passes.items():
                first = (i == 0) if p in ("fwd", "fwd2") else (i == len(configs) - 1)
                v = times[key]
                cells.append(f"{'-' if v is None else f'{v:.3f}'}{'*' if first else ' '}".rjust(9))
            print(f"  {json.dumps(c, sort_keys=True):40s} " + " ".join(cells), flush=True)
        results.append({"case": text, "configs": configs, "passes": passes})
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
