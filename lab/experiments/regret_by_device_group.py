"""Held-out regret of model variants, full-size GPUs apart from SM-limited ones (`@Nsm` device ids).

    python regret_by_device_group.py STORE SPLIT KERNELS MODELS    # e.g. STORE shapes topk_gating transfer,ensemble

Fits every fold as `evaluate` does (nested) and prints, per kernel and method (the baselines included), the
geometric mean regret@1 and @3 of the full-size GPUs' cases, of the SM-limited devices' cases and of all.
"""

import sys
import time

import polars as pl

from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models.evaluate import gather_folds, kernel_features_of, submit_kernel
from zmlx_pipeline.models.pool import KernelPool


def main() -> None:
    db, split, kernels, models = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4].split(",")
    with Store(db, read_only=True) as store:
        features = kernel_features_of(store, kernels)
    ks = (1, 3, 5)
    t0 = time.perf_counter()
    with KernelPool(features, None) as pool:
        futures = {k: submit_kernel(features[k], split, ks, tuple(models), True, pool=pool,
                                    together=split == "devices") for k in features}
        per = {k: gather_folds(futures[k], ks) for k in features}
    print(f"{split}, {time.perf_counter() - t0:.0f} s")
    geo = [pl.len().alias("cases"), pl.col("r1").log().mean().exp().alias("regret@1"),
           pl.col("r3").log().mean().exp().alias("regret@3")]
    with pl.Config(tbl_rows=100):
        for kernel, cases in per.items():
            cases = cases.with_columns(group=pl.when(pl.col("device_id").str.contains("@"))
                                       .then(pl.lit("sm-limited")).otherwise(pl.lit("full")))
            table = pl.concat([cases.group_by("method", "group").agg(geo),
                               cases.group_by("method").agg(geo).with_columns(group=pl.lit("all"))
                               .select("method", "group", "cases", "regret@1", "regret@3")])
            print(kernel)
            print(table.sort("group", "regret@1"))


if __name__ == "__main__":
    main()
