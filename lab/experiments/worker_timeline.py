"""Timeline of a 1M stage's worker tasks: when the first starts, when the last ends, each worker's busy time and gaps.

    python lab/experiments/worker_timeline.py train|evaluate [STORE]

STORE (default /tmp/prof.duckdb): a copy of the bench's 1M store (`cp /work/bench/resampled.duckdb
/tmp/prof.duckdb`); `train` registers models in it. Wraps pool._worker_call in the parent, so each task
logs its start and end from inside its worker to /tmp/timeline.jsonl.
"""
import os, sys, time, json
T0 = time.time()
LOG = "/tmp/timeline.jsonl"

def logged_call(meta, path, fn, args):
    from zmlx_pipeline.models import pool
    s = time.time()
    out = pool._real_worker_call(meta, path, fn, args) if hasattr(pool, "_real_worker_call") else pool._worker_call(meta, path, fn, args)
    with open(LOG, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "start": s, "end": time.time(), "fn": fn.__name__, "kernel": meta.kernel}) + "\n")
    return out

if __name__ == "__main__":
    if os.path.exists(LOG): os.remove(LOG)
    from zmlx_pipeline.models import evaluate as ev, pool
    from zmlx_pipeline.data.store import Store
    t_imp = time.time()
    pool._worker_call = logged_call
    stage = sys.argv[1]
    with Store(sys.argv[2] if len(sys.argv) > 2 else "/tmp/prof.duckdb") as store:
        if stage == "train":
            from zmlx_pipeline.models.train import train_models
            train_models(store, models_dir="/tmp/tl_models")
        else:
            ev.evaluate(store, "shapes")
    t_end = time.time()
    rows = [json.loads(l) for l in open(LOG)]
    first = min(r["start"] for r in rows); last = max(r["end"] for r in rows)
    busy = sum(r["end"] - r["start"] for r in rows)
    print(f"{stage}: imports {t_imp-T0:.1f}s, first task at {first-T0:.1f}s, last task end {last-T0:.1f}s, end {t_end-T0:.1f}s; "
          f"task time {busy:.1f}s over {len(rows)} tasks; 2 workers x (last-first) = {2*(last-first):.1f}s")
    by = {}
    for r in rows: by.setdefault(r["pid"], []).append(r)
    for pid, rs in by.items():
        rs.sort(key=lambda r: r["start"])
        gaps = sum(max(0, b["start"] - a["end"]) for a, b in zip(rs, rs[1:]))
        print(f"  worker {pid}: first {rs[0]['start']-T0:.1f}s last end {rs[-1]['end']-T0:.1f}s busy {sum(r['end']-r['start'] for r in rs):.1f}s gaps {gaps:.1f}s")
    tail = sorted(rows, key=lambda r: r["end"])[-3:]
    for r in tail: print("  tail:", r["kernel"], r["fn"], f"{r['start']-T0:.1f}-{r['end']-T0:.1f}")
