"""Small real bundles for the runtime and publish tests: built once per session from small DuckDB stores.

- `toy`: a kernel with no registered spec (`toy_scale`, TG x VEC), measured on an H100 and an H200
  with times from a fixed formula, so the best config is known; published for every catalog chip.
- `real`: the committed shard of the H100 at 32 SMs, rmsnorm (a registered spec: legal configs
  per shape), published for the full H100 and the H200 (predicted from their family) and the M3 Max
  (extrapolated across vendors).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.data.records import Measurement
from zmlx_pipeline.data.store import Store

REPO = Path(__file__).resolve().parents[2]
#: the smallest committed shard: the H100 under MPS at 32 SMs (device `nvidia-h100-sxm@32sm`, thin grid)
SMOKE_SHARD = REPO / "data" / "nvidia-h100-sxm-32sm.parquet"
TOY_DEVICES = ("nvidia-h100-sxm", "nvidia-h200")
TOY_SHAPES = [{"rows": r, "cols": c} for r in (1, 64, 4096) for c in (1024, 4096)]
TOY_CONFIGS = [{"TG": tg, "VEC": v} for tg in (64, 128, 256, 512) for v in (1, 2, 4)]


def toy_time(device: str, shape: dict, config: dict) -> float:
    """A made-up but structured time: each (device, shape) has an ideal threadgroup; VEC 2 is best."""
    ideal = 7 if shape["rows"] * shape["cols"] < 100_000 else 9  # log2 of the best threadgroup
    if device == "nvidia-h200":
        ideal -= 1
    base = 2.0 + shape["rows"] * shape["cols"] / 2e6
    return base * (1 + 0.25 * abs(math.log2(config["TG"]) - ideal) + 0.05 * abs(config["VEC"] - 2))


def toy_best(device: str, shape: dict) -> dict:
    return min(TOY_CONFIGS, key=lambda c: (toy_time(device, shape, c), c["TG"], c["VEC"]))


def add_device(store: Store, device_id: str) -> None:
    row = get_device(device_id).as_row()
    row["device_id"] = row.pop("id")
    store.upsert_device({**row, "in_catalog": True, "flagged_unknown": False})


def fill_toy(store: Store, devices=TOY_DEVICES) -> None:
    for device in devices:
        add_device(store, device)
        run = store.start_run(device, host="test", backend="cuda", mlx_version="0.30.0", pipeline_version="0.1.0",
                              settings={}, status="imported")
        store.record([
            Measurement(run_id=run, device_id=device, kernel="toy_scale", kernel_version="sha256:00000000000000aa",
                        dtype="float16", shape=shape, config=cfg, status="ok",
                        median_us=toy_time(device, shape, cfg), p10_us=None, p90_us=None, samples=10)
            for shape in TOY_SHAPES for cfg in TOY_CONFIGS
        ])
        store.finish_run(run, "imported")


def build_toy(root: Path) -> tuple[Path, Path]:
    """(store path, publish dir) of the toy bundle."""
    from zmlx_pipeline.publish import publish

    db = root / "toy.duckdb"
    with Store(db) as store:
        fill_toy(store)
        publish(store, root / "toy-bundles")
    return db, root / "toy-bundles"


def build_real(root: Path) -> tuple[Path, Path]:
    """(store path, publish dir) of rmsnorm from the committed 32-SM H100 shard."""
    from zmlx_pipeline.data.shards import ingest_shards
    from zmlx_pipeline.publish import publish

    db = root / "real.duckdb"
    with Store(db) as store:
        ingest_shards(store, [SMOKE_SHARD])
        publish(store, root / "real-bundles", kernels=["rmsnorm"], devices=["nvidia-h100-sxm", "nvidia-h200", "apple-m3-max-40c"])
    return db, root / "real-bundles"


def build_registered(root: Path, record_path: Path) -> tuple[Path, Path]:
    """(store path, publish dir) of the toy kernel published for the H200 and a device registered in the store
    (`devices add`) from the record at `record_path` (tests/pipeline/device_records.py writes one)."""
    from zmlx_pipeline.data.registered import register_device
    from zmlx_pipeline.publish import publish

    db = root / "registered.duckdb"
    with Store(db) as store:
        fill_toy(store)
        device_id = register_device(store, record_path)["device"]["id"]
        publish(store, root / "registered-bundles", devices=[device_id, "nvidia-h200"], record=False, jobs=1)
    return db, root / "registered-bundles"


@pytest.fixture(scope="session")
def toy_bundle(tmp_path_factory) -> tuple[Path, Path]:
    return build_toy(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="session")
def real_bundle(tmp_path_factory) -> tuple[Path, Path]:
    return build_real(tmp_path_factory.mktemp("real"))


def latest_dir(publish_dir: Path) -> Path:
    return publish_dir / (publish_dir / "latest").read_text().strip()


def copy_bundle(publish_dir: Path, dest: Path) -> Path:
    """A private copy of the latest version (to tamper with)."""
    shutil.copytree(latest_dir(publish_dir), dest)
    return dest


def reset_runtime() -> None:
    """No bundle loaded, no answer remembered, no device detected, no refused launch remembered."""
    from zmlx_pipeline.runtime import bundle, device, lookup, profiles, tuner

    bundle.reset()
    lookup.clear_cache()
    device.forget_current_device()
    profiles.forget_current_profile()
    tuner.forget_refusals()


def _fresh_runtime():
    """Every test starts with no bundle loaded and no device detected, and leaves none behind."""
    reset_runtime()
    yield
    reset_runtime()


#: autouse where a conftest imports it (tests/runtime, tests/publish)
fresh_runtime = pytest.fixture(autouse=True, name="fresh_runtime")(_fresh_runtime)
#: the same fixture for a folder where only some modules ask for it: pytestmark = pytest.mark.usefixtures(...)
fresh_runtime_on_request = pytest.fixture(name="fresh_runtime")(_fresh_runtime)


def tree_digest(root: Path) -> str:
    """One hash of every path below `root`, each file's bytes and each link's target: equal when nothing changed."""
    import hashlib
    import os

    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        h.update(os.readlink(p).encode() if p.is_symlink() else p.read_bytes() if p.is_file() else b"")
    return h.hexdigest()
