"""Score stored per-row test scores: regret@k geomeans per kernel for methods and combos.

python analyze.py SPLIT method[,method...]   (combo syntax: il:a+b interleave, mean:a+b mean of case-relative)
"""
import sys, glob
import numpy as np
import polars as pl
CASE = ["device_id", "kernel", "dtype", "shape_key"]
FULL = ["nvidia-h100-sxm", "nvidia-h200"]
OURS = ["add_rmsnorm", "layernorm", "matmul", "moe_combine", "rmsnorm", "softmax", "swiglu", "topk_gating"]
KT = ["convolution_milo", "dedispersion_milo"]
_cache = {}

def load(split):
    if split not in _cache:
        fr = [pl.read_parquet(p) for p in sorted(glob.glob(f"/tmp/exp/scores/{split}-*.parquet"))]
        df = pl.concat(fr, how="vertical_relaxed")
        _cache[split] = df.pivot(on="method", index=[*CASE, "config_key", "median_us", "fold"], values="score")
    return _cache[split]

def rank(df, col):
    return df.select(pl.struct(col, "config_key").rank("ordinal").over(CASE).cast(pl.Float64)).to_series().to_numpy() \
        if False else df.with_columns(pl.col(col).fill_nan(None)).sort([*CASE, col, "config_key"], nulls_last=True) \
        .with_columns(pl.int_range(1, pl.len() + 1).over(CASE).alias("_r"))

def scores_of(df, spec):
    if spec.startswith("il:"):
        names = spec[3:].split("+")
        n = len(names)
        tmp = df.with_row_index("_i")
        ranks = []
        for j, m in enumerate(names):
            r = tmp.with_columns(pl.col(m).fill_nan(None)).sort([*CASE, m, "config_key"], nulls_last=True).with_columns(
                pl.int_range(0, pl.len()).over(CASE).alias("_r")).sort("_i")["_r"].to_numpy()
            ranks.append(r * n + j)
        return np.min(np.column_stack(ranks), axis=1).astype(float)
    if spec.startswith("mean:"):
        names = spec[5:].split("+")
        tot = 0
        for m in names:
            tot = tot + df.select(pl.col(m) - pl.col(m).min().over(CASE)).to_series().to_numpy()
        return tot
    return df[spec].to_numpy()

def regrets(df, s, ks=(1, 3, 5)):
    d = df.select(*CASE, "config_key", "median_us").with_columns(pl.Series("_s", s).fill_nan(None))
    d = d.filter(pl.col("_s").is_not_null().any().over(CASE))
    d = d.sort([*CASE, "_s", "config_key"], nulls_last=True).with_columns(pl.int_range(1, pl.len() + 1).over(CASE).alias("_r"))
    best = pl.col("median_us").min()
    return d.group_by(CASE).agg([(pl.col("median_us").filter(pl.col("_r") <= k).min() / best).alias(f"r{k}") for k in ks])

def gm(x):
    return float(np.exp(np.mean(np.log(x)))) if len(x) else float("nan")

def table(split, specs, subset=None, kernels=None, ks=(1, 3)):
    df = load(split)
    out = {}
    for spec in specs:
        if "=" in spec:
            name, body = spec.split("=", 1)
            df = df.with_columns(pl.Series(name, scores_of(df, body)))
            spec = name
        s = scores_of(df, spec)
        r = regrets(df, s)
        if subset:
            r = r.filter(pl.col("device_id").is_in(subset))
        for kernel in (kernels or sorted(r["kernel"].unique().to_list())):
            rk = r.filter(pl.col("kernel") == kernel)
            out[(spec, kernel)] = tuple(gm(rk[f"r{k}"].to_numpy()) for k in ks) + (rk.height,)
    return out

def show(split, specs, subset=None, kernels=None, ks=(1, 3)):
    t = table(split, specs, subset, kernels, ks)
    ks_ = list(ks)
    kernels = sorted({k for _, k in t}); specs = [x.split("=")[0] for x in specs]
    print(f"{split} subset={subset} " + " ".join(f"@{k}" for k in ks_))
    print(f"{'kernel':18s}" + "".join(f"{s[:22]:>24s}" for s in specs))
    for kern in kernels:
        row = f"{kern:18s}"
        for s in specs:
            v = t.get((s, kern))
            row += f"{'/'.join(f'{x:.3f}' for x in v[:-1]) if v else '-':>24s}"
        print(row)
    return t

if __name__ == "__main__":
    split = sys.argv[1]; specs = sys.argv[2].split(",")
    if split == "shapes":
        show(split, specs, FULL)
    elif split == "devices":
        show(split, specs, None, OURS, ks=(1, 3))
        show(split, specs, None, KT, ks=(1, 5))
