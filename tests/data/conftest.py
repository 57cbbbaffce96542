"""Fixtures of the data tests."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from zmlx_pipeline.data.store import Store


@pytest.fixture
def tampered_store(make_measurement):
    """Builds a store of a few my_norm measurements, a repeat and a registered model (my_norm-1), then runs `sql`
    on it through DuckDB, as someone changing it outside zmlx-pipeline would; returns its bytes."""

    def build(path: Path, *sql: str) -> bytes:
        with Store(path) as s:
            s.record([make_measurement(kernel="my_norm", shape={"rows": r, "cols": 4096}) for r in (1, 2, 4)])
            s.record_repeat([make_measurement(kernel="my_norm", shape={"rows": 1, "cols": 4096}, run_id="r2")])
            s.add_model({"model_id": "my_norm-1", "kernel_filter": "my_norm", "params": {"model": "x"},
                         "versions": {}, "scores": {"prune_k": 3}, "path": "models/my_norm-1.zmodel"})
        con = duckdb.connect(str(path))
        for statement in sql:
            con.execute(statement)
        con.close()
        return path.read_bytes()

    return build
