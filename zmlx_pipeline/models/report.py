"""The report's data: held-out scores, predictions and heatmap grids of a store's kernels, as plain data.

All on data the model did not train on (the folds of models/folds.py):
- regret curves: regret@k geometric mean for k = 1..10, the model against every baseline;
- predicted vs measured time: the `gbr` log-time regressor's predictions (the default ranker
  scores configs relative to each other, so it has no absolute time to plot);
- heatmaps: for a few cases, time over the two config parameters that explain most of the
  within-case variance of log time (each cell: the fastest config with those two values),
  with the model's pick and the measured best marked.
The score table holds the same numbers as `evaluate`. Each fold is fitted once, in worker processes,
for the table and the figures alike (score_fold), with a progress line per fold and an estimate of
the time left. The figures and the page are drawn by zmlx_pipeline/report/.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np
import polars as pl

from zmlx_pipeline import __version__
from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.models import evaluate as ev
from zmlx_pipeline.models.baselines import baseline_names, baseline_scores
from zmlx_pipeline.models.variants import DEFAULT_MODEL, make_ranker
from zmlx_pipeline.models.features import CASE, KernelFeatures
from zmlx_pipeline.models.folds import SPLIT_ALIASES, EvaluationError, canonical_split, fold_plan, fold_rows, folds
from zmlx_pipeline.models.heldout import PROTOCOL, recorded_models
from zmlx_pipeline.models.metrics import case_regrets, noise_bands, regret_rows, tied_regrets
from zmlx_pipeline.models.pool import KernelPool, check_jobs, fit_threads
from zmlx_pipeline.progress import Say, Steps

SPLIT_NAMES = ("shapes", "devices")
CURVE_KS = tuple(range(1, 11))
TABLE_KS = (1, 3, 5)
TIME_MODEL = "gbr"          # the variant that regresses log time (the others rank)
HEATMAPS_PER_KERNEL = 2


class ReportError(ZmlxPipelineError, ValueError):
    "The report cannot be built as asked"


# ------------------------------------------------------------------------------------------
# data


def evaluation_split(split: str) -> str:
    """The split's name (evaluate's alias `lodo` is `devices`); ReportError for an unknown one."""
    try:
        return canonical_split(split)
    except EvaluationError:
        raise ReportError(f"unknown split {split!r}; expected one of {', '.join(SPLIT_NAMES)} "
                          f"(or {', '.join(SPLIT_ALIASES)})") from None


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
             for i in fold_plan(features, split)]
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
    name, train_filter, test_filter = folds(frame, split)[index]
    train, test = fold_rows(frame, split, train_filter, test_filter)
    seen = test["device_id"].is_in(train["device_id"].unique().to_list())
    with fit_threads():
        ranker = make_ranker(features, model)
        if hasattr(ranker, "only"):
            ranker.only = "seen" if seen.all() else "unseen" if not seen.any() else None
        scores = {model: np.asarray(ranker.fit(train).score(test), dtype=float)}
        predicted = _predicted_us(features, train, test, time_model)
        if baselines:
            scores.update({k: v.to_numpy() for k, v in baseline_scores(features, train, test).items()})
    regrets = [case_regrets(test, s, ks).with_columns(pl.lit(method).alias("method"), pl.lit(name).alias("fold"))
               for method, s in scores.items()]
    held = test.select(_held_columns(features)).with_columns(
        pl.Series("score", scores[model]), pl.Series("predicted_us", predicted), pl.lit(name).alias("fold"))
    return regrets, held, time.perf_counter() - start


def time_fold(features: KernelFeatures, index: int, split: str,
              time_model: str = TIME_MODEL) -> tuple[list[pl.DataFrame], pl.DataFrame, float]:
    """score_fold's held-out rows with the time model's predicted time only, for a kernel whose scores and
    picks come from train's records: no regret frames, no `score` column, and the seconds it took."""
    start = time.perf_counter()
    frame = features.frame
    name, train_filter, test_filter = folds(frame, split)[index]
    train, test = fold_rows(frame, split, train_filter, test_filter)
    with fit_threads():
        predicted = _predicted_us(features, train, test, time_model)
    held = test.select(_held_columns(features)).with_columns(pl.Series("predicted_us", predicted),
                                                             pl.lit(name).alias("fold"))
    return [], held, time.perf_counter() - start


def _predicted_us(features: KernelFeatures, train: pl.DataFrame, test: pl.DataFrame, time_model: str) -> np.ndarray:
    """The time model fitted on a fold's training rows: its predicted time of each test row (us)."""
    timer = make_ranker(features, time_model)
    if getattr(timer, "target", None) != "log_time":
        raise ReportError(f"model {time_model!r} does not predict times")
    return np.exp(np.asarray(timer.fit(train).score(test), dtype=float))


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


def _heatmap_cases(count: int, n: int) -> dict[int, str]:
    """Up to n of `count` cases ranked worst first, each with why it is shown: the worst, the median, then cases
    spread evenly over the ranking down to the model's best."""
    if count == 0:
        return {}
    chosen = {0: "the model's worst held-out case"}
    if count > 1:
        chosen[count // 2] = "a typical (median) held-out case"
    for j in range(1, n):  # once n passes count, every case is met
        if len(chosen) >= n:
            break
        index = round(j * (count - 1) / (n - 1))
        chosen.setdefault(index, "the model's best held-out case" if index == count - 1 else
                          f"held-out case {index + 1} of {count} by the model's regret, worst first")
    return dict(list(chosen.items())[:n])


def kernel_heatmaps(features: KernelFeatures, held: pl.DataFrame, n: int = HEATMAPS_PER_KERNEL,
                    picks: pl.DataFrame | None = None) -> tuple[list[HeatmapData], str]:
    """Heatmaps of up to n held-out cases of one kernel (_heatmap_cases), and why fewer than n ("" when n).
    `picks`: per case the model's pick_key, r1 and configs (None: from held's `score`, _case_picks)."""
    if n <= 0:
        return [], ""
    if held.is_empty():
        return [], "no held-out cases"
    ranked = param_importance(features.frame, features.params)
    if not ranked:
        return [], "no config parameter whose values change its time"
    x_param = ranked[0][0]
    y_param = ranked[1][0] if len(ranked) > 1 else None
    picks = (_case_picks(held) if picks is None else picks).filter(pl.col("configs") > 1)
    picks = picks.sort(["r1", *CASE], descending=[True, False, False, False, False])
    chosen = _heatmap_cases(picks.height, n)
    why_fewer = "" if len(chosen) == n else \
        f"{picks.height} held-out case{'' if picks.height == 1 else 's'} of more than one config, a heatmap each"
    shares = ", ".join(f"{p} {s:.0%}" for p, s in ranked[:2])
    out = []
    for index, why in chosen.items():
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
    return out, why_fewer


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
    reused: dict[str, str] = field(default_factory=dict)  # kernel -> model id whose recorded cases were read
    heatmaps_asked: int = HEATMAPS_PER_KERNEL               # per kernel
    heatmaps_fewer: dict[str, str] = field(default_factory=dict)  # kernel -> why it has fewer than asked


def report_data(store, split: str = "shapes", kernels=None, model: str = DEFAULT_MODEL,
                heatmaps_per_kernel: int = HEATMAPS_PER_KERNEL, jobs: int | None = None,
                progress: Say | None = None, started: float | None = None, refit: bool = False,
                pool: KernelPool | None = None) -> ReportData:
    """Scores, held-out predictions and heatmaps of the store's kernels under a split.

    Each fold is fitted once (score_fold) for both the score table and the figures, in `jobs` worker
    processes (None: one per CPU); the table's rows are evaluate()'s, number for number. A kernel whose
    held-out cases train recorded for its registered `model` on unchanged rows (models/heldout.py) takes
    its scores and the model's picks from them, and its folds fit only the time model (time_fold);
    `refit` fits every fold anyway. `progress` gets a line per scored fold with the time elapsed and an
    estimate of the time left. `pool`: an entered KernelPool to use (report_pool), which the caller keeps for
    the figures; None: one made here for the folds.
    """
    from zmlx_pipeline.models.variants import MODEL_VARIANTS

    split_eval = evaluation_split(split)
    public_split = split_eval
    if model not in MODEL_VARIANTS:
        raise ReportError(f"unknown model {model!r}; expected one of {', '.join(MODEL_VARIANTS)}")
    jobs = check_jobs(jobs)
    may = {} if refit else recorded_models(store, kernels, split_eval, PROTOCOL, model)
    # the workers start while the features are read
    with (report_pool(store, kernels, jobs) if pool is None else contextlib.nullcontext(pool)) as pool:
        try:
            features = ev.kernel_features_of(store, kernels)
        except EvaluationError as exc:
            raise ReportError(str(exc)) from None
        plans = {name: fold_plan(f, split_eval) for name, f in features.items()}
        if not any(plans.values()):
            need = "two devices that measured the same kernel" if public_split == "devices" \
                else "a kernel measured at two or more shapes on one device"
            other = "shapes" if public_split == "devices" else "devices"
            other_has = any(fold_plan(f, evaluation_split(other)) for f in features.values())
            hint = f"try --split {other}" if other_has else "neither split has any: measure more shapes or devices"
            raise ReportError(f"no held-out cases under --split {public_split}: it needs {need} ({hint})")
        recorded = ev.recorded_for(store, features, may, split_eval, PROTOCOL, model, CURVE_KS)
        pool.attach(features)
        done = _score_folds(pool, features, plans, split_eval, model, progress, started, recorded=set(recorded))
    noise = noise_bands(store)
    rows: list[dict] = []
    points: dict[str, dict[str, list]] = {}
    heatmaps: dict[str, list[HeatmapData]] = {}
    fewer: dict[str, str] = {}
    cases = 0
    steps = Steps(progress, "report", len(features), parts=len(features), started=started)
    for name, f in features.items():
        picks = None
        if name in recorded:  # every method's per-case rows, as the folds would give them
            cases_of = recorded[name][1]
            regrets = [cases_of.select(ev.gather_folds([], CURVE_KS).columns)] if cases_of.height else []
            picks = cases_of.filter(pl.col("method") == model).select(*CASE, "pick_key", "r1", "configs")
        else:
            regrets = [part for i in plans[name] for part in done[(name, i)][0]]
        oracle = split_eval == "devices" and bool(regrets)  # the after-the-fact floor, as evaluate reports it
        if oracle:
            regrets.append(ev.oracle_device(f, CURVE_KS))
        per_case = tied_regrets(pl.concat(regrets) if regrets else ev.gather_folds([], CURVE_KS), f.frame, noise,
                                   CURVE_KS)
        rows += regret_rows(per_case, name, CURVE_KS, [model, *baseline_names(f), *([ev.ORACLE] if oracle else [])])
        held = pl.concat([done[(name, i)][1] for i in plans[name]]) if plans[name] else _empty_held(f)
        if held.is_empty():
            if heatmaps_per_kernel > 0:
                fewer[name] = "no held-out cases"
            continue
        cases += held.select(CASE).unique().height
        points[name] = {"measured": held["median_us"].to_list(), "predicted": held["predicted_us"].to_list(),
                        "device": held["device_id"].to_list()}
        heatmaps[name], why_fewer = kernel_heatmaps(f, held, heatmaps_per_kernel, picks=picks)
        if why_fewer:
            fewer[name] = why_fewer
        steps.done(f"{name}: scores and heatmap data")
    devices = sorted({d for f in features.values() for d in f.frame["device_id"].unique().to_list()})
    return ReportData(split=public_split, model=model, kernels=list(features), rows=rows, points=points,
                      heatmaps=heatmaps, devices=devices, cases=cases,
                      reused={k: recorded[k][0] for k in features if k in recorded},
                      heatmaps_asked=heatmaps_per_kernel, heatmaps_fewer=fewer)


def report_pool(store, kernels=None, jobs: int | None = None) -> KernelPool:
    """The worker processes of a report (enter it): workers when the store's rows of those kernels are many."""
    return KernelPool(None, check_jobs(jobs), rows=ev.ok_rows(store, kernels))


def _score_folds(pool, features: Mapping[str, KernelFeatures], plans: Mapping[str, list[int]], split: str,
                 model: str, progress: Say | None, started: float | None = None,
                 recorded: set[str] = frozenset()) -> dict[tuple[str, int], tuple]:
    """score_fold of every planned fold (time_fold for the `recorded` kernels), the largest kernels first, in
    the pool's workers (or here one after the other); a progress line as each fold finishes, weighted by its
    kernel's rows per fold."""
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

    def submit(kernel: str, index: int) -> Future:
        if kernel in recorded:
            return pool.submit(kernel, time_fold, index, split)
        return pool.submit(kernel, score_fold, index, split, CURVE_KS, model)

    if not pool.parallel:
        for task in tasks:
            finished(task, submit(*task))
        return out
    pending = {submit(k, i): (k, i) for k, i in tasks}
    while pending:  # short waits: Ctrl-C and SIGTERM reach this thread between them
        ready, _ = wait(list(pending), timeout=0.25, return_when=FIRST_COMPLETED)
        for future in ready:
            finished(pending.pop(future), future)
    return out


def table_rows(rows: Sequence[dict], ks: Sequence[int] = TABLE_KS) -> list[dict]:
    """The score table's rows: evaluate's flat rows at the table's k."""
    return [r for r in rows if r["k"] in ks]
