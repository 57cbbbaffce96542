"""`publish`, `lookup` and `profiles`: bundles out of the store, and what the runtime answers from them."""

from __future__ import annotations

import re
from pathlib import Path

import click

from zmlx_pipeline.pipeline.cli_common import (
    GivenPath,
    OneValueCommand,
    WholeRange,
    db_option,
    emit,
    final_step,
    open_store,
    open_store_to_record,
    output_options,
    progress_line,
    split_names,
)


def bundle_location(ctx, param, value: str | None) -> str | None:
    """--bundle as the runtime reads it (runtime.bundle.bundle_location: a file:// URL is the local path it names),
    a location it cannot read being a usage error."""
    if value is None:
        return value
    from zmlx_pipeline.runtime.bundle import bundle_location as location
    from zmlx_pipeline.runtime.errors import BadArgument

    try:
        return location(value)
    except BadArgument as exc:
        raise click.BadParameter(str(exc), param_hint="--bundle") from None


#: --shape's two forms: DIM=N,DIM=N (named dims) or N,N (the kernel's dims in order); N whole, in ASCII digits
#: (a sign only as "-", which the runtime refuses by name), a space allowed around a comma
_NAMED_SHAPE = re.compile(r" *[A-Za-z_][A-Za-z0-9_]*=-?[0-9]+( *, *[A-Za-z_][A-Za-z0-9_]*=-?[0-9]+)* *", re.ASCII)
_VALUES_SHAPE = re.compile(r" *-?[0-9]+( *, *-?[0-9]+)* *", re.ASCII)
SHAPE_FORMS = "DIM=N,DIM=N (e.g. rows=4096,cols=4096) or the dims' values in order (e.g. 4096,4096), N in digits 0-9"


def parse_shape(text: str) -> dict[str, int] | list[int]:
    """`rows=4096,cols=4096` as a dict, or `4096,4096` (the kernel's dims in order) as a list; any other form
    ("4096x4096", "+4096", an empty item, digits other than 0-9) is a usage error naming the two forms."""
    if _VALUES_SHAPE.fullmatch(text):
        return [int(v) for v in text.split(",")]
    if not _NAMED_SHAPE.fullmatch(text):
        raise click.BadParameter(f"{text!r}: give the shape as {SHAPE_FORMS}", param_hint="--shape")
    out: dict[str, int] = {}
    for item in text.split(","):
        name, value = (part.strip() for part in item.split("="))
        if name in out:
            raise click.BadParameter(f"{text!r}: {name} is given twice", param_hint="--shape")
        out[name] = int(value)
    return out


@click.command("publish", cls=OneValueCommand)
@db_option
@click.option("--to", "to_dir", required=True, type=GivenPath(file_okay=False, path_type=Path),
              help="Directory to publish into: each bundle is a new version there, `latest` names the newest. A new or "
                   "empty directory, or an earlier publish's; one holding other files is refused.")
@click.option("--model", "model_ids", multiple=True,
              help="Registered model id(s) to publish instead of the newest of their kernels.")
@click.option("--kernel", "-k", "kernel_names", multiple=True, help="Only these kernels (default: every kernel with data).")
@click.option("--device", "device_ids", multiple=True,
              help="Lookup tables only for these devices, plus every measured one (default: every catalog chip).")
@output_options
def publish_cmd(db, to_dir, model_ids, kernel_names, device_ids, as_json) -> None:
    """Publish a profile bundle (device profiles, per-shape configs, manifest with hashes) from the newest models."""
    from zmlx_pipeline.publish import publish

    store = open_store_to_record(db)
    with final_step():  # once `latest` names the new bundle, a stop no longer hides it
        result = publish(store, to_dir, split_names(model_ids) or None, kernels=split_names(kernel_names) or None,
                         devices=split_names(device_ids) or None, progress=progress_line)
    if as_json:
        emit(result, True)
        return
    emit({k: result[k] for k in ("bundle_id", "path", "latest", "model_id", "model_source", "data_fingerprint",
                                 "kernels", "devices_with_tables", "profiles", "entries", "files", "bytes")}, False)


@click.command("lookup", cls=OneValueCommand)
@click.argument("kernel")
@click.option("--shape", "shape_text", required=True, help="DIM=N,DIM=N (e.g. rows=4096,cols=4096), or the dims' values in order (e.g. 4096,4096); "
                   "whole numbers in digits 0-9.")
@click.option("--dtype", default="float16", show_default=True, help="float16, bfloat16 or float32.")
@click.option("--device", default=None, help="Catalog device id (default: this machine's GPU).")
@click.option("--bundle", "bundle_path", default=None, callback=bundle_location,
              help="Bundle directory, publish directory (its latest), file:// or http(s) URL "
                   "(default: $ZMLX_PIPELINE_BUNDLE, "
                   "else the bundle shipped with the package).")
@click.option("-k", "k", type=WholeRange(1), default=None, help="Candidates to list (default: the kernel's pruning k).")
@output_options
def lookup_cmd(kernel, shape_text, dtype, device, bundle_path, k, as_json) -> None:
    """The config the runtime would launch KERNEL with: evidence (how far the answer travelled), expected regret,
    predicted time and candidates; exits 1 for an unknown kernel or dtype, or a shape no config is legal for."""
    from zmlx_pipeline.runtime.lookup import lookup

    shape = parse_shape(shape_text)
    result = lookup(kernel, shape, dtype, device=device, bundle=bundle_path, k=k)
    if result["config"] is None:
        raise click.ClickException(result["note"])
    if as_json:
        emit(result, True)
        return
    rows = [{"key": key, "value": result[key]} for key in
            ("kernel", "device", "dtype", "shape", "config", "evidence", "expected_regret", "predicted_us", "bucket",
             "outside_range", "bundle", "note")]
    emit(rows, False, ["key", "value"])
    click.echo("\ncandidates (best first):")
    emit([{"rank": i + 1, **c} for i, c in enumerate(result["candidates"])], False)


@click.command("profiles", cls=OneValueCommand)
@click.option("--device", "device_ids", multiple=True, help="Only these device ids (default: every device in the bundle).")
@click.option("--bundle", "bundle_path", default=None, callback=bundle_location,
              help="Bundle directory, publish directory, file:// or http(s) URL.")
@output_options
def profiles_cmd(device_ids, bundle_path, as_json) -> None:
    """The device profile table: learned default threadgroup per kernel class, ZMLX-style candidates, evidence."""
    from zmlx_pipeline.runtime.profiles import profile_table

    rows = profile_table(split_names(device_ids) or None, bundle=bundle_path)
    if as_json:
        emit(rows, True)
        return
    table = [{
        "device": r["device_id"], "name": r.get("name"), "cores": r.get("gpu_cores"),
        "gb/s": r.get("memory_bandwidth_gbps"), "catalog_tg": r.get("catalog_default_threadgroup"),
        "learned_tg": r.get("default_threadgroup"), "candidates": r.get("threadgroup_candidates"),
        "by_class": " ".join(f"{c}={v['threadgroup']}" for c, v in sorted((r.get("classes") or {}).items())),
        "evidence": r.get("evidence"),
    } for r in rows]
    emit(table, False)


def register(group: click.Group) -> None:
    """Add publish, lookup and profiles to the CLI group."""
    for command in (publish_cmd, lookup_cmd, profiles_cmd):
        group.add_command(command)
