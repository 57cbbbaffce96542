"""The held-out cases `train` recorded in a store, full-size GPUs apart from SM-limited ones (`@Nsm`).

    python heldout_by_device_group.py STORE [METHOD]    # METHOD: the default model's name, `robust`

Per split and kernel: cases and geometric mean regret@1 and @3 of each group, read from `heldout_cases`
(no fit).
"""

import sys

import duckdb


def main() -> None:
    store, method = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "robust")
    con = duckdb.connect(store, read_only=True)
    rows = con.execute("""
        select split, kernel, case when device_id like '%@%' then 'sm-limited' else 'full' end as grp,
               count(*), exp(avg(ln(r1))), exp(avg(ln(r3)))
        from heldout_cases where method = ? group by all order by split, kernel, grp""", [method]).fetchall()
    print(f"{'split':8} {'kernel':12} {'group':10} {'cases':>5} {'@1':>7} {'@3':>7}")
    for split, kernel, group, n, r1, r3 in rows:
        print(f"{split:8} {kernel:12} {group:10} {n:5d} {r1:7.4f} {r3:7.4f}")


if __name__ == "__main__":
    main()
