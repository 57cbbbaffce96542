"""The prior scores every device it was not trained on alike, once: as each such device scored alone."""

import math

import numpy as np
import polars as pl

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.models.features import store_features
from zmlx_pipeline.models.rankers.prior import PriorRanker

DEVICES = ("nvidia-rtx-a4000", "nvidia-h100-sxm", "apple-m3-max-40c")


def fill(store, make_measurement) -> None:
    """Each device at six shapes, 12 configs whose best moves with the shape and the device."""
    for device_id in DEVICES:
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
    store.record([
        make_measurement(device_id=d, kernel="k", dtype="float32", shape={"rows": rows, "cols": 1024},
                         config={"TG": tg, "VEC": vec},
                         median_us=rows * (1 + i) / vec + abs(math.log2(tg) - math.log2(rows) / (1 + i)) * 40 + 1)
        for i, d in enumerate(DEVICES) for rows in (1, 4, 16, 64, 256, 4096)
        for tg in (32, 64, 128, 256, 512, 1024) for vec in (1, 4)
    ])


def test_devices_never_trained_on_get_the_scores_each_gets_alone(store, make_measurement):
    fill(store, make_measurement)
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
