"""Shared fixtures: every test runs with its store, home and caches inside tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import zmlx_pipeline

REPO_ROOT = Path(zmlx_pipeline.__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the store, the pipeline home, HOME and the XDG directories into tmp_path."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("ZMLX_PIPELINE_DB", str(tmp_path / "store.duckdb"))
    monkeypatch.setenv("ZMLX_PIPELINE_HOME", str(tmp_path / "zmlx-pipeline-home"))
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        monkeypatch.setenv(name, str(home / name.lower()))
    return home


@pytest.fixture
def store(tmp_path: Path):
    """A fresh, migrated, writable store at the default path (tmp_path/store.duckdb), closed afterwards."""
    from zmlx_pipeline.data.store import Store, default_db_path

    with Store(default_db_path()) as opened:
        yield opened


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """The environment for a child Python that must import zmlx_pipeline from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture
def make_measurement():
    """A factory for Measurements with test defaults; keyword arguments override any field."""
    from zmlx_pipeline.data.records import Measurement

    def make(**fields) -> "Measurement":
        """A Measurement with defaults; failed statuses drop the timings unless given; a median given without
        p10/p90 gets them around it (0.95x, 1.05x), as every stored row has its median between the two."""
        median = fields.get("median_us")
        if isinstance(median, (int, float)) and not isinstance(median, bool) and median > 0:
            fields.setdefault("p10_us", median * 0.95)
            fields.setdefault("p90_us", median * 1.05)
        values = dict(
            run_id="run-1",
            device_id="apple-m3-max-40",
            kernel="softmax",
            kernel_version="sha256:0000000000000001",
            dtype="float16",
            shape={"rows": 64, "cols": 4096},
            config={"threadgroup": 256},
            status="ok",
            median_us=10.0,
            p10_us=9.5,
            p90_us=11.0,
            samples=20,
        )
        values.update(fields)
        if values["status"] != "ok" and "median_us" not in fields:
            values.update(median_us=None, p10_us=None, p90_us=None, samples=0)
        return Measurement(**values)

    return make


def _gpu_backend() -> str:
    """metal, cuda or cpu: what MLX can run custom kernels on in this process."""
    try:
        from zmlx_pipeline.data.detect import detect_backend

        return detect_backend()
    except Exception:  # noqa: BLE001 - no MLX at all counts as no GPU
        return "cpu"


def pytest_collection_modifyitems(config, items):
    """Skip `gpu`/`cuda`/`metal` tests cleanly where that backend is missing."""
    backend = _gpu_backend()
    reasons = {
        "gpu": None if backend in ("cuda", "metal") else "needs a Metal or CUDA MLX backend",
        "cuda": None if backend == "cuda" else "needs the MLX CUDA backend",
        "metal": None if backend == "metal" else "needs the MLX Metal backend",
    }
    for item in items:
        for marker, reason in reasons.items():
            if reason and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))
                break


@pytest.fixture(scope="session")
def gpu_backend() -> str:
    return _gpu_backend()
