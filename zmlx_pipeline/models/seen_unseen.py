"""A ranker that scores devices seen in training with one model and new devices with another."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import polars as pl

from zmlx_pipeline.models.cv_ensemble import CVEnsembleRanker, _variants
from zmlx_pipeline.models.features import KernelFeatures
from zmlx_pipeline.models.rankers.base import ModelError, Ranker, relative_to_case


class SeenUnseenRanker(Ranker):
    """One model for the devices seen in training, another for new ones.

    Rows of a device the ranker was trained on are scored by the mean of the `seen` members' scores,
    each made relative to its best in the case (no selection: a fixed choice); rows of any other
    device by the `unseen` variant, a CVEnsembleRanker that chooses its own weights by leaving
    training devices out (only its unseen setting is fitted). The seen members see every feature,
    the device specs included, so on a measured device they learn its own order of the configs; on a
    new device such a model extrapolates from a handful of training devices, which the ensemble's
    similarity-weighted members do better (notes/learning.md). A launch geometry the kernel declares for
    new devices only (TileAxes.seen False) is left out of the seen members' features.

    Like CVEnsembleRanker it takes `only` ("seen" or "unseen": fit just that part, and refuse rows of
    the other kind) and `fixed` (selection() of another fit: the unseen ensemble skips its inner
    cross-validation).
    """

    fixed: dict | None = None
    only: str | None = None

    def __init__(self, features: KernelFeatures, seen: Sequence[str], unseen: str = "ensemble",
                 name: str = "split") -> None:
        super().__init__(features)
        if not seen:
            raise ModelError("a seen/unseen ranker needs at least one seen member")
        unknown = [m for m in (*seen, unseen) if m not in _variants().MODEL_VARIANTS]
        if unknown:
            raise ModelError(f"unknown member(s) {', '.join(unknown)}")
        if any(isinstance(_variants().make_ranker(features, m), SeenUnseenRanker) for m in seen):
            raise ModelError("a seen/unseen ranker cannot nest another")
        if not isinstance(_variants().make_ranker(features, unseen), CVEnsembleRanker):
            raise ModelError(f"the unseen model {unseen!r} must be a cross-validated ensemble")
        self.seen_names = list(seen)
        self.unseen_name = unseen
        self.name = name
        self.seen_rankers: dict[str, Ranker] = {}
        self.unseen_ranker: Ranker | None = None
        self.train_devices: list[str] = []

    def fit(self, train: pl.DataFrame) -> "SeenUnseenRanker":
        if train.is_empty():
            raise ModelError(f"{self.features.kernel}: no training rows")
        only = self.only
        if only not in (None, "seen", "unseen"):
            raise ModelError(f"setting {only!r}: expected seen, unseen or None")
        self.train_devices = sorted(train["device_id"].unique().to_list())
        self.seen_rankers = {}
        seen_features = self.features.for_seen_devices()
        for m in ([] if only == "unseen" else self.seen_names):
            ranker = _variants().make_ranker(seen_features, m)
            if hasattr(ranker, "only"):  # an ensemble member: only its seen setting is read here
                fixed = (self.fixed or {}).get("seen", {}).get(m)
                if fixed:
                    ranker.fixed = fixed
                else:
                    ranker.only = "seen"
            self.seen_rankers[m] = ranker.fit(train)
        self.unseen_ranker = None
        if only != "seen":
            ranker = _variants().make_ranker(self.features, self.unseen_name)
            if self.fixed and self.fixed.get("unseen"):
                ranker.fixed = self.fixed["unseen"]
            else:
                ranker.only = "unseen"
            self.unseen_ranker = ranker.fit(train)
        return self

    def selection(self) -> dict:
        """The ensembles' selections, unseen and seen members' (set as `fixed` on an unfitted one to skip their inner CV)."""
        selection = getattr(self.unseen_ranker, "selection", None)
        seen = {m: r.selection() for m, r in self.seen_rankers.items() if callable(getattr(r, "selection", None))}
        return {"unseen": selection() if callable(selection) else None, "seen": seen}

    def score(self, test: pl.DataFrame) -> np.ndarray:
        seen = test["device_id"].is_in(self.train_devices).to_numpy()
        if seen.any() and not self.seen_rankers:
            raise ModelError(f"{self.features.kernel}: fitted for new devices only; refit without `only` "
                             "to score a training device")
        if (~seen).any() and self.unseen_ranker is None:
            raise ModelError(f"{self.features.kernel}: fitted for training devices only; refit without "
                             "`only` to score a new device")
        out = np.zeros(test.height)
        if seen.any():
            part = test.filter(pl.Series(seen))
            out[seen] = sum(relative_to_case(part, r.score(part)) for r in self.seen_rankers.values()) \
                / len(self.seen_rankers)
        if (~seen).any():
            out[~seen] = self.unseen_ranker.score(test.filter(pl.Series(~seen)))
        return out
