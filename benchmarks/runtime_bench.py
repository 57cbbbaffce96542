"""Runtime figures: predicted_config latency (warmed, many distinct shapes) next to asking the sklearn model
directly, the import time of zmlx_pipeline.runtime in fresh processes, and the wall time of a CLI `lookup`.

    python benchmarks/runtime_bench.py [--bundle DIR_OR_URL] [--shapes 20000] [--imports 15] [--cli 10] [--json]

Latency: every (kernel, shape, dtype, device) is asked once to warm it, then each call is timed on
its own with perf_counter_ns, several rounds over all shapes in shuffled order; the clock's own
cost (an empty timed call) is measured the same way and subtracted. The sklearn figures fit the
default model on the committed shards (data/) and time, per case, (a) the Pipeline's predict on a
prepared feature frame of the case's legal configs, (b) the whole path a runtime without bundles
would take: feature rows, the ranker's score, the argmin.

Import time: `import zmlx_pipeline.runtime` timed inside fresh interpreters, with bytecode caches
written (a normal install) and without (PYTHONDONTWRITEBYTECODE=1, every module compiled).

Bundle forms: the bundle rewritten as plain JSON (schema 4; 2 for an older bundle) and compact (5; 3, gzip), in one run and
interleaved so a busy machine slows both alike: bytes stored, verifying load, the first answer for one device
(its table inflated and parsed), warmed lookups, and the first answer in a fresh process; quote the ratios.

CLI lookup: `python -m zmlx_pipeline lookup` (an answer, and a misspelt kernel's error) timed from
process start to exit, with bytecode cached (one untimed run writes it) and without, next to a bare
interpreter's start (`python -c pass`, site packages included) timed the same way: on a busy machine
only the difference means much.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def shapes_for(bundle, n, rng):
    """n distinct (kernel, shape, dtype, device) lookups over the bundle's kernels, dims within their grids."""
    cases, seen = [], set()
    kernels = bundle.kernels
    devices = sorted(bundle.tables)
    measured = bundle.manifest.get("measured_devices") or devices[:1]
    while len(cases) < n:
        kernel = rng.choice(sorted(kernels))
        meta = kernels[kernel]
        reps = list(meta["buckets"].values()) or [{d: 1024 for d in meta["dims"]}]
        lo = {d: max(1, min(r[d] for r in reps) // 2) for d in meta["dims"]}
        hi = {d: max(r[d] for r in reps) * 2 for d in meta["dims"]}
        shape = {d: rng.randint(lo[d], hi[d]) for d in meta["dims"]}
        device = rng.choice(measured) if rng.random() < 0.5 else rng.choice(devices)
        dtype = rng.choice(meta.get("dtypes") or ["float16"])
        key = (kernel, tuple(shape.items()), dtype, device)
        if key not in seen:
            seen.add(key)
            cases.append((kernel, shape, dtype, device))
    return cases


def bench_lookup(bundle_arg, n, rounds, rng):
    from zmlx_pipeline.runtime import load_bundle, lookup, predicted_config

    lookup.clear_cache()

    bundle = load_bundle(bundle_arg, strict=True) if bundle_arg else load_bundle(
        ROOT / "zmlx_pipeline" / "runtime" / "default_bundle", strict=True)
    cases = shapes_for(bundle, n, rng)
    clock = time.perf_counter_ns
    t0 = clock()
    for kernel, shape, dtype, device in cases:
        predicted_config(kernel, shape, dtype, device)
    first_us = (clock() - t0) / len(cases) / 1e3
    evidence = {}
    for kernel, shape, dtype, device in cases:
        e = predicted_config(kernel, shape, dtype, device).evidence
        evidence[e] = evidence.get(e, 0) + 1
    empty = []
    lat = []
    order = list(range(len(cases)))
    for _ in range(rounds):
        rng.shuffle(order)
        for i in order:
            kernel, shape, dtype, device = cases[i]
            a = clock()
            b = clock()
            empty.append(b - a)
            a = clock()
            predicted_config(kernel, shape, dtype, device)
            b = clock()
            lat.append(b - a)
    overhead = statistics.median(empty)
    net = [max(0, v - overhead) for v in lat]
    t0 = clock()
    for _ in range(rounds):
        for kernel, shape, dtype, device in cases:
            predicted_config(kernel, shape, dtype, device)
    loop_us = (clock() - t0) / (rounds * len(cases)) / 1e3
    return {
        "bundle": bundle.bundle_id, "lookups": len(cases), "rounds": rounds, "evidence": evidence,
        "first_call_mean_us": round(first_us, 2),
        "p50_us": round(percentile(net, 0.50) / 1e3, 3), "p99_us": round(percentile(net, 0.99) / 1e3, 3),
        "raw_p50_us": round(percentile(lat, 0.50) / 1e3, 3), "raw_p99_us": round(percentile(lat, 0.99) / 1e3, 3),
        "clock_overhead_us": round(overhead / 1e3, 3), "loop_mean_us": round(loop_us, 3),
    }


def bench_sklearn(cases_n, rng):
    """Per-case latency of asking the model itself (default variant, fitted on data/)."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    from zmlx_pipeline.data.shards import ingest_shards
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.kernels.spec import Limits
    from zmlx_pipeline.models.variants import fit_kernel_model
    from zmlx_pipeline.models.features import store_features
    from zmlx_pipeline.publish.predict import all_devices_frame, candidate_rows, featurize

    kernel = "rmsnorm"
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "s.duckdb") as store:
        ingest_shards(store, [ROOT / "data"])
        features = store_features(store, [kernel])[kernel]
        devices = all_devices_frame(store)
    spec = get_kernel(kernel)
    with threadpool_limits(limits=1):
        ranker = fit_kernel_model(features)
        # the direct sklearn call: the first Pipeline-backed member of the ensemble (or the model itself)
        members = list(getattr(ranker, "rankers", {}).values()) or list(getattr(ranker, "members", [])) or [ranker]
        gbr = next(m for m in members if hasattr(m, "pipeline"))
        limits = Limits(max_threads=1024, simd_width=32, tg_mem_bytes=49152)
        cases = []
        for _ in range(cases_n):
            shape = {"rows": rng.choice([1, 2, 4, 8, 16, 64, 256, 1024, 4096, 16384]),
                     "cols": rng.choice([512, 1024, 2048, 4096, 8192, 16384])}
            cases.append(("nvidia-h200", "float16", shape, spec.legal_configs(shape, "float16", limits)))
        prepared = [featurize(features, candidate_rows(features, [c]), devices) for c in cases]
        cols = list(gbr.features.features)
        predict, full = [], []
        for c, feats in zip(cases, prepared):
            x = feats.select(cols)
            a = time.perf_counter_ns()
            gbr.pipeline.predict(x)
            predict.append(time.perf_counter_ns() - a)
            a = time.perf_counter_ns()
            f2 = featurize(features, candidate_rows(features, [c]), devices)
            int(np.argmin(ranker.score(f2)))
            full.append(time.perf_counter_ns() - a)
    return {
        "kernel": kernel, "cases": len(cases), "configs_per_case_mean": round(statistics.mean(len(c[3]) for c in cases), 1),
        "model": type(ranker).__name__,
        "pipeline_predict_p50_us": round(percentile(predict, 0.5) / 1e3, 1),
        "pipeline_predict_p99_us": round(percentile(predict, 0.99) / 1e3, 1),
        "features_and_ranker_p50_us": round(percentile(full, 0.5) / 1e3, 1),
        "features_and_ranker_p99_us": round(percentile(full, 0.99) / 1e3, 1),
    }


def bench_import(runs):
    """Import time in fresh interpreters: the package alone, and every public part (their modules load on use)."""
    heavy = "sorted(m for m in ('duckdb', 'polars', 'sklearn', 'numpy', 'mlx') if m in sys.modules)"
    statements = {
        "package": "import zmlx_pipeline.runtime",
        "every_part": "from zmlx_pipeline.runtime import predicted_config, candidates, load_bundle, autotune, "
                      "get_device_profile, get_current_device_profile, get_threadgroup_candidates_for_shape",
    }
    out = {}
    with tempfile.TemporaryDirectory() as pycache:
        for label, extra in (("bytecode_cached", {"PYTHONPYCACHEPREFIX": pycache, "PYTHONDONTWRITEBYTECODE": ""}),
                             ("no_bytecode", {"PYTHONDONTWRITEBYTECODE": "1"})):
            env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
            if not env["PYTHONDONTWRITEBYTECODE"]:
                del env["PYTHONDONTWRITEBYTECODE"]
                subprocess.run([sys.executable, "-c", statements["every_part"]], env=env, check=True)
            for what, stmt in statements.items():
                code = (f"import time, sys; t = time.perf_counter(); {stmt}; d = time.perf_counter() - t; "
                        f"print(d, {heavy})")
                times, loaded = [], ""
                for _ in range(runs):
                    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                         check=True)
                    value, loaded = res.stdout.split(" ", 1)
                    times.append(float(value) * 1e3)
                out[f"{what}, {label}"] = {"runs": runs, "min_ms": round(min(times), 2),
                                           "median_ms": round(statistics.median(times), 2),
                                           "max_ms": round(max(times), 2), "heavy_modules_loaded": loaded.strip()}
    return out


def _first_answer_ms(directory, case):
    """Load a bundle into a clean runtime and answer one lookup: (load ms, first answer ms)."""
    from zmlx_pipeline.runtime import bundle, load_bundle, lookup, predicted_config

    bundle.reset()
    lookup.clear_cache()
    t0 = time.perf_counter()
    load_bundle(directory, strict=True)
    t1 = time.perf_counter()
    predicted_config(*case)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3


def bench_forms(bundle_arg, n, rounds, runs, seed):
    """The same bundle as plain JSON and compact, measured side by side (see the module's docstring)."""
    from zmlx_pipeline.publish.writer import rewrite_bundle
    from zmlx_pipeline.runtime.bundle import read_dir

    src = bundle_arg or ROOT / "zmlx_pipeline" / "runtime" / "default_bundle"
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {form: rewrite_bundle(src, Path(tmp) / form, compact=form == "compact")[1] for form in ("json", "compact")}
        bundle = read_dir(dirs["json"])
        device = (bundle.manifest.get("measured_devices") or sorted(bundle.tables))[0]
        kernel = sorted(bundle.kernels)[0]
        meta = bundle.kernels[kernel]
        shape = next(iter(meta["buckets"].values()), None) or {d: 1024 for d in meta["dims"]}
        case = (kernel, dict(shape), (meta.get("dtypes") or ["float16"])[0], device)
        fresh = ("import sys, time; t = time.perf_counter(); "
                 "from zmlx_pipeline.runtime import load_bundle, predicted_config; "
                 f"load_bundle(sys.argv[1], strict=True); predicted_config(*{case!r}); "
                 "print((time.perf_counter() - t) * 1e3)")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        samples = {form: {"load_ms": [], "first_answer_ms": [], "fresh_process_ms": []} for form in dirs}
        for _ in range(runs):
            for form, directory in dirs.items():
                load, first = _first_answer_ms(directory, case)
                samples[form]["load_ms"].append(load)
                samples[form]["first_answer_ms"].append(first)
                res = subprocess.run([sys.executable, "-c", fresh, str(directory)], env=env, capture_output=True,
                                     text=True, check=True)
                samples[form]["fresh_process_ms"].append(float(res.stdout.strip().splitlines()[-1]))
        for _ in range(3):  # warmed lookups, alternating forms; each time the same cases in a fresh runtime
            for form, directory in dirs.items():
                lk = bench_lookup(directory, n, rounds, random.Random(seed))
                samples[form]["p50_us"] = [*samples[form].get("p50_us", []), lk["p50_us"]]
                samples[form]["p99_us"] = [*samples[form].get("p99_us", []), lk["p99_us"]]
        for form, directory in dirs.items():
            stored = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
            out[form] = {"bytes": stored, **{k: round(statistics.median(v), 3) for k, v in samples[form].items()}}
    out["compact_over_json"] = {k: round(out["compact"][k] / out["json"][k], 3) if out["json"][k] else None
                                for k in out["json"]}
    out["case"] = list(case)
    return out


#: the CLI lookups timed: an answer (exit 0) and a misspelt kernel (exit 1, the error path)
CLI_LOOKUPS = {
    "answer": ["rmsnorm", "--shape", "rows=4096,cols=4096", "--dtype", "float16", "--device", "apple-m3-max-40c"],
    "unknown_kernel": ["rmsnrom", "--shape", "rows=4096,cols=4096", "--device", "apple-m3-max-40c"],
}


def bench_cli(runs, bundle_arg):
    """Wall time of `python -m zmlx_pipeline lookup ...` in fresh processes (start to exit), with bytecode
    cached (a normal install) and without (PYTHONDONTWRITEBYTECODE=1, every module compiled)."""
    extra = ["--bundle", str(bundle_arg)] if bundle_arg else []
    out = {}
    with tempfile.TemporaryDirectory() as pycache:
        for cache_label, cache_env in (("bytecode_cached", {"PYTHONPYCACHEPREFIX": pycache}),
                                       ("no_bytecode", {"PYTHONDONTWRITEBYTECODE": "1"})):
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env.update({"PYTHONPATH": str(ROOT), **cache_env})
            commands = {"interpreter only (python -c pass)": [sys.executable, "-c", "pass"],
                        **{label: [sys.executable, "-m", "zmlx_pipeline", "lookup", *args, *extra]
                           for label, args in CLI_LOOKUPS.items()}}
            for label, cmd in commands.items():
                first = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)  # writes the bytecode
                times = []
                for _ in range(runs):
                    t = time.perf_counter()
                    subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
                    times.append((time.perf_counter() - t) * 1e3)
                out[f"{label}, {cache_label}"] = {"runs": runs, "exit_code": first.returncode,
                                                  "min_ms": round(min(times), 1),
                                                  "median_ms": round(statistics.median(times), 1),
                                                  "max_ms": round(max(times), 1)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=None, help="bundle dir, publish dir or URL (default: the shipped one)")
    parser.add_argument("--shapes", type=int, default=20000, help="distinct lookups")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds over all lookups")
    parser.add_argument("--imports", type=int, default=15, help="fresh interpreters per import measurement")
    parser.add_argument("--cli", type=int, default=10, help="fresh processes per CLI lookup measurement")
    parser.add_argument("--sklearn-cases", type=int, default=200)
    parser.add_argument("--forms", type=int, default=9, help="runs per bundle form (JSON against compact); 0 skips")
    parser.add_argument("--skip-sklearn", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    result = {"python": sys.version.split()[0], "cpus": os.cpu_count(),
              "lookup": bench_lookup(args.bundle, args.shapes, args.rounds, rng),
              "import": bench_import(args.imports), "cli": bench_cli(args.cli, args.bundle)}
    if args.forms:
        result["forms"] = bench_forms(args.bundle, min(args.shapes, 5000), args.rounds, args.forms, args.seed)
    if not args.skip_sklearn:
        result["sklearn"] = bench_sklearn(args.sklearn_cases, rng)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    lk = result["lookup"]
    print(f"predicted_config, {lk['lookups']} distinct lookups x {lk['rounds']} rounds (bundle {lk['bundle']}, "
          f"evidence {lk['evidence']}):")
    print(f"  warmed p50 {lk['p50_us']} us, p99 {lk['p99_us']} us (clock cost {lk['clock_overhead_us']} us subtracted; "
          f"raw p50 {lk['raw_p50_us']}, p99 {lk['raw_p99_us']}); mean in a tight loop {lk['loop_mean_us']} us; "
          f"first call {lk['first_call_mean_us']} us")
    if "sklearn" in result:
        sk = result["sklearn"]
        print(f"sklearn model directly ({sk['model']}, {sk['kernel']}, {sk['cases']} cases, "
              f"{sk['configs_per_case_mean']} configs each):")
        print(f"  Pipeline.predict on prepared features p50 {sk['pipeline_predict_p50_us']} us, "
              f"p99 {sk['pipeline_predict_p99_us']} us")
        print(f"  features + ranker + argmin p50 {sk['features_and_ranker_p50_us']} us, "
              f"p99 {sk['features_and_ranker_p99_us']} us")
    if "forms" in result:
        fm = result["forms"]
        print(f"bundle forms (medians of {args.forms} interleaved runs; first answer: {fm['case']}):")
        for form in ("json", "compact"):
            f = fm[form]
            print(f"  {form:8s} {f['bytes']:>9d} bytes, load {f['load_ms']} ms, first answer {f['first_answer_ms']} ms, "
                  f"fresh process {f['fresh_process_ms']} ms, warmed p50 {f['p50_us']} us, p99 {f['p99_us']} us")
        print(f"  compact / json: {fm['compact_over_json']}")
    for label, im in result["import"].items():
        print(f"import zmlx_pipeline.runtime [{label}] ({im['runs']} fresh processes): min {im['min_ms']} ms, "
              f"median {im['median_ms']} ms, max {im['max_ms']} ms; heavy modules loaded: {im['heavy_modules_loaded']}")
    for label, cl in result["cli"].items():
        what = label if label.startswith("interpreter") else f"zmlx-pipeline lookup [{label}]"
        print(f"{what}, exit {cl['exit_code']} ({cl['runs']} fresh processes): "
              f"min {cl['min_ms']} ms, median {cl['median_ms']} ms, max {cl['max_ms']} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
