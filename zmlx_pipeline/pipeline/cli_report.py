"""`zmlx-pipeline report`: the HTML page of figures and scores (zmlx_pipeline/report/ writes it from models/report.py's data)."""

from __future__ import annotations

from pathlib import Path

import click

from zmlx_pipeline.core.files import printable
from zmlx_pipeline.pipeline.cli_common import (
    GivenPath,
    OneValueCommand,
    WholeRange,
    db_option,
    emit,
    final_step,
    open_store,
    output_options,
    progress_line,
    split_names,
    store_path,
)
from zmlx_pipeline.pipeline.cli_models import EVALUATION_SPLITS


@click.command(cls=OneValueCommand)
@db_option
@click.option("--out", "out", required=True, type=GivenPath(file_okay=False, path_type=Path),
              help="Directory for index.html, the PNG figures and scores.json: a new one (created), an empty one, or "
                   "one an earlier report wrote; one holding other files is refused.")
@click.option("--split", type=click.Choice(EVALUATION_SPLITS), default="shapes", show_default=True,
              help="Held-out shapes on seen devices, or leave one device out (devices, alias lodo).")
@click.option("--kernel", "-k", "kernel_names", multiple=True,
              help="Only these kernels (default: every kernel in the store).")
@click.option("--model", default=None, help="Model variant to report (default: the default model).")
@click.option("--heatmaps", default=2, show_default=True, type=WholeRange(0, 10),
              help="Config-space heatmaps per kernel, one per held-out case: the model's worst, its median, then "
                   "cases spread down to its best. A kernel with fewer held-out cases (of more than one config) gets "
                   "fewer; the output says so.")
@click.option("--refit", is_flag=True,
              help="Fit every fold, even where train recorded the held-out cases of the registered model and the "
                   "store's rows are unchanged (the numbers are the same).")
@output_options
def report(db, out, split, kernel_names, model, heatmaps, refit, as_json) -> None:
    """Write an HTML report: regret curves, predicted vs measured time, config-space heatmaps, scores."""
    from zmlx_pipeline.report.build import build_report
    from zmlx_pipeline.models.variants import DEFAULT_MODEL

    path = store_path(db)
    store = open_store(path, read_only=True)
    with final_step():  # once the report is written, a stop no longer hides it
        result = build_report(store, out, split=split, kernels=split_names(kernel_names) or None,
                              model=DEFAULT_MODEL if model is None else model, heatmaps_per_kernel=heatmaps,
                              db=str(path), progress=progress_line, refit=refit)
    if as_json:
        emit(result, True)
        return
    click.echo(f"wrote {printable(str(result['index']))}: {len(result['figures'])} figures, {result['cases']} held-out cases "
               f"of {len(result['kernels'])} kernel(s), split {result['split']}; open it in a browser")
    maps = result["heatmaps"]
    if maps["fewer"]:
        click.echo(printable(f"heatmaps: fewer than the {maps['asked_per_kernel']} asked per kernel: " + "; ".join(
            f"{kernel} {maps['drawn'].get(kernel, 0)} ({why})" for kernel, why in maps["fewer"].items())))


def register(group: click.Group) -> None:
    """Add report to the CLI group."""
    group.add_command(report)
