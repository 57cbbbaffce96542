"""The prior scores every device it was not trained on alike, once: as each such device scored alone."""

import numpy as np
import polars as pl

from zmlx_pipeline.models.features import store_features
from zmlx_pipeline.models.rankers.prior import PriorRanker
from store_fixtures import fill_moving_best

DEVICES = ("nvidia-rtx-a4000", "nvidia-h100-sxm", "apple-m3-max-40c")


def test_devices_never_trained_on_get_the_scores_each_gets_alone(store, make_measurement):
    fill_moving_best(store, make_measurement, DEVICES)
    features = store_features(store)["k"]
    frame = features.frame
    train = frame.filter(pl.col("device_id") != DEVICES[2])
    held = frame.filter(pl.col("device_id") == DEVICES[2])
    prior = PriorRanker(features).fit(train)
    new_a = held.with_columns(pl.lit("new-a").alias("device_id"))
    new_b = held.with_columns(pl.lit("new-b").alias("device_id")).filter(pl.col("shape_key") != held["shape_key"][0])
    seen = frame.filter(pl.col("device_id") == DEVICES[0])
    together = prior.score(pl.concat([new_a, seen, new_b]))
    alone = [prior.score(part) for part in (new_a, seen, new_b)]
    assert np.array_equal(together, np.concatenate(alone))
    a = dict(zip(zip(new_a["shape_key"], new_a["config_key"]), alone[0]))
    assert [a[k] for k in zip(new_b["shape_key"], new_b["config_key"])] == alone[2].tolist()
    assert not np.array_equal(alone[1], alone[0][: alone[1].size])  # a trained device is scored by its own distances
