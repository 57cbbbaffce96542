"""Experimental variants, registered into MODEL_VARIANTS at import."""
import numpy as np
from zmlx_pipeline.models import cv_ensemble, variants
from zmlx_pipeline.models.rankers import base
from zmlx_pipeline.models.rankers import pipeline

class WeightedRel(pipeline.PipelineRanker):
    def __init__(self, f, est, top_weight=4.0, top_scale=0.1, clip=base.CLIP_LOG_REL, name="gbr_rel_w"):
        super().__init__(f, est, target="log_rel", clip=clip, name=name)
        self.top_weight, self.top_scale = top_weight, top_scale
    def fit(self, train):
        train = base.fit_sample(train)
        y = train["log_rel"].to_numpy()
        w = 1.0 + self.top_weight * np.exp(-y / self.top_scale)
        self.pipeline = base.fit_cached(self.pipeline, train.select(self.features.features), np.minimum(y, self.clip), w)
        return self

V = variants.MODEL_VARIANTS
V["gbr_rel_100"] = lambda f: pipeline.PipelineRanker(f, pipeline.boosting_regressor(max_iter=100, learning_rate=0.2), target="log_rel", clip=base.CLIP_LOG_REL, name="gbr_rel_100")
V["gbr_rel_50"] = lambda f: pipeline.PipelineRanker(f, pipeline.boosting_regressor(max_iter=50, learning_rate=0.3), target="log_rel", clip=base.CLIP_LOG_REL, name="gbr_rel_50")
V["gbr_rel_400"] = lambda f: pipeline.PipelineRanker(f, pipeline.boosting_regressor(max_iter=400, learning_rate=0.05), target="log_rel", clip=base.CLIP_LOG_REL, name="gbr_rel_400")
V["gbr_rel_w"] = lambda f: WeightedRel(f, pipeline.boosting_regressor(), name="gbr_rel_w")
V["gbr_rel_w100"] = lambda f: WeightedRel(f, pipeline.boosting_regressor(max_iter=100, learning_rate=0.2), name="gbr_rel_w100")
V["gbr_rel_c2"] = lambda f: pipeline.PipelineRanker(f, pipeline.boosting_regressor(), target="log_rel", clip=np.log(2.0), name="gbr_rel_c2")
V["ensemble_rel5"] = lambda f: cv_ensemble.CVEnsembleRanker(f, variants.ENSEMBLE_MEMBERS + ("gbr_rel",), variants.ENSEMBLE_HEDGES, name="ensemble_rel5")
