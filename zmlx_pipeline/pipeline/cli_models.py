"""The learning commands: `train` (fit, save, register a model per kernel), `evaluate` (regret@k of
the model and the baselines on held-out shapes or devices) and `models` (the registry)."""

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
    open_store,
    open_store_to_record,
    output_options,
    split_names,
)
from zmlx_pipeline.runtime.contents import MAX_PRUNE_K  # the runtime's cap on k: a larger k ranks nothing more


#: --split's values: models/folds.py's SPLITS and SPLIT_ALIASES (named here: that module loads polars, and --help
#: should not wait for it; tests/pipeline/test_cli_models.py checks they agree)
EVALUATION_SPLITS = ("shapes", "devices", "lodo")


def _fmt(value) -> str | None:
    return None if value is None else f"{value:.4f}"


@click.command(cls=OneValueCommand)
@db_option
@click.option("--split", required=True, type=click.Choice(EVALUATION_SPLITS),
              help="shapes: held-out shapes of measured devices; devices: leave one device out (alias lodo).")
@click.option("--kernel", "-k", "kernel_names", multiple=True, help="Only these kernels (repeat or comma-separate).")
@click.option("--model", "model_names", multiple=True,
              help="Model variant(s) to score (default: the default model, reported as method \"model\").")
@click.option("--k", "ks", multiple=True, type=WholeRange(1, MAX_PRUNE_K),
              help=f"k of regret@k, 1 to {MAX_PRUNE_K} (default: 1, 3, 5).")
@click.option("--jobs", "-j", type=WholeRange(1, 64), default=None,
              help="Worker processes for the folds (default: one per CPU; 1: none). Results do not depend on it.")
@click.option("--protocol", type=click.Choice(["nested", "fixed"]), default="nested", show_default=True,
              help="nested: every choice of the model (weights, hedging, fallback) is made inside each fold's "
                   "training rows, never seeing the test device or shapes; fixed: the choices of one fit on "
                   "every row are kept for every fold (faster, optimistic).")
@click.option("--refit", is_flag=True,
              help="Fit every fold, even where train recorded these held-out cases for the registered model "
                   "and the store's rows are unchanged (the numbers are the same).")
@output_options
def evaluate(db, split, kernel_names, model_names, ks, jobs, protocol, refit, as_json) -> None:
    """Regret@k of the model and of every baseline on data the model did not train on."""
    from zmlx_pipeline.models.variants import DEFAULT_MODEL
    from zmlx_pipeline.models.evaluate import evaluate as run_evaluation

    models = split_names(model_names) or [DEFAULT_MODEL]
    # writable: folds fitted for the registered model are recorded with it (read the next time); a store another
    # process writes, or one this user cannot write, is evaluated all the same and nothing recorded
    store = open_store_to_record(db)
    ks = tuple(sorted(set(ks))) or (1, 3, 5)
    result = run_evaluation(store, split, kernels=split_names(kernel_names) or None, ks=ks, models=models,
                            label_model=len(models) == 1, jobs=jobs, protocol=protocol, refit=refit)
    scored = {r["kernel"] for r in result["results"]}
    if scored and set(_kernels_without_cases(result["results"])) == scored:  # nothing to show: said as report says it
        need, other = (("a kernel measured at two or more shapes on one device", "devices") if split == "shapes"
                       else ("two devices that measured the same kernel", "shapes"))
        raise click.ClickException(f"no held-out cases under --split {split} in {store.path}: it needs {need} (try "
                                   f"--split {other})")
    if as_json:
        emit({"split": result["split"], "models": result["models"], "protocol": result["protocol"],
              "floors": result["floors"], "results": result["results"], "noise": result["noise"],
              "reused": result["reused"]}, True)
        return
    table: dict[tuple, dict] = {}
    devices = {}
    for r in result["results"]:
        devices.setdefault(r["kernel"], set()).add(r["device"])
    for r in result["results"]:
        if r["device"] is not None and len(devices[r["kernel"]]) <= 2:
            continue  # one device: its rows repeat the pooled ones
        key = (r["kernel"], r["device"] or "", r["method"])
        method = f"{r['method']} (floor)" if r["method"] in result["floors"] else r["method"]
        row = table.setdefault(key, {"kernel": r["kernel"], "device": r["device"] or "(all)", "method": method})
        row[f"regret@{r['k']}"] = _fmt(r["regret_geomean"])
        row[f"p95@{r['k']}"] = _fmt(r["regret_p95"])
        row[f"hit@{r['k']}"] = None if r["hit_2pct"] is None else f"{r['hit_2pct']:.2f}"
        row[f"tied@{r['k']}"] = _fmt(r["regret_tied_geomean"])
        row["cases"] = r["cases"]
    columns = (["kernel", "device", "method"] + [f"{m}@{k}" for k in ks for m in ("regret", "p95", "hit", "tied")]
               + ["cases"])
    emit(list(table.values()), False, columns)
    click.echo(f"\nsplit {result['split']}: regret@k = time of the best of the top k / measured best, geometric mean "
               "(and p95) over held-out cases; hit = share within 2% of the best; (all) = every device pooled; "
               "per-device rows with --json or where a kernel has several devices")
    click.echo(f"protocol {result['protocol']}: " + ("every choice of the model made inside each fold's training rows"
               if result["protocol"] == "nested" else "the choices of one fit on every row, kept for every fold "
               "(they saw the test rows: optimistic)"))
    for method, what in result["floors"].items():
        click.echo(f"{method} (floor) = {what}")
    click.echo("tied = regret@k counting a pick inside the repeat noise of the case's best as a tie: "
               "geomean of max(1, regret / (1 + band)); " + _band_line(result["noise"]))
    for name in _kernels_without_cases(result["results"]):
        click.echo(f"{name}: no held-out cases: " + ("measured on one device; left-out devices need two or more"
                   if split != "shapes" else "no device holds shapes enough to leave any out"))
    if result["reused"]:
        click.echo(f"read from the held-out cases train recorded (registered model, unchanged rows; --refit fits "
                   f"again): {', '.join(f'{k} ({m})' for k, m in sorted(result['reused'].items()))}")


def _kernels_without_cases(results: list[dict]) -> list[str]:
    """The kernels every result row of which scored no case (nothing could be held out), sorted."""
    cases: dict[str, int] = {}
    for r in results:
        cases[r["kernel"]] = cases.get(r["kernel"], 0) + int(r["cases"] or 0)
    return sorted(k for k, n in cases.items() if n == 0)


def _band_line(noise: dict) -> str:
    """Where the tie band came from, in one line (says FALLBACK when the store has no repeats)."""
    if noise["fallback"]:
        return (f"tie band: FALLBACK {100 * noise['fallback_band']:g}% for every case, the store has no repeated "
                "timings (run `zmlx-pipeline repeat` on the GPU, or ingest shards that carry repeats)")
    pooled = ", ".join(f"{b['bucket']} {100 * b['band']:.1f}%" for b in noise["bands"] if b["device"] is None)
    return (f"tie band = median max/min - 1 of {noise['pairs']} repeat pairs, per device and time bucket of the "
            f"case's best (pooled over devices under {noise['min_pairs']} pairs); pooled: {pooled}")


@click.command(cls=OneValueCommand)
@db_option
@click.option("--kernel", "-k", "kernel_names", multiple=True, help="Only these kernels (default: every kernel).")
@click.option("--device", "device_ids", multiple=True, help="Train only on these devices' measurements.")
@click.option("--model", "model_name", default=None, help="Model variant (default: the default model).")
@click.option("--models-dir", type=GivenPath(file_okay=False, path_type=Path), default=None,
              help="Where model files go (default: models/ next to the store).")
@click.option("--jobs", "-j", type=WholeRange(1, 64), default=None,
              help="Worker processes for the fits and held-out folds (default: one per CPU; 1: none).")
@output_options
def train(db, kernel_names, device_ids, model_name, models_dir, jobs, as_json) -> None:
    """Fit a model per kernel on the store's data, save it and register it with its held-out scores."""
    from zmlx_pipeline.models.variants import DEFAULT_MODEL
    from zmlx_pipeline.models.train import train_models

    store = open_store(db, must_exist=True)  # train_models checks --models-dir before any fit (check_models_dir)
    rows = train_models(store, kernels=split_names(kernel_names) or None, devices=split_names(device_ids) or None,
                        model=DEFAULT_MODEL if model_name is None else model_name,
                        models_dir=models_dir, jobs=jobs,
                        on_kernel=None if as_json else lambda k: click.echo(f"training {k} ...", err=True))
    if as_json:
        emit(rows, True)
        return
    emit([_registry_line(r) for r in rows], False, _REGISTRY_COLUMNS)
    if rows:
        click.echo(f"\n{len(rows)} model(s) registered in {printable(str(store.path))}; prune_k = configs the runtime times "
                   "(held-out top k within 2% of the best in 95% of cases); regret@1 on held-out data")


_REGISTRY_COLUMNS = ["kernel", "model_id", "model", "rows", "devices", "prune_k", "split", "regret@1", "p95@1",
                     "seconds", "path"]


def _registry_line(row: dict) -> dict:
    params, scores = row.get("params") or {}, row.get("scores") or {}
    return {
        "kernel": row["kernel_filter"], "model_id": row["model_id"], "model": params.get("model"),
        "rows": params.get("rows"), "devices": len(params.get("devices") or ()), "prune_k": scores.get("prune_k"),
        "split": scores.get("prune_split"), "regret@1": _fmt(scores.get("regret1_geomean")),
        "p95@1": _fmt(scores.get("regret1_p95")), "seconds": scores.get("train_s"), "path": row.get("path"),
    }


def _one_name(value: str | None) -> str | None:
    """A blank --kernel is a usage error, as the other commands' is: leaving it out asks for every kernel."""
    if value is not None and not value.strip():
        raise click.BadParameter(f"{value!r} names nothing: give a kernel, or leave --kernel out for all")
    return value


@click.command("models", cls=OneValueCommand)
@db_option
@click.option("--kernel", "-k", "kernel_name", default=None, callback=lambda ctx, param, value: _one_name(value),
              help="Only this kernel's models.")
@click.option("--verify", is_flag=True, help="Also load every model file safely (checksum and trusted types).")
@output_options
def models_cmd(db, kernel_name, verify, as_json) -> None:
    """The model registry: every trained model, newest first, with its data fingerprint and scores."""
    from zmlx_pipeline.models.train import BadModelFiles, list_models, verify_models

    store = open_store(db, read_only=True)
    refused = None
    try:
        rows = (verify_models if verify else list_models)(store, kernel=kernel_name)
    except BadModelFiles as err:  # every file was checked: show them all, then fail
        rows, refused = err.rows, err
    if as_json:
        emit(rows, True)
    else:
        columns = _REGISTRY_COLUMNS + (["verified"] if verify else [])
        emit([{**_registry_line(r), **({"verified": r["verified"]} if verify else {})} for r in rows], False, columns)
    if refused is not None:
        raise click.ClickException(str(refused))


def register(group: click.Group) -> None:
    """Add train, evaluate and models to the `zmlx-pipeline` group."""
    for command in (train, evaluate, models_cmd):
        group.add_command(command)
