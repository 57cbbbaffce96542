"""`publish`, `lookup` and `profiles`: bundles out of the store, and what the runtime answers from them."""

from __future__ import annotations

import re
from pathlib import Path

import click

from zmlx_pipeline.core.errors import shown, shown_number
from zmlx_pipeline.core.files import printable
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
    significant_digits,
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
#: (a sign only as "-", which kernel_shape refuses by name), ordinary spaces allowed around an item, none inside one
#: (`rows= 5`), as in every option that reads a number (cli_common._plain)
_NAMED_SHAPE = re.compile(r" *[A-Za-z_][A-Za-z0-9_]*=-?[0-9]+( *, *[A-Za-z_][A-Za-z0-9_]*=-?[0-9]+)* *", re.ASCII)
_VALUES_SHAPE = re.compile(r" *-?[0-9]+( *, *-?[0-9]+)* *", re.ASCII)
_SHAPE_ITEM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*=)?-?[0-9]+", re.ASCII)
SHAPE_FORMS = "DIM=N,DIM=N (e.g. rows=4096,cols=4096) or the dims' values in order (e.g. 4096,4096), N in digits 0-9"


def parse_shape(text: str) -> dict[str, int] | list[int]:
    """`rows=4096,cols=4096` as a dict, or `4096,4096` (the kernel's dims in order) as a list; any other form
    ("4096x4096", "+4096", an empty item, digits other than 0-9) is a usage error naming the two forms."""
    if _VALUES_SHAPE.fullmatch(text):
        return [_dim_int(f"value {i + 1}", v.strip()) for i, v in enumerate(text.split(","))]
    if not _NAMED_SHAPE.fullmatch(text):
        spaced = next((i.strip(" ") for i in text.split(",") if " " in i.strip(" ")
                       and _SHAPE_ITEM.fullmatch(i.replace(" ", ""))), None)
        if spaced is not None:  # `rows= 5`: a space inside an item, where only one around it is left out
            joined = spaced.replace(" ", "")
            raise click.BadParameter(f"{shown(text)}: a space inside {shown(spaced)}; write {shown(joined)} (spaces "
                                     "may stand around an item, not inside one)", param_hint="--shape")
        raise click.BadParameter(f"{shown(text)}: give the shape as {SHAPE_FORMS}", param_hint="--shape")
    out: dict[str, int] = {}
    for item in text.split(","):
        name, value = (part.strip() for part in item.split("="))
        if name in out:
            raise click.BadParameter(f"{shown(text)}: {name} is given twice", param_hint="--shape")
        out[name] = _dim_int(f"dimension {name}", value)
    return out


def _dim_int(label: str, digits: str) -> int:
    """A typed dim's digits as an int; more digits than the largest array dimension has are refused here, as too large,
    before int() (which refuses text of over 4300 digits with a ValueError); a long one is shown by its start."""
    from zmlx_pipeline.runtime.contents import MAX_DIM

    if significant_digits(digits) > len(str(MAX_DIM)):
        raise click.BadParameter(f"shape {label}={shown_number(digits)} is larger than an array dimension can be "
                                 f"({MAX_DIM})", param_hint="--shape")
    return int(digits)


def _shape_option(ctx, param, value: str | None):
    """--shape parsed as click reads it (parse_shape), so a malformed one is a usage error before any work."""
    return None if value is None else parse_shape(value)


def kernel_shape(kernel: str, shape: dict[str, int] | list[int]) -> None:
    """A usage error (exit 2, as a malformed --shape is) for a --shape that does not fit KERNEL's dims in the bundle
    in use (names or count), naming the dims, or that holds a dim below 1 or above an array's largest. The dims are
    the bundle's (the one --bundle names), so this runs in the command once it is loaded, not in the option's
    callback; a kernel the bundle lacks is left to the lookup, which names the kernels it has."""
    from zmlx_pipeline.runtime.bundle import active_bundle
    from zmlx_pipeline.runtime.contents import MAX_DIM
    from zmlx_pipeline.runtime.lookup import dims_in_order, unnamed_values_problem

    def bad(why: str) -> click.BadParameter:
        return click.BadParameter(why, param_hint="--shape")

    bundle = active_bundle()
    meta = bundle.kernels.get(kernel) if bundle is not None else None
    dims = tuple(meta["dims"]) if isinstance(meta, dict) and isinstance(meta.get("dims"), list) else None
    if isinstance(shape, list):
        if dims is not None and not dims_in_order(meta):
            raise bad(unnamed_values_problem(kernel, dims, len(shape)))
        if dims is not None and len(shape) != len(dims):
            raise bad(f"kernel {kernel!r} has dims {', '.join(dims)}; got {len(shape)} values")
        named = dict(zip(dims or [f"d{i}" for i in range(len(shape))], shape))
    else:
        if dims is not None and set(shape) != set(dims):
            raise bad(f"kernel {kernel!r} has dims {', '.join(dims)}; got {', '.join(shape)}")
        named = shape
    for dim, value in named.items():
        if value < 1:
            raise bad(f"shape dimension {dim}={value} must be a positive integer")
        if value > MAX_DIM:
            raise bad(f"shape dimension {dim}={value} is larger than an array dimension can be ({MAX_DIM})")


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
    for line in no_entry_lines(result["no_entries"]):
        click.echo(printable(line))
    if result.get("latest_replaced_link") is not None:
        click.echo(printable(f"{result['latest']} was a symbolic link to {result['latest_replaced_link']!r}; it is now "
                             f"the pointer file naming {result['bundle_id']} (what the link named is unchanged)"))


def no_entry_lines(no_entries: dict[str, dict[str, str]]) -> list[str]:
    """One line per device of publish's `no_entries`: `acme-x32: no legal config of toy_scale (every config breaks:
    TG <= max_threads)`, kernels of one reason named together."""
    lines = []
    for device, kernels in no_entries.items():
        if not kernels:
            continue
        by_reason: dict[str, list[str]] = {}
        for kernel, why in kernels.items():
            by_reason.setdefault(why, []).append(kernel)
        lines.append(f"{device}: " + "; ".join(f"no legal config of {', '.join(names)} ({why})"
                                               for why, names in by_reason.items()))
    return lines


def _device_option(ctx, param, value):
    """A blank --device is a usage error, as the other commands' --device is: leaving it out asks for this GPU."""
    if value is not None and not value.strip():
        raise click.BadParameter(f"{value!r} names no device: give a device id such as nvidia-h200, or leave "
                                 "--device out for this machine's GPU")
    return value


@click.command("lookup", cls=OneValueCommand)
@click.argument("kernel")
@click.option("--shape", "shape", required=True, callback=_shape_option, help="DIM=N,DIM=N (e.g. rows=4096,cols=4096), or the dims' values in order (e.g. 4096,4096); "
                   "whole numbers in digits 0-9.")
@click.option("--dtype", default="float16", show_default=True, help="float16, bfloat16 or float32.")
@click.option("--device", default=None, callback=_device_option,
              help="Catalog device id or name, or a device of the bundle (a registered one also by its name or "
                   "alias) (default: this machine's GPU).")
@click.option("--bundle", "bundle_path", default=None, callback=bundle_location,
              help="Bundle directory, publish directory (its latest), file:// or http(s) URL "
                   "(default: $ZMLX_PIPELINE_BUNDLE, "
                   "else the bundle shipped with the package).")
@click.option("-k", "k", type=WholeRange(1), default=None, help="Candidates to list (default: the kernel's pruning k).")
@output_options
def lookup_cmd(kernel, shape, dtype, device, bundle_path, k, as_json) -> None:
    """The config the runtime would launch KERNEL with: evidence (how far the answer travelled), expected regret,
    predicted time and candidates; exits 1 for an unknown kernel or dtype, or a shape no config is legal for, and 2
    for a --shape that does not fit the kernel's dims."""
    from zmlx_pipeline.runtime.lookup import load_strictly, lookup

    load_strictly(bundle_path)  # once, here: the shape is checked against its dims, and the lookup answers from it
    kernel_shape(kernel, shape)
    result = lookup(kernel, shape, dtype, device=device, bundle=None, k=k)
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
