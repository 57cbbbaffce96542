"""The config-only prior: each config's similarity-weighted mean log(time / best) over the nearest training cases."""

from __future__ import annotations

import numpy as np
import polars as pl
from sklearn.neighbors import KDTree

from zmlx_pipeline.models.features import CASE, KernelFeatures, device_distances
from zmlx_pipeline.models.rankers.base import (
    CLIP_LOG_REL,
    PRIOR_TAU,
    VENDOR_PENALTY,
    ModelError,
    Ranker,
)

PRIOR_NEIGHBOURS = 8          # training cases that vote for each test case
_SHAPE_WEIGHT = 1.0           # distance per unit of log2 shape dimension
_DTYPE_PENALTY = 1.0
_NEW = "\x00new device"   # the one device id the cases of every device never trained on are scored under


class PriorRanker(Ranker):
    """Config-only prior: similarity-weighted mean log(time / best) of each config over training cases."""

    def __init__(self, features: KernelFeatures, vendor_penalty: float = VENDOR_PENALTY,
                 tau: float = PRIOR_TAU, neighbours: int = PRIOR_NEIGHBOURS, uniform: bool = False,
                 target: str = "log_rel", name: str = "prior") -> None:
        super().__init__(features)
        if target not in ("log_rel", "rank_pct"):
            raise ModelError(f"unknown prior target {target!r}; expected log_rel or rank_pct")
        self.target = target
        self.vendor_penalty = vendor_penalty
        self.tau = tau
        self.neighbours = neighbours
        self.uniform = uniform
        self.name = name
        ids, dist = device_distances(features.devices, vendor_penalty=vendor_penalty) \
            if features.devices is not None and not features.devices.is_empty() else ([], np.zeros((0, 0)))
        self._device_distance = pl.DataFrame({
            "device_id": [a for a in ids for _ in ids],
            "_train_device": [b for _ in ids for b in ids],
            "_ddist": dist.reshape(-1).tolist(),
        }, schema={"device_id": pl.String, "_train_device": pl.String, "_ddist": pl.Float64})

    def _cases(self, frame: pl.DataFrame) -> pl.DataFrame:
        # in the frame's order: the KD-tree's choice among equally near shapes follows the order of its
        # points, and polars' group_by order without maintain_order changes from call to call
        dims = [f"shape_log2_{d}" for d in self.features.shape_dims]
        return frame.group_by(CASE, maintain_order=True).agg([pl.col(c).first() for c in dims])

    def fit(self, train: pl.DataFrame) -> "PriorRanker":
        if train.is_empty():
            raise ModelError(f"{self.features.kernel}: no training rows")
        value = (pl.col("rank_pct") if getattr(self, "target", "log_rel") == "rank_pct"
                 else pl.col("log_rel").clip(upper_bound=CLIP_LOG_REL))
        self._train = train.select(*CASE, "config_key", value.alias("_v"))
        self._train_cases = self._cases(train)
        return self

    def _neighbours(self, tc: pl.DataFrame) -> pl.DataFrame:
        """Each test case's `neighbours` nearest training cases: CASE, the neighbour's _t_ CASE, _dist.

        Device and dtype terms are constant within a (kernel, device, dtype) group of training
        cases, so the nearest cases overall are among each group's nearest shapes: one KD-tree
        query per group, never a cross join (the cost grows with cases, not cases squared).
        """
        dims = [f"shape_log2_{d}" for d in self.features.shape_dims]
        queries = {key[0]: (q.select(CASE), q.select(dims).to_numpy() if dims else None)
                   for key, q in tc.partition_by("kernel", as_dict=True).items()}  # the same for every group
        parts = []
        for key, group in self._train_cases.partition_by(["kernel", "device_id", "dtype"], as_dict=True).items():
            if key[0] not in queries:
                continue
            query, points = queries[key[0]]
            k = min(self.neighbours, group.height)
            if dims:
                dist, idx = KDTree(group.select(dims).to_numpy()).query(points, k=k)
            else:
                dist, idx = np.zeros((query.height, k)), np.tile(np.arange(k), (query.height, 1))
            found = group.select([pl.col(c).alias("_t_" + c) for c in CASE])[idx.reshape(-1)]
            parts.append(pl.concat([query[np.repeat(np.arange(query.height), k)], found,
                                    pl.DataFrame({"_sd": dist.reshape(-1)})], how="horizontal"))
        if not parts:
            return pl.DataFrame(schema={**{c: pl.String for c in CASE}, **{"_t_" + c: pl.String for c in CASE},
                                        "_dist": pl.Float64})
        pairs = pl.concat(parts).join(self._device_distance, left_on=["device_id", "_t_device_id"],
                                      right_on=["device_id", "_train_device"], how="left")
        dist = (pl.col("_ddist").fill_null(0.0) + _SHAPE_WEIGHT * pl.col("_sd")
                + _DTYPE_PENALTY * (pl.col("dtype") != pl.col("_t_dtype")).cast(pl.Float64))
        pairs = pairs.with_columns(dist.alias("_dist")).sort([*CASE, "_dist", "_t_device_id", "_t_dtype", "_t_shape_key"])
        return pairs.group_by(CASE, maintain_order=True).head(self.neighbours).select(
            *CASE, *["_t_" + c for c in CASE], "_dist")

    def score(self, test: pl.DataFrame) -> np.ndarray:
        # a device never trained on has no distance to the training devices (0 to each), so its neighbours and
        # votes are those of any other such device: its cases are scored once, under _NEW, for all of them
        trained = self._device_distance["device_id"].unique().to_list()
        as_new = pl.when(pl.col("device_id").is_in(trained)).then(pl.col("device_id")).otherwise(pl.lit(_NEW))
        test = test.with_columns(as_new.alias("device_id"))
        pairs = self._neighbours(self._cases(test))
        weight = pl.lit(1.0) if self.uniform else (-(pl.col("_dist") - pl.col("_dist").min().over(CASE))
                                                   / self.tau).exp()
        pairs = pairs.with_columns(weight.alias("_w")).select(*CASE, *["_t_" + c for c in CASE], "_w")
        train = self._train if "_v" in self._train.columns else self._train.rename({"log_rel": "_v"})  # older files
        votes = pairs.join(train.rename({c: "_t_" + c for c in CASE}), on=[f"_t_{c}" for c in CASE])
        prior = votes.group_by([*CASE, "config_key"]).agg(
            ((pl.col("_w") * pl.col("_v")).sum() / pl.col("_w").sum()).alias("_prior"))
        scored = test.select(*CASE, "config_key").join(prior, on=[*CASE, "config_key"], how="left",
                                                       maintain_order="left")
        # a config no neighbour measured goes after every config one did
        return scored.select(pl.col("_prior").fill_null(CLIP_LOG_REL + 1.0)).to_series().to_numpy()
