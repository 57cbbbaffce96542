"""Store per-row test scores of each method on every outer fold, so combos can be scored offline.

python run_scores.py METHOD[,METHOD...] SPLIT [KERNELS]
"""
import os, sys, time
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np
import polars as pl
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import variants  # noqa: registers experimental variants
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models.baselines import baseline_scores
from zmlx_pipeline.models.evaluate import kernel_features_of
from zmlx_pipeline.models.folds import folds, fold_rows as _fold_rows
from zmlx_pipeline.models.variants import make_ranker
from zmlx_pipeline.models.features import CASE

OURS = ["add_rmsnorm", "layernorm", "matmul", "moe_combine", "rmsnorm", "softmax", "swiglu", "topk_gating"]
KT = ["convolution_milo", "dedispersion_milo"]

if __name__ == "__main__":
    methods = sys.argv[1].split(",")
    split = sys.argv[2]
    kernels = sys.argv[3].split(",") if len(sys.argv) > 3 else (OURS + KT if split == "devices" else OURS)
    out = "/tmp/exp/scores"
    os.makedirs(out, exist_ok=True)
    with Store("/tmp/learn.duckdb", read_only=True) as store:
        feats = kernel_features_of(store, kernels)
    for method in methods:
        t0 = time.process_time(); w0 = time.perf_counter()
        parts = []
        for kernel, f in feats.items():
            tk = time.process_time()
            for i, (name, trf, tef) in enumerate(folds(f.frame, split)):
                train, test = _fold_rows(f.frame, split, trf, tef)
                if train.is_empty() or test.is_empty():
                    continue
                base = test.select(*CASE, "config_key", "median_us").with_columns(pl.lit(name).alias("fold"))
                with threadpool_limits(1):
                    if method == "baselines":
                        for b, s in baseline_scores(f, train, test).items():
                            parts.append(base.with_columns(pl.lit(b).alias("method"), s.cast(pl.Float64).alias("score")))
                        continue
                    r = make_ranker(f, method)
                    if hasattr(r, "only"):
                        seen = test["device_id"].is_in(train["device_id"].unique().to_list())
                        r.only = "seen" if seen.all() else "unseen" if not seen.any() else None
                    s = r.fit(train).score(test)
                parts.append(base.with_columns(pl.lit(method).alias("method"), pl.Series("score", np.asarray(s, float))))
            print(f"  {method} {split} {kernel}: cpu {time.process_time() - tk:.1f} s", flush=True)
        pl.concat(parts).write_parquet(f"{out}/{split}-{method}.parquet")
        print(f"{method} {split}: cpu {time.process_time() - t0:.1f} s wall {time.perf_counter() - w0:.1f} s", flush=True)
