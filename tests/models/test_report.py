"""The report's data (models/report.py): parameter importance, heatmap grids, split names, and reading the
held-out cases train recorded instead of fitting the folds again."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "report"))
from report_fixtures import fill_store  # noqa: E402

from zmlx_pipeline.data.store import Store  # noqa: E402
from zmlx_pipeline.models.report import (  # noqa: E402
    ReportError,
    evaluation_split,
    heatmap_data,
    param_importance,
    result_rows,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny fits run faster on one OpenMP thread, and a busy machine does not oversubscribe."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


def test_param_importance_ranks_the_parameter_that_moves_time_first():
    frame = pl.DataFrame({
        "device_id": ["d"] * 8, "kernel": ["k"] * 8, "dtype": ["float16"] * 8, "shape_key": ["s"] * 8,
        "cfg_TG": [64.0, 64.0, 64.0, 64.0, 256.0, 256.0, 256.0, 256.0],
        "cfg_VEC": [1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0],
        "cfg_ROWS": [1.0] * 8,
        "log_time": np.log([10.0, 10.0, 11.0, 11.0, 20.0, 20.0, 22.0, 22.0]).tolist(),
    })
    ranked = param_importance(frame, ["ROWS", "VEC", "TG"])
    assert [p for p, _ in ranked] == ["TG", "VEC"]  # ROWS never varies: not a candidate axis
    assert ranked[0][1] > 0.9 and 0 < ranked[1][1] < 0.1
    assert sum(s for _, s in ranked) == pytest.approx(1.0)  # the two explain all of it here


def test_heatmap_grid_keeps_the_fastest_config_per_cell_and_marks_best_and_pick():
    rows = pl.DataFrame({
        "config_key": ["a", "b", "c", "d", "e"],
        "cfg_TG": [64.0, 64.0, 256.0, 256.0, 1024.0],
        "cfg_VEC": [1.0, 1.0, 1.0, 2.0, 2.0],
        "median_us": [30.0, 20.0, 10.0, 15.0, 40.0],
    })
    data = heatmap_data(rows, "TG", "VEC", pick_key="d", title="t")
    assert data.x_values == [64.0, 256.0, 1024.0] and data.y_values == [1.0, 2.0]
    grid = np.array(data.times_us)
    assert grid[0, 0] == 20.0                      # a and b share a cell: the faster one shows
    assert np.isnan(grid[0, 2])                    # TG 1024, VEC 1 was never measured
    assert data.best == (0, 1) and data.pick == (1, 1)
    assert data.pick_regret == pytest.approx(1.5)
    one_param = heatmap_data(rows, "TG", None, pick_key=None, title="t")
    assert np.array(one_param.times_us).shape == (1, 3) and one_param.pick is None


def test_split_names_and_result_keys():
    assert evaluation_split("shapes") == "shapes"
    assert evaluation_split("devices") == evaluation_split("lodo") == "devices"
    with pytest.raises(ReportError, match="unknown split 'random'"):
        evaluation_split("random")
    assert result_rows({"results": [1]}) == [1] and result_rows({"rows": [2]}) == [2]


@pytest.mark.parametrize("split", ["shapes", "devices"])
def test_a_report_read_from_trains_records_equals_a_refitted_one(tmp_path, monkeypatch, split):
    """Train records the held-out cases of both splits; the report of either split reads them and fits only
    the time model, and every number and figure's data equal a report that fits again."""
    from zmlx_pipeline.models import variants
    from zmlx_pipeline.models import report as rp
    from zmlx_pipeline.models.train import train_models

    with Store(tmp_path / "s.duckdb") as store:
        fill_store(store)
        (row,) = train_models(store, model="prior", models_dir=tmp_path / "models", jobs=1)
        fresh = rp.report_data(store, split, model="prior", jobs=1, refit=True)
        made: list[str] = []
        real = variants.make_ranker
        monkeypatch.setattr(rp, "make_ranker", lambda features, model="ensemble": made.append(model) or
                            real(features, model))
        again = rp.report_data(store, split, model="prior", jobs=1)
    assert again.reused == {"rowk": row["model_id"]} and fresh.reused == {}
    assert made and set(made) == {"gbr"}  # the time model only: the scores and picks were read
    assert again.rows == fresh.rows and again.points == fresh.points and again.heatmaps == fresh.heatmaps
    assert again.cases == fresh.cases and again.heatmaps["rowk"]
