"""Held-out ensemble scores per kernel, fitted as evaluate fits them, with the selection patched by
selection_averaging (AVG_TOL=0: the unpatched selection). Writes /tmp/selection/{SPLIT}-{TAG}-{kernel}.parquet."""
import sys, os, polars as pl
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import selection_averaging  # noqa: patches the selection
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models.evaluate import kernel_features_of
from zmlx_pipeline.models.folds import folds, fold_rows as _fold_rows
from zmlx_pipeline.models.variants import make_ranker
from zmlx_pipeline.models.features import CASE
from concurrent.futures import ProcessPoolExecutor
from threadpoolctl import threadpool_limits
TAG = os.environ.get("TAG", "x"); SPLIT = os.environ.get("SPLIT", "shapes")
def one(kernel):
    with threadpool_limits(1):
        st = Store('/work/bench/committed.duckdb', read_only=True)
        f = kernel_features_of(st, [kernel], None)[kernel]
        st.close()
        out = []
        for i, (name, tr, te) in enumerate(folds(f.frame, SPLIT)):
            train, test = _fold_rows(f.frame, SPLIT, tr, te)
            if train.is_empty() or test.is_empty():
                continue
            seen = test["device_id"].is_in(train["device_id"].unique().to_list())
            r = make_ranker(f, "ensemble"); r.only = "seen" if seen.all() else "unseen" if not seen.any() else None
            s = r.fit(train).score(test)
            out.append(test.select(*CASE, "config_key", "config", "median_us").with_columns(pl.Series("_s", s), pl.lit(name).alias("fold")))
        pl.concat(out).write_parquet(f"/tmp/selection/{SPLIT}-{TAG}-{kernel}.parquet")
        return kernel
if __name__ == "__main__":
    with ProcessPoolExecutor(2) as ex:
        for k in ex.map(one, sys.argv[1:]):
            pass
