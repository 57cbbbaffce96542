"""How far a published answer travels: from which measured device, at what evidence, and with what time.

A device that was measured answers from its own data. One that was not answers from the measured
full chip nearest to it in memory bandwidth and cores (log distance), preferring one of its own
architecture family (same vendor and catalog `family`): the evidence is `predicted` when such a
sibling exists, `extrapolated` across families or vendors otherwise. Its predicted time is the
source device's, scaled by the roofline bound of the bucket's shape on each chip (runtime/roofline.py).

Expected regret of an extrapolated answer comes from leave-one-family-out folds: the ranker fitted
without every device of one family and scored on that family. With one family measured there is
no such fold, and the regret is None: nothing was validated across families.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

from zmlx_pipeline.runtime.roofline import bound_s, scale

EVIDENCE_SAME_FAMILY = "predicted"
EVIDENCE_OTHER_FAMILY = "extrapolated"


def family_key(row: Mapping[str, Any] | None) -> tuple[str, str]:
    """(vendor, family) of a device row, lower-cased; ("", "") when the row is silent."""
    row = row or {}
    return str(row.get("vendor") or "").lower(), str(row.get("family") or "").lower()


def _distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    out = 0.0
    for field in ("memory_bandwidth_gbps", "gpu_cores"):
        x, y = a.get(field), b.get(field)
        out += abs(math.log(float(x) / float(y))) if x and y else 10.0
    return out


def source_device(device: str, devices: Mapping[str, Mapping[str, Any]], measured: Iterable[str]) -> tuple[str, str] | None:
    """(source device id, evidence) for a device never measured; None when nothing was measured."""
    measured = sorted(m for m in measured if m in devices)
    if not measured:
        return None
    full = [m for m in measured if not devices[m].get("core_limited_from") and "@" not in m] or measured
    row = devices.get(device, {})
    mine = family_key(row)
    same = [m for m in full if family_key(devices[m]) == mine and mine != ("", "")]
    pool, evidence = (same, EVIDENCE_SAME_FAMILY) if same else (full, EVIDENCE_OTHER_FAMILY)
    return min(pool, key=lambda m: (_distance(row, devices[m]), m)), evidence


def scaled_time(time_us: float | None, src_row: Mapping[str, Any], dst_row: Mapping[str, Any],
                bytes_moved: float | None, flops: float | None) -> tuple[float | None, str | None]:
    """(the source's time on the destination chip, the bound that decided it), or (None, None)."""
    dst = bound_s(bytes_moved, flops, dst_row)
    return scale(time_us, bound_s(bytes_moved, flops, src_row), dst), (dst[1] if dst else None)


# ------------------------------------------------------------------------------------------
# work terms: a kernel spec's bytes_moved / flops as published polynomial terms


def work_terms(fn: Callable[[Mapping[str, int]], float], dims: Sequence[str],
               checks: Iterable[Mapping[str, int]]) -> list[dict] | None:
    """`fn` over the dims as multilinear terms {"dims": [...], "coef": c}, found by Moebius inversion of its
    values at the 0/1 corners and verified on `checks` (the kernel's grid shapes); None when `fn` is not
    multilinear in the dims (then no published time is moved to another shape)."""
    dims = list(dims)
    if len(dims) > 8:
        return None
    try:
        corner = {}
        for subset in itertools.chain.from_iterable(itertools.combinations(dims, r) for r in range(len(dims) + 1)):
            corner[subset] = float(fn({d: (1 if d in subset else 0) for d in dims}))
        terms = []
        for subset in corner:
            coef = sum((-1) ** (len(subset) - len(sub)) * corner[sub]
                       for r in range(len(subset) + 1) for sub in itertools.combinations(subset, r))
            if abs(coef) > 1e-12:
                terms.append({"dims": list(subset), "coef": coef})
        from zmlx_pipeline.runtime.roofline import work

        for shape in checks:
            want, got = float(fn(shape)), work(terms, shape)
            if got is None or abs(got - want) > 1e-9 * max(1.0, abs(want)):
                return None
    except (ArithmeticError, KeyError, TypeError, ValueError):
        return None
    return terms


def kernel_work(spec, dtype_bytes: Mapping[str, int], checks: Sequence[Mapping[str, int]]) -> dict[str, dict] | None:
    """Per dtype, the spec's bytes and flops as terms; None when either cannot be written so."""
    dims = list(spec.shape_grid.dims)
    flops = work_terms(spec.flops, dims, checks)
    out: dict[str, dict] = {}
    for dtype, b in dtype_bytes.items():
        moved = work_terms(lambda s, b=b: spec.bytes_moved(s, b), dims, checks)
        if moved is None or flops is None:
            return None
        out[dtype] = {"bytes": moved, "flops": flops}
    return out


def work_of(work: Mapping[str, dict] | None, dtype: str, shape: Mapping[str, int]) -> tuple[float | None, float | None]:
    """(bytes, flops) of a shape from published terms."""
    from zmlx_pipeline.runtime.roofline import work as evaluate

    terms: dict = (work or {}).get(dtype) or {}
    return evaluate(terms.get("bytes"), shape), evaluate(terms.get("flops"), shape)


# ------------------------------------------------------------------------------------------
# leave-one-family-out validation


def family_folds(device_ids: Iterable[str], devices: Mapping[str, Mapping[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """The measured devices grouped by (vendor, family); a device with no catalog or store row is its own group."""
    groups: dict[tuple[str, str], list[str]] = {}
    for d in sorted(device_ids):
        key = family_key(devices.get(d)) if d in devices else ("?", d)
        groups.setdefault(key if key != ("", "") else ("?", d), []).append(d)
    return groups


def families_are_devices(frame, devices: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether every architecture family of the frame's devices is one device: its leave-one-family-out folds are
    then the leave-one-device-out folds, in the same order, and cross_family_regret equals that regret."""
    return all(len(members) == 1 for members in family_folds(frame["device_id"].unique().to_list(), devices).values())


def cross_family_regret(features, variant: str, devices: Mapping[str, Mapping[str, Any]]) -> float | None:
    """Regret@1 geometric mean of the variant on each architecture family left out of training, pooled over
    the folds' cases; None with fewer than two families (no jump across families can be validated)."""
    import polars as pl

    from zmlx_pipeline.models.variants import MODEL_VARIANTS, make_ranker
    from zmlx_pipeline.models.metrics import case_regrets, summarize
    from zmlx_pipeline.models.pool import fit_threads

    frame = features.frame
    groups = family_folds(frame["device_id"].unique().to_list(), devices)
    if len(groups) < 2 or variant not in MODEL_VARIANTS:
        return None
    regrets: list[float] = []
    for members in groups.values():
        held = pl.col("device_id").is_in(members)
        train, test = frame.filter(~held), frame.filter(held)
        if train.is_empty() or test.is_empty():
            continue
        with fit_threads():
            ranker = make_ranker(features, variant)
            if hasattr(ranker, "only"):  # an ensemble fits only the unseen-device setting these cases use
                ranker.only = "unseen"
            scores = ranker.fit(train).score(test)
        regrets += case_regrets(test, scores, (1,))["r1"].to_list()
    return summarize(regrets)["regret_geomean"] if regrets else None
