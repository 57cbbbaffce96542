"""Rankers for devices never measured that stay robust when the training devices hold few cases.

A new device is ranked by two designs that fail differently: the ensemble's unseen setting (its members
weighted by leaving training devices out; its per-device transfer models carry what tells the devices
apart) and the shared ranking model `gbr_shared_top` (one boosting model on relative time, no choices to
make). `TransferRankRanker` holds both and leads with one design:

- `ensemble`, `rank`: one of them alone;
- `blend`: their equal-weight rank average (each config's rank in its case under either, summed; a
  config one of them puts first beats one both put in the middle), fixed a priori.

Which design leads is chosen by nested leave-one-training-device-out inside the training rows (each
inner fold is scored with the ensemble weights the other inner folds choose), but only when the inner
folds hold at least `select_min_cases` cases; with fewer, the `default` design leads. Its top k is
hedged as the guarded ensemble's (CVEnsembleRanker's guard policy: a baseline may lead only with
GUARD_MIN_CASES inner cases and a win in every inner fold; the inner folds choose the baselines the top
k interleaves), except where the inner folds hold fewer than `thin_cases` cases: then the top k
interleaves the lead with the `thin_hedges` baselines a priori (the fleet-wide winners), since a
choice made on a dozen cases is noise, and, with `unanimous`, a config that was the fastest on every
training device that measured the case's shape and dtype (two at least) goes first: where the whole
measured fleet agrees, no model is needed. Where one device is all the training rows hold, its fastest goes first:
no device feature varies in them, so no model fitted on them can rank another device differently. The ensemble's weights are still chosen there; with `settled` they
are not (equal weights, no inner fit), which lost two of 26 thin settings to a baseline and is not the default.
notes/ranker-selection.md compares the variants.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import polars as pl

from zmlx_pipeline.models import baselines as _baselines
from zmlx_pipeline.models.cv_ensemble import GUARD_MIN_CASES, CVEnsembleRanker, _first_min
from zmlx_pipeline.models.rankers.base import ModelError, relative_to_case
from zmlx_pipeline.models.seen_unseen import SeenUnseenRanker
from zmlx_pipeline.models.features import CASE, KernelFeatures

DESIGNS = ("blend", "rank", "ensemble")
RANK_MEMBER = "gbr_shared_top"  # the shared ranking model of the `rank` and `blend` designs
SELECT_MIN_CASES = 9            # inner cases a per-kernel choice of design needs (3 inner devices x 3 dtypes)


def blend_ranks(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Equal-weight rank average of two rankings given as ordinal ranks within the cases (1 = first):
    the sum of the ranks, ties broken by the better of the two (a config either design puts first
    leads one both put in the middle); the tie-break adds under one rank, so it never reorders sums."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a + b + np.minimum(a, b) / (2.0 * (max(a.size, 1) + 1))


def case_ranks(frame: pl.DataFrame, scores: np.ndarray) -> np.ndarray:
    """Each row's ordinal rank (1 = lowest score) in its case, ties in row order (as _FoldRegret.ranks)."""
    ranked = frame.select(CASE).with_columns(pl.Series("_s", np.asarray(scores, dtype=float)).fill_nan(None))
    return ranked.select(pl.col("_s").rank("ordinal").over(CASE).cast(pl.Float64))["_s"].fill_null(np.inf).to_numpy()


def unanimous_winners(train: pl.DataFrame) -> pl.DataFrame:
    """Per (dtype, shape_key) measured on two training devices or more, the config that was the fastest on every one
    of them (cases where the devices disagree are left out); ties within a device go to the lower config_key. Where
    the training rows hold one device, its fastest per case: a model fitted on one device's rows sees no device
    feature vary, so it can tell no other device from it, and that device's measurement beats its fit of them."""
    best = (train.sort(["median_us", "config_key"]).group_by(["device_id", "dtype", "shape_key"], maintain_order=True)
            .agg(pl.col("config_key").first()))
    agree = best.group_by(["dtype", "shape_key"]).agg(pl.col("config_key").n_unique().alias("_u"),
                                                      pl.col("config_key").first(), pl.len().alias("_n"))
    least = 1 if train["device_id"].n_unique() == 1 else 2
    return agree.filter((pl.col("_u") == 1) & (pl.col("_n") >= least)).select("dtype", "shape_key", "config_key").sort(
        ["dtype", "shape_key"])


def lead_with_winners(frame: pl.DataFrame, scores: np.ndarray, winners: pl.DataFrame) -> np.ndarray:
    """`scores` with each case's unanimous winner (if it has one) moved ahead of every other config; the rest keep
    their order."""
    if winners.is_empty():
        return np.asarray(scores, dtype=float)
    hit = frame.select("dtype", "shape_key", "config_key").join(
        winners.with_columns(pl.lit(True).alias("_w")), on=["dtype", "shape_key", "config_key"], how="left",
        maintain_order="left")["_w"].fill_null(False).to_numpy()
    scores = np.asarray(scores, dtype=float).copy()
    if hit.any():
        floor = np.nanmin(scores) if np.isfinite(scores).any() else 0.0
        scores[hit] = floor - 1.0
    return scores


class TransferRankRanker(CVEnsembleRanker):
    """The ensemble's unseen setting and the shared ranking model, one of three designs leading (see the
    module docstring); `policy_unseen["design"]` names it, `policy_unseen["evidence"]` says whether the
    inner folds held enough cases to choose ("chosen") or not ("thin"). Only the unseen setting differs
    from CVEnsembleRanker; the seen one is the ensemble's."""

    rank_member: str = RANK_MEMBER
    designs: tuple = ("blend",)
    default: str = "blend"
    select_min_cases: int = SELECT_MIN_CASES
    thin_cases: int = 0
    thin_hedges: tuple = ()
    unanimous: bool = False
    settled: bool = False  # on thin evidence nothing is chosen from the inner folds (class default: older files)
    winners: pl.DataFrame | None = None
    _selecting: str | None = None  # the split `_select` is choosing for, read by `_guard_policy`

    def __init__(self, features: KernelFeatures, designs: Sequence[str] = ("blend",), default: str | None = None,
                 select_min_cases: int = SELECT_MIN_CASES, thin_cases: int = 0, thin_hedges: Sequence[str] = (),
                 unanimous: bool = False, settled: bool = False,
                 inner_fits: dict[str, dict[str, str]] | None = None, name: str = "transfer_rank") -> None:
        from zmlx_pipeline.models import variants as _variants  # the registry imports this module

        super().__init__(features, _variants.ENSEMBLE_MEMBERS, _variants.ENSEMBLE_HEDGES, max_device_folds=4,
                         guards_seen=_variants.GUARDS_SEEN, guards_unseen=_variants.GUARDS_UNSEEN,
                         inner_fits=inner_fits, name=name)
        unknown = [d for d in designs if d not in DESIGNS]
        if unknown or not designs:
            raise ModelError(f"unknown design(s) {', '.join(unknown) or '(none)'}; expected some of {', '.join(DESIGNS)}")
        default = default or designs[0]
        if default not in designs:
            raise ModelError(f"the default design {default!r} is not one of {', '.join(designs)}")
        unknown = [b for b in thin_hedges if b not in self.guards_unseen]
        if unknown:
            raise ModelError(f"unknown baseline(s) {', '.join(unknown)}: the thin hedges are guard baselines "
                             f"({', '.join(self.guards_unseen)})")
        self.designs = tuple(designs)
        self.default = default
        self.select_min_cases = select_min_cases
        self.thin_cases = thin_cases
        self.thin_hedges = tuple(thin_hedges)
        self.unanimous = unanimous
        self.settled = settled
        self.winners = None  # (dtype, shape_key, config_key): the config every training device measured fastest
        self.rank_member = RANK_MEMBER
        self.policy_unseen = self._thin_policy(None)

    def _names(self) -> list[str]:
        return list(dict.fromkeys([*self.member_names, *self.hedge_names, self.rank_member]))

    def _thin_policy(self, inner: dict | None) -> dict:
        """The a priori policy: the default design leads, its top k interleaved with the thin hedges."""
        hedges = [b for b in self.thin_hedges if b in _baselines.baseline_names(self.features)]
        return {"mode": "model", "baseline": None, "hedges": hedges, "design": self.default, "evidence": "thin",
                **({"inner": inner} if inner else {})}

    def new_device_cases(self, train: pl.DataFrame) -> tuple[int, int]:
        """(inner folds, cases they score) of the new-device selection on `train`, counted without fitting anything:
        each fold's test cases up to `inner_cases`, as `_fold_scores` samples them (its `_FoldRegret.cases`)."""
        folds = self._inner_folds(train, "devices")
        return len(folds), sum(min(self.inner_cases, test.select(CASE).n_unique()) for _, test in folds)

    def _select(self, train: pl.DataFrame, split: str) -> tuple[list[float], bool, float | None, dict]:
        """CVEnsembleRanker's selection (its inner folds score the rank member too: `_names`); for the devices
        split `_guard_policy` below also chooses the design. No guard baseline leaves the default design and no
        hedges; a single training device (no inner fold) is thin evidence (the a priori policy, with `thin_cases`). With `settled`, inner folds of fewer than
        `thin_cases` cases choose nothing, the ensemble's weights included: equal weights, no hedging of its
        own, the a priori policy, and no inner fit is made."""
        if split == "devices" and self.settled and self.thin_cases:
            folds, cases = self.new_device_cases(train)
            if folds and cases < self.thin_cases:
                return [1.0 / len(self.member_names)] * len(self.member_names), False, None, \
                    self._thin_policy({"cases": cases})
        self._selecting = split
        try:
            weights, hedge, loss, policy = super()._select(train, split)
        finally:
            self._selecting = None
        if split == "devices" and self.thin_cases and loss is None:  # no inner fold (one training device): the
            policy = self._thin_policy({"cases": 0})  # thinnest evidence of all, hedged a priori as thin evidence is
        return weights, hedge, loss, policy

    def _guard_policy(self, per_fold, ranks, model_k, base_k, first, last) -> dict:
        """The design, then the lead and hedges of the guard for it (or, on thin evidence, the a priori ones).

        `ranks` are the ensemble's nested ranks per inner fold (each fold scored with the weights the other
        inner folds choose); the rank member's and the blend's come from the same folds' scores."""
        if self._selecting != "devices":
            return super()._guard_policy(per_fold, ranks, model_k, base_k, first, last)
        design_ranks: dict[str, list[np.ndarray]] = {"ensemble": list(ranks), "rank": [], "blend": []}
        for (t, s, regret, hedged, base), ens in zip(per_fold, ranks):
            rank = regret.ranks(s[self.rank_member])
            design_ranks["rank"].append(rank)
            design_ranks["blend"].append(regret.ranks(blend_ranks(ens, rank)))
        cases = sum(regret.cases for _, _, regret, _, _ in per_fold)
        design_loss = {d: float(np.mean([regret.mean(r) for (_, _, regret, _, _), r in zip(per_fold, design_ranks[d])]))
                       for d in self.designs}
        inner = {"cases": cases, **{f"design[{d}]": v for d, v in design_loss.items()}}
        design = self.default
        if cases >= self.select_min_cases and len(per_fold) >= 2:
            order = [self.default, *[d for d in self.designs if d != self.default]]  # the default wins ties
            design = order[_first_min(np.array([design_loss[d] for d in order]))]
        if cases < self.thin_cases:
            policy = self._thin_policy(inner)
            policy["design"] = design
            return policy
        mine = design_ranks[design]
        model_k = {k: [regret.mean(r, [k]) for (_, _, regret, _, _), r in zip(per_fold, mine)] for k in (first, last)}
        policy = super()._guard_policy(per_fold, mine, model_k, base_k, first, last)
        policy.update(design=design, evidence="chosen")
        policy["inner"] = {**policy.get("inner", {}), **inner}
        return policy

    def fit(self, train: pl.DataFrame) -> "TransferRankRanker":
        super().fit(train)
        self.winners = unanimous_winners(train) if self.unanimous else None
        return self

    def _design(self) -> str:
        return (self.policy_unseen or {}).get("design", self.default)

    def needed(self) -> list[str]:
        used: set[str] = set()
        if self.only != "unseen":
            used |= self._seen_used()
        if self.only != "seen":
            design = self._design()
            if design != "rank":
                used |= self._used(self.weights_unseen, self.hedge_unseen)
            if design != "ensemble":
                used.add(self.rank_member)
        return [m for m in self._names() if m in used]

    def _lead(self, frame: pl.DataFrame, scores: dict[str, np.ndarray]) -> np.ndarray:
        """The unseen setting's scores before the policy's hedges: the design's."""
        design = self._design()
        if design == "rank":
            return scores[self.rank_member]
        ens = self._combine(frame, scores, self.weights_unseen, self.hedge_unseen)
        if design == "ensemble":
            return ens
        return blend_ranks(case_ranks(frame, ens), case_ranks(frame, scores[self.rank_member]))

    def score(self, test: pl.DataFrame) -> np.ndarray:
        seen = test["device_id"].is_in(self.train_devices).to_numpy()
        only = None if self.fixed else self.only
        if (only == "seen" and not seen.all()) or (only == "unseen" and seen.any()):
            raise ModelError(f"{self.features.kernel}: this ranker chose its settings for {only} devices only; "
                             "refit it without `only` to score other devices")
        missing = sorted(set(self.needed()) - set(self.rankers))
        if missing:
            raise ModelError(f"{self.features.kernel}: this ranker did not fit {', '.join(missing)}; refit it")
        scores = {m: relative_to_case(test, r.score(test)) for m, r in self.rankers.items()}
        out = np.zeros(test.height)
        for mask, weights, hedge in self.seen_settings(test, seen):
            if mask.any():
                part = test.filter(pl.Series(mask))
                total = self._combine(part, {m: v[mask] for m, v in scores.items()}, weights, hedge)
                out[mask] = self._apply_policy(part, total, self.policy_seen)
        if (~seen).any():
            part = test.filter(pl.Series(~seen))
            lead = self._lead(part, {m: v[~seen] for m, v in scores.items()})
            ranked = self._apply_policy(part, lead, self.policy_unseen)
            if self.winners is not None and self.policy_unseen.get("evidence") == "thin":
                ranked = lead_with_winners(part, ranked, self.winners)
            out[~seen] = ranked
        return out


# the unseen parts (TransferRankRanker) and the rankers a user names (the ensemble's seen setting for measured
# devices, the unseen part for new ones); notes/ranker-selection.md compares them
VARIANTS = {
    # per kernel the rank objective or the ensemble, by nested inner leave-one-device-out (9+ inner cases)
    "unseen_select": lambda f: TransferRankRanker(f, ("rank", "ensemble"), "rank", name="unseen_select"),
    # the equal-weight rank average of the two, fixed a priori, guarded as rank_guarded is
    "unseen_blend": lambda f: TransferRankRanker(f, ("blend",), name="unseen_blend"),
    # the rank average, its top k interleaved with the fleet-wide winner (most_common_best) when the inner
    # folds hold under GUARD_MIN_CASES cases; with more, the design too is chosen by the inner folds
    "unseen_hedged": lambda f: TransferRankRanker(f, DESIGNS, "blend", select_min_cases=GUARD_MIN_CASES,
                                                  thin_cases=GUARD_MIN_CASES, thin_hedges=("most_common_best",),
                                                  name="unseen_hedged"),
    # as unseen_hedged, and where the inner folds are thin a config every training device measured fastest leads
    "unseen_unanimous": lambda f: _unanimous(f, "unseen_unanimous"),
    # as unseen_unanimous, its inner leave-one-device-out folds fitting a quarter of the boosting trees
    # (variants.INNER_FITS["quarter"]): 2.5x less selection time (notes/learning.md, "Lighter inner fits")
    "unseen_unanimous_fast": lambda f: _unanimous(f, "unseen_unanimous_fast", inner="quarter"),
    # as unseen_unanimous, and where the inner folds are thin they choose nothing, the ensemble's weights included
    "unseen_settled": lambda f: _unanimous(f, "unseen_settled", settled=True),
    "robust_select": lambda f: SeenUnseenRanker(f, ("ensemble",), "unseen_select", name="robust_select"),
    "robust_blend": lambda f: SeenUnseenRanker(f, ("ensemble",), "unseen_blend", name="robust_blend"),
    "robust_hedged": lambda f: SeenUnseenRanker(f, ("ensemble",), "unseen_hedged", name="robust_hedged"),
    # the default: the ensemble's seen setting for measured devices, unseen_unanimous for new ones
    "robust": lambda f: SeenUnseenRanker(f, ("ensemble",), "unseen_unanimous", name="robust"),
    # the default with the lighter new-device selection: train about 1.4x faster on the committed data
    "robust_fast": lambda f: SeenUnseenRanker(f, ("ensemble",), "unseen_unanimous_fast", name="robust_fast"),
    # the default whose seen devices measured at few shapes take seen weights of their own (ensemble_sparse)
    "robust_sparse": lambda f: SeenUnseenRanker(f, ("ensemble_sparse",), "unseen_unanimous", name="robust_sparse"),
    # the default choosing nothing on thin new-device evidence: compared, not adopted (notes/ranker-selection.md)
    "robust_settled": lambda f: SeenUnseenRanker(f, ("ensemble",), "unseen_settled", name="robust_settled"),
}


def _unanimous(features: KernelFeatures, name: str, inner: str | None = None,
               settled: bool = False) -> TransferRankRanker:
    """unseen_hedged's design choice and hedges, and the fleet's unanimous winner first on thin evidence; `inner`:
    the variants.INNER_FITS setting its new-device selection fits (None: the members themselves); `settled`: on thin
    evidence the ensemble's weights are not chosen either (TransferRankRanker._select)."""
    from zmlx_pipeline.models import variants as _variants  # the registry imports this module

    return TransferRankRanker(features, DESIGNS, "blend", select_min_cases=GUARD_MIN_CASES, thin_cases=GUARD_MIN_CASES,
                              thin_hedges=("most_common_best",), unanimous=True, settled=settled,
                              inner_fits={"devices": dict(_variants.INNER_FITS[inner])} if inner else None, name=name)
