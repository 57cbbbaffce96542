import os
import sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analyze as A
OURS, KT, FULL = A.OURS, A.KT, A.FULL
BASE = ["chip_default", "common_top10", "seed_candidates", "most_common_best", "nearest_shape", "other_device_best"]
cands = sys.argv[1].split(",")  # name=shapes_spec|devices_spec
sh = {}; dv = {}
for c in cands:
    name, rest = c.split("=", 1)
    s_spec, d_spec = rest.split("|")
    t = A.table("shapes", [f"{name}={s_spec}" if s_spec != name else s_spec], FULL, OURS, ks=(1, 3))
    sh[name] = {k: v for (_, k), v in t.items()}
    if d_spec != "-":
        t = A.table("devices", [f"{name}_d={d_spec}" if d_spec != name else d_spec], None, OURS + KT, ks=(1, 3, 5))
        dv[name] = {k: v for (_, k), v in t.items()}
bs = A.table("shapes", [b for b in BASE if b in A.load("shapes").columns], FULL, OURS, ks=(1, 3))
bd = A.table("devices", [b for b in BASE if b in A.load("devices").columns], None, OURS + KT, ks=(1, 3, 5))
import math
def best(tab, kern, i):
    vals = [(v[i], m) for (m, k), v in tab.items() if k == kern and not math.isnan(v[i])]
    return min(vals) if vals else (float("nan"), "-")
print("| kernel | " + " | ".join(f"{n} shapes @1/@3" for n in sh) + " | best baseline @1 / @3 |")
for k in OURS:
    b1, b3 = best(bs, k, 0), best(bs, k, 1)
    print(f"| {k} | " + " | ".join(f"{sh[n][k][0]:.3f} / {sh[n][k][1]:.3f}" for n in sh) + f" | {b1[0]:.3f} {b1[1]} / {b3[0]:.3f} {b3[1]} |")
print()
print("| kernel | " + " | ".join(f"{n} devices @1 (@3)" for n in dv) + " | best baseline @1 |")
for k in OURS:
    b1 = best(bd, k, 0)
    print(f"| {k} | " + " | ".join(f"{dv[n][k][0]:.3f} ({dv[n][k][1]:.3f})" for n in dv) + f" | {b1[0]:.3f} {b1[1]} |")
for k in KT:
    b1, b5 = best(bd, k, 0), best(bd, k, 2)
    print(f"| {k} @1/@5 | " + " | ".join(f"{dv[n][k][0]:.3f} / {dv[n][k][2]:.3f}" for n in dv) + f" | {b1[0]:.3f} {b1[1]} / {b5[0]:.3f} {b5[1]} |")
