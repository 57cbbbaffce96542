"""The report's page: index.html (header, score table, figures) from the report's data."""

from __future__ import annotations

import html
import math
from datetime import datetime, timezone
from typing import Mapping, Sequence

import numpy as np

from zmlx_pipeline import __version__
from zmlx_pipeline.models.report import TABLE_KS, TIME_MODEL, ReportData
from zmlx_pipeline.report.figures import _SPLIT_TITLES

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0; color: #1d2330;
       background: #f6f7f9; }
header { background: #1f4e9c; color: white; padding: 22px 32px 18px; }
header h1 { margin: 0 0 6px; font-size: 26px; }
header p { margin: 2px 0; opacity: 0.9; }
main { padding: 8px 32px 40px; max-width: 1500px; }
section { background: white; border-radius: 8px; padding: 14px 20px 18px; margin: 18px 0;
          box-shadow: 0 1px 3px rgba(0,0,0,0.08); }
h2 { margin: 4px 0 4px; font-size: 20px; }
p.caption { color: #4a5263; margin: 2px 0 12px; max-width: 1000px; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin: 8px 0; }
.card { background: #f0f4fb; border-radius: 6px; padding: 8px 14px; min-width: 120px; }
.card b { display: block; font-size: 22px; color: #1f4e9c; }
img { max-width: 100%; height: auto; border: 1px solid #e3e6eb; border-radius: 4px; }
.maps { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 14px; }
table.scores { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
table.scores th, table.scores td { padding: 4px 9px; border-bottom: 1px solid #e6e8ec; text-align: right; }
table.scores th { background: #eef1f6; }
table.scores td.name, table.scores th.name { text-align: left; }
table.scores tr.model td { background: #f3f7ff; font-weight: 600; }
table.scores td.best { color: #0b6b2e; font-weight: 700; }
table.scores tr.first td { border-top: 2px solid #c7ccd6; }
details { margin-top: 12px; }
figure { margin: 0; }
figure.wide { grid-column: 1 / -1; }
figcaption { font-size: 12.5px; color: #4a5263; margin-top: 4px; }
"""


def _fmt(metric: str, value) -> str:
    if value is None:
        return "–"
    if metric == "hit_2pct":
        return f"{value:.0%}"
    return f"{value:.3f}"


def score_table_html(rows: Sequence[dict], models: Sequence[str], ks: Sequence[int] = TABLE_KS,
                     per_device: bool = False) -> str:
    """The score table: one row per (kernel[, device], method), per k geomean, p95 and within 2%.

    Every number cell carries data-kernel/-device/-method/-k/-metric and data-value (repr of
    the float from evaluate), so the page can be checked against evaluate's output.
    """
    metrics = (("regret_geomean", "geomean"), ("regret_p95", "p95"), ("hit_2pct", "≤2%"))
    rows = [r for r in rows if r["k"] in ks and ((r.get("device") is not None) == per_device)]
    by_key: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        by_key.setdefault((r["kernel"], r.get("device"), r["method"]), {})[r["k"]] = r
    best: dict[tuple, float] = {}
    for (kernel, device, _), per_k in by_key.items():
        for k, r in per_k.items():
            v = r.get("regret_geomean")
            if v is not None:
                best[(kernel, device, k)] = min(v, best.get((kernel, device, k), math.inf))
    order = {m: i for i, m in enumerate(models)}
    keys = sorted(by_key, key=lambda t: (t[0], t[1] or "", order.get(t[2], len(order)), t[2]))
    head_top = "<th class='name'>kernel</th>" + ("<th class='name'>device</th>" if per_device else "") + \
        "<th class='name'>method</th>" + "".join(f"<th colspan='3'>k = {k}</th>" for k in ks) + "<th>cases</th>"
    head_sub = "<th></th>" * (3 if per_device else 2) + "".join(f"<th>{label}</th>" for k in ks
                                                                 for _, label in metrics) + "<th></th>"
    out = ["<table class='scores'>", f"<thead><tr>{head_top}</tr><tr>{head_sub}</tr></thead>", "<tbody>"]
    previous = None
    for key in keys:
        kernel, device, method = key
        per_k = by_key[key]
        classes = ["model"] if method in models else []
        group = (kernel, device)
        if group != previous:
            classes.append("first")
            previous = group
        cells = [f"<td class='name'>{html.escape(kernel)}</td>"]
        if per_device:
            cells.append(f"<td class='name'>{html.escape(str(device))}</td>")
        cells.append(f"<td class='name'>{html.escape(method)}{' (model)' if method in models else ''}</td>")
        for k in ks:
            r = per_k.get(k, {})
            for metric, _ in metrics:
                v = r.get(metric)
                cls = " class='best'" if metric == "regret_geomean" and v is not None and \
                    v == best.get((kernel, device, k)) else ""
                attrs = (f" data-kernel='{html.escape(kernel)}' data-device='{html.escape(str(device or ''))}'"
                         f" data-method='{html.escape(method)}' data-k='{k}' data-metric='{metric}'"
                         f" data-value='{'' if v is None else repr(float(v))}'")
                cells.append(f"<td{cls}{attrs}>{_fmt(metric, v)}</td>")
        cases = next((r.get("cases") for r in per_k.values()), None)
        cells.append(f"<td>{'' if cases is None else cases}</td>")
        out.append(f"<tr class='{' '.join(classes)}'>{''.join(cells)}</tr>")
    out += ["</tbody>", "</table>"]
    return "\n".join(out)


def _verdict(rows: Sequence[dict], models: Sequence[str], k: int = 1) -> str:
    """How many kernels the model beats every scored baseline on at k (pooled geomean)."""
    pooled = [r for r in rows if r.get("device") is None and r["k"] == k and r.get("regret_geomean") is not None]
    kernels = sorted({r["kernel"] for r in pooled if r["method"] in models})
    wins = 0
    for kernel in kernels:
        mine = [r for r in pooled if r["kernel"] == kernel]
        model = min(r["regret_geomean"] for r in mine if r["method"] in models)
        others = [r["regret_geomean"] for r in mine if r["method"] not in models]
        wins += all(model < o for o in others)
    return f"{wins} of {len(kernels)}"


def page_html(data: ReportData, figures: Mapping[str, object], db: str = "") -> str:
    """The index.html text: header, score table, and the figures (file names relative to the page)."""
    models = [data.model]
    pooled = [r for r in data.rows if r.get("device") is None and r["method"] == data.model and r["k"] == 1
              and r.get("regret_geomean") is not None]
    geo = [r["regret_geomean"] for r in pooled]
    mean_r1 = float(np.exp(np.mean(np.log(geo)))) if geo else None
    esc = html.escape
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cards = [
        ("kernels", str(len(data.kernels))), ("devices", str(len(data.devices))),
        ("held-out cases", str(data.cases)),
        ("model regret@1", "–" if mean_r1 is None else f"{mean_r1:.3f}×"),
        ("beats every baseline @1", _verdict(data.rows, models, 1)),
    ]
    parts = [
        "<!doctype html>", "<html lang='en'><head><meta charset='utf-8'>",
        f"<title>zmlx-pipeline report · {esc(data.split)}</title>", f"<style>{_CSS}</style></head><body>",
        "<header>", "<h1>How well does the model pick launch configs?</h1>",
        f"<p>split: <b>{esc(data.split)}</b> ({esc(_SPLIT_TITLES.get(data.split, data.split))}) · model: "
        f"<b>{esc(data.model)}</b> · kernels: {esc(', '.join(data.kernels))}</p>",
        f"<p>devices: {esc(', '.join(data.devices))}</p>",
        f"<p>{esc(stamp)} · zmlx-pipeline {esc(__version__)}{' · store ' + esc(db) if db else ''}</p>",
        "</header><main>",
        "<section><div class='cards'>" + "".join(
            f"<div class='card'><b>{esc(v)}</b>{esc(k)}</div>" for k, v in cards) + "</div>",
        "<p class='caption'>Every figure and number is on data the model did not train on: "
        + ("each kernel's shapes in folds, scored on devices seen in training."
           if data.split == "shapes" else "each device is scored by models trained on the other devices.")
        + " regret@k = measured time of the best of the method's top k configs / the case's measured best; "
          "1.00 is perfect.</p></section>",
    ]
    if figures.get("regret"):
        parts += ["<section><h2>Regret curves</h2>",
                  "<p class='caption'>How many configs the runtime must time to get close to the best: the model "
                  "(solid blue) against the baselines people use today (dashed), pooled over devices.</p>",
                  f"<img src='{esc(str(figures['regret']))}' alt='regret@k curves per kernel'></section>"]
    parts += ["<section><h2>Scores</h2>",
              "<p class='caption'>The numbers of <code>zmlx-pipeline evaluate</code> (also in "
              "<a href='scores.json'>scores.json</a>): geometric mean and 95th percentile of regret@k, "
              "and the share of cases within 2% of the best. Green: the lowest geomean for that kernel and k.</p>",
              score_table_html(data.rows, models),
              "<details><summary>Per device</summary>", score_table_html(data.rows, models, per_device=True),
              "</details></section>"]
    if figures.get("predicted"):
        parts += ["<section><h2>Predicted vs measured time</h2>",
                  f"<p class='caption'>Every held-out config: the {TIME_MODEL} log-time regressor's prediction "
                  "against the measured median (the picking model ranks configs relatively and predicts no "
                  "absolute time). On the diagonal is exact; dotted lines are 2× off.</p>",
                  f"<img src='{esc(str(figures['predicted']))}' alt='predicted vs measured time'></section>"]
    maps = figures.get("heatmaps") or []
    if maps:
        parts += ["<section><h2>The config space of a few cases</h2>",
                  "<p class='caption'>Time relative to the case's best over the two parameters that explain most "
                  "of the variance of log time; each cell is the fastest config with those two values (grey: "
                  "none measured). Star: measured best. Ring: the model's pick, trained without this case.</p>",
                  "<div class='maps'>"]
        parts += [f"<figure{' class=wide' if wide else ''}><img src='{esc(str(name))}' alt='{esc(title)}'>"
                  f"<figcaption>{esc(note)}</figcaption></figure>" for name, title, note, wide in maps]
        parts += ["</div></section>"]
    parts += ["</main></body></html>"]
    return "\n".join(parts)
