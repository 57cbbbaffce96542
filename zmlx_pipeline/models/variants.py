"""The named ranker variants (MODEL_VARIANTS), the default one and make_ranker.

- `gbr`: HistGradientBoostingRegressor on log time, every feature (the plain model; publish's time model);
- `gbr_rel`: the same on the per-case normalised target log(time / best time of the case), clipped
  at 4x: a ranking target that spends no capacity on how slow the bad configs are;
- `gbr_shared`: the same target from config, shape and ratio features and the device vendor only:
  what holds across the devices of a vendor;
- `prior`: no fitting, a config-only prior: each config's mean log(time / best) over the
  nearest training cases, weighted by how close each case's device (normalised spec
  distance, plus a penalty across vendors), shape and dtype are; `prior_uniform` weighs the
  training cases alike;
- `transfer`: kNN over devices: one config model per training device (boosting with rows near each
  case's best weighted up), their predictions averaged with weights by spec similarity to the test device;
- `simd_aligned`: a rule, no fitting: launch groups that fill whole SIMD groups first;
- `gbr_med`: `gbr_shared` plus the launch geometry (features.py's geo_*), on log(time / case
  median), clipped at 4x;
- `prior_rank_uniform`: `prior_uniform` averaging each config's rank in its case (rank_pct)
  instead of its log(time / best): a device whose bad configs are 100x slow weighs no more
  than one where they are 1.2x;
- `transfer_geo`: `transfer` whose per-device models also see the launch geometry relative
  to the device (blocks per core, wave quantisation), which moves with the test device;
- launch geometry a kernel declares (KernelSpec.tiles: matmul's tiles, waves over the cores,
  tile waste; features.py's geo_*) is in `gbr_shared`'s and `transfer`'s features by default
  (shared_features); geometry inferred from Kernel Tuner names only in the `*_geo`/`gbr_med` variants;
- `ensemble`: `prior`, `transfer`, `gbr_shared` and `simd_aligned` weighted,
  and its top k hedged with `prior`, `transfer` and `prior_uniform`, as cross-validation on
  the training rows alone decides: leaving training devices out for devices never measured,
  holding out training shapes for seen devices (CVEnsembleRanker);
- `ensemble_light`: the same with `gbr_shared_light` (50 trees, not 200) and `transfer_light`
  (20 trees per device, not 60): under half the fitting time, picks that move a little either way
  (notes/learning.md, "Training and evaluation time").
- `split_rel`: a different model for the devices seen in training (the mean of `gbr_rel`,
  `gbr_rel_clip2`, clipped at 2x, and `gbr_rel_top`, each case's fastest configs weighted up) and
  for new devices (`ensemble`, its unseen setting only): SeenUnseenRanker;
- `baseline_<name>`: one of evaluate's baselines (models/baselines.py) as a ranker (BaselineRanker);
- `robust` (the default) and its siblings `robust_*`: the ensemble's seen setting for measured devices; for
  a new device the ensemble's transfer and `gbr_shared_top` together (models/robust.py); `robust_rank`, the
  default before it: `rank_guarded` for a new device; `robust_fast`: `robust` whose new-device selection fits
  a quarter of the boosting trees inside its inner folds (INNER_FITS; the final members are full), 1.4x faster
  to train, opt-in (notes/learning.md, "Lighter inner fits"); `robust_settled`: `robust` that chooses nothing where
  the new-device folds hold under 30 cases (equal ensemble weights, no inner fit), opt-in (notes/ranker-selection.md);
  `robust_sparse`: `robust` whose seen devices measured at few shapes take seen weights of their own (`ensemble_sparse`),
  compared and not adopted (notes/learning.md, "Weights of their own for the sparse devices");
- `ensemble_guarded`: `ensemble` whose nested inner selection may also let a baseline lead (only when the
  inner folds hold enough cases and the baseline wins every one) and interleaves the best baselines
  into its top k where the inner folds say so (CVEnsembleRanker's guards; notes/ranker-selection.md);
- `stacked`: the ensemble with `baseline_other_device_best` and `baseline_common_top10` as weighted members;
- `gbr_shared_top`: `gbr_shared` with each case's fastest configs weighted up (a ranking objective on
  relative time); `rank_guarded`: it alone, guarded as `ensemble_guarded` is.

The default was chosen by the scores of evaluate.py (leave-one-device-out on the Kernel Tuner
files, both splits on our H100/H200 data); its weights are never fitted on the rows it is
scored on (in evaluate.py the inner folds lie inside the outer training rows).
"""

from __future__ import annotations

import math
from typing import Callable

from zmlx_pipeline.models import baselines as _baselines
from zmlx_pipeline.models import robust as _robust
from zmlx_pipeline.models.cv_ensemble import SPARSE_SHARE, CVEnsembleRanker
from zmlx_pipeline.models.features import KernelFeatures
from zmlx_pipeline.models.rankers.alignment import AlignmentRanker
from zmlx_pipeline.models.rankers.base import CLIP_LOG_REL, ModelError, Ranker
from zmlx_pipeline.models.rankers.baseline import BaselineRanker
from zmlx_pipeline.models.rankers.pipeline import (
    PipelineRanker,
    boosting_regressor,
    shared_features,
)
from zmlx_pipeline.models.rankers.prior import PriorRanker
from zmlx_pipeline.models.seen_unseen import SeenUnseenRanker
from zmlx_pipeline.models.transfer import CORE_WEIGHTS, DeviceTransferRanker

MODEL_VARIANTS: dict[str, Callable[[KernelFeatures], Ranker]] = {
    "gbr": lambda f: PipelineRanker(f, boosting_regressor(), target="log_time", name="gbr"),
    "gbr_rel": lambda f: PipelineRanker(f, boosting_regressor(), target="log_rel", clip=CLIP_LOG_REL, name="gbr_rel"),
    "gbr_shared": lambda f: PipelineRanker(shared_features(f), boosting_regressor(), target="log_rel", clip=CLIP_LOG_REL,
                                           name="gbr_shared"),
    "prior": lambda f: PriorRanker(f, name="prior"),
    "prior_uniform": lambda f: PriorRanker(f, uniform=True, vendor_penalty=0.0, name="prior_uniform"),
    "transfer": lambda f: DeviceTransferRanker(f, "gbr", name="transfer"),
    "transfer_geo": lambda f: DeviceTransferRanker(f, "gbr", geometry=True, name="transfer_geo"),
    # the core count's weight in the device distance chosen by leaving one training device out (notes/learning.md)
    "transfer_cores": lambda f: DeviceTransferRanker(f, "gbr", core_weights=CORE_WEIGHTS, name="transfer_cores"),
    "simd_aligned": lambda f: AlignmentRanker(f, name="simd_aligned"),
    "gbr_med": lambda f: PipelineRanker(shared_features(f, geometry=True), boosting_regressor(), target="log_med",
                                        clip=CLIP_LOG_REL, name="gbr_med"),
    "prior_rank_uniform": lambda f: PriorRanker(f, uniform=True, vendor_penalty=0.0, target="rank_pct",
                                                name="prior_rank_uniform"),
    "ensemble": lambda f: CVEnsembleRanker(f, ENSEMBLE_MEMBERS, ENSEMBLE_HEDGES, name="ensemble"),
    # the ensemble whose seen devices measured at few shapes take weights of their own (cv_ensemble.SPARSE_SHARE)
    "ensemble_sparse": lambda f: CVEnsembleRanker(f, ENSEMBLE_MEMBERS, ENSEMBLE_HEDGES, sparse_share=SPARSE_SHARE,
                                                  name="ensemble_sparse"),
    # the ensemble with a quarter / a third of the boosting trees (the cost of its fits; notes/learning.md)
    "gbr_shared_light": lambda f: PipelineRanker(shared_features(f), boosting_regressor(max_iter=50, learning_rate=0.3),
                                                 target="log_rel", clip=CLIP_LOG_REL, name="gbr_shared_light"),
    "transfer_light": lambda f: DeviceTransferRanker(f, "gbr_light", name="transfer_light"),
    # half of the trees, each twice the step: candidates for the inner selection's fits (INNER_FITS)
    "gbr_shared_half": lambda f: PipelineRanker(shared_features(f), boosting_regressor(max_iter=100, learning_rate=0.2),
                                                target="log_rel", clip=CLIP_LOG_REL, name="gbr_shared_half"),
    "gbr_shared_top_half": lambda f: PipelineRanker(shared_features(f), boosting_regressor(max_iter=100, learning_rate=0.2),
                                                    target="log_rel", clip=CLIP_LOG_REL, top_weight=4.0, top_scale=0.1,
                                                    name="gbr_shared_top_half"),
    "gbr_shared_top_light": lambda f: PipelineRanker(shared_features(f), boosting_regressor(max_iter=50, learning_rate=0.3),
                                                     target="log_rel", clip=CLIP_LOG_REL, top_weight=4.0, top_scale=0.1,
                                                     name="gbr_shared_top_light"),
    "transfer_half": lambda f: DeviceTransferRanker(f, "gbr_half", name="transfer_half"),
    "ensemble_light": lambda f: CVEnsembleRanker(f, ("prior", "transfer_light", "gbr_shared_light", "simd_aligned"),
                                                 ("prior", "transfer_light", "prior_uniform"), name="ensemble_light"),
    # gbr_rel clipped at 2x (not 4x), and gbr_rel with each case's fast configs weighted up (as `transfer`)
    "gbr_rel_clip2": lambda f: PipelineRanker(f, boosting_regressor(), target="log_rel", clip=math.log(2.0), name="gbr_rel_clip2"),
    "gbr_rel_top": lambda f: PipelineRanker(f, boosting_regressor(), target="log_rel", clip=CLIP_LOG_REL, top_weight=4.0,
                                            top_scale=0.1, name="gbr_rel_top"),
    # the three gbr_rel variants averaged for the devices seen in training, the ensemble for new ones
    # (notes/learning.md, "gbr_rel for seen devices")
    "split_rel": lambda f: SeenUnseenRanker(f, SPLIT_REL_SEEN, "ensemble", name="split_rel"),
    # a ranking objective on relative time: log(time / case best), each case's fastest configs weighted up
    "gbr_shared_top": lambda f: PipelineRanker(shared_features(f), boosting_regressor(), target="log_rel",
                                               clip=CLIP_LOG_REL, top_weight=4.0, top_scale=0.1, name="gbr_shared_top"),
    # the ensemble whose nested selection may fall back to a baseline or interleave one with its top k
    "ensemble_guarded": lambda f: CVEnsembleRanker(f, ENSEMBLE_MEMBERS, ENSEMBLE_HEDGES, max_device_folds=4,
                                                   guards_seen=GUARDS_SEEN, guards_unseen=GUARDS_UNSEEN,
                                                   name="ensemble_guarded"),
    # the ensemble for the devices seen in training (its seen setting), and for new devices the ranking objective
    # guarded by the baselines (the default before `robust`; notes/ranker-selection.md)
    "robust_rank": lambda f: SeenUnseenRanker(f, ("ensemble",), "rank_guarded", name="robust_rank"),
    # stacking: baselines as weighted members of the ensemble
    "stacked": lambda f: CVEnsembleRanker(f, STACKED_MEMBERS, ENSEMBLE_HEDGES, max_device_folds=4, name="stacked"),
    # the ranking objective alone, guarded as `ensemble_guarded` is (`robust_rank`'s new-device part)
    "rank_guarded": lambda f: CVEnsembleRanker(f, ("gbr_shared_top",), (), max_device_folds=4, guards_seen=GUARDS_SEEN,
                                               guards_unseen=GUARDS_UNSEEN, name="rank_guarded"),
    **{f"baseline_{b}": (lambda b: lambda f: BaselineRanker(f, b))(b) for b in _baselines.BASELINES},
    # for new devices the ensemble's transfer and the ranking objective together (models/robust.py); `robust`, the
    # default, is one of them (notes/ranker-selection.md)
    **{n: (lambda n: lambda f: _robust.VARIANTS[n](f))(n) for n in (
        "unseen_select", "unseen_blend", "unseen_hedged", "unseen_unanimous", "unseen_unanimous_fast", "unseen_settled",
        "robust_select", "robust_blend", "robust_hedged", "robust", "robust_fast", "robust_settled",
        "robust_sparse")},
}
ENSEMBLE_MEMBERS = ("prior", "transfer", "gbr_shared", "simd_aligned")  # weighted by inner CV
ENSEMBLE_HEDGES = ("prior", "transfer", "prior_uniform")     # rankings its top k may interleave
SPLIT_REL_SEEN = ("gbr_rel", "gbr_rel_clip2", "gbr_rel_top")  # split_rel's members for seen devices
# the baselines `robust` may fall back to or interleave with, for a seen device (new shape) and a new device
GUARDS_SEEN = ("nearest_shape", "most_common_best")
GUARDS_UNSEEN = ("other_device_best", "most_common_best", "common_top10", "chip_default")
STACKED_MEMBERS = ("prior", "transfer", "gbr_shared", "baseline_other_device_best", "baseline_common_top10")
DEFAULT_MODEL = "robust"
# the variants the inner selection folds fit in place of the boosting members, by how many of the trees they keep
INNER_FITS = {
    "full": {},
    "half": {"gbr_shared": "gbr_shared_half", "gbr_shared_top": "gbr_shared_top_half", "transfer": "transfer_half"},
    "quarter": {"gbr_shared": "gbr_shared_light", "gbr_shared_top": "gbr_shared_top_light",
                "transfer": "transfer_light"},
    "quarter_transfer": {"transfer": "transfer_light"},  # the per-device models alone lighter
}


def check_model(model: str) -> str:
    """The name of a known variant, or ModelError naming the known ones."""
    if model not in MODEL_VARIANTS:
        raise ModelError(f"unknown model {model!r}; expected one of {', '.join(MODEL_VARIANTS)}")
    return model


def make_ranker(features: KernelFeatures, model: str = DEFAULT_MODEL) -> Ranker:
    """An unfitted ranker of the named variant for one kernel."""
    return MODEL_VARIANTS[check_model(model)](features)


def fit_kernel_model(features: KernelFeatures, model: str = DEFAULT_MODEL) -> Ranker:
    """A ranker of the named variant trained on all of a kernel's measurements."""
    return make_ranker(features, model).fit(features.frame)
