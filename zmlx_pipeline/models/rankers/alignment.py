"""A rule, no fitting: launch groups that fill whole SIMD groups first."""

from __future__ import annotations

import numpy as np
import polars as pl

from zmlx_pipeline.models.features import KernelFeatures
from zmlx_pipeline.models.rankers.base import Ranker


class AlignmentRanker(Ranker):
    """Device-aware rule, no fitting: launch groups that fill whole SIMD groups (threads a multiple
    of the device's SIMD width) before those that leave lanes idle; one order for kernels without
    thread parameters. An ensemble member whose weight the inner cross-validation decides."""

    def __init__(self, features: KernelFeatures, name: str = "simd_aligned") -> None:
        super().__init__(features)
        self.name = name

    def fit(self, train: pl.DataFrame) -> "AlignmentRanker":
        return self

    def score(self, test: pl.DataFrame) -> np.ndarray:
        if "cfg_simd_aligned" not in test.columns:
            return np.zeros(test.height)
        return 1.0 - test["cfg_simd_aligned"].fill_null(1.0).to_numpy().astype(float)
