"""The report's figures: plain data in, a valid PNG out."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from report_fixtures import assert_png  # noqa: E402

from zmlx_pipeline.models.report import HeatmapData, ReportError  # noqa: E402
from zmlx_pipeline.report.figures import (  # noqa: E402
    heatmap_figure,
    predicted_vs_measured_figure,
    regret_curves_figure,
)


def _rows(kernel: str, method: str, values, cases: int = 4) -> list[dict]:
    return [{"kernel": kernel, "device": None, "method": method, "k": k, "regret_geomean": v,
             "regret_p95": v, "hit_2pct": 0.5, "cases": cases if v is not None else 0}
            for k, v in enumerate(values, start=1)]


def test_a_kernel_named_in_glyphs_the_font_lacks_is_drawn_without_a_warning_per_glyph(tmp_path):
    """The figure is kept (the missing glyphs drawn as boxes); the font's per-glyph warnings are not passed on."""
    import warnings

    name = "my kernel ünï 名前"
    rows = _rows(name, "ensemble", [1.2, 1.05, 1.01, 1.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_png(regret_curves_figure(rows, ["ensemble"], tmp_path / "curves.png", "shapes"))
        assert_png(heatmap_figure(HeatmapData(title=f"{name} on d", x_param="TG", x_values=[64, 128],
                                              times_us=[[3.0, 2.0]], best=(0, 1)), tmp_path / "map.png"))
    assert [str(w.message) for w in caught if "Glyph" in str(w.message)] == []


def test_figures_are_valid_pngs(tmp_path):
    rows = (_rows("a", "ensemble", [1.2, 1.05, 1.01, 1.0]) + _rows("a", "chip_default", [1.5, 1.3, 1.2, 1.1])
            + _rows("a", "other_device_best", [None] * 4) + _rows("b", "ensemble", [None] * 4))
    assert_png(regret_curves_figure(rows, ["ensemble"], tmp_path / "curves.png", "shapes"))
    rng = np.random.default_rng(0)
    measured = np.exp(rng.uniform(1, 8, 300))
    points = {"a": {"measured": measured.tolist(), "predicted": (measured * np.exp(rng.normal(0, 0.2, 300))).tolist(),
                    "device": ["d1", "d2", "d3"] * 100}}
    assert_png(predicted_vs_measured_figure(points, tmp_path / "pred.png"))
    grid = [[10.0, 12.0, float("nan")], [11.0, 30.0, 15.0]]
    two = HeatmapData(title="k on d", subtitle="float16, rows=1", x_param="TG", x_values=[64, 128, 256],
                      y_param="VEC", y_values=[1, 2], times_us=grid, best=(0, 0), pick=(1, 2), pick_regret=1.5)
    assert_png(heatmap_figure(two, tmp_path / "map2.png"))
    one = HeatmapData(title="k on d", x_param="TG", x_values=[64, 128], times_us=[[3.0, 2.0]], best=(0, 1))
    assert_png(heatmap_figure(one, tmp_path / "map1.png"))
    with pytest.raises(ReportError, match="no score rows"):
        regret_curves_figure([], ["ensemble"], tmp_path / "none.png")
