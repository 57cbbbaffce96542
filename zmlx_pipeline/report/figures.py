"""The report's figures: plain data in, a PNG out (matplotlib's Agg canvas, no pyplot state).

matplotlib is imported only when a figure is drawn, so the figures test alone and the rest of the
package never loads it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from zmlx_pipeline.models.metrics import HIT_WITHIN
from zmlx_pipeline.models.report import CURVE_KS, TIME_MODEL, HeatmapData, ReportError

_DPI = 110
_MAX_ANNOTATED_CELLS = 144
_SPLIT_TITLES = {"shapes": "held-out shapes on seen devices", "devices": "leave one device out"}

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
    """The figure rendered, then written beside `path` and renamed over it: a link of that name is replaced, never
    written through. A character the font lacks (a kernel named in CJK) is drawn as a box without a warning per
    glyph: the command's warnings are its own one-line ones."""
    import io
    import warnings

    from zmlx_pipeline.core.files import current_umask, write_bytes_atomic

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        fig.savefig(buffer, format="png", dpi=_DPI, facecolor="white")
    write_bytes_atomic(Path(path), buffer.getvalue(), mode=0o666 & ~current_umask())
    return Path(path)


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
