"""Publish's expected regrets: read from the held-out cases train recorded where they hold, the figures a refit
gives, float for float; fitted again where they do not."""

import math
from pathlib import Path

import pytest

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.data.store import HELDOUT_KS
from zmlx_pipeline.models import evaluate as ev
from zmlx_pipeline.models.features import store_features
from zmlx_pipeline.models.heldout import record_cases
from zmlx_pipeline.models.train import train_models
from zmlx_pipeline.publish.build import device_records
from zmlx_pipeline.publish.models import load_models
from zmlx_pipeline.publish.transfer import cross_family_regret, families_are_devices

#: three devices of three architecture families (ampere, hopper, apple m3)
DEVICES = ("nvidia-rtx-a4000", "nvidia-h100-sxm", "apple-m3-max-40c")
MODEL = "ensemble"


def _time(i: int, rows: int, tg: int, vec: int) -> float:
    return rows * (1 + i) / vec + abs(math.log2(tg) - math.log2(rows) / (1 + i)) * 40 + 7 * ((tg * vec + rows + 3 * i) % 5) + 1


def fill(store, make_measurement, devices=DEVICES) -> None:
    """Each device at six shapes, 12 configs whose best moves with the shape and the device."""
    for device_id in devices:
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
    store.record([
        make_measurement(device_id=d, kernel="k", dtype="float32", shape={"rows": rows, "cols": 1024},
                         config={"TG": tg, "VEC": vec}, median_us=_time(i, rows, tg, vec))
        for i, d in enumerate(devices) for rows in (1, 4, 16, 64, 256, 4096)
        for tg in (32, 64, 128, 256, 512, 1024) for vec in (1, 4)
    ])


def record_devices_split(store, row: dict) -> None:
    """What train records for a kernel measured at several shapes only under `shapes`: the left-out-device cases."""
    features = store_features(store)["k"]
    per_case = ev.evaluate_kernel(features, "devices", ks=HELDOUT_KS, models=(MODEL,), baselines=True)
    record_cases(store, row["model_id"], row["data_fingerprint"], "devices", per_case)


@pytest.fixture
def trained(store, make_measurement, tmp_path):
    fill(store, make_measurement)
    (row,) = train_models(store, model=MODEL, models_dir=tmp_path / "models", jobs=1)
    return store, row


def _refitted(store) -> dict:
    """The regrets publish scores when nothing is recorded under `devices` (the folds fitted here)."""
    return load_models(store, evaluate=True, jobs=1).kernels["k"].regret


def test_left_out_device_regret_is_read_from_the_records_and_equals_the_refit(trained, monkeypatch):
    store, row = trained
    refit = _refitted(store)
    assert refit["unseen_device"] is not None and refit["unseen_device"] > 1.0
    record_devices_split(store, row)

    def no_fit(*args, **kwargs):
        raise AssertionError("a fold was fitted although the records hold")

    monkeypatch.setattr(ev, "submit_kernel", no_fit)
    models = load_models(store, evaluate=True, jobs=1)
    assert models.reused == {"k": row["model_id"]}
    read = models.kernels["k"].regret
    assert read["unseen_device"] == refit["unseen_device"]  # float for float
    assert read == refit


def test_records_of_other_rows_are_not_read_and_the_folds_are_fitted(trained, make_measurement):
    store, row = trained
    record_devices_split(store, row)
    store.record([make_measurement(device_id=DEVICES[0], kernel="k", dtype="float32", shape={"rows": 8, "cols": 1024},
                                   config={"TG": tg, "VEC": 4}, median_us=_time(0, 8, tg, 4))
                  for tg in (32, 64, 128)])  # a shape measured since train
    models = load_models(store, evaluate=True, jobs=1)
    assert models.reused == {}
    features = store_features(store)["k"]
    per_case = ev.evaluate_kernel(features, "devices", ks=(1,), models=(MODEL,), baselines=False)
    from zmlx_pipeline.models.metrics import summarize

    assert models.kernels["k"].regret["unseen_device"] == summarize(per_case["r1"].to_list())["regret_geomean"]


def test_with_one_device_per_family_the_cross_family_regret_is_the_left_out_device_one(trained):
    store, _ = trained
    features = store_features(store)["k"]
    records = device_records(store)
    assert families_are_devices(features.frame, records)
    regret = load_models(store, evaluate=True, jobs=1).kernels["k"].regret
    assert regret["cross_family"] == cross_family_regret(features, MODEL, records)  # what the family folds give
    assert regret["cross_family"] == regret["unseen_device"]


def test_two_devices_of_one_family_are_not_taken_for_left_out_devices(store, make_measurement):
    fill(store, make_measurement, devices=("nvidia-rtx-a4000", "nvidia-rtx-a6000", "nvidia-h100-sxm"))
    assert not families_are_devices(store_features(store)["k"].frame, device_records(store))


def test_a_changed_model_file_stops_publish_in_one_line_and_writes_no_bundle(trained, tmp_path):
    from click.testing import CliRunner

    from zmlx_pipeline.pipeline.cli import cli

    store, row = trained
    path = store.path
    model_file = tmp_path / "models" / Path(row["path"]).name
    model_file.write_bytes(model_file.read_bytes()[:-4] + b"evil")  # read where the tables are built
    store.close()
    result = CliRunner().invoke(cli, ["publish", "--db", str(path), "--to", str(tmp_path / "out")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if not line.startswith("... ")]  # progress lines aside
    assert len(errors) == 1 and errors[0].startswith(f"Error: cannot load model {row['model_id']}: ")
    assert "changed since it was registered" in errors[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
