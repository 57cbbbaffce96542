"""Each ensemble member alone on the selection's inner shape folds, the sparse devices' cases apart from the others.

    PYTHONPATH=../.. python sparse_members_inner.py STORE KERNEL MEMBER,MEMBER,...

For every outer fold of the held-out-shapes split, the members are fitted as the ensemble's seen-device
selection fits them (CVEnsembleRanker._fold_scores: inner shape folds of the outer training rows, each fit on
its 6,000-row sample), with the seen devices' features (`seen`) and with the launch geometry too (`geo`), and each
member's regret@1 and @3 is pooled over the inner cases of the sparse devices (cv_ensemble.sparse_devices) and of
the others. No outer test row is read.
"""

import sys

import numpy as np

from row_geometry_inner import _features, _inner
from zmlx_pipeline.models.cv_ensemble import SPARSE_SHARE, CVEnsembleRanker, sparse_devices
from zmlx_pipeline.models.evaluate import fit_threads
from zmlx_pipeline.models.folds import folds


def main(db: str, kernel: str, members: list[str]) -> None:
    full = _features(db, kernel, "default")
    pooled: dict[tuple, list[np.ndarray]] = {}
    with fit_threads():
        for outer in range(len(folds(full.frame, "shapes"))):
            sub = _inner(full, "shapes", outer)
            sparse = sparse_devices(sub.frame, SPARSE_SHARE)
            for features, tag in ((sub.for_seen_devices(), "seen"), (sub, "geo")):
                for _, scores, regret, _, _ in CVEnsembleRanker(features, members, ())._fold_scores(sub.frame, "shapes"):
                    mask = np.isin(regret.case_device, sparse)
                    for m in members:
                        for k in (1, 3):
                            per_case = regret.per_case(scores[m], [k])
                            pooled.setdefault((tag, m, k, "sparse"), []).append(per_case[mask])
                            pooled.setdefault((tag, m, k, "dense"), []).append(per_case[~mask])
    for (tag, m, k, group), parts in sorted(pooled.items()):
        logs = np.concatenate(parts)
        print(f"{kernel} {tag:5} {m:16} @{k} {group:6} cases {logs.size:5d} {np.exp(logs.mean()):.4f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3].split(","))
