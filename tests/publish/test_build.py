"""The tables built in worker processes are the tables built here, and registered models publish what a fresh fit does."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))

from bundle_fixtures import TOY_CONFIGS, TOY_DEVICES, TOY_SHAPES, fill_toy, latest_dir, toy_time  # noqa: E402
from zmlx_pipeline.data.records import Measurement  # noqa: E402
from zmlx_pipeline.data.store import Store  # noqa: E402
from zmlx_pipeline.publish import publish  # noqa: E402

#: what names the model in a bundle (its id and where it came from), not what it answers
MODEL_NAMING = ("model_id", "model_source", "models", "note")


def _contents(publish_dir: Path) -> dict[str, object]:
    """Every file of the latest bundle by name, the manifest without its times and ids, kernels.json without
    the model's naming."""
    root = latest_dir(publish_dir)
    out = {}
    for path in sorted(root.rglob("*.json")):
        name = str(path.relative_to(root))
        data = json.loads(path.read_text())
        if name == "manifest.json":
            continue
        if name == "kernels.json":
            for meta in data["kernels"].values():
                for key in MODEL_NAMING:
                    meta.pop(key, None)
        out[name] = data
    return out


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory):
    """The toy kernel and a second one (its times with the threadgroup's effect reversed): the workers build
    tables only when there are two kernels or more."""
    db = tmp_path_factory.mktemp("build") / "toy.duckdb"
    with Store(db) as store:
        fill_toy(store)
        run = store.start_run(TOY_DEVICES[0], host="test", backend="cuda", mlx_version="0.30.0",
                              pipeline_version="0.1.0", settings={}, status="imported")
        store.record([
            Measurement(run_id=run, device_id=device, kernel="toy_flip", kernel_version="sha256:00000000000000bb",
                        dtype="float16", shape=shape, config=cfg, status="ok",
                        median_us=toy_time(device, shape, {**cfg, "TG": 32768 // cfg["TG"]}), p10_us=None,
                        p90_us=None, samples=10)
            for device in TOY_DEVICES for shape in TOY_SHAPES for cfg in TOY_CONFIGS
        ])
        store.finish_run(run, "imported")
    return db


def test_tables_built_in_workers_equal_tables_built_here(toy_store, tmp_path, monkeypatch):
    from zmlx_pipeline.models import pool as pool_module

    with Store(toy_store) as store, threadpool_limits(limits=1):
        here = publish(store, tmp_path / "here", jobs=1, evaluate=False, record=False)
        monkeypatch.setattr(pool_module, "PARALLEL_MIN_ROWS", 0)  # the toy store is small: use the workers anyway
        lines: list[str] = []
        there = publish(store, tmp_path / "there", jobs=2, evaluate=False, record=False, progress=lines.append)
    assert any("in 2 worker processes" in line for line in lines), lines
    built = [line for line in lines if re.match(r"publish: toy_\w+: tables built \(\d/2\)", line)]
    assert len(built) == 2 and built[-1].endswith("done") and "left" in built[0], lines
    assert here["entries"] == there["entries"] > 0
    assert _contents(tmp_path / "here") == _contents(tmp_path / "there")


def test_registered_model_publishes_what_a_fit_at_publish_does(tmp_path):
    """The registered model (train) is the fit publish would make: same tables, profiles, pruning k and
    expected regret; only the model's id and source differ."""
    from zmlx_pipeline.models.train import train_models

    with Store(tmp_path / "s.duckdb") as store, threadpool_limits(limits=1):
        fill_toy(store)
        fitted = publish(store, tmp_path / "fitted", record=False)
        assert fitted["model_source"] == "fitted"
        train_models(store, models_dir=tmp_path / "models", jobs=1)
        registered = publish(store, tmp_path / "registered", record=False)
        assert registered["model_source"] == "registry"
    a, b = _contents(tmp_path / "fitted"), _contents(tmp_path / "registered")
    assert a.keys() == b.keys() and any(name.startswith("devices/") for name in a)
    assert a == b
    meta = b["kernels.json"]["kernels"]["toy_scale"]
    assert meta["prune_k_trained"] >= 1 and meta["expected_regret"]["seen_device"] is not None
