"""`zmlx-pipeline report`: the HTML page of figures and scores (zmlx_pipeline/report/ writes it from models/report.py's data)."""

from __future__ import annotations

from pathlib import Path

import click

from zmlx_pipeline.pipeline.output import emit, output_options, progress_line


def _names(values: tuple[str, ...]) -> list[str]:
    """Repeated options and comma-separated lists alike."""
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


@click.command()
@click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="DuckDB store (default: $ZMLX_PIPELINE_DB or ~/.local/share/zmlx-pipeline/store.duckdb).")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for index.html, the PNG figures and scores.json (created if missing).")
@click.option("--split", type=click.Choice(["shapes", "devices"]), default="shapes", show_default=True,
              help="Held-out shapes on seen devices, or leave one device out.")
@click.option("--kernel", "-k", "kernel_names", multiple=True,
              help="Only these kernels (default: every kernel in the store).")
@click.option("--model", default=None, help="Model variant to report (default: the default model).")
@click.option("--heatmaps", default=2, show_default=True, type=click.IntRange(0, 10),
              help="Config-space heatmaps per kernel.")
@click.option("--refit", is_flag=True,
              help="Fit every fold, even where train recorded the held-out cases of the registered model and the "
                   "store's rows are unchanged (the numbers are the same).")
@output_options
def report(db, out, split, kernel_names, model, heatmaps, refit, as_json) -> None:
    """Write an HTML report: regret curves, predicted vs measured time, config-space heatmaps, scores."""
    from zmlx_pipeline.data.store import Store, StoreError, default_db_path
    from zmlx_pipeline.models.estimators import DEFAULT_MODEL, ModelError
    from zmlx_pipeline.models.evaluate import EvaluationError
    from zmlx_pipeline.models.features import FeatureError
    from zmlx_pipeline.models.report import ReportError
    from zmlx_pipeline.report.build import build_report

    path = db or default_db_path()
    try:
        store = Store(path, read_only=True)
        click.get_current_context().call_on_close(store.close)
        result = build_report(store, out, split=split, kernels=_names(kernel_names) or None,
                              model=model or DEFAULT_MODEL, heatmaps_per_kernel=heatmaps, db=str(path),
                              progress=progress_line, refit=refit)
    except (StoreError, ReportError, FeatureError, EvaluationError, ModelError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        emit(result, True)
        return
    click.echo(f"wrote {result['index']}: {len(result['figures'])} figures, {result['cases']} held-out cases "
               f"of {len(result['kernels'])} kernel(s), split {result['split']}; open it in a browser")
