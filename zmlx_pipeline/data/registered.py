"""Devices the catalog lacks, registered in a store (`zmlx-pipeline devices add`): a record of a catalog row's fields,
checked as the catalog's rows are checked, stored as a device row that import, the listing and publish take as they
take a catalog chip's."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.data.catalog import CatalogError, DeviceSpec, is_https, registration_problems
from zmlx_pipeline.data.records import device_id_problem
from zmlx_pipeline.data.store import DEVICE_COLUMNS, BadDeviceRow, Store


class DeviceRecordError(ZmlxPipelineError, ValueError):
    "A device record that cannot be registered; nothing was stored"


#: what an inline source of a record holds
SOURCE_KEYS = ("title", "url")
_WHOLE_RECORD = ("write the record as one JSON object (or, in a .toml file, one TOML table) of a catalog row's fields, "
                 "each figure cited under sources")


def _refusal(path: Path, text: str, fix: str) -> DeviceRecordError:
    return DeviceRecordError(f"cannot register {path}: {text}; {fix}; nothing was stored")


def _fix_of(err: CatalogError) -> str:
    """What to do about a record DeviceSpec.from_json refuses."""
    text = str(err)
    if "missing field" in text:
        return "add each, every figure cited under sources (`zmlx-pipeline devices --json` shows catalog rows)"
    if "unknown fields" in text:
        return "leave them out: a record holds a catalog row's fields (`zmlx-pipeline devices --json` shows them)"
    if "aliases is" in text:
        return "give aliases as a list of names"
    if "sources is" in text:
        return "give sources as a table of each figure's source"
    return _WHOLE_RECORD


def read_record(path: str | Path) -> tuple[DeviceSpec, dict[str, dict]]:
    """(the device, the sources it declares) of a record file: JSON, or TOML by its .toml suffix, read as device maps
    are; `sources` cites each figure by a catalog source's id or as {title, url}. DeviceRecordError (one line, with the
    fix) for a file that is no such record; its figures are checked by register_device."""
    from zmlx_pipeline.data.importers.kernel_tuner import ImportFileError, read_json_or_toml

    path = Path(path)
    try:
        data = read_json_or_toml(path)
    except ImportFileError as err:
        raise _refusal(path, str(err), _WHOLE_RECORD) from None
    if not isinstance(data, dict):
        raise _refusal(path, f"it holds a {type(data).__name__}, not the device's fields", _WHOLE_RECORD)
    row: dict[str, Any] = dict(data)
    if "core_limited_from" in row:  # what collect writes of an MPS-limited run, never a catalog row's field
        raise _refusal(path, "core_limited_from is no field of a record", "register the whole chip: leave it out")
    declared: dict[str, dict] = {}
    if isinstance(row.get("sources"), dict):
        cited: dict[str, Any] = {}
        for field, source in row["sources"].items():
            if isinstance(source, dict):
                odd = sorted(set(source) - set(SOURCE_KEYS))
                if odd or not all(isinstance(source.get(k, ""), str) for k in SOURCE_KEYS):
                    raise _refusal(path, f"sources.{field} is {source!r:.60}",
                                   "give a source as {title, url} (two strings) or a catalog source's id")
                if not source.get("url"):
                    raise _refusal(path, f"sources.{field} gives no url", "give the https:// address of the page the "
                                   "figure comes from, or cite a catalog source's id")
                if not is_https(source["url"]):
                    raise _refusal(path, f"sources.{field} url {source['url']!r:.60} is not an https:// address",
                                   "give the https:// address of the page the figure comes from")
                source_id = f"{row.get('id')}:{field}"
                declared[source_id] = {key: source.get(key) for key in SOURCE_KEYS}
                cited[field] = source_id
            else:
                cited[field] = source
        row["sources"] = cited
    try:
        return DeviceSpec.from_json(row), declared
    except CatalogError as err:
        raise _refusal(path, str(err), _fix_of(err)) from None


def record_row(spec: DeviceSpec) -> dict[str, Any]:
    """A device as a catalog row (catalog.json's form), its unset optional fields left out."""
    row = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    row["aliases"] = list(spec.aliases)
    return {k: v for k, v in row.items() if v is not None and k != "core_limited_from"}


def listing_row(spec: DeviceSpec, registered: bool) -> dict[str, Any]:
    """A device as `zmlx-pipeline devices` lists it: its spec fields, aliases and whether the store registered it."""
    return {**spec.as_row(), "aliases": list(spec.aliases), "registered": registered}


def register_device(store: Store, path: str | Path, replace: bool = False) -> dict[str, Any]:
    """Register the device a record file describes in `store`: checked as the catalog's rows are (catalog.
    registration_problems: beside the catalog and the devices registered before it, no id or name any of them or
    the catalog's name rules take) and as the store's device rows are, then stored; DeviceRecordError (one line, with
    the fix) when refused, and nothing is stored. `replace`: a device registered under the record's id with another
    record takes this one (a figure mended), its measurements kept. Returns {"device": its listing row, "added":
    False when the same record was registered already or replaced, "replaced", "store": the store's path}."""
    path = Path(path)
    spec, declared = read_record(path)
    others = tuple(s for s in store.registered_devices() if s.id != spec.id)
    problems = registration_problems(spec, declared, others)
    if problems:
        raise _refusal(path, problems[0].text, problems[0].fix)
    problem = device_id_problem(spec.id)
    if problem is not None:
        raise _refusal(path, problem, "write the id as lower-case letters and digits joined by single hyphens "
                                      "(acme-x1)")
    row = {c: v for c, v in {**spec.as_row(), "device_id": spec.id}.items() if c in DEVICE_COLUMNS}
    record = {"device": record_row(spec), "sources": declared,
              "registered_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        state = store.register_device(row, record, replace)
    except BadDeviceRow as err:
        raise _refusal(path, str(err), "give the chip's own figure") from None
    return {"device": listing_row(spec, True), "added": state == "added", "replaced": state == "replaced",
            "store": str(store.path)}


def as_registered(device: Any, store: Store) -> Any:
    """A detected device the catalog does not know (a DetectedDevice) as the device registered in `store` under the
    name its backend reports, where one is of its backend and core count: collect then files its timings under the
    registered id, as import does. Else the device as it is (a core limit of a registered chip stays unknown)."""
    from zmlx_pipeline.data.catalog import AmbiguousDevice, UnknownDevice, resolve_device

    if getattr(device, "known", True) or not getattr(device, "reported_name", ""):
        return device
    registered = store.registered_devices()
    if not registered:
        return device
    try:
        spec = resolve_device(device.reported_name, registered)
    except (AmbiguousDevice, UnknownDevice, ValueError):
        return device
    if spec.backend != device.backend or device.gpu_cores not in (None, spec.gpu_cores):
        return device
    return dataclasses.replace(device, device_id=spec.id, spec=spec, known=True, gpu_cores=spec.gpu_cores,
                               registered=True)
