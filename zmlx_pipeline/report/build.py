"""The whole report written to a folder: its data (models/report.py), every figure, scores.json and index.html."""

from __future__ import annotations

import json
import time
from pathlib import Path

from zmlx_pipeline.models.variants import DEFAULT_MODEL
from zmlx_pipeline.models.report import HEATMAPS_PER_KERNEL, ReportData, ReportError, report_data, table_rows
from zmlx_pipeline.progress import Say, Steps
from zmlx_pipeline.report.figures import heatmap_figure, predicted_vs_measured_figure, regret_curves_figure
from zmlx_pipeline.report.page import page_html

def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def write_report(data: ReportData, out: Path, db: str = "", progress: Say | None = None,
                 started: float | None = None) -> dict:
    """Draw every figure of `data` into `out`, then scores.json and index.html; returns what was written.
    `progress` gets a line per figure drawn, with the time elapsed and an estimate of the time left."""
    out = Path(out)
    steps = Steps(progress, "report", 2 + sum(len(items) for items in data.heatmaps.values()), started=started)
    figures: dict[str, object] = {}
    written: list[str] = []
    if any(r.get("regret_geomean") is not None for r in data.rows):
        regret_curves_figure(data.rows, [data.model], out / "regret_curves.png", data.split)
        figures["regret"] = "regret_curves.png"
        written.append("regret_curves.png")
    steps.done("regret curves drawn")
    if data.points:
        predicted_vs_measured_figure(data.points, out / "predicted_vs_measured.png")
        figures["predicted"] = "predicted_vs_measured.png"
        written.append("predicted_vs_measured.png")
    steps.done("predicted vs measured drawn")
    maps = []
    for kernel, items in data.heatmaps.items():
        for i, item in enumerate(items):
            name = f"heatmap_{_safe(kernel)}_{i + 1}.png"
            heatmap_figure(item, out / name)
            maps.append((name, f"{item.title}, {item.subtitle}", item.note, len(item.x_values) > 10))
            written.append(name)
            steps.done(f"{name} drawn")
    figures["heatmaps"] = maps
    scores = {"split": data.split, "model": data.model, "results": table_rows(data.rows)}
    (out / "scores.json").write_text(json.dumps(scores, indent=2) + "\n")
    index = out / "index.html"
    index.write_text(page_html(data, figures, db), encoding="utf-8")
    return {"index": str(index), "split": data.split, "model": data.model, "kernels": data.kernels,
            "cases": data.cases, "figures": written, "scores": str(out / "scores.json"), "reused": data.reused}


def prepare_out(out: Path) -> Path:
    """Create `out` (a directory) and check it is writable before any work is done."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".zmlx-report-write-check"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ReportError(f"cannot write the report to {out}: {exc.strerror or exc}; "
                          "pick a writable directory with --out") from None
    return out


def build_report(store, out: Path, split: str = "shapes", kernels=None, model: str = DEFAULT_MODEL,
                 heatmaps_per_kernel: int = HEATMAPS_PER_KERNEL, db: str = "", jobs: int | None = None,
                 progress: Say | None = None, refit: bool = False) -> dict:
    """The whole report of the store under a split, written to `out` (index.html, PNGs, scores.json).
    A report that fails leaves no directory it created itself (a folder it found is left as it was).
    `jobs`: worker processes for the folds (None: one per CPU); `progress` gets lines with an estimate
    of the time left; `refit` fits every fold even where train recorded the held-out cases (report_data)."""
    started = time.monotonic()
    created = [p for p in (Path(out), *Path(out).parents) if not p.exists()]
    out = prepare_out(out)
    try:
        data = report_data(store, split, kernels, model, heatmaps_per_kernel, jobs=jobs, progress=progress,
                           started=started, refit=refit)
    except BaseException:
        for directory in created:  # innermost first; rmdir refuses a folder that is not empty
            try:
                directory.rmdir()
            except OSError:
                break
        raise
    return write_report(data, out, db, progress=progress, started=started)
