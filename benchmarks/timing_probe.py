"""GPU probe: can configs of a sub-10 us case be told apart, and by which timing method?

    python benchmarks/timing_probe.py CASES.json [--out FILE] [--methods A,B,C] [--rounds R]

For each case (kernel, shape, dtype, configs) it times every config with
  A. the collect method (kernels/timing.py: chain differences, 5 samples, chains of <= 128), twice;
  B. interleaved rounds: every round takes one chain-difference sample of every config, in a
     shuffled order, so drift in the host's dispatch speed falls on all configs alike; twice;
  C. GPU time from CUPTI through torch.profiler, when torch is importable: the kernels' own
     durations in a chain, with no dispatch in them (but overlapping kernels); twice;
  G. the gpu timer as collect uses it (harness.measure(timer="gpu"): each launch alone, CUPTI
     durations); twice, and the times of pass 1 are printed so two processes can be compared.
and prints, per method, how well its two passes agree: the Spearman correlation of the config
times, and the regret in pass 2 of pass 1's best (1.0 = the same best).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())


def spearman(a, b):
    """Rank correlation of two equally long lists (no tie correction: times rarely tie)."""
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for pos, i in enumerate(order):
            r[i] = pos
        return r
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def agreement(p1, p2):
    """How two passes over the same configs agree."""
    best1 = min(range(len(p1)), key=lambda i: p1[i])
    return {"spearman": round(spearman(p1, p2), 3),
            "regret_of_pass1_best": round(p2[best1] / min(p2), 4),
            "min_us": [round(min(p1), 3), round(min(p2), 3)],
            "median_over_min": [round(statistics.median(p1) / min(p1), 3), round(statistics.median(p2) / min(p2), 3)]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases")
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--methods", default="A,B,C")
    args = ap.parse_args()
    import mlx.core as mx

    from zmlx_pipeline.kernels.harness import Launcher, input_sets
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.kernels.timing import time_launches

    methods = args.methods.split(",")
    prof = None
    if "C" in methods:
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile
            torch.cuda.init()
            prof = (profile, ProfilerActivity)
        except Exception as exc:  # noqa: BLE001
            print(json.dumps({"cupti": f"unavailable: {exc}"}), flush=True)
    rotate = 2 * 50 * 2**20
    results = []
    for case in json.load(open(args.cases)):
        spec = get_kernel(case["kernel"])
        L = Launcher(spec, "cuda")
        shape, dt, cfgs = case["shape"], case["dtype"], case["configs"]
        sets = input_sets(spec, shape, dt, 11, rotate)
        p = len(sets)
        bound = [L.bind(c, shape, dt) for c in cfgs]
        for b in bound:  # compile
            mx.eval(b(sets[0]))
        mx.synchronize()
        out = {"kernel": case["kernel"], "shape": shape, "configs": len(cfgs)}
        t0 = time.time()
        if "A" in methods:
            passes = []
            for _ in range(2):
                passes.append([time_launches(lambda i, b=b: b(sets[i % p]), warmup=3, samples=5,
                                             max_chain=128, period=p).median_us for b in bound])
            out["A"] = agreement(*passes)
            stored = case.get("stored")
            out["A"]["stored_vs_pass1"] = agreement(stored, passes[0]) if stored and len(stored) == len(cfgs) else None
        out["A_s"] = round(time.time() - t0, 1)
        t0 = time.time()
        if "B" in methods:
            def chain(b, n):
                outs = [b(sets[i % p]) for i in range(n)]
                t = time.perf_counter()
                mx.eval(outs)
                mx.synchronize()
                return time.perf_counter() - t
            n = 128
            for b in bound:  # warm the two chain lengths' graphs
                chain(b, n)
                chain(b, 2 * n)
            passes = []
            for _ in range(2):
                samples = [[] for _ in bound]
                order = list(range(len(bound)))
                for _ in range(args.rounds):
                    random.shuffle(order)
                    for j in order:
                        s = chain(bound[j], n)
                        d = chain(bound[j], 2 * n)
                        samples[j].append((d - s) / n * 1e6)
                passes.append([statistics.median(v) for v in samples])
            out["B"] = agreement(*passes)
        out["B_s"] = round(time.time() - t0, 1)
        t0 = time.time()
        if "C" in methods and prof is not None:
            profile, Act = prof
            passes = []
            names = set()
            for _ in range(2):
                times = []
                for b in bound:
                    outs = [b(sets[i % p]) for i in range(64)]
                    with profile(activities=[Act.CUDA]) as pr:
                        mx.eval(outs)
                        mx.synchronize()
                    evs = [e for e in pr.events() if getattr(e, "device_time", 0) > 0]
                    names |= {e.name for e in evs}
                    times.append(statistics.median(e.device_time for e in evs) if evs else float("nan"))
                passes.append(times)
            ok = all(t == t for t in passes[0] + passes[1])
            out["C"] = agreement(*passes) if ok else {"failed": True}
            out["C_names"] = sorted(names)[:2]
            out["C_pass1_us"] = [round(t, 3) for t in passes[0][:10]]
        out["C_s"] = round(time.time() - t0, 1)
        t0 = time.time()
        if "G" in methods:
            from zmlx_pipeline.kernels.harness import measure
            passes = []
            for _ in range(2):
                passes.append([measure(L, c, shape, dt, rotate_bytes=rotate, timer="gpu").timing.median_us for c in cfgs])
            out["G"] = agreement(*passes)
            out["G_us"] = [round(t, 3) for t in passes[0]]
            out["G_spread"] = None
        out["G_s"] = round(time.time() - t0, 1)
        print(json.dumps(out), flush=True)
        results.append(out)
    if args.out:
        json.dump(results, open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
