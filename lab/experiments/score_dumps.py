import sys, glob, polars as pl, numpy as np
CASE = ["device_id", "kernel", "dtype", "shape_key"]
split, tags = sys.argv[1], sys.argv[2:]
kernels = sorted({p.split("-")[-1][:-8] for p in glob.glob(f"/tmp/selection/{split}-{tags[0]}-*.parquet")})
for k in kernels:
    line = f"{k:18s}"
    for tag in tags:
        df = pl.read_parquet(f"/tmp/selection/{split}-{tag}-{k}.parquet")
        if split == "shapes":
            df = df.filter(pl.col("device_id").is_in(["nvidia-h100-sxm", "nvidia-h200"]))
        df = df.sort([*CASE, "_s", "config_key"], nulls_last=True).with_columns(pl.int_range(1, pl.len()+1).over(CASE).alias("rank"))
        per = df.group_by(CASE).agg(*[(pl.col("median_us").filter(pl.col("rank")<=j).min()/pl.col("median_us").min()).alias(f"r{j}") for j in (1,3,5)])
        g = [float(np.exp(per[f"r{j}"].log().mean())) for j in (1, 3, 5)]
        line += f" | {tag}: {g[0]:.4f} {g[1]:.4f} {g[2]:.4f}"
    print(line)
