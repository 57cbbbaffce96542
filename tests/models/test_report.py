"""The report: figure functions on plain data, the page against evaluate's numbers, and a real render."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.data.records import Measurement
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models.evaluate import evaluate
from zmlx_pipeline.models.report import (
    TABLE_KS,
    HeatmapData,
    ReportError,
    evaluation_split,
    heatmap_data,
    param_importance,
    result_rows,
)
from zmlx_pipeline.report.build import build_report
from zmlx_pipeline.report.figures import heatmap_figure, predicted_vs_measured_figure, regret_curves_figure

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DEVICES = {"nvidia-rtx-a4000": 448.0, "nvidia-rtx-a6000": 768.0, "apple-m3-max-40c": 400.0}
BEST_TG = {"nvidia-rtx-a4000": 256, "nvidia-rtx-a6000": 512, "apple-m3-max-40c": 128}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny fits run faster on one OpenMP thread, and a busy machine does not oversubscribe."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


def synthetic_time(device: str, rows: int, cols: int, tg: int, vec: int) -> float:
    """A bandwidth-bound time with a best TG per device (shifting with the row length) and VEC 4 best."""
    base = rows * cols * 4 / DEVICES[device] / 1e3 + 2.0
    best_tg = BEST_TG[device] * (2 if cols >= 4096 else 1)
    return base * (1 + 0.3 * abs(math.log2(tg / best_tg))) * (1 + 0.1 * abs(math.log2(vec / 4)))


def fill_store(store: Store, kernel: str = "rowk", devices=tuple(DEVICES)) -> None:
    """Three devices x four shapes x 12 configs (TG x VEC) of one kernel, ROWS fixed at 1."""
    for d in devices:
        store.upsert_device({**get_device(d).as_row(), "device_id": d, "in_catalog": True})
    store.record([
        Measurement(run_id="run-1", device_id=d, kernel=kernel, kernel_version="sha256:0000000000000001",
                    dtype="float16", shape={"rows": rows, "cols": cols}, config={"TG": tg, "VEC": vec, "ROWS": 1},
                    status="ok", median_us=t, p10_us=t * 0.95, p90_us=t * 1.05, samples=10)
        for d in devices for rows, cols in ((1, 1024), (16, 4096), (256, 1024), (1024, 8192))
        for tg in (64, 128, 256, 512, 1024) for vec in (1, 2, 4)
        for t in [synthetic_time(d, rows, cols, tg, vec)]
    ])


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    with Store(tmp_path_factory.mktemp("report") / "store.duckdb") as store:
        fill_store(store)
        yield store


@pytest.fixture(scope="module")
def reports(filled, tmp_path_factory):
    """The report of the fixture store under each split (built once: fitting takes a moment)."""
    out = {}
    for split in ("shapes", "devices"):
        directory = tmp_path_factory.mktemp(f"report-{split}")
        out[split] = (directory, build_report(filled, directory, split=split))
    return out


class _Page(HTMLParser):
    """Collects <img src> and the data-* attributes of score cells."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.cells: dict[tuple, str] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.images.append(a["src"])
        if tag == "td" and "data-metric" in a:
            key = (a["data-kernel"], a["data-device"] or None, a["data-method"], int(a["data-k"]), a["data-metric"])
            self.cells[key] = a["data-value"]


def parse_page(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def assert_png(path: Path, min_side: int = 200) -> np.ndarray:
    """The file is a PNG matplotlib can read, of a sensible size, and not a single colour."""
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_MAGIC, path
    img = imread(path)
    assert img.ndim == 3 and min(img.shape[:2]) >= min_side, (path, img.shape)
    assert float(img[..., :3].std()) > 0.02, f"{path} is blank"
    return img


# ------------------------------------------------------------------------------------------
# data helpers


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
    assert evaluation_split("devices") in ("devices", "lodo")
    with pytest.raises(ReportError, match="unknown split 'random'"):
        evaluation_split("random")
    assert result_rows({"results": [1]}) == [1] and result_rows({"rows": [2]}) == [2]


# ------------------------------------------------------------------------------------------
# figures


def _rows(kernel: str, method: str, values, cases: int = 4) -> list[dict]:
    return [{"kernel": kernel, "device": None, "method": method, "k": k, "regret_geomean": v,
             "regret_p95": v, "hit_2pct": 0.5, "cases": cases if v is not None else 0}
            for k, v in enumerate(values, start=1)]


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


# ------------------------------------------------------------------------------------------
# the page


@pytest.mark.parametrize("split", ["shapes", "devices"])
def test_page_references_every_png_it_wrote_and_each_is_valid(reports, split):
    directory, result = reports[split]
    page = parse_page(directory / "index.html")
    pngs = sorted(p.name for p in directory.glob("*.png"))
    assert sorted(page.images) == pngs == sorted(result["figures"])
    assert "regret_curves.png" in pngs and "predicted_vs_measured.png" in pngs
    assert sum(p.startswith("heatmap_rowk_") for p in pngs) == 2
    for name in pngs:
        assert_png(directory / name)
    assert result["split"] == split and result["kernels"] == ["rowk"]
    assert result["cases"] == 12  # 4 shapes x 3 devices, each held out once under either split


@pytest.mark.parametrize("split", ["shapes", "devices"])
def test_score_table_has_evaluates_numbers(filled, reports, split):
    directory, _ = reports[split]
    expected = [r for r in result_rows(evaluate(filled, evaluation_split(split))) if r["k"] in TABLE_KS]
    assert expected and any(r["regret_geomean"] is not None for r in expected)
    scores = json.loads((directory / "scores.json").read_text())
    assert scores["results"] == expected
    cells = parse_page(directory / "index.html").cells
    for r in expected:
        for metric in ("regret_geomean", "regret_p95", "hit_2pct"):
            shown = cells[(r["kernel"], r["device"], r["method"], r["k"], metric)]
            assert shown == ("" if r[metric] is None else repr(float(r[metric]))), (r, metric)
    assert len(cells) == 3 * len(expected)


def test_heatmaps_use_the_two_parameters_that_matter(reports):
    directory, _ = reports["devices"]
    html = (directory / "index.html").read_text(encoding="utf-8")
    # TG moves time far more than VEC; ROWS is fixed and never an axis
    assert re.search(r"explained by TG \d+%, VEC \d+%", html)


def test_errors_are_one_line_report_errors(tmp_path):
    with Store(tmp_path / "empty.duckdb") as empty:
        with pytest.raises(ReportError, match="no ok measurements"):
            build_report(empty, tmp_path / "out" / "deeper")
        assert not (tmp_path / "out").exists()  # a failed report leaves no folder it made
        found = tmp_path / "mine"
        (found / "keep.txt").parent.mkdir()
        (found / "keep.txt").write_text("x")
        with pytest.raises(ReportError, match="no ok measurements"):
            build_report(empty, found)
        assert (found / "keep.txt").read_text() == "x"  # a folder it found stays, with its files
    with Store(tmp_path / "one.duckdb") as one:
        fill_store(one, devices=("nvidia-rtx-a4000",))
        with pytest.raises(ReportError, match="no ok measurements of kernel"):
            build_report(one, tmp_path / "out", kernels=["nope"])
        with pytest.raises(ReportError, match="no held-out cases under --split devices"):
            build_report(one, tmp_path / "out", split="devices")
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        with pytest.raises(ReportError, match="cannot write the report to"):
            build_report(one, blocker / "out")


# ------------------------------------------------------------------------------------------
# a real render

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.mark.chromium
@pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium (apt-get install chromium)")
def test_page_renders_in_headless_chromium(reports, tmp_path):
    directory, _ = reports["devices"]
    shot = tmp_path / "page.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1200,2000",
                        (directory / "index.html").resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)
    img = assert_png(shot)
    assert img.shape[:2] == (2000, 1200)
    rgb = img[..., :3]
    # images loaded: many distinct colours (heatmap and plot palettes), not just the page's flat boxes
    colours = np.unique((rgb.reshape(-1, 3) * 255).astype(np.uint8), axis=0)
    assert len(colours) > 500
    # the header band is the report's blue, and most of the page is not empty background
    assert np.allclose(rgb[10, 10], np.array([0x1F, 0x4E, 0x9C]) / 255, atol=0.02)
    background = np.all(np.abs(rgb - np.array([0xF6, 0xF7, 0xF9]) / 255) < 0.01, axis=-1)
    assert background.mean() < 0.6


# ------------------------------------------------------------------------------------------
# one fit per fold, and progress


def test_each_fold_is_fitted_once_for_table_and_figures_and_no_whole_data_model(filled, tmp_path, monkeypatch):
    """The score table and the figures share each fold's fits: one model and one time model per fold
    (evaluate's fits and a second round for the figures were two), and nothing is fitted on all rows,
    registered model or not."""
    from zmlx_pipeline.models import estimators
    from zmlx_pipeline.models import evaluate as ev
    from zmlx_pipeline.models import report as rp
    from zmlx_pipeline.models.train import train_models

    made: list[str] = []
    real = estimators.make_ranker

    def counting(features, model="ensemble"):
        made.append(model)
        return real(features, model)

    def refuse(*args, **kwargs):
        raise AssertionError("the report fitted a model on every row")

    with Store(tmp_path / "s.duckdb") as store:
        fill_store(store)
        train_models(store, models_dir=tmp_path / "models", jobs=1)
        folds = len(ev.fold_plan(ev.kernel_features_of(store)["rowk"], "shapes"))
        expected = [r for r in result_rows(evaluate(store, "shapes")) if r["k"] in TABLE_KS]
        for module in (rp, ev):  # where the folds' models are made (an ensemble makes its members elsewhere)
            monkeypatch.setattr(module, "make_ranker", counting)
        monkeypatch.setattr(estimators, "fit_kernel_model", refuse)
        build_report(store, tmp_path / "out", split="shapes", jobs=1, refit=True)
    assert folds >= 2 and sorted(made) == sorted([estimators.DEFAULT_MODEL] * folds + ["gbr"] * folds)
    assert json.loads((tmp_path / "out" / "scores.json").read_text())["results"] == expected


def test_progress_lines_carry_elapsed_and_time_left(filled, tmp_path):
    lines: list[str] = []
    build_report(filled, tmp_path / "out", split="devices", jobs=1, progress=lines.append)
    folds = [line for line in lines if " fold " in line and " scored in " in line]
    assert len(folds) == 3  # one fold per left-out device
    assert all(re.search(r"\(\d/3\), \d+:\d\d elapsed, (about \d+:\d\d left|done)$", line) for line in folds), lines
    assert folds[-1].endswith("done") and any("left" in line for line in folds[:-1])
    assert any(line.startswith("report: heatmap_rowk_1.png drawn") for line in lines)
    assert all(line.startswith("report: ") for line in lines)


def test_folds_scored_in_worker_processes_give_the_same_report(filled, reports, tmp_path, monkeypatch):
    from zmlx_pipeline.models import pool as pool_module

    monkeypatch.setattr(pool_module, "PARALLEL_MIN_ROWS", 0)  # the fixture store is small: use the workers anyway
    lines: list[str] = []
    result = build_report(filled, tmp_path / "out", split="shapes", jobs=2, progress=lines.append)
    directory, here = reports["shapes"]
    assert any("in 2 worker processes" in line for line in lines), lines
    assert json.loads((tmp_path / "out" / "scores.json").read_text()) == \
        json.loads((directory / "scores.json").read_text())
    assert result["cases"] == here["cases"] and result["figures"] == here["figures"]


@pytest.mark.parametrize("split", ["shapes", "devices"])
def test_a_report_read_from_trains_records_equals_a_refitted_one(tmp_path, monkeypatch, split):
    """Train records the held-out cases of its split (held-out shapes here); the report of that split reads
    them and fits only the time model, and every number and figure's data equal a report that fits again.
    The other split has no records and fits as before."""
    from zmlx_pipeline.models import estimators
    from zmlx_pipeline.models import report as rp
    from zmlx_pipeline.models.train import train_models

    with Store(tmp_path / "s.duckdb") as store:
        fill_store(store)
        (row,) = train_models(store, model="prior", models_dir=tmp_path / "models", jobs=1)
        fresh = rp.report_data(store, split, model="prior", jobs=1, refit=True)
        made: list[str] = []
        real = estimators.make_ranker
        monkeypatch.setattr(rp, "make_ranker", lambda features, model="ensemble": made.append(model) or
                            real(features, model))
        again = rp.report_data(store, split, model="prior", jobs=1)
    expected_reuse = {"rowk": row["model_id"]} if split == "shapes" else {}
    assert again.reused == expected_reuse and fresh.reused == {}
    if split == "shapes":
        assert made and set(made) == {"gbr"}  # the time model only: the scores and picks were read
    assert again.rows == fresh.rows and again.points == fresh.points and again.heatmaps == fresh.heatmaps
    assert again.cases == fresh.cases and again.heatmaps["rowk"]
