"""The cross-validated ensemble: member rankers weighted, hedged and guarded by inner folds of the training rows.

Why one long module: every choice it makes (weights, hedging, the guard's lead and hedges, the sparse devices'
setting) is read off the same inner folds' per-case losses (_FoldRegret), and scoring applies exactly those choices.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np
import polars as pl

from zmlx_pipeline.models import baselines as _baselines
from zmlx_pipeline.models.features import CASE, KernelFeatures
from zmlx_pipeline.models.rankers.base import (
    ModelError,
    Ranker,
    fit_sample,
    relative_to_case,
)
from zmlx_pipeline.models.rankers.baseline import BaselineRanker


def _variants():
    """models/variants.py, imported on use: it imports this module to name the ensembles."""
    from zmlx_pipeline.models import variants

    return variants


def _positions_in_runs(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sorted codes: each element's 0-based position within its run of equal codes, and the runs' starts."""
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    return np.arange(codes.size) - np.repeat(starts, np.diff(np.r_[starts, codes.size])), starts


class _FoldRegret:
    """Per fold of the inner selection: the mean over cases of the mean over ks of log(best time among
    the top k by score / best time), for many score vectors on one frame. Ranks by score, ties by
    config_key (as evaluate.case_regrets).

    Everything that does not depend on the scores is built once per fold: the rows sorted by case then
    config (so a stable sort by score keeps ties in config order), each case's run of rows, each row's
    position in its run and each case's best time. A score vector then costs two stable argsorts."""

    def __init__(self, frame: pl.DataFrame, ks: Sequence[int]) -> None:
        keys = frame.select(pl.concat_str([pl.col(c) for c in CASE], separator="\x1f")).to_series().to_numpy()
        case = np.unique(keys, return_inverse=True)[1].reshape(-1)
        config = np.unique(frame["config_key"].to_numpy(), return_inverse=True)[1].reshape(-1)
        median = frame["median_us"].to_numpy().astype(float)
        small = np.int16 if case.size == 0 or case.max() < np.iinfo(np.int16).max else np.int64
        self.ks = list(ks)
        self._by_config = np.lexsort((config, case))  # rows by case, then config
        self._by_row = np.argsort(case, kind="stable")  # rows by case, then row order
        self._case = case[self._by_config].astype(small)  # the same runs in either order
        self._median = median[self._by_config]
        position, self._starts = _positions_in_runs(self._case)
        self._top = {k: position < k for k in self.ks}
        self._position = position + 1.0
        self._best = np.minimum.reduceat(self._median, self._starts) if case.size else np.zeros(0)
        self.cases = int(self._starts.size)
        self.case_device = frame["device_id"].to_numpy()[self._by_config][self._starts] if case.size else np.zeros(0, object)

    def _order(self, scores: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Indices into `rows` ordering them by case, then score (NaN last), ties as `rows` has them."""
        by_score = np.argsort(np.asarray(scores, dtype=float)[rows], kind="stable")
        return by_score[np.argsort(self._case[by_score], kind="stable")]

    def ranks(self, scores: np.ndarray) -> np.ndarray:
        """Each row's ordinal rank (1 = lowest score) in its case, ties in row order (interleave's ranks)."""
        out = np.empty(self._by_row.size, dtype=float)
        out[self._by_row[self._order(scores, self._by_row)]] = self._position
        return out

    def per_case(self, scores: np.ndarray, ks: Sequence[int] | None = None) -> np.ndarray:
        """Per case (in `case_device`'s order), the mean over `ks` (default: the fold's) of log regret@k."""
        ks = self.ks if ks is None else list(ks)
        median = self._median[self._order(scores, self._by_config)]
        total = np.zeros(self._starts.size)
        for k in ks:
            top = self._top[k] if k in self._top else self._position <= k
            total += np.log(np.minimum.reduceat(np.where(top, median, np.inf), self._starts) / self._best)
        return total / len(ks)

    def mean(self, scores: np.ndarray, ks: Sequence[int] | None = None) -> float:
        """Mean over cases of the mean over `ks` (default: the fold's) of log regret@k."""
        return float(self.per_case(scores, ks).mean())


def _first_min(values: np.ndarray) -> int:
    """Index of the lowest value; an earlier one wins within 1e-12 (equal weights, the model alone come first)."""
    values = np.asarray(values, dtype=float)
    return int(np.flatnonzero(values <= values.min() + 1e-12)[0])


def weight_grid(n: int, step: float) -> list[tuple[float, ...]]:
    """Every weight vector on the simplex with the given step, equal weights first (they win ties)."""
    m = round(1.0 / step)
    grid = [tuple(c / m for c in combo) for combo in itertools.product(range(m + 1), repeat=n) if sum(combo) == m]
    equal = tuple([1.0 / n] * n)
    return [equal] + [w for w in grid if not np.allclose(w, equal)]


# rows an inner fold of CVEnsembleRanker scores at most: above every inner fold of the committed data
# (the largest, one Kernel Tuner dedispersion device, holds 11k rows), so only bigger stores are thinned
INNER_TEST_ROWS = 30_000
# a guard baseline leads a robust ranker only when its nested inner log regret@1 is this much lower (1%)
GUARD_MARGIN = math.log(1.01)
GUARD_MIN_CASES = 30  # ... and only when its inner folds held this many cases in all
# With `sparse_share` set, a training device measured at fewer distinct shapes than this share of the kernel's
# best-covered device is sparse, and its seen rows take weights chosen on the sparse devices' inner cases alone
# (when those hold GUARD_MIN_CASES cases): a new shape of a device with few shapes has no near neighbour of its
# own, and the members that borrow from other devices' shapes serve it better (notes/learning.md)
SPARSE_SHARE = 0.5


def sparse_devices(train: pl.DataFrame, share: float) -> list[str]:
    """The devices of `train` measured at fewer distinct shapes than `share` of the best-covered one's."""
    counts = train.group_by("device_id").agg(pl.col("shape_key").n_unique().alias("shapes"))
    if counts.is_empty():
        return []
    top = counts["shapes"].max()
    return sorted(counts.filter(pl.col("shapes") < share * top)["device_id"].to_list())


def sample_cases(frame: pl.DataFrame, cases: int, seed: int = 0) -> pl.DataFrame:
    """The rows of at most `cases` cases of the frame (a fixed random choice; all when fewer)."""
    keys = frame.select(CASE).unique().sort(CASE)
    if keys.height <= cases:
        return frame
    keep = keys[np.sort(np.random.default_rng(seed).choice(keys.height, cases, replace=False))]
    return frame.join(keep, on=list(CASE), how="semi", maintain_order="left")


def interleave_ranks(ranks: Sequence[np.ndarray]) -> np.ndarray:
    """interleave() from each list's ordinal ranks within the cases (_FoldRegret.ranks)."""
    n = len(ranks)
    return ((np.column_stack(ranks) - 1.0) * n + np.arange(n)[None, :]).min(axis=1)


def interleave(frame: pl.DataFrame, lists: Sequence[np.ndarray]) -> np.ndarray:
    """Scores that merge several rankings of each case round-robin: the first list's best, then
    each other list's best, then every list's second, ... (a config already placed keeps its
    first place). A top k drawn from several hypotheses, not k near-copies of one pick."""
    n = len(lists)
    ranks = frame.select(CASE).with_columns([pl.Series(f"_l{j}", np.asarray(v, dtype=float)) for j, v in enumerate(lists)])
    ranks = ranks.select([pl.col(f"_l{j}").rank("ordinal").over(CASE).cast(pl.Float64) for j in range(n)]).to_numpy()
    return interleave_ranks(list(ranks.T))


class CVEnsembleRanker(Ranker):
    """Weighted mean of member rankers, the weights chosen by cross-validation inside `fit`.

    Two settings, each picked by the mean log regret@1 and @5 over inner folds of the training
    rows only (equal weights and no hedging win ties): `weights_unseen`/`hedge_unseen` by
    leaving one training device out (ranking for a device never measured), `weights_seen`/
    `hedge_seen` by holding out training shapes (a seen device, a new shape). A test row uses
    the setting of its kind. The weights come from a simplex grid; hedging interleaves the
    weighted mean's ranking with each `hedges` ranker's own (see `interleave`), so the top k
    covers several hypotheses of what the new device or shape is like. Inner fits see at most
    `inner_rows` rows (every case's fastest configs kept) and inner folds score at most
    `inner_cases` cases and `inner_test_rows` rows (every case kept, with its fastest configs),
    which bounds their cost on big stores. With `only` ("seen" or "unseen") fit chooses just that
    setting, for a caller whose test rows are all of one kind (evaluate.py's folds). The final fit fits
    only the members and hedges the chosen setting(s) use (`needed`: a member of weight 0 that no
    hedging reads is left out; scores are unchanged).
    """

    # class-level defaults, for rankers restored by from_state() from model files saved before these
    # attributes existed (from_state skips __init__)
    inner_test_rows: int = INNER_TEST_ROWS
    fixed: dict | None = None
    only: str | None = None
    guards_seen: tuple = ()
    guards_unseen: tuple = ()
    policy_seen: dict = {"mode": "model", "baseline": None}
    policy_unseen: dict = {"mode": "model", "baseline": None}
    guard_rankers: dict = {}
    inner_fits: dict = {}
    inner_seed: int = 0  # the seed of the inner fits' row sample (fit_sample)
    sparse_share: float | None = None  # None: one seen setting for every seen device
    sparse_devices: list = []
    weights_sparse: list | None = None  # the sparse devices' seen weights (None: weights_seen)
    hedge_sparse: bool = False

    def __init__(self, features: KernelFeatures, members: Sequence[str], hedges: Sequence[str] = (),
                 step: float = 0.25, inner_rows: int = 6_000, inner_cases: int = 120,
                 inner_test_rows: int = INNER_TEST_ROWS, max_device_folds: int = 3,
                 shape_folds: int = 2, ks: Sequence[int] = (1, 5), guards_seen: Sequence[str] = (),
                 guards_unseen: Sequence[str] = (), inner_fits: dict[str, dict[str, str]] | None = None,
                 sparse_share: float | None = None, name: str = "ensemble") -> None:
        super().__init__(features)
        if not members:
            raise ModelError("an ensemble needs members")
        inner_fits = {split: dict(m) for split, m in (inner_fits or {}).items()}
        unknown = [m for m in (*members, *hedges, *[v for m in inner_fits.values() for v in m.values()])
                   if m not in _variants().MODEL_VARIANTS]
        if unknown or set(inner_fits) - {"devices", "shapes"}:
            raise ModelError(f"unknown ensemble member(s) or split(s) {', '.join(unknown or sorted(inner_fits))}")
        # per inner split, the variant each member is fitted as inside its folds (lighter boosting: the folds
        # only choose the weights; notes/learning.md, "Lighter inner fits"); a member
        # not named is fitted as itself
        self.inner_fits = inner_fits
        self.member_names = list(members)
        self.hedge_names = list(hedges)
        self.step = step
        self.inner_rows = inner_rows
        self.inner_cases = inner_cases
        self.inner_test_rows = inner_test_rows
        self.max_device_folds = max_device_folds
        self.shape_folds = shape_folds
        self.ks = list(ks)
        self.name = name
        unknown = [b for b in (*guards_seen, *guards_unseen) if b not in _baselines.BASELINES]
        if unknown:
            raise ModelError(f"unknown baseline(s) {', '.join(unknown)}")
        # baselines the nested selection may fall back to, or interleave with, per kind of test device
        self.guards_seen, self.guards_unseen = tuple(guards_seen), tuple(guards_unseen)
        self.policy_seen = {"mode": "model", "baseline": None}
        self.policy_unseen = {"mode": "model", "baseline": None}
        self.guard_rankers: dict[str, Ranker] = {}
        self.rankers: dict[str, Ranker] = {}
        equal = [1.0 / len(self.member_names)] * len(self.member_names)
        self.weights_seen, self.weights_unseen = list(equal), list(equal)
        self.hedge_seen = self.hedge_unseen = False
        self.sparse_share = sparse_share
        self.sparse_devices: list[str] = []
        self.weights_sparse: list[float] | None = None
        self.hedge_sparse = False
        self.train_devices: list[str] = []
        self.inner_scores: dict = {}
        self.fixed: dict | None = None  # selection() of another fit: skip the inner cross-validation
        # "seen" or "unseen": fit() chooses only that setting (its score() is then refused rows of the
        # other kind); evaluate.py sets it for a fold whose test devices are all seen, or all unseen
        self.only: str | None = None

    def _inner_folds(self, train: pl.DataFrame, split: str) -> list[tuple[pl.DataFrame, pl.DataFrame]]:
        """(inner training rows, inner test rows) per inner fold, all inside `train`: training devices left
        out one at a time (`devices`), or training shapes held out (`shapes`)."""
        if split == "devices":
            devices = sorted(train["device_id"].unique().to_list())
            if len(devices) < 2:
                return []
            if len(devices) > self.max_device_folds:
                devices = [devices[i] for i in np.linspace(0, len(devices) - 1, self.max_device_folds).round().astype(int)]
            return [(train.filter(pl.col("device_id") != d), train.filter(pl.col("device_id") == d)) for d in devices]
        shapes = sorted(train["shape_key"].unique().to_list())
        if len(shapes) < 2:
            return []
        n = min(self.shape_folds, len(shapes))
        folds = []
        for i in range(n):
            held = pl.col("shape_key").is_in(shapes[i::n])
            inner_train, inner_test = train.filter(~held), train.filter(held)
            inner_test = inner_test.filter(pl.col("device_id").is_in(inner_train["device_id"].unique().to_list()))
            if not inner_test.is_empty():
                folds.append((inner_train, inner_test))
        return folds

    def _names(self) -> list[str]:
        return list(dict.fromkeys([*self.member_names, *self.hedge_names]))

    def _total(self, frame: pl.DataFrame, scores: dict[str, np.ndarray], weights: Sequence[float]) -> np.ndarray:
        total = sum(w * scores[m] for m, w in zip(self.member_names, weights) if w)
        return np.asarray(total, dtype=float) if not np.isscalar(total) else np.zeros(frame.height)

    def _combine(self, frame: pl.DataFrame, scores: dict[str, np.ndarray], weights: Sequence[float],
                 hedge: bool) -> np.ndarray:
        total = self._total(frame, scores, weights)
        if not hedge or not self.hedge_names:
            return total
        return interleave(frame, [total, *[scores[h] for h in self.hedge_names]])

    def _fold_scores(self, train: pl.DataFrame, split: str) -> list[tuple]:
        """Per inner fold: (test rows, each member's and hedge's relative scores, _FoldRegret, the hedges' ranks,
        the guard baselines' ranks). Members are fitted as `inner_fits[split]` names them (a lighter variant in
        place of a member, or the member itself): the folds only choose weights, the final fit uses the members."""
        guards = [b for b in (self.guards_unseen if split == "devices" else self.guards_seen)
                  if b in _baselines.baseline_names(self.features)]
        per_fold, inner = [], self.inner_fits.get(split, {})
        for inner_train, inner_test in self._inner_folds(train, split):
            sample = fit_sample(inner_train, max_rows=self.inner_rows, seed=self.inner_seed)
            # at most inner_cases cases, and of a case with thousands of configs its fastest ones and a
            # share of the rest (fit_sample: every case is kept; the loss needs each case's best only)
            inner_test = fit_sample(sample_cases(inner_test, self.inner_cases),
                                    max_rows=self.inner_test_rows)
            make = _variants().make_ranker
            scores = {m: relative_to_case(inner_test, make(self.features, inner.get(m, m))
                                          .fit(sample).score(inner_test))
                      for m in self._names()}
            regret = _FoldRegret(inner_test, self.ks)
            hedged = [regret.ranks(scores[h]) for h in self.hedge_names]  # the same for every weight vector
            # a baseline reads up to MAX_FIT_ROWS inner training rows (every case's fastest configs kept): all of
            # them on the committed data, a bounded group-by on a big store
            base_train = fit_sample(inner_train) if guards else inner_train
            base = {b: regret.ranks(BaselineRanker(self.features, b).fit(base_train).score(inner_test))
                    for b in guards}
            per_fold.append((inner_test, scores, regret, hedged, base))
        return per_fold

    def _combined(self, t, s, w, hedge, regret, hedged) -> np.ndarray:
        """_combine on one inner fold, with the hedges' ranks computed once (`hedged`)."""
        total = self._total(t, s, w)
        return interleave_ranks([regret.ranks(total), *hedged]) if hedge else total

    def candidate_loss(self, train: pl.DataFrame, split: str, weights: Sequence[float], hedge: bool) -> float | None:
        """The mean inner loss of one setting (weights, hedging) on this ranker's inner folds of `train` (None:
        no folds): how a selection made another way (lighter inner fits) fares on these folds."""
        per_fold = self._fold_scores(train, split)
        if not per_fold:
            return None
        return float(np.mean([regret.mean(self._combined(t, s, list(weights), hedge, regret, hedged))
                              for t, s, regret, hedged, _ in per_fold]))

    def _select(self, train: pl.DataFrame, split: str) -> tuple[list[float], bool, float | None, dict]:
        """The grid weights and hedging with the lowest mean inner log regret, that regret (None: no folds)
        and the policy: the weighted model alone, or one of the setting's guard baselines alone, first, or
        after the model (see `_apply_policy`)."""
        equal = [1.0 / len(self.member_names)] * len(self.member_names)
        keep = {"mode": "model", "baseline": None}
        per_fold = self._fold_scores(train, split)
        if not per_fold:
            return equal, False, None, keep
        guards = per_fold[0][4]
        combined = self._combined
        candidates = [(list(w), hedge) for hedge in ([False, True] if self.hedge_names else [False])
                      for w in weight_grid(len(self.member_names), self.step)]
        per_case = [[regret.per_case(combined(t, s, w, hedge, regret, hedged)) for t, s, regret, hedged, _ in per_fold]
                    for w, hedge in candidates]
        loss = np.array([[p.mean() for p in row] for row in per_case])  # candidates x folds
        best = _first_min(loss.mean(axis=1))
        weights, hedge = candidates[best]
        if split == "shapes":
            self._select_sparse(per_fold, per_case, candidates, best)
        if not guards:
            return weights, hedge, float(loss[best].mean()), keep
        # Nested: each inner fold is scored by the candidate the OTHER inner folds choose, so the model's
        # figures carry the cost of its own selection, as a baseline's do (it has none to make).
        first, last = min(self.ks), max(self.ks)
        model_k, base_k, ranks = {first: [], last: []}, {}, []
        for f, (t, s, regret, hedged, base) in enumerate(per_fold):
            others = [g for g in range(len(per_fold)) if g != f]
            c = _first_min(loss[:, others].mean(axis=1)) if others else 0
            model_ranks = regret.ranks(combined(t, s, *candidates[c], regret, hedged))
            ranks.append(model_ranks)
            for k in (first, last):
                model_k[k].append(regret.mean(model_ranks, [k]))
                for b, r in base.items():
                    base_k.setdefault(b, {first: [], last: []})[k].append(regret.mean(r, [k]))
        policy = self._guard_policy(per_fold, ranks, model_k, base_k, first, last)
        return weights, hedge, float(loss[best].mean()), policy

    def _select_sparse(self, per_fold, per_case, candidates, best: int) -> None:
        """The sparse devices' seen setting: the candidate of lowest mean inner loss over their cases alone, when
        they hold GUARD_MIN_CASES inner cases and other devices' cases too (else, or on a tie with the setting
        chosen for all, that setting: weights_sparse None)."""
        self.weights_sparse, self.hedge_sparse = None, False
        if not self.sparse_devices:
            return
        masks = [np.isin(regret.case_device, self.sparse_devices) for _, _, regret, _, _ in per_fold]
        cases = sum(int(m.sum()) for m in masks)
        if cases < GUARD_MIN_CASES or all(m.all() for m in masks):
            return
        loss = np.array([sum(float(p[m].sum()) for p, m in zip(row, masks)) / cases for row in per_case])
        pick = _first_min(loss)
        if loss[best] > loss[pick] + 1e-12:
            self.weights_sparse, self.hedge_sparse = list(candidates[pick][0]), bool(candidates[pick][1])

    def _guard_policy(self, per_fold, ranks, model_k, base_k, first, last) -> dict:
        """Which ranking leads and which baselines the top k interleaves, from nested inner regrets.

        The lead: the model, unless the inner folds hold at least GUARD_MIN_CASES cases and a baseline's
        inner regret@first is lower by GUARD_MARGIN (in log) on the mean and in every inner fold (a kernel
        measured at one shape per device gives one case per inner fold: too few to overrule the model).
        The hedge: the top k interleaves the lead with the one or two baselines of lowest inner
        regret@last (the model too, when a baseline leads), whichever of none, one or two gives the
        lowest inner regret@last (more hedging wins ties: it costs no regret@1).
        """
        folds = len(per_fold)
        cases = sum(regret.cases for _, _, regret, _, _ in per_fold)
        lead = None
        gains = {b: np.mean(model_k[first]) - np.mean(v[first]) for b, v in base_k.items()}
        best = max(gains, key=lambda b: (gains[b], -list(gains).index(b)))
        wins = sum(m > x for m, x in zip(model_k[first], base_k[best][first]))
        if cases >= GUARD_MIN_CASES and gains[best] > GUARD_MARGIN and wins == folds:
            lead = best
        by_last = sorted((b for b in base_k if b != lead), key=lambda b: (np.mean(base_k[b][last]), list(base_k).index(b)))
        hedges = [[], *([by_last[:1]] if by_last else []), *([by_last[:2]] if len(by_last) > 1 else [])]
        if lead is not None:
            hedges = [["model", *h] for h in hedges]
        losses = []
        for names in hedges:
            mixed = []
            for (t, s, regret, hedged, base), model_ranks in zip(per_fold, ranks):
                lists = [model_ranks if lead is None else base[lead]]
                lists += [model_ranks if n == "model" else base[n] for n in names]
                mixed.append(regret.mean(interleave_ranks(lists) if len(lists) > 1 else lists[0], [last]))
            losses.append(float(np.mean(mixed)))
        pick = max(i for i, v in enumerate(losses) if v <= min(losses) + 1e-12)
        inner = {f"model@{first}": float(np.mean(model_k[first])), f"model@{last}": float(np.mean(model_k[last])),
                 **{f"{b}@{k}": float(np.mean(v[k])) for b, v in base_k.items() for k in (first, last)},
                 **{f"hedge[{','.join(h)}]@{last}": v for h, v in zip(hedges, losses)}}
        return {"mode": "model" if lead is None else "baseline", "baseline": lead, "hedges": hedges[pick],
                "inner": inner}

    def _apply_policy(self, frame: pl.DataFrame, total: np.ndarray, policy: dict) -> np.ndarray:
        """The model's scores under a policy: the lead (the model, or baseline `baseline` when mode is
        `baseline`), its ranking interleaved with the rankings of `hedges` (baselines, or "model")."""
        lead = total if policy.get("mode", "model") == "model" else self.guard_rankers[policy["baseline"]].score(frame)
        hedges = policy.get("hedges") or []
        if not hedges:
            return lead
        return interleave(frame, [lead, *[total if h == "model" else self.guard_rankers[h].score(frame) for h in hedges]])

    def selection(self) -> dict:
        """The fitted weights and hedging: set them as `fixed` on an unfitted ensemble and its fit skips the
        inner cross-validation (train.py's held-out scoring refits one per fold at the cost of its members)."""
        return {"weights_seen": list(self.weights_seen), "hedge_seen": bool(self.hedge_seen),
                "weights_unseen": list(self.weights_unseen), "hedge_unseen": bool(self.hedge_unseen),
                "policy_seen": dict(self.policy_seen), "policy_unseen": dict(self.policy_unseen),
                "weights_sparse": None if self.weights_sparse is None else list(self.weights_sparse),
                "hedge_sparse": bool(self.hedge_sparse)}

    def fit(self, train: pl.DataFrame) -> "CVEnsembleRanker":
        if train.is_empty():
            raise ModelError(f"{self.features.kernel}: no training rows")
        fixed = self.fixed
        self.sparse_devices = (sparse_devices(train, self.sparse_share)
                               if self.sparse_share and self.only != "unseen" else [])
        self.weights_sparse, self.hedge_sparse = None, False
        if fixed:
            if self.sparse_share and fixed.get("weights_sparse") is not None:
                self.weights_sparse, self.hedge_sparse = list(fixed["weights_sparse"]), bool(fixed.get("hedge_sparse"))
            self.weights_seen, self.hedge_seen = list(fixed["weights_seen"]), fixed["hedge_seen"]
            self.weights_unseen, self.hedge_unseen = list(fixed["weights_unseen"]), fixed["hedge_unseen"]
            self.policy_seen = dict(fixed.get("policy_seen") or {"mode": "model", "baseline": None})
            self.policy_unseen = dict(fixed.get("policy_unseen") or {"mode": "model", "baseline": None})
            self.inner_scores = {"devices": None, "shapes": None}
        else:
            only = self.only
            if only not in (None, "seen", "unseen"):
                raise ModelError(f"ensemble setting {only!r}: expected seen, unseen or None")
            equal = [1.0 / len(self.member_names)] * len(self.member_names)
            keep = {"mode": "model", "baseline": None}
            self.weights_unseen, self.hedge_unseen, loss_unseen, self.policy_unseen = (
                self._select(train, "devices") if only != "seen" else (list(equal), False, None, keep))
            self.weights_seen, self.hedge_seen, loss_seen, self.policy_seen = (
                self._select(train, "shapes") if only != "unseen" else (list(equal), False, None, dict(keep)))
            self.inner_scores = {"devices": loss_unseen, "shapes": loss_seen}
        self.rankers = {m: _variants().make_ranker(self.features, m).fit(train) for m in self.needed()}
        used = {b for p in self._policies() for b in [p.get("baseline"), *(p.get("hedges") or [])]
                if b is not None and b != "model"}
        self.guard_rankers = {b: BaselineRanker(self.features, b).fit(train) for b in sorted(used)}
        self.train_devices = sorted(train["device_id"].unique().to_list())
        return self

    def _policies(self) -> list[dict]:
        """The policies of the settings fitted (both, or `only`'s)."""
        only = None if self.fixed else self.only
        return [p for p, kind in ((self.policy_seen, "seen"), (self.policy_unseen, "unseen")) if only in (None, kind)]

    def _used(self, weights: Sequence[float], hedge: bool) -> set[str]:
        """The members a setting's scores read: those of nonzero weight, and the hedges when it hedges."""
        return {m for m, w in zip(self.member_names, weights) if w} | (set(self.hedge_names) if hedge else set())

    def needed(self) -> list[str]:
        """The members and hedges the fitted settings use (of both, or of `only`'s): fit fits only these.
        A member of weight 0 that no hedge needs would be fitted and scored for nothing; leaving it out
        changes no score (`_total` skips zero weights)."""
        used: set[str] = set()
        if self.only != "unseen":
            used |= self._seen_used()
        if self.only != "seen":
            used |= self._used(self.weights_unseen, self.hedge_unseen)
        return [m for m in self._names() if m in used]

    def _seen_used(self) -> set[str]:
        """The members the seen settings read (the sparse devices' too)."""
        used = self._used(self.weights_seen, self.hedge_seen)
        if self.weights_sparse is not None:
            used |= self._used(self.weights_sparse, self.hedge_sparse)
        return used

    def seen_settings(self, test: pl.DataFrame, seen: np.ndarray) -> list[tuple[np.ndarray, list, bool]]:
        """(rows, weights, hedging) of the seen settings: the sparse devices' rows apart when they have their own."""
        if self.weights_sparse is None:
            return [(seen, self.weights_seen, self.hedge_seen)]
        sparse = seen & test["device_id"].is_in(list(self.sparse_devices)).to_numpy()
        return [(seen & ~sparse, self.weights_seen, self.hedge_seen), (sparse, self.weights_sparse, self.hedge_sparse)]

    def score(self, test: pl.DataFrame) -> np.ndarray:
        seen = test["device_id"].is_in(self.train_devices).to_numpy()
        only = None if self.fixed else self.only
        if (only == "seen" and not seen.all()) or (only == "unseen" and seen.any()):
            raise ModelError(f"{self.features.kernel}: this ensemble chose its weights for "
                             f"{only} devices only; refit it without `only` to score other devices")
        settings = [(m, w, h, self.policy_seen, "seen") for m, w, h in self.seen_settings(test, seen)]
        settings.append((~seen, self.weights_unseen, self.hedge_unseen, self.policy_unseen, "unseen"))
        for mask, weights, hedge, _, kind in settings:
            missing = sorted(self._used(weights, hedge) - set(self.rankers)) if mask.any() else []
            if missing:  # fitted with `only` (and `fixed`) for the other kind of device
                raise ModelError(f"{self.features.kernel}: this ensemble did not fit {', '.join(missing)}, "
                                 f"which its {kind}-device setting needs; refit it without `only`")
        scores = {m: relative_to_case(test, r.score(test)) for m, r in self.rankers.items()}
        out = np.zeros(test.height)
        for mask, weights, hedge, policy, _ in settings:
            if mask.any():
                part = test.filter(pl.Series(mask))
                total = self._combine(part, {m: v[mask] for m, v in scores.items()}, weights, hedge)
                out[mask] = self._apply_policy(part, total, policy)
        return out
