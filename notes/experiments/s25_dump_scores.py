"""Dump held-out-shape ensemble scores per kernel (as evaluate computes them) for offline top-k rule experiments."""
import sys, polars as pl
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models.evaluate import kernel_features_of, folds, _fold_rows
from zmlx_pipeline.models.estimators import make_ranker
from zmlx_pipeline.models.features import CASE
from concurrent.futures import ProcessPoolExecutor
from threadpoolctl import threadpool_limits

def one(kernel):
    with threadpool_limits(1):
        st = Store('/work/bench/committed.duckdb', read_only=True)
        f = kernel_features_of(st, [kernel], None)[kernel]
        st.close()
        frame = f.frame
        out = []
        for i, (name, tr, te) in enumerate(folds(frame, "shapes")):
            train, test = _fold_rows(frame, "shapes", tr, te)
            if train.is_empty() or test.is_empty():
                continue
            r = make_ranker(f, "ensemble"); r.only = "seen"
            s = r.fit(train).score(test)
            out.append(test.select(*CASE, "config_key", "config", "median_us").with_columns(pl.Series("_s", s), pl.lit(name).alias("fold")))
        pl.concat(out).write_parquet(f"/tmp/s25/scores-{kernel}.parquet")
        return kernel

kernels = sys.argv[1:]
with ProcessPoolExecutor(2) as ex:
    for k in ex.map(one, kernels):
        print("done", k, flush=True)
