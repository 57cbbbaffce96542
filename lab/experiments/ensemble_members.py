"""Scores of the ensemble with and without extra members, per kernel (the ensemble_members-*.txt results)."""
import sys, time, math
from pathlib import Path
import polars as pl
from threadpoolctl import threadpool_limits
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models import cv_ensemble, variants
from zmlx_pipeline.models.evaluate import evaluate_kernel, kernel_features_of
variants.MODEL_VARIANTS["ens_top"] = lambda f: cv_ensemble.CVEnsembleRanker(f, variants.ENSEMBLE_MEMBERS + ("gbr_rel_top",), variants.ENSEMBLE_HEDGES, name="ens_top")
variants.MODEL_VARIANTS["ens_rel"] = lambda f: cv_ensemble.CVEnsembleRanker(f, variants.ENSEMBLE_MEMBERS + ("gbr_rel",), variants.ENSEMBLE_HEDGES, name="ens_rel")
kernels = sys.argv[1].split(',')
models = sys.argv[2].split(',')
split = sys.argv[3]
with Store('/tmp/dense.duckdb', read_only=True) as store:
    feats = kernel_features_of(store, kernels=kernels)
for k, f in feats.items():
    for m in models:
        t0 = time.time()
        with threadpool_limits(1):
            pc = evaluate_kernel(f, split, ks=(1, 3), models=[m], baselines=False)
        g = pc.filter(pl.col('device_id').is_in(['nvidia-h100-sxm', 'nvidia-h200']))
        gm = lambda s: math.exp(float(s.log().mean()))
        print(f"{split:7s} {k:12s} {m:10s} h100+h200 {g.height} @1 {gm(g['r1']):.4f} @3 {gm(g['r3']):.4f} | all6 {pc.height} @1 {gm(pc['r1']):.4f} @3 {gm(pc['r3']):.4f}  {time.time()-t0:.0f}s", flush=True)
