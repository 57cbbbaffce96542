"""The `zmlx-pipeline` command: each command parses, calls one library function, and formats.

Why one long module: it holds the store and collection commands, each a few lines of options and formatting;
the model, publish and report commands live in their own modules (cli_models, cli_publish, cli_report).
"""

from __future__ import annotations

import json
import os
import re
import sys
import warnings
from pathlib import Path

import click

from zmlx_pipeline import __version__
from zmlx_pipeline.core import commits
from zmlx_pipeline.core.errors import shown
from zmlx_pipeline.pipeline.stops import stops_wait_once_final, terminate_as_interrupt
from zmlx_pipeline.data.records import DTYPES
from zmlx_pipeline.pipeline import cli_models, cli_publish, cli_report
from zmlx_pipeline.core.files import printable
from zmlx_pipeline.pipeline.cli_common import (
    CommandGroup,
    FiniteRange,
    GivenPath,
    OneValueGroup,
    WholeRange,
    check_filters,
    device_filter_option,
    db_option,
    emit,
    existing_store,
    final_step,
    one_line,
    open_store,
    output_options,
    progress_line,
    split_names,
    store_path,
    store_to_fill,
)


#: a GPU index or count of --gpus: digits 0-9 only
_DIGITS = re.compile(r"[0-9]+", re.ASCII)


def _budget(budget: str | None) -> float | None:
    """--budget as seconds (None: no budget); a usage error names the accepted forms."""
    from zmlx_pipeline.pipeline.collect import parse_duration

    if budget is not None and not budget.strip():
        raise click.BadParameter("empty; give a duration such as 90s, 10m or 1h, or leave the option out",
                                 param_hint="--budget")
    try:
        return parse_duration(budget) if budget else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--budget") from None


def _kernels(kernel_names: tuple[str, ...]):
    """The chosen kernel specs and, per kernel name, how a worker process finds it again (name or module:attr)."""
    from zmlx_pipeline.kernels.registry import resolve

    names = split_names(kernel_names)
    specs = resolve(names)
    return specs, {s.name: (n if ":" in n else s.name) for s, n in zip(specs, names or [s.name for s in specs])}


def _check_preset(specs, preset: str, kernel_names: tuple[str, ...]) -> None:
    """A usage error (exit 2) for a --preset one of the chosen kernels lacks, naming the presets there are: the
    presets of every chosen kernel, or, where they differ, of the first kernel that lacks it."""
    lacking = [s for s in specs if preset not in s.shape_grid.presets]
    if not lacking:
        return
    first = lacking[0]
    if all(s.shape_grid.presets == first.shape_grid.presets for s in specs) and not kernel_names:
        where = "the kernels have"
    else:
        where = f"kernel {first.name} has"
    raise click.BadParameter(f"no shape preset {preset!r}; {where} {', '.join(first.shape_grid.presets)}",
                             param_hint="--preset")


@click.group(cls=CommandGroup)
@click.version_option(__version__, prog_name="zmlx-pipeline")
def cli() -> None:
    """Measure custom MLX kernels, learn their best launch configs, publish them."""


_DEVICE_COLUMNS = ["current", "registered", "id", "name", "gpu_cores", "memory_bandwidth_gbps", "l2_bytes", "clock_mhz",
                   "threadgroup_memory_bytes", "default_threadgroup"]


@cli.group(cls=OneValueGroup, invoke_without_command=True)
@click.option("--vendor", type=click.Choice(["apple", "nvidia", "amd"]), default=None, help="Only this vendor's GPUs.")
@db_option
@output_options
@click.pass_context
def devices(ctx: click.Context, vendor: str | None, db: Path | None, as_json: bool) -> None:
    """List the device catalog and the devices registered in the store, marking the device this machine runs on.

    `devices add RECORD` registers a device the catalog lacks.
    """
    if ctx.invoked_subcommand is not None:
        if vendor is not None:
            raise click.UsageError("--vendor only narrows the listing; leave it out of `devices add`")
        return
    from zmlx_pipeline.data.store import StoreLocked
    from zmlx_pipeline.pipeline.listing import device_listing

    registered = ()
    try:
        registered = open_store(db, read_only=True).registered_devices() if store_path(db).exists() else ()
    except StoreLocked as exc:
        if db is not None:
            raise
        click.echo(f"Warning: the devices registered in the store are not listed: {one_line(exc)}", err=True)
    rows, current = device_listing(vendor, registered)
    if as_json:
        emit({"current": current, "devices": rows}, True)
        return
    emit([{**r, "current": "*" if r["current"] else "", "registered": "*" if r["registered"] else ""} for r in rows],
         False, _DEVICE_COLUMNS)
    if registered:
        click.echo(f"\n{len(registered)} registered in {store_path(db)} (registered: *)")
    state = "in the catalog" if current.get("known") else "NOT in the catalog (recorded as reported, flagged)"
    click.echo(f"\ncurrent device: {current.get('reported_name')} [{current.get('backend')}] -> "
               f"{current.get('device_id')}, {state}")


@devices.command("add")
@click.argument("record", type=GivenPath(exists=True, dir_okay=False, path_type=Path))
@click.option("--replace", is_flag=True,
              help="Give a device registered under RECORD's id these figures instead (its measurements are kept).")
@db_option
@output_options
@click.pass_context
def devices_add(ctx: click.Context, record: Path, replace: bool, db: Path | None, as_json: bool) -> None:
    """Register a device the catalog lacks from RECORD, a JSON (or .toml) file of a catalog row's fields, each figure
    cited under `sources` (a catalog source's id, or {title, url}); import and publish then take it by its id or name.

    The record is checked as the catalog's rows are (and against every catalog chip's and registered device's id and
    names); a refused one stores nothing. A registered device keeps its record unless --replace is given.
    """
    from zmlx_pipeline.data.registered import register_device

    parent = ctx.parent.params if ctx.parent is not None else {}
    db = db if db is not None else parent.get("db")
    with store_to_fill(db) as store, final_step():  # a refusal leaves no new store behind
        out = register_device(store, record, replace)
    if as_json or parent.get("as_json"):
        emit(out, True)
        return
    device = out["device"]
    emit([device], False, ["id", "name", "vendor", "architecture", "gpu_cores", "memory_bandwidth_gbps",
                           "fp32_tflops", "aliases"])
    if out["replaced"]:
        click.echo(f"\n{device['id']} now has these figures in {out['store']}, its measurements kept: models trained "
                   "before read its old ones, so train again, then publish")
        return
    said = "registered" if out["added"] else "is registered already, unchanged,"
    click.echo(f"\n{device['id']} {said} in {out['store']}: import its files by the GPU name they report or with "
               f"--device {device['id']}")


@cli.command()
@db_option
@click.option("--kernels", "-k", "kernel_names", multiple=True,
              help="Kernel names or module:attr paths (default: all registered, and those imported into the store).")
@output_options
def kernels(db, kernel_names: tuple[str, ...], as_json: bool) -> None:
    """List the kernels: backends, parameters, constraints, shape grids; and what the store holds of imported ones."""
    from zmlx_pipeline.pipeline.listing import kernel_listing

    store = existing_store(db) if db is not None else None  # a --db given is read, so a typo in it is said
    rows = kernel_listing(split_names(kernel_names), lambda: store if db is not None else existing_store(None))
    if as_json:
        emit(rows, True)
        return
    stored = [r for r in rows if "store" in r]  # a kernel only the store describes (an imported one)
    registered = [r for r in rows if "store" not in r]
    if registered:
        emit([{
            "kernel": r["name"], "class": r["class"], "backends": r["backends"],
            "parameters": " ".join(f"{k}={'/'.join(map(str, v))}" for k, v in r["parameters"].items()),
            "configs": r["configs"], "shapes": " ".join(f"{p}:{len(s)}" for p, s in r["shape_grid"].items()),
        } for r in registered], False)
    if stored:
        if registered:
            click.echo()
        emit([{
            "kernel": r["name"], "source": r["source"], "parameters": _values_text(r["parameters"]),
            "configs": r["configs"], "shapes": _shapes_text(r),
            "devices": " ".join(f"{d['device']}:{d['rows']}" for d in r["devices"]),
            "files": " ".join(sorted({f"{i['file']} ({i['format']})" for i in r["imports"]})) or None,
            "measured": _measured_text(r["imports"]),
        } for r in stored], False, title=f"in the store {stored[0]['store']}:")


def _values_text(values: dict) -> str:
    """Parameters (or dims) and their values as a table cell: `TG=32/64 VEC=1/2`."""
    return " ".join(f"{k}={'/'.join(v if isinstance(v, str) else json.dumps(v) for v in vs)}"
                    for k, vs in values.items())


def _measured_text(imports: list[dict]) -> str | None:
    """When a stored kernel's imported rows were timed: the days its files date them, and "at import" for files that
    hold no date (their rows carry the time they were imported)."""
    dated = [i for i in imports if i["measured_at_from"] != "import"]
    moments = sorted(i[k] for i in dated for k in ("first_measured_at", "last_measured_at"))
    parts = [_days(moments[0], moments[-1])] if moments else []
    if len(dated) < len(imports):
        parts.append("at import (no date in the file)")
    return ", ".join(parts) or None


def _shapes_text(record: dict) -> str:
    """A stored kernel's shapes as a table cell: how many, and each dim's values; an empty shape is an unknown size."""
    n = len(record["shapes"])
    known = _values_text(record["dim_values"]) or "unknown problem size"
    return known if n == 1 else f"{n}: {known}"


_timer_option = click.option(
    "--timer", type=click.Choice(["auto", "gpu", "chain"]), default="auto", show_default=True,
    help="gpu: each kernel's duration from CUPTI (CUDA with torch installed; tells sub-10 us configs apart); "
         "chain: host-timed chains of launches (every backend); auto: gpu where it can be read. "
         "Keep one timer per device's data; collect refuses to finish a case another timer started.")


@cli.command()
@db_option
@click.option("--kernels", "-k", "kernel_names", multiple=True, help="Kernel names or module:attr paths (default: all registered).")
@click.option("--dtypes", "-t", "dtype_names", multiple=True, help=f"Dtypes (default: {','.join(DTYPES)}).")
@click.option("--preset", default="smoke", show_default=True, help="Shape preset of each kernel's grid (smoke, full, ...).")
@click.option("--budget", default=None,
              help="Stop starting new measurements after this long: 90s, 10m, 1.5h (digits 0-9; units s, m, h in "
                   "lower case).")
@click.option("--jobs", "-j", default=1, show_default=True, type=WholeRange(1, 64),
              help="Processes that compile in parallel and measure in turn (CUDA).")
@click.option("--samples", default=5, show_default=True, type=WholeRange(1, 1000),
              help="Timed samples per config with the chain timer (each the difference of a chain and its double); the gpu timer times 20 launches.")
@click.option("--warmup", default=3, show_default=True, type=WholeRange(1, 100), help="Warm-up launches per config.")
@click.option("--warmup-ms", default=0.0, show_default=True, type=FiniteRange(0, 1000),
              help="Also keep warming up until this many milliseconds have passed (clocks of an idle GPU).")
@click.option("--max-shapes", default=None, type=WholeRange(1), help="Only the first N shapes of each preset.")
@click.option("--max-configs", default=None, type=WholeRange(1),
              help="At most N legal configs per shape, evenly spread (a quick check).")
@click.option("--gpus", "gpus_text", default=None, metavar="all|N|0,2,3",
              help="CUDA: one measuring process per GPU of this host, each pinned to its GPU, all timing at once "
                   "into this store (every GPU its own run of the same device): all, the first N, or indices (3, for one). "
                   "-j is not used then: each GPU's process compiles in threads.")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
              help="Collect on a Ray cluster (pip install 'zmlx-pipeline[ray]'): one actor per GPU, each writing a "
                   "shard into --shards, ingested into this store; 'auto' joins the running cluster.")
@click.option("--shards", "shard_dir", default=None, type=GivenPath(file_okay=False),
              help="With --ray: the folder, shared by the cluster, the actors write their shards to "
                   "(default: shards/ next to the store).")
@_timer_option
@output_options
def collect(db, kernel_names, dtype_names, preset, budget, jobs, samples, warmup, warmup_ms, max_shapes, max_configs,
            gpus_text, ray_address, shard_dir, timer, as_json) -> None:
    """Check and time every legal config of the chosen kernels on this machine's GPU; resumable."""
    from zmlx_pipeline.data.detect import detect_device
    from zmlx_pipeline.pipeline import collect as stage
    from zmlx_pipeline.pipeline.gpus import parse_gpus

    budget_s = _budget(budget)
    if gpus_text is not None and ray_address is not None:
        raise click.UsageError("--gpus and --ray exclude each other: Ray places one actor on every GPU itself")
    if shard_dir is not None and ray_address is None:  # the shards are the Ray actors' output: alone, it means nothing
        raise click.UsageError("--shards is only for --ray (the folder the Ray actors write their shards to): add "
                               "--ray ADDRESS, or leave --shards out")
    if gpus_text is not None:
        t = gpus_text.strip(" ").lower()  # digits 0-9 only, as every whole-number option (WholeRange)
        if t != "all" and not all(_DIGITS.fullmatch(p.strip(" ")) for p in t.split(",") if p.strip(" ")) or not t.strip(","):
            raise click.BadParameter(f"cannot read {shown(gpus_text)}: use all, a count such as 2, or indices such as "
                                     "0,2,3", param_hint="--gpus")
    if ray_address is not None:
        from zmlx_pipeline.pipeline import ray_collect

        specs, refs = _kernels(kernel_names)
        _check_preset(specs, preset, kernel_names)
        with store_to_fill(db, keep_filled=True) as store:  # a refusal (no Ray, no cluster) leaves no new store
            out = ray_collect.collect_on_ray(
                store, specs, refs, address=ray_address, shard_dir=shard_dir or ray_collect.default_shard_dir(store.path),
                dtypes=split_names(dtype_names) or list(DTYPES), preset=preset, budget_s=budget_s,
                settings=stage.TimingSettings(warmup=warmup, samples=samples, warmup_s=warmup_ms / 1000, timer=timer),
                shapes_limit=max_shapes, configs_limit=max_configs)
        emit(out if as_json else out["actors"], as_json)
        if not as_json:
            click.echo(f"\n{out['ingested']} measurements ingested from {len(out['shards'])} shards; "
                       f"{out['remaining']} left: run the same command again to resume")
        return
    specs, refs = _kernels(kernel_names)
    dtypes = split_names(dtype_names) or list(DTYPES)
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        raise click.BadParameter(f"unknown dtype {', '.join(unknown)}; known: {', '.join(DTYPES)}", param_hint="--dtypes")
    _check_preset(specs, preset, kernel_names)  # before the GPU is looked for
    device = detect_device()
    if device.backend not in ("cuda", "metal"):
        raise click.ClickException(
            f"no Metal or CUDA backend on this machine (MLX runs on the {device.backend}): custom kernels "
            "need Apple silicon, or an NVIDIA GPU with `pip install 'mlx[cuda13]'`"
        )
    gpus = None
    if gpus_text is not None:
        if device.backend != "cuda":
            raise click.ClickException(f"--gpus needs the MLX CUDA backend (MLX runs on the {device.backend} here)")
        gpus = parse_gpus(gpus_text)
    bar_holder: dict = {}

    def on_plan(n: int, already: int) -> None:
        click.echo(f"{device.device_id}: {n} measurements to make, {already} already in the store", err=True)
        if n:
            bar_holder["bar"] = click.progressbar(length=n, label="collect", show_eta=True, show_pos=True, file=sys.stderr)
            bar_holder["bar"].__enter__()

    def on_result(task, outcome) -> None:
        bar_holder["bar"].update(1)

    settings = stage.TimingSettings(warmup=warmup, samples=samples, warmup_s=warmup_ms / 1000, timer=timer)
    try:
        with store_to_fill(db, keep_filled=True) as store:  # what was measured stays: the next collect resumes
            from zmlx_pipeline.data.registered import as_registered

            device = as_registered(device, store)  # named by its registered id from here on (on_plan's line)
            result = stage.collect(store, device, specs, dtypes=dtypes, preset=preset, budget_s=budget_s, settings=settings,
                                   jobs=jobs, kernel_refs=refs, shapes_limit=max_shapes, configs_limit=max_configs,
                                   on_plan=on_plan, on_result=on_result, gpus=gpus)
    finally:
        if "bar" in bar_holder:
            bar_holder["bar"].__exit__(None, None, None)
    data = result.as_dict()
    if as_json:
        emit(data, True)
    else:
        rows = [{"kernel": k, **v} for k, v in result.by_kernel.items()]
        emit(rows, False, ["kernel", "ok", "wrong_result", "launch_error", "compile_error", "timeout"])
        click.echo(f"\n{result.done} measured ({' '.join(f'{k}={v}' for k, v in result.by_status.items()) or 'none'}), "
                   f"{result.already} already stored, {result.remaining} left; stopped: {result.stopped}; "
                   f"{result.elapsed_s:.1f} s")
        if result.remaining:
            click.echo("run the same command again to resume")
    _abort_if_interrupted(result.stopped)


def _abort_if_interrupted(stopped: str) -> None:
    """A measuring command stopped by Ctrl-C or SIGTERM ends as every other interrupted command does ("Aborted!",
    exit 1), after saying what it saved: a script must not read a stopped run as a finished one."""
    if stopped == "interrupted":
        raise click.Abort()


@cli.command()
@db_option
@click.option("--kernels", "-k", "kernel_names", multiple=True, help="Kernel names or module:attr paths (default: all registered).")
@click.option("--fraction", default=0.05, show_default=True, type=FiniteRange(0, 1, min_open=True),
              help="Share of this device's ok measurements to time again (chosen by key hash).")
@click.option("--budget", default=None,
              help="Stop starting new measurements after this long: 90s, 10m, 1.5h (digits 0-9; units s, m, h in "
                   "lower case).")
@click.option("--jobs", "-j", default=1, show_default=True, type=WholeRange(1, 64),
              help="Processes that compile in parallel and measure in turn (CUDA).")
@_timer_option
@output_options
def repeat(db, kernel_names, fraction, budget, jobs, timer, as_json) -> None:
    """Time a sample of measured configs again in a new process, to show how large noise is."""
    from zmlx_pipeline.data.detect import detect_device
    from zmlx_pipeline.pipeline import collect as stage

    budget_s = _budget(budget)
    specs, refs = _kernels(kernel_names)
    device = detect_device()
    if device.backend not in ("cuda", "metal"):
        raise click.ClickException(f"no Metal or CUDA backend on this machine (MLX runs on the {device.backend}): "
                                   "repeat on the GPU the measurements came from")
    result = stage.repeat(open_store(db, must_exist=True), device, specs, fraction=fraction, budget_s=budget_s,
                          settings=stage.TimingSettings(timer=timer), jobs=jobs, kernel_refs=refs)
    if as_json:
        emit(result.as_dict(), True)
    else:
        click.echo(f"{device.device_id}: {result.done} of {result.planned} repeated ({result.by_status}); "
                   f"stopped: {result.stopped}; {result.elapsed_s:.1f} s")
    _abort_if_interrupted(result.stopped)


@cli.command()
@db_option
@click.option("--device", default=None, callback=device_filter_option, help="Only this device id.")
@output_options
def noise(db, device, as_json) -> None:
    """How far repeated timings of one config differ, by kernel time (from `repeat`)."""
    from zmlx_pipeline.pipeline.collect import noise_summary

    store = open_store(db, read_only=True)
    device = check_filters(store, device=device)["device"]
    rows = noise_summary(store, device=device)
    if not rows:  # with --json too, as `models` says it has nothing to list
        raise click.ClickException("no repeated timings in the store: run `zmlx-pipeline repeat` on the GPU first")
    if as_json:
        emit(rows, True)
        return
    emit([{**r, **{k: f"{100 * r[k]:.1f}%" for k in ("median_diff", "p95_diff", "max_diff", "within_5pct")}} for r in rows],
         False, ["bucket", "pairs", "median_diff", "p95_diff", "max_diff", "within_5pct"])


@cli.command()
@db_option
@click.option("--device", default=None, callback=device_filter_option, help="Only this device id.")
@click.option("--force", is_flag=True, help="Replace OUT when it is already a shard.")
@click.argument("out", type=GivenPath(dir_okay=False, path_type=Path))
def export(db, device, force, out) -> None:
    """Write the store's measurements as one Parquet shard (zstd), for ingest elsewhere."""
    from zmlx_pipeline.runtime.bundle import published_problem

    if not force and (out.exists() or out.is_symlink()):
        raise click.ClickException(f"{out} exists: pass --force to replace it, or choose another path")
    published = published_problem(out.parent)
    if published is not None:
        raise click.ClickException(f"cannot export to {out}: {published}; choose another path")
    store = open_store(db, read_only=True)
    device = check_filters(store, device=device)["device"]
    with final_step():  # once the shard is renamed into place, a stop no longer hides it
        n = store.export_shard(out, device=device)
    click.echo(f"wrote {n} measurements to {printable(str(out))} ({out.stat().st_size / 1024:.1f} KiB)")


@cli.command()
@db_option
@click.argument("sources", nargs=-1, required=True, type=GivenPath(exists=True, path_type=Path))
@output_options
def ingest(db, sources, as_json) -> None:
    """Merge Parquet shards (files or directories of them) into the store; idempotent."""
    from zmlx_pipeline.data.shards import ingest_shards

    with store_to_fill(db) as store, final_step():  # once committed, a stop no longer reports a failure
        result = ingest_shards(store, list(sources))
    if as_json:
        emit(result, True)
        return
    replaced = f", {result['replaced']} replaced by newer timings" if result.get("replaced") else ""
    click.echo(f"{result['files']} shard(s), {result['rows']} rows: {result['added']} added{replaced}, "
               f"{result['skipped']} already present")


@cli.command()
@db_option
@click.option("--device", default=None, callback=device_filter_option, help="Only this device id.")
@click.option("--kernel", default=None, help="Only this kernel.")
@output_options
def summary(db, device, kernel, as_json) -> None:
    """Per device, kernel and dtype: measurements by status, shapes covered, shapes with an ok config, when timed."""
    store = open_store(db, read_only=True)
    named = check_filters(store, device=device, kernel=kernel)
    rows = store.summary(device=named["device"], kernel=named["kernel"])
    if as_json:
        emit([{**r, **{k: _iso(r[k]) for k in ("first_measured_at", "last_measured_at")}} for r in rows], True)
        return
    emit([{**r, "measured": _days(r["first_measured_at"], r["last_measured_at"])} for r in rows], False,
         ["device", "kernel", "dtype", "measurements", "by_status", "shapes", "shapes_ok", "measured"])


def _iso(moment) -> str | None:
    """A stored time (UTC, naive) as ISO 8601 with its zone: `2026-03-05T09:04:43Z`."""
    return None if moment is None else moment.isoformat(timespec="seconds") + "Z"


def _days(first, last) -> str | None:
    """The days rows were timed, as a table cell: `2026-03-05` or `2026-03-05..2026-03-07`."""
    if first is None or last is None:
        return None
    days = sorted({f"{first:%Y-%m-%d}", f"{last:%Y-%m-%d}"})
    return days[0] if len(days) == 1 else f"{days[0]}..{days[-1]}"


@cli.command("run")
@db_option
@click.option("--data", "data_dir", type=GivenPath(exists=True, file_okay=False, path_type=Path),
              default=Path("data"), show_default=True, help="Directory of committed Parquet shards.")
@click.option("--bundle-dir", type=GivenPath(file_okay=False, path_type=Path), default=Path("bundles"),
              show_default=True, help="Where the profile bundle is published.")
@click.option("--kernel", "-k", "kernel_names", multiple=True, help="Only these kernels (default: all measured).")
@click.option("--collect", "collect_budget", default=None, metavar="BUDGET",
              help="On a GPU machine, first collect this machine (full grid) for up to BUDGET (e.g. 30m; units s, "
                   "m, h in lower case).")
@click.option("--model", "model_name", default=None,
              help="Model variant to train and score (default: the default model; robust_fast trains about 1.4x faster).")
@output_options
def run_main(db, data_dir, bundle_dir, kernel_names, collect_budget, model_name, as_json) -> None:
    """The main job: ingest data/, train, evaluate on held-out shapes and devices, publish, look up."""
    from zmlx_pipeline.data.shards import shard_paths
    from zmlx_pipeline.pipeline.main_job import check_kernels, main_job
    from zmlx_pipeline.publish.writer import check_publish_dir

    if model_name is not None:  # refused before ingest, not after it
        from zmlx_pipeline.models.variants import check_model

        check_model(model_name)

    check_publish_dir(bundle_dir)  # refused before minutes of ingest and training, not when the bundle is written
    shard_paths(data_dir)  # no shard there is said before a store is made
    collect_first = _collect_first(collect_budget) if collect_budget is not None else None  # before the store is made
    kernels = split_names(kernel_names) or None
    with store_to_fill(db, keep_filled=True) as store:  # the store's kernels count too; a typo leaves no new store
        check_kernels(store, data_dir, kernels)  # a typo is refused before the ingest changes the store
        collect = collect_first(store) if collect_first is not None else None
        result = main_job(store, data_dir, bundle_dir, kernels=kernels, collect=collect,
                          progress=progress_line, model=model_name)  # stderr, also with --json: stdout holds the result
    if as_json:
        emit(result, True)
        return
    ing = result["ingest"]
    replaced = f", {ing['replaced']} replaced by newer timings" if ing.get("replaced") else ""
    click.echo(f"ingested {ing['files']} shard(s) from {printable(str(data_dir))}: {ing['added']} new rows{replaced}, "
               f"{ing['skipped']} already present")
    click.echo("\nscores: regret@k = time of the best of the model's top k / measured best (geometric mean over held-out cases)")
    tied = ("model_tied@1", "best_baseline_tied@1")  # noise-aware scores (models/evaluate.py)
    emit([{**r, **{k: f"{r[k]:.3f}" for k in ("model@1", "model@3", "model@5", "best_baseline@1", "hit_2pct", *tied)
                   if r.get(k) is not None}}
          for r in result["scores"]],
         False, ["split", "kernel", "cases", "model@1", "model@3", "model@5", "hit_2pct", "best_baseline@1", "baseline",
                 *tied, "tie_band"])
    click.echo(f"\npublished {result['bundle']['bundle_id']} to {printable(str(result['bundle']['path']))}\n\nlookups:")
    emit([{**r, "shape": ",".join(f"{k}={v}" for k, v in r["shape"].items()),
           "config": ",".join(f"{k}={v}" for k, v in r["config"].items()),
           "expected_regret": None if r["expected_regret"] is None else f"{r['expected_regret']:.3f}"}
          for r in result["lookups"]], False, ["kernel", "device", "dtype", "shape", "config", "evidence", "expected_regret"])
    click.echo("\ntimings: " + ", ".join(f"{k} {v} s" for k, v in result["timings_s"].items()))


def _collect_first(budget: str):
    """The collect step of `run --collect` for a store: this machine, every kernel and dtype, full grid, within the
    budget; the budget and the GPU are checked here, before any store is opened or made."""
    from zmlx_pipeline.data.detect import detect_device
    from zmlx_pipeline.kernels.registry import builtin_kernels
    from zmlx_pipeline.pipeline import collect as stage

    if not budget.strip():
        raise click.BadParameter("empty; give a duration such as 30m, or leave the option out", param_hint="--collect")
    try:
        budget_s = stage.parse_duration(budget)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--collect") from None
    device = detect_device()
    if device.backend not in ("cuda", "metal"):
        raise click.ClickException(f"--collect needs a Metal or CUDA GPU (MLX runs on the {device.backend} here); "
                                   "run without --collect to learn from the committed data only")
    specs = builtin_kernels()

    def measure(store) -> dict:
        result = stage.collect(store, device, specs, preset="full", budget_s=budget_s, jobs=os.cpu_count() or 1,
                               kernel_refs={s.name: s.name for s in specs})
        if result.stopped == "interrupted":  # Ctrl-C stops the main job here, not only its collect step
            raise KeyboardInterrupt
        return result.as_dict()

    return lambda store: lambda: measure(store)


@cli.command()
@db_option
@click.option("--budget", default="30m", show_default=True,
              help="Stop starting new measurements after this long: 90s, 10m, 1.5h (digits 0-9; units s, m, h in "
                   "lower case); run again to add more.")
@click.option("--out", "out_dir", type=GivenPath(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Directory the shard is written to.")
@output_options
def contribute(db, budget, out_dir, as_json) -> None:
    """Time every built-in kernel on this machine's GPU within a budget and write one shard to send in."""
    from zmlx_pipeline.data.detect import detect_device
    from zmlx_pipeline.kernels.registry import builtin_kernels
    from zmlx_pipeline.pipeline.contribute import contribute as make_shard

    budget_s = _budget(budget)
    device = detect_device()
    if device.backend not in ("cuda", "metal"):
        raise click.ClickException(
            f"no Metal or CUDA backend on this machine (MLX runs on the {device.backend}): contribute on "
            "Apple silicon, or on an NVIDIA GPU with `pip install 'mlx[cuda13]'`"
        )
    specs = builtin_kernels()

    def on_plan(n: int, already: int) -> None:
        if not as_json:
            click.echo(f"{device.device_id}: {n} measurements to make, {already} already in the store; "
                       f"stopping after {budget}", err=True)

    with store_to_fill(db, keep_filled=True) as store:
        made = make_shard(store, device, out_dir, specs, budget_s=budget_s,
                          jobs=(os.cpu_count() or 1) if device.backend == "cuda" else 1,
                          kernel_refs={s.name: s.name for s in specs}, on_plan=on_plan)
    if as_json:
        emit(made.as_dict(), True)
        return
    left = made.collected.remaining
    click.echo(f"wrote {made.rows} measurements of {made.device_id} to {printable(str(made.path))} "
               f"({made.path.stat().st_size / 1024:.1f} KiB)"
               + (f"; {left} left, run the same command again to add them" if left else ""))
    if not made.known:
        click.echo(f"this GPU ({device.reported_name or device.architecture}) is not in the catalog yet: "
                   "the shard records what MLX reported about it")
    click.echo(f"send {made.path.name} to the zmlx-pipeline maintainers (a pull request adding it under data/); "
               "it holds the timings, what MLX reported about the GPU and this machine's host name")


def _problem_size_option(ctx, param, value):
    """--problem-size parsed early, so a typo is a usage error naming the accepted forms."""
    if value is None:
        return None
    from zmlx_pipeline.data.importers import parse_problem_size

    try:
        return parse_problem_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _kernel_name_option(ctx, param, value):
    """import --kernel: a name, never white space only (left out, each file names its own kernel)."""
    if value is not None and not value.strip():
        raise click.BadParameter(f"{value!r} names no kernel: give a name, or leave the option out for each file's "
                                 "own", param_hint="--kernel")
    return value


@cli.command("import")
@db_option
@click.option("--device", default=None,
              help="Catalog id or name of the GPU every file was measured on, or a device registered with "
                   "`zmlx-pipeline devices add` (default: the name each file reports, else its file name). "
                   "`zmlx-pipeline devices` lists the ids.")
@click.option("--device-map", "device_map", default=None,
              type=GivenPath(exists=True, dir_okay=False, path_type=Path),
              help='JSON or TOML file mapping file-name globs or reported device names to catalog ids, '
                   'e.g. {"A100*": "nvidia-a100-sxm4-80gb", "Tesla V100": "nvidia-v100-pcie-16gb"}.')
@click.option("--problem-size", "problem_size", default=None, callback=_problem_size_option,
              help="Problem size for files that give none (neither the file nor a search-space description "
                   "beside it): whole numbers (digits 0-9) split by commas like 4096,4096, or JSON like [25000, 2048, 1].")
@click.option("--kernel", "kernel", default=None, callback=_kernel_name_option,
              help="Kernel name for every file (default: each file's kernel_name, else the BenchmarkName of a "
                   "search-space description beside it, else its folder's name, as a T4 file names no kernel).")
@click.option("--replace", is_flag=True, help="Let these files' results replace the stored ones of the same keys.")
@click.argument("files", nargs=-1, required=True, type=GivenPath(exists=True, path_type=Path))
@output_options
def import_cmd(db, device, device_map, problem_size, kernel, replace, files, as_json) -> None:
    """Import Kernel Tuner cache, T4, Kernel Tuner results or KTT JSON files (gzipped or not, or directories of
    them); idempotent.

    Every file is checked before any is stored: a refused file (one giving a stored key another result, without
    --replace) stores nothing. A file whose kernel name is stored with other parameters or dims goes under a name
    of its own (KERNEL_2, ...; a --kernel of other parameters is refused).
    """
    from zmlx_pipeline.data.importers import import_files

    with store_to_fill(db) as store, final_step():  # once committed, a stop no longer reports a failure
        rows = import_files(store, list(files), device=device, device_map=device_map, problem_size=problem_size,
                            kernel=kernel, replace=replace)
    counts = [] if as_json else [c for c in ("replaced", "skipped") if any(r.get(c) for r in rows)]  # when non-zero
    emit(rows if as_json else [{**r, **{c: r.get(c) or 0 for c in counts}} for r in rows], as_json,
         ["file", "device", "kernel", "rows", "added", "failed", *counts])
    if not as_json:  # a file stored under another kernel name than it gives says why, one line each
        for r in rows:
            if r.get("note"):
                click.echo(printable(f"{Path(r['file']).name}: {r['note']}"))


for _commands in (cli_report, cli_publish, cli_models):  # report; publish, lookup, profiles; train, evaluate, models
    _commands.register(cli)


def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """warnings.showwarning for the command: a warning is one line on stderr ("Warning: ..."), never Python's
    file:line header and source line (a strict lookup that falls back to a cached bundle warns so)."""
    text = printable(" ".join(str(message).split()))
    print(f"Warning: {text}", file=file if file is not None else sys.stderr)


def main() -> None:
    """Console-script entry point."""
    warnings.showwarning = one_line_warning
    terminate_as_interrupt()
    stops_wait_once_final()
    try:
        cli(prog_name="zmlx-pipeline")
    except SystemExit as exc:
        if exc.code in (0, None):  # it finished: what is left is the interpreter's teardown
            commits.mark_done()
        raise
