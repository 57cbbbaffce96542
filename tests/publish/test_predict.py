"""Publish scores candidates through the model's own scoring: the same rows score the same as in evaluate.

The toy kernel's buckets are its measured shapes, so every bucket of a measured device holds rows the model
was trained on: publish's candidate rows (built and featurised anew) must get exactly the scores
`ranker.score` gives those training rows, and each published ranking must be that order.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from bundle_fixtures import TOY_DEVICES, fill_toy
from zmlx_pipeline.core.keys import mapping_key
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models.features import CASE
from zmlx_pipeline.publish.build import STORE_K, build_kernel, device_records
from zmlx_pipeline.publish.models import load_models
from zmlx_pipeline.publish.predict import all_devices_frame, candidate_rows, featurize, predict_log_time, score_rows


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy kernel's model (fitted, no held-out scoring) and its store's device rows."""
    with Store(tmp_path_factory.mktemp("predict") / "toy.duckdb") as store:
        fill_toy(store)
        km = load_models(store, evaluate=False).kernels["toy_scale"]
        return km, device_records(store), all_devices_frame(store)


def test_publish_scores_the_models_training_rows_as_the_model_does(toy):
    km, _, frame = toy
    f = km.features
    cases = [(row["device_id"], row["dtype"], json.loads(row["shape"]), [json.loads(c) for c in row["config"]])
             for row in f.frame.group_by(["device_id", "dtype", "shape_key"], maintain_order=True)
             .agg(pl.col("shape").first(), pl.col("config")).iter_rows(named=True)]
    needed = [*km.ranker.features.features, *km.time_model.features.features]
    feats = featurize(f, candidate_rows(f, cases), frame, needed)
    published = score_rows(km.ranker, feats).with_columns(
        pl.Series("log_time", predict_log_time(km.time_model, feats)))
    model = f.frame.select(*CASE, "config_key").with_columns(
        pl.Series("model_score", km.ranker.score(f.frame)), pl.Series("model_log_time", km.time_model.score(f.frame)))
    both = published.join(model, on=[*CASE, "config_key"], how="inner")
    assert both.height == f.frame.height == published.height
    np.testing.assert_allclose(both["score"].to_numpy(), both["model_score"].to_numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(both["log_time"].to_numpy(), both["model_log_time"].to_numpy(), rtol=1e-12)


def test_every_published_ranking_of_a_measured_device_is_the_models_order_of_those_rows(toy):
    km, devices, frame = toy
    tables, _ = build_kernel(km, devices, frame, only_devices=list(TOY_DEVICES))
    f = km.features
    scored = f.frame.select(*CASE, "shape", "config_key").with_columns(pl.Series("_s", km.ranker.score(f.frame)))
    checked = 0
    for (device, dtype, _), case in scored.group_by(["device_id", "dtype", "shape_key"]):
        shape = json.loads(case["shape"][0])
        want = case.sort(["_s", "config_key"])["config_key"].to_list()[:STORE_K]
        entry = tables.entries[device][dtype]["buckets"][tables.bucket_key(shape)]
        got = [mapping_key(tables.configs[i]) for i in entry["ranked"]]
        assert got == want, (device, shape)
        assert entry["best"] == entry["ranked"][0] and entry["evidence"] == "predicted"
        checked += 1
    assert checked == f.frame.select("device_id", "dtype", "shape_key").n_unique() == 12


def test_candidate_rows_are_one_row_per_case_and_config_in_order(toy):
    km = toy[0]
    legal_a, legal_b = [{"TG": 64, "VEC": 1}, {"TG": 128, "VEC": 2}], [{"TG": 256, "VEC": 4}]
    cases = [("nvidia-h200", "float16", {"rows": 64, "cols": 1024}, legal_a),
             ("nvidia-h200", "float32", {"rows": 64, "cols": 1024}, []),
             ("apple-m3-max-40c", "float16", {"rows": 1, "cols": 4096}, legal_b),
             ("nvidia-h100-sxm", "float16", {"rows": 64, "cols": 1024}, legal_a)]
    rows = candidate_rows(km.features, cases)
    want = [(d, t, mapping_key(s), json.loads(json.dumps(s)), mapping_key(c), c)
            for d, t, s, configs in cases for c in configs]
    got = [(r["device_id"], r["dtype"], r["shape_key"], json.loads(r["shape"]), r["config_key"], json.loads(r["config"]))
           for r in rows.iter_rows(named=True)]
    assert got == want
    assert set(rows["kernel"]) == {"toy_scale"} and set(rows["status"]) == {"ok"}
