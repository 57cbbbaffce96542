"""The pruning k measured through the runtime's own lookup path, on shapes the tables are made to not know.

Training's k (`KernelModel.prune_k`) is the smallest k whose model top-k holds a config within 2% of
the best on 95% of held-out cases. The runtime answers an unseen shape differently: from the
prediction for its bucket's representative shape, or from the two nearest buckets interleaved,
then drops configs illegal for the exact shape. Here every fully measured (device, dtype, shape)
is looked up with its own measured entry taken out of the table (and its bucket too, when that
bucket's prediction was made at this very shape), through `runtime.lookup.rank_in_table`, and the
autotuner's rule is applied: time the first min(k, a fifth of the legal configs) candidates. The
published k is the smallest k whose timed candidates hold a config within 2% of the measured best
on 95% of those cases. The neighbouring buckets' predictions come from a model that saw this shape,
so the check leans optimistic; publish takes the larger of this k and training's. The same replay
chooses each kernel's per-dimension weights of the lookup's nearest-bucket distance
(`choose_dim_weights`), published as `dim_weights`.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import polars as pl

from zmlx_pipeline.models.metrics import HIT_WITHIN, PRUNE_SHARE as HIT_SHARE  # training's pruning rule
from zmlx_pipeline.runtime.lookup import _Kernel, _parse_key, _Table, bucket_of, rank_in_table
from zmlx_pipeline.runtime.tuner import MAX_FRACTION

#: a case counts only when at least this share of its legal configs was measured
FULL_SWEEP = 0.9
#: per-dimension weights of the nearest-bucket distance that publish tries
DIM_WEIGHT_CHOICES = (1.0, 4.0)


@dataclass(frozen=True)
class RuntimeK:
    k: int | None          # smallest k reaching HIT_SHARE; None when no k up to max_k does
    share: float | None    # hit share at k (at max_k when k is None)
    cases: int             # fully measured cases replayed
    max_k: int


class _Replayed(_Kernel):
    """The lookup's kernel with its legality checks remembered in `seen` (shared by the kernels of one replay, whose
    constraints are the same): a replay asks the same config on the same shape for every k and every weighting."""

    __slots__ = ("_seen",)

    def __init__(self, name: str, meta: dict, seen: dict) -> None:
        super().__init__(name, meta)
        self._seen = seen

    def legal(self, items, shape: dict, limits: dict) -> bool:
        # keyed by the case's own shape and limits dicts (replay_cases makes them once, and the cases hold them
        # while the replay runs): building a key from their items cost more than the checks it saved
        per_case = self._seen.get((id(shape), id(limits)))
        if per_case is None:  # cases of one shape and limits (other devices alike, other weightings) share checks
            per_case = self._seen.setdefault((tuple(shape.items()), tuple(limits.items())), {})
            self._seen[(id(shape), id(limits))] = per_case
        ok = per_case.get(items)
        if ok is None:
            ok = per_case[items] = super().legal(items, shape, limits)
        return ok


class _ReplayTable(_Table):
    """A case's table with its nearest buckets remembered: a replay asks them for every k and every weighting."""

    __slots__ = ("_near",)

    def __init__(self, measured: dict, buckets: dict) -> None:
        super().__init__(measured, buckets)
        self._near: dict[tuple, list] = {}

    def nearest(self, values: tuple[int, ...], n: int = 1, weights: Sequence[float] | None = None) -> list:
        key = (values, n, weights)
        near = self._near.get(key)
        if near is None:
            near = self._near[key] = super().nearest(values, n, weights)
        return near


def _items(config: Mapping) -> tuple:
    return tuple(sorted(config.items()))


def replay_cases(frame: pl.DataFrame, meta: dict, entries: Mapping[str, Mapping[str, dict]],
                 bucket_shapes: Mapping[str, dict], limits_for: Callable[[str, str], dict],
                 n_legal: Callable[[str, str, dict], int], devices: Sequence[str] | None = None) -> list[tuple]:
    """Every fully measured case of `frame` (one kernel's features frame), each with its table as an unseen
    shape would find it: (table, values, shape, limits, the tuner's cap, configs within 2% of the best)."""
    dims = list(meta["dims"])
    cols = ["device_id", "dtype", "shape_key", "shape", "config", "median_us"]
    cases_frame = (frame.select(cols).group_by(["device_id", "dtype", "shape_key"], maintain_order=True)
                   .agg(pl.col("shape").first(), pl.col("config"), pl.col("median_us")))
    cases = []
    for row in cases_frame.iter_rows(named=True):
        device, dtype = row["device_id"], row["dtype"]
        if devices is not None and device not in devices:
            continue
        t = entries.get(device, {}).get(dtype)
        if not t:
            continue
        shape = {d: int(v) for d, v in json.loads(row["shape"]).items()}
        if any(d not in shape for d in dims):
            continue
        legal_n = n_legal(device, dtype, shape)
        times = row["median_us"]
        if not times or legal_n <= 0 or len(times) < FULL_SWEEP * legal_n:
            continue
        best = min(times)
        hits = {_items(json.loads(c)) for c, us in zip(row["config"], times) if us <= HIT_WITHIN * best}
        values = tuple(shape[d] for d in dims)
        bucket = ",".join(str(e) for e in bucket_of(values))
        own = bucket_shapes.get(bucket)
        buckets = {_parse_key(b): e for b, e in t["buckets"].items()
                   if not (b == bucket and own is not None and all(int(own[d]) == shape[d] for d in dims))}
        measured = {_parse_key(m): e for m, e in t["measured"].items() if _parse_key(m) != values}
        cap = max(1, int(legal_n * MAX_FRACTION))
        cases.append((_ReplayTable(measured, buckets), values, shape, limits_for(device, dtype), cap, hits))
    return cases


def replay(kernel: _Kernel, cases: Sequence[tuple], max_k: int) -> RuntimeK:
    """The smallest k (1..max_k) whose timed candidates hit on HIT_SHARE of the cases."""
    if not cases:
        return RuntimeK(None, None, 0, max_k)
    share = None
    for k in range(1, max_k + 1):
        hit = 0
        for table, values, shape, limits, cap, hits in cases:
            r = rank_in_table(kernel, table, values, shape, limits, prune_k=k)
            if not r.failure and any(c in hits for c in r.ranked[: min(cap, r.prune_k)]):
                hit += 1
        share = hit / len(cases)
        if share >= HIT_SHARE:
            return RuntimeK(k, share, len(cases), max_k)
    return RuntimeK(None, share, len(cases), max_k)


def runtime_k(frame: pl.DataFrame, meta: dict, entries: Mapping[str, Mapping[str, dict]], bucket_shapes: Mapping[str, dict],
              limits_for: Callable[[str, str], dict], n_legal: Callable[[str, str, dict], int], max_k: int,
              devices: Sequence[str] | None = None) -> RuntimeK:
    """Replay every fully measured case of `frame` through the lookup (meta's dim_weights, if any).

    `entries[device][dtype]` holds the published "measured" and "buckets" dicts (keys as in the bundle),
    `limits_for(device, dtype)` the lookup's limits, `n_legal(device, dtype, shape)` the legal configs
    of the exact shape; k runs from 1 to `max_k` (the candidates an entry stores).
    """
    cases = replay_cases(frame, meta, entries, bucket_shapes, limits_for, n_legal, devices)
    return replay(_Replayed(meta.get("name", "kernel"), meta, {}), cases, max_k)


def _better(a: RuntimeK, b: RuntimeK) -> bool:
    """a beats b: reaches the share at a smaller k, or (neither reaching it) hits more cases at max_k."""
    if a.k is not None or b.k is not None:
        return b.k is None or (a.k is not None and a.k < b.k)
    return (a.share or 0.0) > (b.share or 0.0)


def choose_dim_weights(meta: dict, cases: Sequence[tuple], max_k: int,
                       choices: Sequence[float] = DIM_WEIGHT_CHOICES) -> tuple[dict[str, float], RuntimeK]:
    """The nearest-bucket weights (one of `choices` per dim, all 1 first) whose replay does best.

    A dimension that decides the code path (topk's k: KMAX must cover it) should pull a shape towards
    buckets that match it, even when another dimension is nearer; which dims do is read off the
    measurements, not declared. Ties keep the plainer weights (fewest dims weighted).
    """
    dims = list(meta["dims"])
    best_w = {d: 1.0 for d in dims}
    seen: dict = {}
    best = replay(_Replayed(meta.get("name", "kernel"), {**meta, "dim_weights": best_w}, seen), cases, max_k)
    for combo in sorted(itertools.product(choices, repeat=len(dims)), key=lambda c: sum(w != 1.0 for w in c)):
        w = dict(zip(dims, combo))
        if w == best_w:
            continue
        r = replay(_Replayed(meta.get("name", "kernel"), {**meta, "dim_weights": w}, seen), cases, max_k)
        if _better(r, best):
            best_w, best = w, r
    return best_w, best
