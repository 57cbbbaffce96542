"""Train's recorded held-out cases: evaluate reads them only while they are what a fresh evaluation gives."""

from __future__ import annotations

import pytest
from store_fixtures import DEVICES, fill

from zmlx_pipeline.models import variants
from zmlx_pipeline.data.store import HELDOUT_KS
from zmlx_pipeline.models.evaluate import evaluate, evaluate_kernel
from zmlx_pipeline.models.heldout import data_fingerprint, recorded_cases
from zmlx_pipeline.models.features import store_features
from zmlx_pipeline.models.train import train_models


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _no_fits(monkeypatch) -> list:
    """Make every ranker fit fail loudly; returns the kernels whose fits were attempted."""
    tried: list = []
    real = variants.make_ranker

    def counting(features, model="ensemble"):
        tried.append(features.kernel)
        return real(features, model)

    from zmlx_pipeline.models import evaluate as ev

    monkeypatch.setattr(ev, "make_ranker", counting)
    return tried


@pytest.mark.parametrize("model", ["prior", "ensemble"])
def test_evaluate_reads_trains_records_and_they_equal_a_fresh_evaluation(store, make_measurement, tmp_path,
                                                                          monkeypatch, model):
    fill(store, make_measurement)
    rows = train_models(store, model=model, models_dir=tmp_path / "models", jobs=1)
    assert all(r["scores"]["prune_split"] == "shapes" for r in rows)
    fresh = evaluate(store, "shapes", models=(model,), ks=(1, 3, 5), jobs=1, refit=True)
    assert fresh["reused"] == {}
    tried = _no_fits(monkeypatch)
    reused = evaluate(store, "shapes", models=(model,), ks=(1, 3, 5), jobs=1)
    assert tried == []  # no fold was fitted
    assert reused["reused"] == {r["kernel_filter"]: r["model_id"] for r in rows}
    assert reused["results"] == fresh["results"]  # every figure, float for float
    assert len(reused["results"]) > 2 * 3 * 2  # model and baselines, pooled and per device, both kernels
    # left-out devices were recorded too: read, no fit
    devices = evaluate(store, "devices", models=(model,), ks=(1,), jobs=1)
    assert devices["reused"] == reused["reused"] and tried == []


def test_the_records_hold_the_pruning_ks_cases_and_the_baselines(store, make_measurement, tmp_path):
    fill(store, make_measurement, kernels=("k",))
    (row,) = train_models(store, model="prior", models_dir=tmp_path / "models", jobs=1)
    features = store_features(store)["k"]
    model_id, cases = recorded_cases(store, features, "shapes", "nested", "prior")
    assert model_id == row["model_id"] and row["data_fingerprint"] == data_fingerprint(features.frame)
    model_rows = cases.filter(cases["method"] == "prior")
    assert model_rows.height == row["scores"]["prune_cases"] == 4 * len(DEVICES)
    assert {"nearest_shape", "most_common_best", "chip_default"} <= set(cases["method"].to_list())
    assert [f"r{k}" for k in range(1, 11)] == [c for c in cases.columns if c.startswith("r") and c[1:].isdigit()]
    assert model_rows["pick_key"].null_count() == 0


def test_new_rows_are_not_served_stale_figures(store, make_measurement, tmp_path, monkeypatch):
    fill(store, make_measurement)
    train_models(store, model="prior", models_dir=tmp_path / "models", jobs=1)
    before = evaluate(store, "shapes", models=("prior",), jobs=1)
    assert set(before["reused"]) == {"k", "k2"}
    # one more shape measured on one device for kernel k: k's rows changed, k2's did not
    store.record([make_measurement(device_id=DEVICES[0], kernel="k", dtype="float32", shape={"rows": 64, "cols": 1024},
                                   config={"TG": tg, "VEC": vec}, median_us=50.0 + tg / vec)
                  for tg in (64, 128, 256, 1024) for vec in (1, 2, 4)])
    after = evaluate(store, "shapes", models=("prior",), jobs=1)
    assert after["reused"] == {"k2": before["reused"]["k2"]}
    assert after["results"] == evaluate(store, "shapes", models=("prior",), jobs=1, refit=True)["results"]
    cases = {r["cases"] for r in after["results"] if r["kernel"] == "k" and r["device"] == DEVICES[0]
             and r["method"] == "prior" and r["k"] == 1}
    assert cases == {5}  # the new shape is scored


def test_records_are_read_only_for_the_registered_variant_and_the_nested_protocol(store, make_measurement, tmp_path):
    fill(store, make_measurement, kernels=("k",))
    train_models(store, model="prior", models_dir=tmp_path / "models", jobs=1)
    assert evaluate(store, "shapes", models=("prior",), ks=(1, 10), jobs=1)["reused"]
    assert not evaluate(store, "shapes", models=("prior",), ks=(11,), jobs=1)["reused"]  # k past the records
    assert not evaluate(store, "shapes", models=("gbr",), jobs=1)["reused"]
    assert not evaluate(store, "shapes", models=("prior", "gbr"), jobs=1)["reused"]
    assert not evaluate(store, "shapes", models=("prior",), protocol="fixed", jobs=1)["reused"]


def test_trains_left_out_device_cases_equal_a_fresh_evaluation_float_for_float(store, make_measurement, tmp_path):
    fill(store, make_measurement)
    rows = train_models(store, model="ensemble", models_dir=tmp_path / "models", jobs=1)
    features = store_features(store)
    for row in rows:
        f = features[row["kernel_filter"]]
        model_id, cases = recorded_cases(store, f, "devices", "nested", "ensemble")
        assert model_id == row["model_id"]
        fresh = evaluate_kernel(f, "devices", ks=HELDOUT_KS, models=("ensemble",))
        assert cases.height == fresh.height > 0
        order = ["fold", "method", "device_id", "dtype", "shape_key"]
        assert cases.sort(order).to_dicts() == fresh.sort(order).to_dicts()  # every case and method, float for float
        assert set(cases["fold"].to_list()) == set(DEVICES)
    fresh = evaluate(store, "devices", models=("ensemble",), ks=(1, 3, 5), jobs=1, refit=True)
    reused = evaluate(store, "devices", models=("ensemble",), ks=(1, 3, 5), jobs=1)
    assert reused["reused"] == {r["kernel_filter"]: r["model_id"] for r in rows} and fresh["reused"] == {}
    assert reused["results"] == fresh["results"]


def test_no_devices_split_is_recorded_for_a_kernel_of_one_device(store, make_measurement, tmp_path):
    fill(store, make_measurement, kernels=("k",), devices=DEVICES[:1])
    (row,) = train_models(store, model="prior", models_dir=tmp_path / "models", jobs=1)
    assert store.heldout_count(row["model_id"], "shapes", "nested") > 0
    assert store.heldout_count(row["model_id"], "devices", "nested") == 0


def test_evaluate_records_what_it_fitted_for_the_registered_model(store, make_measurement, tmp_path, monkeypatch):
    fill(store, make_measurement, kernels=("k",))
    (row,) = train_models(store, model="prior", models_dir=tmp_path / "models", jobs=1)
    store._conn.execute("DELETE FROM heldout_cases WHERE split = 'devices'")  # as a model trained before the split was recorded
    first = evaluate(store, "devices", models=("prior",), ks=(1, 3), jobs=1)
    assert first["reused"] == {}
    assert store.heldout_count(row["model_id"], "devices", "nested") > 0
    tried = _no_fits(monkeypatch)
    second = evaluate(store, "devices", models=("prior",), ks=(1, 3), jobs=1)
    assert tried == [] and second["reused"] == {"k": row["model_id"]}
    assert second["results"] == first["results"]
    # another variant than the registered one is fitted, and recorded for nothing
    evaluate(store, "devices", models=("gbr",), ks=(1,), jobs=1)
    assert {m for (m,) in store._conn.execute("SELECT DISTINCT method FROM heldout_cases").fetchall()} >= {"prior"}
    assert "gbr" not in {m for (m,) in store._conn.execute("SELECT DISTINCT method FROM heldout_cases").fetchall()}
