"""The whole report written to a folder: its data (models/report.py), every figure, scores.json and index.html."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path

from zmlx_pipeline.core.files import current_umask, not_regular_file, write_text_atomic

from zmlx_pipeline.models.variants import DEFAULT_MODEL
from zmlx_pipeline.models.pool import KernelPool
from zmlx_pipeline.models.report import (
    HEATMAPS_PER_KERNEL,
    ReportData,
    ReportError,
    report_data,
    report_pool,
    table_rows,
)
from zmlx_pipeline.progress import Say, Steps
from zmlx_pipeline.report.figures import heatmap_figure, predicted_vs_measured_figure, regret_curves_figure
from zmlx_pipeline.report.page import page_html

def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _draw(features, figure, *args) -> None:
    """One figure drawn where a KernelPool runs it (a worker, or this process); the kernel's features go unused."""
    figure(*args)


def write_report(data: ReportData, out: Path, db: str = "", progress: Say | None = None,
                 started: float | None = None, pool: KernelPool | None = None,
                 earlier: list[str] | None = None) -> dict:
    """Draw every figure of `data` into `out`, then scores.json and index.html, and remove the figures of an earlier
    report there that this one did not draw (`earlier`, None: earlier_figures(out)); returns what was written.
    `pool`: an entered KernelPool whose workers draw the figures at once (None: drawn here, one after the
    other); `progress` gets a line per figure drawn, with the time elapsed and an estimate of the time left
    (a figure of every kernel weighs as many heatmaps as there are kernels)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    out = Path(out)
    earlier = earlier_figures(out) if earlier is None else earlier
    figures: dict[str, object] = {}
    # (file, what the progress line says, weight, the figure's function and arguments), in the page's order
    jobs: list[tuple[str, str, float, tuple]] = []
    per_kernel = float(max(1, len(data.kernels)))
    if any(r.get("regret_geomean") is not None for r in data.rows):
        jobs.append(("regret_curves.png", "regret curves", per_kernel,
                     (regret_curves_figure, data.rows, [data.model], out / "regret_curves.png", data.split)))
        figures["regret"] = "regret_curves.png"
    if data.points:
        jobs.append(("predicted_vs_measured.png", "predicted vs measured", per_kernel,
                     (predicted_vs_measured_figure, data.points, out / "predicted_vs_measured.png")))
        figures["predicted"] = "predicted_vs_measured.png"
    maps = []
    for kernel, items in data.heatmaps.items():
        for i, item in enumerate(items):
            name = f"heatmap_{_safe(kernel)}_{i + 1}.png"
            jobs.append((name, name, 1.0, (heatmap_figure, item, out / name)))
            maps.append((name, f"{item.title}, {item.subtitle}", item.note, len(item.x_values) > 10))
    figures["heatmaps"] = maps
    written = [name for name, _, _, _ in jobs]
    _mark(out, sorted({*earlier, *written}))  # a report stopped while drawing leaves every figure listed for the next
    steps = Steps(progress, "report", sum(w for _, _, w, _ in jobs) or 1.0, parts=len(jobs) or None, started=started)
    some_kernel = data.kernels[0] if data.kernels else None
    if pool is None or not pool.parallel or some_kernel is None:
        for _, what, weight, (figure, *args) in jobs:
            figure(*args)
            steps.done(f"{what} drawn", weight)
    else:
        pending = {pool.submit(some_kernel, _draw, *call): (what, weight) for _, what, weight, call in jobs}
        while pending:  # short waits: Ctrl-C and SIGTERM reach this thread between them
            ready, _ = wait(list(pending), timeout=0.25, return_when=FIRST_COMPLETED)
            for future in ready:
                what, weight = pending.pop(future)
                future.result()
                steps.done(f"{what} drawn", weight)
    scores = {"split": data.split, "model": data.model, "results": table_rows(data.rows)}
    # each file replaced atomically: a link of its name is replaced itself, never written through
    _write(out / "scores.json", json.dumps(scores, indent=2) + "\n")
    index = out / "index.html"
    _write(index, page_html(data, figures, db))
    for name in sorted(set(earlier) - set(written)):  # no earlier figure is left beside the new page
        if _FIGURE_NAME.fullmatch(name) and _regular_file(out / name):
            try:
                os.unlink(out / name)
            except OSError:
                pass
    _mark(out, written)  # a later report may write here again, and knows the figures it is to replace
    drawn = {kernel: len(items) for kernel, items in data.heatmaps.items()}
    return {"index": str(index), "split": data.split, "model": data.model, "kernels": data.kernels,
            "cases": data.cases, "figures": written, "scores": str(out / "scores.json"), "reused": data.reused,
            "heatmaps": {"asked_per_kernel": data.heatmaps_asked, "drawn": drawn, "fewer": data.heatmaps_fewer}}


#: the file a report leaves in its folder, so that a later report knows the folder for its own and writes there again;
#: below its first line, the figures it wrote, which a later report replaces or removes
REPORT_MARKER = ".zmlx-pipeline-report"
_MARKER_TEXT = "written by zmlx-pipeline report: a later report may replace the files here\n"
_FIGURES_LINE = "figures written:"
#: a figure's name as a report writes it: a plain file name (no folder) ending in .png
_FIGURE_NAME = re.compile(r"[^/\\\x00]+\.png")
#: the figures a report writes (those of an earlier report whose marker lists none: one before the list, or older)
_REPORT_FIGURE = re.compile(r"(regret_curves|predicted_vs_measured|heatmap_[A-Za-z0-9._-]+_[0-9]+)\.png")
#: what a report's page starts with (a folder an older report wrote, before the marker): its title
_PAGE_TITLE = b"<title>zmlx-pipeline report"


def _write(path: Path, text: str) -> None:
    """`text` written to a temp file beside `path`, then renamed over it (a link there is replaced, not followed)."""
    write_text_atomic(path, text, mode=0o666 & ~current_umask())


def _mark(out: Path, figures: list[str] | tuple = ()) -> None:
    _write(out / REPORT_MARKER, f"{_MARKER_TEXT}{_FIGURES_LINE}\n" + "".join(f"{name}\n" for name in figures))


def earlier_figures(out: Path) -> list[str]:
    """The figures an earlier report in `out` wrote, which a new one replaces or removes: those its marker lists,
    else (a report whose marker lists none, or one known by its page) every file named as a report's figure is; none
    where `out` holds no report (a user's own PNGs are never a report's)."""
    out = Path(out)
    if not out.is_dir() or not _an_earlier_report(out):
        return []
    lines: list[str] = []
    if _regular_file(out / REPORT_MARKER):
        try:
            with open(out / REPORT_MARKER, "rb") as fh:
                lines = fh.read(1 << 20).decode("utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
    if _FIGURES_LINE in lines:
        return [n for n in lines[lines.index(_FIGURES_LINE) + 1:] if _FIGURE_NAME.fullmatch(n)]
    try:
        return sorted(e.name for e in os.scandir(out) if _REPORT_FIGURE.fullmatch(e.name))
    except OSError:
        return []


def _regular_file(path: Path) -> bool:
    """Whether `path` is a regular file itself (lstat: a symlink, even to a file, is not)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _an_earlier_report(out: Path) -> bool:
    """Whether `out` holds a report: its marker, or (an older report's) an index.html whose page is a report's;
    each only as a regular file, never a link."""
    if _regular_file(out / REPORT_MARKER):
        return True
    page = out / "index.html"
    if not _regular_file(page):  # a regular file only: a FIFO's read would block, a link leads elsewhere
        return False
    try:
        with open(page, "rb") as fh:
            return _PAGE_TITLE in fh.read(4096)
    except OSError:
        return False


def _a_report_file(name: str) -> bool:
    """Whether the report writes a file of this name (its marker, page, scores or a figure)."""
    return name in (REPORT_MARKER, "index.html", "scores.json") or name.endswith(".png")


def check_out(out: Path) -> None:
    """Refuse an --out that is an existing directory holding files a report did not write (a site's index.html, the
    shards of data/, a store, a link to /etc): the report would replace or sit among them; and one where a file
    the report writes (its marker, index.html, scores.json, a figure) is a symlink or not a regular file. A missing
    or empty directory (dot-files aside) or one an earlier report wrote is fine, unless it is or lies in a published
    bundle or is a publish directory (published_problem). Nothing is written."""
    from zmlx_pipeline.runtime.bundle import published_problem

    out = Path(out)
    published = published_problem(out)
    if published is not None:
        raise ReportError(f"cannot write the report to {out}: {published}; pass --out a directory outside it")
    if not out.is_dir():
        what = not_regular_file(out) if os.path.lexists(out) else None
        if os.path.lexists(out) and what != "missing":  # missing: made later
            raise ReportError(f"cannot write the report to {out}: it is {what or 'a file'}, not a directory; pass "
                              "--out a new or empty directory")
        if os.path.islink(out):
            raise ReportError(f"cannot write the report to {out}: it is a symlink to {os.path.realpath(out)}, which "
                              "does not exist; pass --out a new or empty directory")
        return
    try:
        entries = sorted(os.scandir(out), key=lambda e: e.name)
    except OSError as exc:
        raise ReportError(f"cannot write the report to {out}: cannot list it ({exc.strerror or exc}); "
                          "pick a writable directory with --out") from None
    for entry in entries:
        if _a_report_file(entry.name) and not _regular_file(out / entry.name):
            what = "a symlink" if entry.is_symlink() else "not a regular file"
            raise ReportError(f"cannot write the report to {out}: its {entry.name} is {what}, which the report "
                              "would write through or over; remove it, or pass --out a new or empty directory")
    if _an_earlier_report(out):
        return
    names = [e.name for e in entries if not e.name.startswith(".")]
    if names:
        raise ReportError(f"cannot write the report to {out}: it holds other files (e.g. {names[0]}), which the "
                          "report's index.html, scores.json and figures would replace or sit among; pass --out a new "
                          "or empty directory, or one an earlier report wrote")


def prepare_out(out: Path, earlier: list[str] | tuple = ()) -> Path:
    """Check `out` (check_out), create it (a directory) and mark it as a report's (REPORT_MARKER, which also
    checks it is writable, listing the `earlier` report's figures still there), before any work is done."""
    out = Path(out)
    check_out(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        _mark(out, earlier)
    except OSError as exc:
        raise ReportError(f"cannot write the report to {out}: {exc.strerror or exc}; "
                          "pick a writable directory with --out") from None
    return out


def build_report(store, out: Path, split: str = "shapes", kernels=None, model: str = DEFAULT_MODEL,
                 heatmaps_per_kernel: int = HEATMAPS_PER_KERNEL, db: str = "", jobs: int | None = None,
                 progress: Say | None = None, refit: bool = False) -> dict:
    """The whole report of the store under a split, written to `out` (index.html, PNGs, scores.json).
    `out` must be missing, empty or an earlier report's (check_out: a folder of other files is refused before any
    work). A report that fails leaves no directory it created itself (a folder it found is left as it was).
    `jobs`: worker processes for the folds (None: one per CPU); `progress` gets lines with an estimate
    of the time left; `refit` fits every fold even where train recorded the held-out cases (report_data)."""
    started = time.monotonic()
    created = [p for p in (Path(out), *Path(out).parents) if not p.exists()]
    marked = (Path(out) / REPORT_MARKER).exists()
    earlier = earlier_figures(out)  # read before the marker is written again
    out = prepare_out(out, earlier)
    with report_pool(store, kernels, jobs) as pool:  # the folds' workers draw the figures too
        try:
            data = report_data(store, split, kernels, model, heatmaps_per_kernel, jobs=jobs, progress=progress,
                               started=started, refit=refit, pool=pool)
        except BaseException:
            if not marked:  # the folder is left as it was found: unmarked, or not there
                try:
                    (out / REPORT_MARKER).unlink()
                except OSError:
                    pass
            for directory in created:  # innermost first; rmdir refuses a folder that is not empty
                try:
                    directory.rmdir()
                except OSError:
                    break
            raise
        return write_report(data, out, db, progress=progress, started=started, pool=pool, earlier=earlier)
