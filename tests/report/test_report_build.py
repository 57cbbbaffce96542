"""The whole report written to a folder: every PNG it references, the page against evaluate's numbers, one fit
per fold, progress lines, workers, errors, and a real render."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from report_fixtures import assert_png, fill_store  # noqa: E402

from zmlx_pipeline.data.store import Store  # noqa: E402
from zmlx_pipeline.models.evaluate import evaluate  # noqa: E402
from zmlx_pipeline.models.report import TABLE_KS, ReportError, evaluation_split, result_rows  # noqa: E402
from zmlx_pipeline.report.build import REPORT_MARKER, build_report  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny fits run faster on one OpenMP thread, and a busy machine does not oversubscribe."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


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


def _refused_before_work(monkeypatch, out) -> str:
    """build_report's refusal of `out`, with the report's work made to fail if it ever started."""

    def no_work(*args, **kwargs):
        raise AssertionError("the report's work started")

    monkeypatch.setattr("zmlx_pipeline.report.build.report_data", no_work)
    with pytest.raises(ReportError) as refused:
        build_report(object(), out)
    return str(refused.value)


def test_errors_are_one_line_report_errors(tmp_path):
    with Store(tmp_path / "empty.duckdb") as empty:
        with pytest.raises(ReportError, match="no ok measurements"):
            build_report(empty, tmp_path / "out" / "deeper")
        assert not (tmp_path / "out").exists()  # a failed report leaves no folder it made
        found = tmp_path / "mine"  # an earlier report's folder, with a file of the user's beside it
        found.mkdir()
        (found / REPORT_MARKER).write_text("an earlier report\n")
        (found / "keep.txt").write_text("x")
        with pytest.raises(ReportError, match="no ok measurements"):
            build_report(empty, found)
        assert (found / "keep.txt").read_text() == "x"  # a folder it found stays, with its files
        fresh = tmp_path / "empty-folder"
        fresh.mkdir()
        with pytest.raises(ReportError, match="no ok measurements"):
            build_report(empty, fresh)
        assert list(fresh.iterdir()) == []  # left unmarked, as it was found
    with Store(tmp_path / "one.duckdb") as one:
        fill_store(one, devices=("nvidia-rtx-a4000",))
        with pytest.raises(ReportError, match="no ok measurements of kernel"):
            build_report(one, tmp_path / "out", kernels=["nope"])
        with pytest.raises(ReportError, match=r"no held-out cases under --split devices: .* \(try --split shapes\)"):
            build_report(one, tmp_path / "out", split="devices")
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        with pytest.raises(ReportError, match="cannot write the report to"):
            build_report(one, blocker / "out")


@pytest.mark.parametrize("kind", ["site", "data", "store", "link to a full folder"])
def test_a_folder_of_other_files_is_refused_before_any_work_and_left_as_it_was(tmp_path, kind, monkeypatch):
    """--out never replaces or joins files a report did not write: a site's own index.html and scores.json, the
    shards of data/, a store's folder, a link to a folder of such files; said before the store is read."""
    folder = tmp_path / "folder"
    folder.mkdir()
    first = {"site": "index.html", "data": "a.parquet", "store": "models", "link to a full folder": "passwd"}[kind]
    if kind == "site":
        (folder / "index.html").write_text("<h1>my own page</h1>\n")
        (folder / "scores.json").write_text('{"mine": true}\n')
    elif kind == "data":
        (folder / "a.parquet").write_bytes(b"PAR1")
    elif kind == "store":
        (folder / "store.duckdb").write_bytes(b"db")
        (folder / "models").mkdir()
    else:
        (folder / "passwd").write_text("root:x:0:0\n")
        (tmp_path / "link").symlink_to(folder)
    out = tmp_path / "link" if kind == "link to a full folder" else folder
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}

    assert _refused_before_work(monkeypatch, out) == (
        f"cannot write the report to {out}: it holds other files (e.g. {first}), which the report's index.html, "
        "scores.json and figures would replace or sit among; pass --out a new or empty directory, or one an earlier "
        "report wrote")
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
    assert not (folder / REPORT_MARKER).exists()


def test_a_report_writes_again_into_its_own_folder_an_empty_one_or_an_older_reports(tmp_path, monkeypatch):
    """The folder rule lets a report into a missing or empty folder (dot-files aside), one it marked, and one an
    older report wrote before the marker (its index.html is a report's page)."""
    from zmlx_pipeline.report.build import check_out, prepare_out

    check_out(tmp_path / "missing")
    (tmp_path / "dots").mkdir()
    (tmp_path / "dots" / ".DS_Store").write_bytes(b"x")
    assert prepare_out(tmp_path / "dots") == tmp_path / "dots"
    assert (tmp_path / "dots" / REPORT_MARKER).is_file()  # marked: a later report writes here again
    (tmp_path / "dots" / "index.html").write_text("<html>the report's own page</html>")
    check_out(tmp_path / "dots")
    older = tmp_path / "older"
    older.mkdir()
    (older / "index.html").write_text("<!doctype html><html lang='en'><head><meta charset='utf-8'><title>zmlx-pipeline "
                                      "report · shapes</title>")
    (older / "scores.json").write_text("{}")
    check_out(older)


def test_an_out_that_is_no_directory_is_refused_for_what_it_is_and_left_as_it_was(tmp_path):
    import os

    from zmlx_pipeline.report.build import prepare_out

    tmp_path = tmp_path / "outs"
    tmp_path.mkdir()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    for out, says in ((fifo, "it is a FIFO (named pipe), not a directory"),
                      (dangling, f"it is a symlink to {tmp_path / 'nowhere'}, which does not exist")):
        with pytest.raises(ReportError) as exc:
            prepare_out(out)
        assert str(exc.value).startswith(f"cannot write the report to {out}: {says}; pass --out a new or empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "pipe"] and not (tmp_path / "nowhere").exists()


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
    from zmlx_pipeline.models import variants
    from zmlx_pipeline.models import evaluate as ev
    from zmlx_pipeline.models import report as rp
    from zmlx_pipeline.models.train import train_models

    made: list[str] = []
    real = variants.make_ranker

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
        monkeypatch.setattr(variants, "fit_kernel_model", refuse)
        build_report(store, tmp_path / "out", split="shapes", jobs=1, refit=True)
    assert folds >= 2 and sorted(made) == sorted([variants.DEFAULT_MODEL] * folds + ["gbr"] * folds)
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


def test_figures_drawn_by_the_workers_are_the_figures_drawn_here(filled, tmp_path):
    from zmlx_pipeline.models.evaluate import kernel_features_of
    from zmlx_pipeline.models.pool import KernelPool
    from zmlx_pipeline.models.report import report_data
    from zmlx_pipeline.report.build import write_report

    data = report_data(filled, "shapes", jobs=1)
    (tmp_path / "here").mkdir()
    here = write_report(data, tmp_path / "here")
    lines: list[str] = []
    # as many rows as a store whose report uses workers: the figures go to the two workers at once
    with KernelPool(kernel_features_of(filled), jobs=2, rows=10**9) as pool:
        assert pool.parallel
        (tmp_path / "workers").mkdir()
        there = write_report(data, tmp_path / "workers", pool=pool, progress=lines.append)
    assert here["figures"] == there["figures"] and len(there["figures"]) >= 3
    for name in here["figures"]:
        assert (tmp_path / "here" / name).read_bytes() == (tmp_path / "workers" / name).read_bytes(), name
    def page(where: str) -> str:  # without the minute it was written
        return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "", (tmp_path / where / "index.html").read_text())

    assert page("here") == page("workers")
    assert len(lines) == len(there["figures"]) and lines[-1].endswith("done")
    assert all(re.search(r"\d+:\d\d elapsed", line) for line in lines)


@pytest.mark.parametrize("kind", ["marker to a file outside", "dangling marker", "scores.json link",
                                  "index.html link", "figure link"])
def test_a_link_among_the_files_a_report_writes_is_refused_and_never_written_through(tmp_path, kind, monkeypatch):
    """The marker counts only as a regular file (a link to a file outside, or to nothing, is refused: the report
    would write through it and take the folder, with the user's files, for its own); and in an earlier report's
    folder, a link named as a file the report writes (scores.json, index.html, a figure) is refused before any
    work: nothing outside the folder is written or created."""
    out = tmp_path / "rep"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious outside\n")
    name = {"marker to a file outside": REPORT_MARKER, "dangling marker": REPORT_MARKER,
            "scores.json link": "scores.json", "index.html link": "index.html",
            "figure link": "regret_curves.png"}[kind]
    if kind.startswith("marker") or kind == "dangling marker":
        (out / "precious.txt").write_text("mine\n")
    else:
        (out / REPORT_MARKER).write_text("an earlier report\n")
    (out / name).symlink_to(tmp_path / "nothing-here" if kind == "dangling marker" else victim)
    before = {p.name: (p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else None)
              for p in tmp_path.rglob("*")}

    assert _refused_before_work(monkeypatch, out) == (
        f"cannot write the report to {out}: its {name} is a symlink, which the report would write through or over; "
        "remove it, or pass --out a new or empty directory")
    assert victim.read_text() == "precious outside\n"
    assert not (tmp_path / "nothing-here").exists()
    assert {p.name: (p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in tmp_path.rglob("*")} == before


def test_report_files_replace_a_link_of_their_name_never_writing_through_it(tmp_path):
    """Each file a report writes goes to a temp file in the folder and is renamed over its name: a link there (one
    made after the check) is replaced itself, the file it led to left as it was."""
    from matplotlib.figure import Figure

    from zmlx_pipeline.report.build import _mark, _write
    from zmlx_pipeline.report.figures import _save

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "rep"
    out.mkdir()
    for link in ("scores.json", REPORT_MARKER, "fig.png"):
        (out / link).symlink_to(victim)
    _write(out / "scores.json", "{}\n")
    _mark(out)
    _save(Figure(figsize=(1, 1)), out / "fig.png")
    assert victim.read_text() == "precious\n"
    for link in ("scores.json", REPORT_MARKER, "fig.png"):
        assert (out / link).is_file() and not (out / link).is_symlink()
    assert (out / "scores.json").read_text() == "{}\n"
    assert sorted(p.name for p in out.iterdir()) == sorted(["scores.json", REPORT_MARKER, "fig.png"])


@pytest.mark.parametrize("split", ["devices", "shapes"])
def test_a_store_of_one_shape_on_one_device_says_neither_split_has_cases(tmp_path, make_measurement, split):
    """The other split has no cases either, so the message does not send the user there."""
    from zmlx_pipeline.data.catalog import get_device

    with Store(tmp_path / "one-shape.duckdb") as one:
        one.upsert_device({**get_device("nvidia-rtx-a4000").as_row(), "device_id": "nvidia-rtx-a4000",
                           "in_catalog": True})
        one.record([make_measurement(device_id="nvidia-rtx-a4000", kernel="rowk", shape={"rows": 8, "cols": 1024},
                                     config={"TG": tg}, median_us=float(tg)) for tg in (32, 64, 128)])
        with pytest.raises(ReportError, match=rf"no held-out cases under --split {split}: .* \(neither split has any: "
                                              r"measure more shapes or devices\)$"):
            build_report(one, tmp_path / "out", split=split)
