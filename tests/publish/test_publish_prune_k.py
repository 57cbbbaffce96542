"""Publishing a kernel with no registered model scores it as `train` does: the same pruning k and regrets."""

import sys
from pathlib import Path

from zmlx_pipeline.models.evaluate import gather_folds, submit_kernel
from zmlx_pipeline.models.metrics import prune_k as prune_k_of
from zmlx_pipeline.models.features import store_features
from zmlx_pipeline.models.train import train_models
from zmlx_pipeline.publish.models import fit_kernel, load_models

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from store_fixtures import fill_moving_best  # noqa: E402

DEVICES = ("nvidia-rtx-a4000", "nvidia-rtx-a6000", "nvidia-h100-sxm")


def test_train_and_publish_record_the_same_pruning_k(store, make_measurement, tmp_path):
    fill_moving_best(store, make_measurement, DEVICES, bumps=True)
    (row,) = train_models(store, model="ensemble", models_dir=tmp_path / "models", jobs=1)
    features = store_features(store)["k"]
    published = fit_kernel(features, "ensemble")  # the path of a kernel without a registered model
    scores = row["scores"]
    assert scores["prune_split"] == "shapes" and published.prune_k == scores["prune_k"]
    assert published.regret["seen_device"] == scores["regret1_geomean"]
    assert published.regret["cases"] == scores["prune_cases"]
    # the registered model gives the registry's k; both routes of load_models agree
    assert load_models(store, kernels=["k"], evaluate=False).kernels["k"].prune_k == scores["prune_k"]
    # both are the model's cases of evaluate's nested folds of held-out shapes, every fold
    nested = gather_folds(submit_kernel(features, "shapes", ks=(1, 3, 5), models=("ensemble",), baselines=False),
                          (1, 3, 5))
    assert prune_k_of(nested["hit_rank"].to_list()) == scores["prune_k"] and nested.height == scores["prune_cases"]
