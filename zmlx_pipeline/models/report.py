"""The report: one HTML page of PNG figures that shows how well the model picks configs.

Figures, all on data the model did not train on (the folds of evaluate.py):
- regret curves: regret@k geometric mean for k = 1..10, the model against every baseline;
- predicted vs measured time: the `gbr` log-time regressor's predictions (the default ranker
  scores configs relative to each other, so it has no absolute time to plot);
- heatmaps: for a few cases, time over the two config parameters that explain most of the
  within-case variance of log time (each cell: the fastest config with those two values),
  with the model's pick and the measured best marked.
The page also carries the score table: the same numbers as `evaluate` (scores.json holds
them as flat rows). Each fold is fitted once, in worker processes, for the table and the figures
alike (score_fold), with a progress line per fold and an estimate of the time left. Figure
functions take plain data and write a PNG, so they test alone; matplotlib is imported only when a
figure is drawn (Agg canvas, no pyplot state).
"""

from __future__ import annotations

import html
import json
import math
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import polars as pl

from zmlx_pipeline import __version__
from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.models import evaluate as ev
from zmlx_pipeline.models.estimators import DEFAULT_MODEL, make_ranker
from zmlx_pipeline.models.features import CASE, KernelFeatures
from zmlx_pipeline.progress import Say, Steps

SPLIT_NAMES = ("shapes", "devices")
CURVE_KS = tuple(range(1, 11))
TABLE_KS = (1, 3, 5)
TIME_MODEL = "gbr"          # the variant that regresses log time (the others rank)
HEATMAPS_PER_KERNEL = 2
HIT_WITHIN = 1.02
_DPI = 110
_MAX_ANNOTATED_CELLS = 144
_SPLIT_TITLES = {"shapes": "held-out shapes on seen devices", "devices": "leave one device out"}


class ReportError(ZmlxPipelineError, ValueError):
    "The report cannot be built as asked"


# ------------------------------------------------------------------------------------------
# data


def evaluation_split(split: str) -> str:
    """The evaluate.py name of a report split ("devices" is "lodo" where evaluate still calls it so)."""
    if split not in SPLIT_NAMES and split not in ev.SPLITS:
        raise ReportError(f"unknown split {split!r}; expected one of {', '.join(SPLIT_NAMES)}")
    if split in ev.SPLITS:
        return split
    return next(s for s in ("devices", "lodo") if s in ev.SPLITS)


def result_rows(result: Mapping) -> list[dict]:
    """The flat score rows of an evaluate() result, whichever key ("results" or "rows") holds them."""
    for key in ("results", "rows"):
        if key in result:
            return list(result[key])
    raise ReportError("the evaluation returned no score rows")


def held_out_predictions(features: KernelFeatures, split: str, model: str = DEFAULT_MODEL,
                         time_model: str = TIME_MODEL) -> pl.DataFrame:
    """Every held-out row of a kernel under `split`, with the model's score and a predicted time.

    Same folds (and, for shapes, the same seen-device filter) as evaluate.py; columns: the
    frame's ids and config columns, median_us, `score` (the ranker's, lower is better),
    `predicted_us` (exp of the time model's log-time prediction) and `fold`.
    """
    split = evaluation_split(split)
    parts = [score_fold(features, i, split, CURVE_KS, model, time_model, baselines=False)[1]
             for i in ev.fold_plan(features, split)]
    return pl.concat(parts) if parts else _empty_held(features)


def _held_columns(features: KernelFeatures) -> list[str]:
    frame = features.frame
    cfg = [f"cfg_{p}" for p in features.params if f"cfg_{p}" in frame.columns]
    return [*CASE, "shape", "config_key", "config", "median_us", *cfg]


def _empty_held(features: KernelFeatures) -> pl.DataFrame:
    keep = _held_columns(features)
    return pl.DataFrame(schema={**{c: features.frame.schema[c] for c in keep}, "score": pl.Float64,
                                "predicted_us": pl.Float64, "fold": pl.String})


def score_fold(features: KernelFeatures, index: int, split: str, ks: Sequence[int], model: str,
               time_model: str = TIME_MODEL, baselines: bool = True) -> tuple[list[pl.DataFrame], pl.DataFrame, float]:
    """Fold `index` of a kernel, fitted once for both the score table and the figures: evaluate.py's
    per-case regret frames of the model and every baseline (as its fold scoring makes them: the ranker
    fits only the seen or unseen setting its test rows use, on one OpenMP thread), the held-out rows
    with the model's score and the time model's predicted time, and the seconds it took."""
    start = time.perf_counter()
    frame = features.frame
    name, train_filter, test_filter = ev.folds(frame, split)[index]
    train, test = frame.filter(train_filter), frame.filter(test_filter)
    if split == "shapes":
        test = test.filter(pl.col("device_id").is_in(train["device_id"].unique().to_list()))
    seen = test["device_id"].is_in(train["device_id"].unique().to_list())
    with ev.fit_threads():
        ranker = make_ranker(features, model)
        if hasattr(ranker, "only"):
            ranker.only = "seen" if seen.all() else "unseen" if not seen.any() else None
        scores = {model: np.asarray(ranker.fit(train).score(test), dtype=float)}
        timer = make_ranker(features, time_model)
        if getattr(timer, "target", None) != "log_time":
            raise ReportError(f"model {time_model!r} does not predict times")
        predicted = np.exp(np.asarray(timer.fit(train).score(test), dtype=float))
        if baselines:
            scores.update({k: v.to_numpy() for k, v in ev.baseline_scores(features, train, test).items()})
    regrets = [ev.case_regrets(test, s, ks).with_columns(pl.lit(method).alias("method"), pl.lit(name).alias("fold"))
               for method, s in scores.items()]
    held = test.select(_held_columns(features)).with_columns(
        pl.Series("score", scores[model]), pl.Series("predicted_us", predicted), pl.lit(name).alias("fold"))
    return regrets, held, time.perf_counter() - start


def param_importance(frame: pl.DataFrame, params: Sequence[str]) -> list[tuple[str, float]]:
    """Each varying config parameter's share of the within-case variance of log time, largest first.

    Share = between-group sum of squares (groups: case x parameter value) / total sum of
    squares around each case's mean; times over 4x the case's best count as 4x.
    """
    y = pl.col("log_time").clip(upper_bound=pl.col("log_time").min().over(CASE) + math.log(4.0))
    df = frame.with_columns(y.alias("_y")).with_columns(pl.col("_y").mean().over(CASE).alias("_m"))
    total = df.select(((pl.col("_y") - pl.col("_m")) ** 2).sum()).item()
    out = []
    for p in params:
        col = f"cfg_{p}"
        if col not in df.columns or df[col].n_unique() < 2:
            continue
        between = df.group_by([*CASE, col]).agg(pl.len().alias("_n"), pl.col("_y").mean().alias("_g"),
                                                pl.col("_m").first()).select(
            (pl.col("_n") * (pl.col("_g") - pl.col("_m")) ** 2).sum()).item()
        out.append((p, float(between / total) if total and total > 0 else 0.0))
    return sorted(out, key=lambda t: (-t[1], t[0]))


@dataclass
class HeatmapData:
    """Times of one case over two config parameters (y rows x x columns, NaN = nothing measured)."""

    title: str
    x_param: str
    x_values: list
    times_us: list[list[float]]
    best: tuple[int, int]                 # (row, column) of the measured best
    pick: tuple[int, int] | None = None   # (row, column) of the model's pick
    pick_regret: float | None = None
    y_param: str | None = None            # None: one parameter only, a single row
    y_values: list = field(default_factory=lambda: [None])
    subtitle: str = ""
    note: str = ""                        # the page's caption of the figure


def _sorted_values(values: Iterable) -> list:
    vals = list({v for v in values if v is not None})
    try:
        return sorted(vals)
    except TypeError:
        return sorted(vals, key=str)


def heatmap_data(rows: pl.DataFrame, x_param: str, y_param: str | None, pick_key: str | None,
                 title: str, subtitle: str = "", note: str = "") -> HeatmapData:
    """The grid of one case's rows: per (y, x) value pair the fastest config's time."""
    xc, yc = f"cfg_{x_param}", (f"cfg_{y_param}" if y_param else None)
    xs = _sorted_values(rows[xc].to_list())
    ys = _sorted_values(rows[yc].to_list()) if yc else [None]
    grid = np.full((len(ys), len(xs)), np.nan)
    for r in rows.iter_rows(named=True):  # one case: at most a few thousand configs
        i = ys.index(r[yc]) if yc else 0
        j = xs.index(r[xc])
        if not grid[i, j] <= r["median_us"]:
            grid[i, j] = r["median_us"]

    def cell(key: str | None):
        hit = rows.filter(pl.col("config_key") == key) if key is not None else rows.clear()
        if hit.is_empty():
            return None
        r = hit.row(0, named=True)
        return (ys.index(r[yc]) if yc else 0, xs.index(r[xc]))

    best_key = rows.sort(["median_us", "config_key"])["config_key"][0]
    pick = cell(pick_key)
    regret = None
    if pick is not None:
        regret = float(rows.filter(pl.col("config_key") == pick_key)["median_us"][0] / rows["median_us"].min())
    return HeatmapData(title=title, x_param=x_param, x_values=xs, y_param=y_param, y_values=ys,
                       times_us=grid.tolist(), best=cell(best_key), pick=pick, pick_regret=regret,
                       subtitle=subtitle, note=note)


def _case_picks(held: pl.DataFrame) -> pl.DataFrame:
    """Per held-out case: the model's pick (lowest score, ties by config_key) and its regret@1."""
    ranked = held.sort([*CASE, "score", "config_key"], nulls_last=True)
    return ranked.group_by(CASE, maintain_order=True).agg(
        pl.col("config_key").first().alias("pick_key"),
        (pl.col("median_us").first() / pl.col("median_us").min()).alias("r1"),
        pl.len().alias("configs"))


def _json_text(text: str) -> str:
    """`{"a": 1, "b": 2}` as `a=1 b=2`."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return str(text)
    return " ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else str(value)


def kernel_heatmaps(features: KernelFeatures, held: pl.DataFrame, n: int = HEATMAPS_PER_KERNEL) -> list[HeatmapData]:
    """Heatmaps of up to n held-out cases of one kernel: the model's worst case, then its median one."""
    if n <= 0 or held.is_empty():
        return []
    ranked = param_importance(features.frame, features.params)
    if not ranked:
        return []
    x_param = ranked[0][0]
    y_param = ranked[1][0] if len(ranked) > 1 else None
    picks = _case_picks(held).filter(pl.col("configs") > 1).sort(["r1", *CASE], descending=[True, False, False,
                                                                                          False, False])
    if picks.is_empty():
        return []
    chosen = [(0, "the model's worst held-out case")]
    if picks.height > 1:
        chosen.append((picks.height // 2, "a typical (median) held-out case"))
    shares = ", ".join(f"{p} {s:.0%}" for p, s in ranked[:2])
    out = []
    for index, why in chosen[:n]:
        case = picks.row(index, named=True)
        rows = held.filter(*[pl.col(c) == case[c] for c in CASE])
        best = rows.sort(["median_us", "config_key"]).row(0, named=True)
        pick = rows.filter(pl.col("config_key") == case["pick_key"]).row(0, named=True)
        configs = ("the model picked the measured best config" if pick["config_key"] == best["config_key"]
                   else f"model's pick {_json_text(pick['config'])}; measured best {_json_text(best['config'])}")
        out.append(heatmap_data(
            rows, x_param, y_param, case["pick_key"], title=f"{features.kernel} on {case['device_id']}",
            subtitle=f"{case['dtype']}, {_json_text(rows['shape'][0])}",
            note=f"{features.kernel}: {why}. {configs}. Within-case variance of log time explained by {shares}."))
    return out


@dataclass
class ReportData:
    """Everything the page shows, as plain data."""

    split: str
    model: str
    kernels: list[str]
    rows: list[dict]                          # evaluate's flat rows, k = 1..10
    points: dict[str, dict[str, list]]        # kernel -> measured, predicted, device
    heatmaps: dict[str, list[HeatmapData]]
    devices: list[str]
    cases: int


def report_data(store, split: str = "shapes", kernels=None, model: str = DEFAULT_MODEL,
                heatmaps_per_kernel: int = HEATMAPS_PER_KERNEL, jobs: int | None = None,
                progress: Say | None = None, started: float | None = None) -> ReportData:
    """Scores, held-out predictions and heatmaps of the store's kernels under a split.

    Each fold is fitted once (score_fold) for both the score table and the figures, in `jobs` worker
    processes (None: one per CPU); the table's rows are evaluate()'s, number for number. `progress`
    gets a line per scored fold with the time elapsed and an estimate of the time left.
    """
    from zmlx_pipeline.models.estimators import MODEL_VARIANTS

    split_eval = evaluation_split(split)
    public_split = "devices" if split_eval in ("devices", "lodo") else split_eval
    if model not in MODEL_VARIANTS:
        raise ReportError(f"unknown model {model!r}; expected one of {', '.join(MODEL_VARIANTS)}")
    jobs = ev.check_jobs(jobs)
    # the workers start while the features are read
    with ev.KernelPool(None, jobs, rows=ev.ok_rows(store, kernels)) as pool:
        try:
            features = ev.kernel_features_of(store, kernels)
        except ev.EvaluationError as exc:
            raise ReportError(str(exc)) from None
        plans = {name: ev.fold_plan(f, split_eval) for name, f in features.items()}
        if not any(plans.values()):
            need = "two devices that measured the same kernel" if public_split == "devices" \
                else "a kernel measured at two or more shapes on one device"
            raise ReportError(f"no held-out cases under --split {public_split}: it needs {need} "
                              f"(try the other split)")
        pool.attach(features)
        done = _score_folds(pool, features, plans, split_eval, model, progress, started)
    noise = ev.noise_bands(store)
    rows: list[dict] = []
    points: dict[str, dict[str, list]] = {}
    heatmaps: dict[str, list[HeatmapData]] = {}
    cases = 0
    steps = Steps(progress, "report", len(features), parts=len(features), started=started)
    for name, f in features.items():
        regrets = [part for i in plans[name] for part in done[(name, i)][0]]
        oracle = split_eval == "devices" and bool(regrets)  # the after-the-fact floor, as evaluate reports it
        if oracle:
            regrets.append(ev.oracle_device(f, CURVE_KS))
        per_case = ev.tied_regrets(pl.concat(regrets) if regrets else ev.gather_folds([], CURVE_KS), f.frame, noise,
                                   CURVE_KS)
        rows += ev.regret_rows(per_case, name, CURVE_KS, [model, *ev.baseline_names(f), *([ev.ORACLE] if oracle else [])])
        held = pl.concat([done[(name, i)][1] for i in plans[name]]) if plans[name] else _empty_held(f)
        if held.is_empty():
            continue
        cases += held.select(CASE).unique().height
        points[name] = {"measured": held["median_us"].to_list(), "predicted": held["predicted_us"].to_list(),
                        "device": held["device_id"].to_list()}
        heatmaps[name] = kernel_heatmaps(f, held, heatmaps_per_kernel)
        steps.done(f"{name}: scores and heatmap data")
    devices = sorted({d for f in features.values() for d in f.frame["device_id"].unique().to_list()})
    return ReportData(split=public_split, model=model, kernels=list(features), rows=rows, points=points,
                      heatmaps=heatmaps, devices=devices, cases=cases)


def _score_folds(pool, features: Mapping[str, KernelFeatures], plans: Mapping[str, list[int]], split: str,
                 model: str, progress: Say | None, started: float | None = None) -> dict[tuple[str, int], tuple]:
    """score_fold of every planned fold, the largest kernels first, in the pool's workers (or here one after
    the other); a progress line as each fold finishes, weighted by its kernel's rows per fold."""
    order = sorted(features, key=lambda k: -features[k].frame.height)
    tasks = [(k, i) for k in order for i in plans[k]]
    weight = {k: features[k].frame.height / max(1, len(plans[k])) for k in order}
    steps = Steps(progress, "report", sum(weight[k] for k, _ in tasks), parts=len(tasks), started=started)
    steps.note(f"{len(tasks)} folds of {len(order)} kernel(s) to fit and score"
               + (f" in {pool.jobs} worker processes" if pool.parallel else ""))
    out: dict[tuple[str, int], tuple] = {}

    def finished(task: tuple[str, int], future: Future) -> None:
        out[task] = future.result()
        steps.done(f"{task[0]} fold {task[1] + 1} scored in {out[task][2]:.1f} s", weight[task[0]])

    if not pool.parallel:
        for task in tasks:
            finished(task, pool.submit(task[0], score_fold, task[1], split, CURVE_KS, model))
        return out
    pending = {pool.submit(k, score_fold, i, split, CURVE_KS, model): (k, i) for k, i in tasks}
    while pending:  # short waits: Ctrl-C and SIGTERM reach this thread between them
        ready, _ = wait(list(pending), timeout=0.25, return_when=FIRST_COMPLETED)
        for future in ready:
            finished(pending.pop(future), future)
    return out


def table_rows(rows: Sequence[dict], ks: Sequence[int] = TABLE_KS) -> list[dict]:
    """The score table's rows: evaluate's flat rows at the table's k."""
    return [r for r in rows if r["k"] in ks]


# ------------------------------------------------------------------------------------------
# figures (plain data in, a PNG out)

_METHOD_COLORS = {
    "chip_default": "#e6862e", "common_top10": "#e6862e", "most_common_best": "#8c6bb1",
    "nearest_shape": "#2ca25f", "other_device_best": "#d6604d",
}
_EXTRA_COLORS = ("#6b6b6b", "#b8860b", "#1b9e77", "#e7298a", "#66a61e", "#a6761d")
_MODEL_COLOR = "#1f4e9c"
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    return fig


def _save(fig, path: Path) -> Path:
    path = Path(path)
    fig.savefig(path, format="png", dpi=_DPI, facecolor="white")
    return path


def _grid(n: int, cols: int = 3) -> tuple[int, int]:
    cols = max(1, min(cols, n))
    return math.ceil(n / cols), cols


_NICE_RATIOS = (1.0, 1.01, 1.02, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 50.0, 100.0,
                200.0, 500.0, 1000.0)


def _ratio_ticks(lo: float, hi: float, min_gap: float = 0.07) -> list[float]:
    """Round ratios within [lo, hi] for a log axis, at least min_gap of the log range apart."""
    gap = min_gap * math.log(max(hi, lo * 1.0001) / lo)
    ticks: list[float] = []
    for t in _NICE_RATIOS:
        if lo * 0.999 <= t <= hi * 1.001 and (not ticks or math.log(t / ticks[-1]) >= gap):
            ticks.append(t)
    return ticks if len(ticks) >= 2 else [lo, hi]


def _ratio_label(y: float, _pos=None) -> str:
    return f"{y:.2f}×" if y < 1.1 else f"{y:.3g}×"


def regret_curves_figure(rows: Sequence[dict], models: Sequence[str], path: Path, split: str = "") -> Path:
    """Regret@k (geometric mean, pooled over devices) against k, one panel per kernel."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    pooled = [r for r in rows if r.get("device") is None and r.get("regret_geomean") is not None]
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    if not kernels:
        raise ReportError("no score rows to plot")
    methods = list(dict.fromkeys([*models, *(r["method"] for r in rows)]))
    extra = iter(_EXTRA_COLORS * 3)
    colors = {m: (_MODEL_COLOR if m in models else _METHOD_COLORS.get(m) or next(extra)) for m in methods}
    nrows, ncols = _grid(len(kernels))
    fig = _figure(max(4.2 * ncols, 7.5), 3.3 * nrows + 0.8)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    shown: dict[str, Line2D] = {}
    for ax, kernel in zip(axes.flat, kernels):
        mine = [r for r in pooled if r["kernel"] == kernel]
        values = []
        cases = max([r["cases"] for r in mine] + [0]) if mine else 0
        for i, method in enumerate(methods):
            pts = sorted((r["k"], r["regret_geomean"]) for r in mine if r["method"] == method)
            if not pts:
                continue
            ks, ys = zip(*pts)
            values += ys
            is_model = method in models
            line, = ax.plot(ks, ys, color=colors[method], lw=2.8 if is_model else 1.5,
                            ls="-" if is_model else "--", marker="o" if is_model else _MARKERS[1 + i % 6],
                            ms=5 if is_model else 4, zorder=3 if is_model else 2,
                            label=f"{method} (model)" if is_model else method)
            shown.setdefault(method, line)
        ax.set_title(f"{kernel}  ({cases} held-out cases)", fontsize=11, loc="left")
        ax.set_xlabel("k (configs timed at run time)")
        ax.set_ylabel("regret@k, geometric mean")
        ax.set_xlim(0.7, max(CURVE_KS) + 0.3)
        ax.set_xticks(list(CURVE_KS))
        ax.grid(True, which="major", color="#dddddd", lw=0.8)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        if not values:
            ax.text(0.5, 0.5, "no held-out cases\nunder this split", ha="center", va="center",
                    transform=ax.transAxes, color="#777777")
            ax.set_yticks([])
            continue
        hi = max(max(values), HIT_WITHIN) * 1.03
        ax.set_yscale("log")
        ax.set_ylim(0.995, hi)
        ax.axhline(HIT_WITHIN, color="#999999", lw=0.9, ls=":", zorder=1)
        ax.text(max(CURVE_KS) + 0.25, HIT_WITHIN, "2%", va="bottom", ha="right", fontsize=8, color="#777777")
        ax.yaxis.set_major_locator(FixedLocator(_ratio_ticks(1.0, hi)))
        ax.yaxis.set_major_formatter(FuncFormatter(_ratio_label))
        ax.yaxis.set_minor_locator(NullLocator())
    for ax in list(axes.flat)[len(kernels):]:
        ax.set_visible(False)
    fig.suptitle("Regret@k, lower is better" + (f" · {_SPLIT_TITLES.get(split, split)}" if split else ""),
                 fontsize=13, fontweight="bold", x=0.01, ha="left")
    if shown:
        fig.legend(handles=list(shown.values()), loc="outside lower center",
                   ncol=min(len(shown), 3 if ncols < 2 else 6), frameon=False, fontsize=10)
    return _save(fig, path)


def predicted_vs_measured_figure(points: Mapping[str, Mapping[str, Sequence]], path: Path,
                                 time_model: str = TIME_MODEL) -> Path:
    """Log-log scatter of predicted against measured time per kernel, coloured by device."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    kernels = [k for k, p in points.items() if len(p["measured"])]
    if not kernels:
        raise ReportError("no held-out predictions to plot")
    devices = sorted({d for k in kernels for d in points[k]["device"]})
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf")
    colors = {d: palette[i % len(palette)] for i, d in enumerate(devices)}
    nrows, ncols = _grid(len(kernels))
    width = max(4.2 * ncols, 7.0)
    fig = _figure(width, 4.0 * nrows + 0.3 * math.ceil(len(devices) / max(1, int(width // 2.6))) + 0.6)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax, kernel in zip(axes.flat, kernels):
        p = points[kernel]
        measured = np.asarray(p["measured"], dtype=float)
        predicted = np.asarray(p["predicted"], dtype=float)
        dev = np.asarray(p["device"])
        ok = (measured > 0) & (predicted > 0) & np.isfinite(predicted)
        alpha = 0.75 if ok.sum() < 500 else 0.25
        size = 14 if ok.sum() < 500 else 4
        for d in devices:
            sel = ok & (dev == d)
            if sel.any():
                ax.scatter(measured[sel], predicted[sel], s=size, alpha=alpha, color=colors[d], lw=0,
                           rasterized=True)
        lo = float(min(measured[ok].min(), predicted[ok].min())) / 1.3
        hi = float(max(measured[ok].max(), predicted[ok].max())) * 1.3
        ax.plot([lo, hi], [lo, hi], color="#333333", lw=1)
        for f in (0.5, 2.0):
            ax.plot([lo, hi], [lo * f, hi * f], color="#999999", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal", adjustable="box")
        err = np.exp(np.median(np.abs(np.log(predicted[ok] / measured[ok]))))
        within = float(np.mean(np.abs(np.log(predicted[ok] / measured[ok])) <= math.log(1.25)))
        ax.text(0.03, 0.97, f"median error ×{err:.2f}\n{within:.0%} within 25%\n{int(ok.sum())} configs",
                transform=ax.transAxes, va="top", fontsize=9,
                bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "#cccccc"})
        ax.set_title(kernel, fontsize=11, loc="left")
        decades = math.log10(hi / lo)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(_time_label))
            # within a decade or so the 2s and 5s get labels too; over many decades none do
            axis.set_minor_formatter(FuncFormatter(
                lambda v, _, few=decades < 1.6: _time_label(v) if few and _mantissa(v) in (2, 5) else ""))
        ax.set_xlabel("measured median time")
        ax.set_ylabel("predicted time")
        ax.grid(True, which="major", color="#e5e5e5", lw=0.8)
        ax.set_axisbelow(True)
    for ax in list(axes.flat)[len(kernels):]:
        ax.set_visible(False)
    fig.suptitle(f"Predicted ({time_model}) vs measured time, held-out", fontsize=13, fontweight="bold",
                 x=0.01, ha="left")
    handles = [Line2D([], [], ls="", marker="o", color=colors[d], label=d) for d in devices]
    fig.legend(handles=handles, loc="outside lower center", ncol=max(1, min(len(devices), int(width // 2.6))),
               frameon=False, fontsize=10)
    return _save(fig, path)


def _time_label(us: float, _pos=None) -> str:
    """A time tick in µs as `10 µs`, `1 ms`, `2 s`."""
    for scale, unit in ((1e6, "s"), (1e3, "ms")):
        if us >= scale:
            return f"{us / scale:g} {unit}"
    return f"{us:g} µs"


def _mantissa(value: float) -> int:
    """The leading digit of a positive number (2 for 0.2, 20, 2000)."""
    return int(round(value / 10 ** math.floor(math.log10(value) + 1e-9)))


def _label(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def heatmap_figure(data: HeatmapData, path: Path) -> Path:
    """Time relative to the case's best over two parameters; star = measured best, ring = model's pick."""
    from matplotlib.colors import LogNorm
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    grid = np.asarray(data.times_us, dtype=float)
    if grid.size == 0 or np.isnan(grid).all():
        raise ReportError(f"{data.title}: nothing measured to plot")
    rel = grid / np.nanmin(grid)
    ny, nx = rel.shape
    fig = _figure(min(max(6.4, 0.62 * nx + 2.8), 12.0), min(max(4.2, 0.5 * ny + 2.6), 9.0))
    ax = fig.subplots()
    vmax = max(float(np.nanmax(rel)), 1.05)
    im = ax.imshow(np.ma.masked_invalid(rel), cmap="YlOrRd", norm=LogNorm(vmin=1.0, vmax=vmax), aspect="auto",
                   origin="lower", interpolation="nearest")
    ax.set_facecolor("#e4e4e4")
    by, bx = data.best
    if nx * ny <= _MAX_ANNOTATED_CELLS:
        for i in range(ny):
            for j in range(nx):
                if np.isfinite(rel[i, j]) and (i, j) != (by, bx):
                    dark = math.log(rel[i, j]) / math.log(vmax) > 0.6
                    ax.text(j, i, f"{rel[i, j]:.2f}", ha="center", va="center", fontsize=8,
                            color="white" if dark else "#222222")
    ax.set_xticks(range(nx))
    ax.set_xticklabels([_label(v) for v in data.x_values], rotation=45 if nx > 10 else 0)
    ax.set_xlabel(data.x_param, fontsize=11)
    if data.y_param:
        ax.set_yticks(range(ny))
        ax.set_yticklabels([_label(v) for v in data.y_values])
        ax.set_ylabel(data.y_param, fontsize=11)
    else:
        ax.set_yticks([])
    ax.plot(bx, by, marker="*", ms=18, mfc="#111111", mec="white", mew=1.2, ls="", zorder=4)
    handles = [Line2D([], [], marker="*", ms=13, mfc="#111111", mec="white", ls="", label="measured best")]
    if data.pick is not None:
        py, px = data.pick
        ax.plot(px, py, marker="o", ms=26, mfc="none", mec="#1f4e9c", mew=2.8, ls="", zorder=5)
        regret = f" ({data.pick_regret:.3f}× the best)" if data.pick_regret is not None else ""
        handles.append(Line2D([], [], marker="o", ms=12, mfc="none", mec="#1f4e9c", mew=2.4, ls="",
                              label=f"model's pick{regret}"))
    cbar = fig.colorbar(im, ax=ax, shrink=0.95, pad=0.02, aspect=25)
    cbar.ax.yaxis.set_major_locator(FixedLocator(_ratio_ticks(1.0, vmax, 0.12)))
    cbar.ax.yaxis.set_major_formatter(FuncFormatter(_ratio_label))
    cbar.ax.yaxis.set_minor_locator(NullLocator())
    cbar.set_label("time / measured best")
    ax.set_title(data.title + (f"\n{data.subtitle}" if data.subtitle else ""), fontsize=11, loc="left")
    fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False, fontsize=9.5)
    return _save(fig, path)


# ------------------------------------------------------------------------------------------
# page

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
            "cases": data.cases, "figures": written, "scores": str(out / "scores.json")}


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
                 progress: Say | None = None) -> dict:
    """The whole report of the store under a split, written to `out` (index.html, PNGs, scores.json).
    A report that fails leaves no directory it created itself (a folder it found is left as it was).
    `jobs`: worker processes for the folds (None: one per CPU); `progress` gets lines with an estimate
    of the time left."""
    started = time.monotonic()
    created = [p for p in (Path(out), *Path(out).parents) if not p.exists()]
    out = prepare_out(out)
    try:
        data = report_data(store, split, kernels, model, heatmaps_per_kernel, jobs=jobs, progress=progress,
                           started=started)
    except BaseException:
        for directory in created:  # innermost first; rmdir refuses a folder that is not empty
            try:
                directory.rmdir()
            except OSError:
                break
        raise
    return write_report(data, out, db, progress=progress, started=started)
