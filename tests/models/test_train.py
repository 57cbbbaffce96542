"""Training: a model per kernel, saved, registered with fingerprint, versions and held-out scores incl. pruning k."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.data.store import Store, StoreError
from zmlx_pipeline.models.rankers.base import fit_sample
from zmlx_pipeline.models.variants import fit_kernel_model
from zmlx_pipeline.models.evaluate import evaluate_kernel
from zmlx_pipeline.models.folds import EvaluationError
from zmlx_pipeline.models.metrics import prune_k as prune_k_of
from zmlx_pipeline.models.features import store_features
from zmlx_pipeline.models.persist import ModelFileError
from zmlx_pipeline.models.train import (
    NoTrainedModel,
    data_fingerprint,
    load_model,
    prune_k,
    train_models,
    verify_models,
)

DEVICES = ("nvidia-rtx-a4000", "nvidia-rtx-a6000")


def fill(store, make_measurement, kernels=("k",), scale=1.0) -> None:
    for i, device_id in enumerate(DEVICES):
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
    store.record([
        make_measurement(device_id=d, kernel=kernel, dtype="float32", shape={"rows": rows, "cols": 1024},
                         config={"TG": tg, "VEC": vec},
                         median_us=scale * (rows * (1 + i) / vec + abs(tg - 64 * rows ** 0.5) / 16 + 1))
        for kernel in kernels for i, d in enumerate(DEVICES) for rows in (1, 16, 256, 4096)
        for tg in (64, 256, 1024) for vec in (1, 4)
    ])


def test_train_saves_and_registers_one_model_per_kernel(store, make_measurement):
    fill(store, make_measurement, kernels=("k", "k2"))
    rows = train_models(store, model="prior")
    assert [r["kernel_filter"] for r in rows] == ["k", "k2"]
    row = rows[0]
    assert row["data_fingerprint"].startswith("sha256:") and len(row["data_fingerprint"]) == 7 + 16
    assert {"python", "scikit-learn", "numpy", "polars", "skops", "zmlx-pipeline"} <= set(row["versions"])
    params, scores = row["params"], row["scores"]
    assert params["model"] == "prior" and params["rows"] == 2 * 4 * 6 and params["devices"] == list(DEVICES)
    assert params["file_sha256"].startswith("sha256:")
    assert scores["prune_split"] == "shapes" and scores["prune_cases"] == 8 and scores["configs_max"] == 6
    assert 1 <= scores["prune_k"] <= 6 and scores["prune_hit"] >= 0.95
    assert scores["regret1_geomean"] >= 1.0
    # the model file lies in models/ next to the store, referenced relative to the store's folder
    assert row["path"].startswith("models/") and (Path(store.path).parent / row["path"]).is_file()
    # the registry holds the same rows, newest first
    registered = store.models(kernel="k")
    assert registered[0]["model_id"] == row["model_id"] and registered[0]["scores"] == scores
    assert {r["kernel_filter"] for r in store.models()} == {"k", "k2"}


def test_the_loaded_model_scores_like_the_fitted_one(store, make_measurement):
    fill(store, make_measurement)
    (row,) = train_models(store, model="prior")
    trained = load_model(store, "k")
    assert trained.model_id == row["model_id"] and trained.prune_k == row["scores"]["prune_k"]
    f = store_features(store)["k"]
    np.testing.assert_allclose(trained.ranker.score(f.frame), fit_kernel_model(f, "prior").score(f.frame))
    assert prune_k(store, "k") == row["scores"]["prune_k"]
    assert load_model(store, model_id=row["model_id"]).kernel == "k"


def test_pruning_k_is_the_held_out_95_percent_coverage(store, make_measurement):
    fill(store, make_measurement)
    (row,) = train_models(store, model="prior")
    per_case = evaluate_kernel(store_features(store)["k"], "shapes", ks=(1,), models=("prior",), baselines=False)
    k = prune_k_of(per_case["hit_rank"].to_list())
    assert row["scores"]["prune_k"] == k
    covered = (per_case["hit_rank"] <= k).mean()
    assert covered >= 0.95 and (k == 1 or (per_case["hit_rank"] <= k - 1).mean() < 0.95)


def test_device_filter_and_fingerprint(store, make_measurement, tmp_path_factory):
    fill(store, make_measurement)
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # outside the store's folder: kept as an absolute path
    (only,) = train_models(store, devices=["nvidia-rtx-a4000"], model="prior", models_dir=elsewhere)
    assert only["params"]["devices"] == ["nvidia-rtx-a4000"] and only["params"]["device_filter"] == ["nvidia-rtx-a4000"]
    assert Path(only["path"]).is_absolute() and Path(only["path"]).parent == elsewhere.resolve()
    frame = store_features(store)["k"].frame
    assert data_fingerprint(frame) == data_fingerprint(frame.reverse())  # row order does not matter
    changed = frame.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(pl.col("median_us") * 2)
                                 .otherwise(pl.col("median_us")).alias("median_us"))
    assert data_fingerprint(changed) != data_fingerprint(frame)
    assert only["data_fingerprint"] != data_fingerprint(frame)  # one device's rows only


def test_errors(store, make_measurement, tmp_path):
    with pytest.raises(EvaluationError, match="the store has no ok measurements"):
        train_models(store)
    with pytest.raises(NoTrainedModel, match="no trained model for kernel 'k'.*`zmlx-pipeline train --kernel k` first"):
        load_model(store, "k")  # the default store: no --db in the command
    fill(store, make_measurement)
    with pytest.raises(EvaluationError, match="no ok measurements of kernel\\(s\\) nope; the store has k"):
        train_models(store, kernels=["nope"])
    with Store(tmp_path / "ro.duckdb") as other:
        fill(other, make_measurement)
    with Store(tmp_path / "ro.duckdb", read_only=True) as ro, pytest.raises(StoreError, match="read-only"):
        train_models(ro)


def test_a_tampered_model_file_is_refused(store, make_measurement):
    fill(store, make_measurement)
    (row,) = train_models(store, model="gbr_shared")
    path = Path(store.path).parent / row["path"]
    path.write_bytes(path.read_bytes()[:-10] + b"tampered!!")
    with pytest.raises(ModelFileError, match="changed since it was registered"):
        load_model(store, "k")
    with pytest.raises(ModelFileError):
        verify_models(store)


def test_fit_sample_keeps_each_case_fast_configs(store, make_measurement):
    fill(store, make_measurement)
    frame = store_features(store)["k"].frame
    assert fit_sample(frame, max_rows=10 ** 6) is frame
    small = fit_sample(frame, max_rows=20, top=1)
    assert small.height < frame.height
    best = frame.filter(pl.col("log_rel") == 0).select("device_id", "shape_key", "config_key")
    assert best.join(small, on=["device_id", "shape_key", "config_key"], how="anti").is_empty()
    assert fit_sample(frame, max_rows=20, top=1).equals(small)  # same seed, same rows


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_train_stopped_while_registering_keeps_the_models_before_and_no_stray_file(store, make_measurement,
                                                                                       monkeypatch, stop):
    fill(store, make_measurement, kernels=("a", "b"))
    real, calls = store.add_model, []

    def add_model(row):
        calls.append(row["kernel_filter"])
        if len(calls) == 2:
            raise stop("stopped")
        return real(row)

    monkeypatch.setattr(store, "add_model", add_model)
    with pytest.raises(stop):
        train_models(store, jobs=1)
    folder = Path(store.path).parent / "models"
    assert [r["kernel_filter"] for r in store.models()] == calls[:1]
    assert sorted(p.name for p in folder.iterdir()) == [Path(r["path"]).name for r in store.models()]


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_trains_unregistered_model_and_temp_files_are_removed_by_the_next_train(store, make_measurement):
    fill(store, make_measurement)
    (first,) = train_models(store, model="prior")
    folder = Path(store.path).parent / "models"
    registered = folder / Path(first["path"]).name
    dead = _dead_pid()
    # what `kill -9` leaves: a saved model never registered, its half-written sibling, the pending list
    orphan = folder / "k-20260101T000000Z.zmodel"
    orphan.write_bytes(b"x" * 1000)
    half = folder / f".k-20260101T000001Z.zmodel.tmp-{dead}-abcd1234"
    half.write_bytes(b"x")
    here = str(Path(store.path).resolve())
    (folder / f".pending-{dead}").write_text(f"{here}\t{orphan.name}\n{here}\t{registered.name}\n")
    live = folder / f".k-20260101T000002Z.zmodel.tmp-{os.getpid()}-abcd1234"  # a running process's: kept
    live.write_bytes(b"x")
    # another store's killed train noted a file in the same folder: only that store's next train may remove it
    theirs = folder / "k-20260101T000003Z.zmodel"
    theirs.write_bytes(b"y")
    other_dead = _dead_pid()
    (folder / f".pending-{other_dead}").write_text(f"{Path(store.path).parent / 'other.duckdb'}\t{theirs.name}\n")
    (second,) = train_models(store, model="prior")
    assert not orphan.exists() and not half.exists() and not (folder / f".pending-{dead}").exists()
    assert registered.is_file() and live.is_file()  # a registered model is never swept
    assert theirs.is_file() and theirs.name in (folder / f".pending-{other_dead}").read_text()
    assert (folder / Path(second["path"]).name).is_file()
    assert not list(folder.glob(f".pending-{os.getpid()}"))  # this run registered what it noted


def test_train_submits_the_final_fits_then_the_longest_folds(store, make_measurement):
    """The final fits go to the workers first (they fit what the folds reuse), then every split's folds (a task fitting
    a model per fold), the split with the most folds first, so that the tasks left last, while a worker may idle,
    are the short ones."""
    from zmlx_pipeline.models.evaluate import kernel_features_of
    from zmlx_pipeline.models.folds import fold_plan
    from zmlx_pipeline.models.pool import KernelPool

    order: list[tuple] = []

    class RecordingPool(KernelPool):  # the real pool, in this process, noting what is submitted in which order
        def submit(self, kernel, fn, *args):
            order.append((kernel, fn.__name__, args[1] if fn.__name__ == "_score_folds" else None))
            return super().submit(kernel, fn, *args)

    fill(store, make_measurement, kernels=("k", "k2"))
    features = kernel_features_of(store, None)
    with RecordingPool(features, jobs=1) as pool:
        rows = train_models(store, model="prior", features=features, pool=pool)
    assert [r["kernel_filter"] for r in rows] == ["k", "k2"]
    assert [fn for _, fn, _ in order] == ["_fit_task"] * 2 + ["_score_folds"] * 4
    folds = [len(fold_plan(features[kernel], split)) for kernel, _, split in order[2:]]
    assert folds == sorted(folds, reverse=True) and folds[0] > folds[-1]
    assert [split for _, _, split in order[2:]] == ["shapes", "shapes", "devices", "devices"]
    assert all(r["scores"]["prune_split"] == "shapes" and r["scores"]["prune_k"] for r in rows)


def test_a_registry_row_pointed_at_another_models_file_is_refused(store, make_measurement):
    """The file's hash is right (it is the other model's file, unchanged), but the file says which model it is."""
    fill(store, make_measurement)
    (first,) = train_models(store, model="prior")
    (second,) = train_models(store, model="prior")
    store._conn.execute("UPDATE models SET path = ?, params = ? WHERE model_id = ?",
                        [second["path"], json.dumps({**first["params"], "file_sha256": second["params"]["file_sha256"]}),
                         first["model_id"]])
    with pytest.raises(ModelFileError, match=f"saved as model_id '{second['model_id']}'"):
        load_model(store, model_id=first["model_id"])
    with pytest.raises(ModelFileError, match="not the registry's"):
        verify_models(store)
    assert load_model(store, model_id=second["model_id"]).model_id == second["model_id"]


def test_the_train_command_a_message_gives_runs_as_shown_for_its_store_and_kernel(tmp_path):
    import shlex

    from zmlx_pipeline.data.store import Store

    with Store(tmp_path / "my store.duckdb") as other:
        with pytest.raises(NoTrainedModel) as exc:
            load_model(other, "my norm;rm")
    hint = str(exc.value).split("`")[1]
    assert shlex.split(hint) == ["zmlx-pipeline", "train", "--db", str(tmp_path / "my store.duckdb"), "--kernel",
                                 "my norm;rm"]
