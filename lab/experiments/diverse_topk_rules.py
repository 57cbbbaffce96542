import polars as pl, numpy as np, json, sys, glob
CASE = ["device_id", "kernel", "dtype", "shape_key"]
DEV = ["nvidia-h100-sxm", "nvidia-h200"]

def topk_plain(scores, cfgs, k):
    return list(np.argsort(scores, kind="stable")[:k])

def topk_diverse(scores, cfgs, k, d=2):
    order = np.argsort(scores, kind="stable")
    picked = [order[0]]
    for j in order[1:]:
        if len(picked) == k: break
        if all(sum(cfgs[j][p] != cfgs[q][p] for p in cfgs[j]) >= d for q in picked):
            picked.append(j)
    for j in order:
        if len(picked) == k: break
        if j not in picked: picked.append(j)
    return picked

rules = {"plain": topk_plain, "div2": lambda s, c, k: topk_diverse(s, c, k, 2), "div3": lambda s, c, k: topk_diverse(s, c, k, 3)}
for path in sorted(glob.glob("/tmp/selection/shapes-base-*.parquet")):
    df = pl.read_parquet(path).filter(pl.col("device_id").is_in(DEV))
    res = {r: {1: [], 3: [], 5: []} for r in rules}
    for key, g in df.group_by(CASE):
        t = g["median_us"].to_numpy(); s = g["_s"].to_numpy()
        cfgs = [json.loads(c) for c in g["config"].to_list()]
        best = t.min()
        for r, fn in rules.items():
            for k in (1, 3, 5):
                idx = fn(s, cfgs, k)
                res[r][k].append(t[idx].min() / best)
    kern = path.split("shapes-base-")[1][:-8]
    line = f"{kern:12s} n={len(res['plain'][1]):4d} "
    for r in rules:
        line += f"| {r}: " + " ".join(f"{np.exp(np.mean(np.log(res[r][k]))):.4f}" for k in (1, 3, 5)) + " "
    print(line)
