"""Every built-in kernel's version is one the committed data and the shipped bundle were measured and
published at: a version hashes the generated code, so a changed byte of it would orphan the data."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from zmlx_pipeline.kernels.builtin import BUILTIN
from zmlx_pipeline.kernels.registry import get_kernel

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"
DEFAULT_BUNDLE = REPO / "zmlx_pipeline" / "runtime" / "default_bundle"


def _data_versions() -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    for path in sorted(DATA.glob("*.parquet")):
        table = pq.read_table(path, columns=["kernel", "kernel_version"])
        for kernel, version in zip(table.column("kernel").to_pylist(), table.column("kernel_version").to_pylist()):
            seen.setdefault(kernel, set()).add(version)
    return seen


def _bundle_versions() -> dict[str, str]:
    kernels = json.loads(gzip.decompress((DEFAULT_BUNDLE / "kernels.json.gz").read_bytes()))
    return {name: entry["version"] for name, entry in kernels.get("kernels", kernels).items()}


@pytest.mark.parametrize("name", BUILTIN)
def test_the_builtin_kernel_version_is_one_the_committed_data_holds(name):
    versions = _data_versions()
    assert versions, f"no shards in {DATA}"
    assert get_kernel(name).version in versions.get(name, set()), (name, sorted(versions.get(name, ())))


@pytest.mark.parametrize("name", BUILTIN)
def test_the_builtin_kernel_version_is_the_one_the_shipped_bundle_ranks(name):
    assert get_kernel(name).version == _bundle_versions()[name]
