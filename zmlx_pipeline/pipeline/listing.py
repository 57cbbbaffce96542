"""Rows for the listing commands (devices, kernels), kept out of the CLI so they can be tested and reused."""

from __future__ import annotations

import json
from typing import Any, Callable

from zmlx_pipeline.core.errors import SHOWN_CHARS, UnknownKernel, shown


def current_device() -> dict[str, Any]:
    """What this machine's MLX reports, matched to the catalog (a CPU-only machine is its own, unknown, device)."""
    from zmlx_pipeline.data.detect import detect_device

    try:
        dev = detect_device()
    except Exception as exc:  # noqa: BLE001 - MLX missing or broken: still list the catalog
        return {"device_id": None, "reported_name": None, "backend": None, "known": False, "error": str(exc)}
    return {"device_id": dev.device_id, "reported_name": dev.reported_name, "architecture": dev.architecture,
            "backend": dev.backend, "gpu_cores": dev.gpu_cores, "known": dev.known, "core_limited": dev.core_limited,
            "catalog_id": dev.spec.core_limited_from or dev.spec.id if dev.spec else None}


def device_listing(vendor: str | None = None, registered: tuple = ()) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The catalog rows, then the devices `registered` in the store (optionally one vendor's), each with `current` set
    on the row this machine matches and `registered` on those of the store."""
    from zmlx_pipeline.data.catalog import load_catalog
    from zmlx_pipeline.data.registered import listing_row

    current = current_device()
    rows = []
    for spec, mine in [*((s, False) for s in load_catalog()), *((s, True) for s in registered)]:
        if vendor and spec.vendor != vendor:
            continue
        rows.append({"current": spec.id == current.get("catalog_id"), **listing_row(spec, mine)})
    return rows, current


#: the most stored kernel names an unknown-kernel error lists (a store may hold hundreds)
LISTED_NAMES = 20


def kernel_listing(names: list[str], open_store: Callable[[], Any] = lambda: None) -> list[dict[str, Any]]:
    """One record per chosen kernel (all when `names` is empty): a registered kernel's description, or what the store
    holds of one only the store knows (an imported kernel). `open_store` gives the store or None, asked only when
    needed; UnknownKernel lists every known name for one neither knows."""
    from zmlx_pipeline.kernels.registry import get_kernel, registered_names

    registered = registered_names()
    if not names:
        records = [_registered_record(get_kernel(n), n) for n in registered]
        store = open_store()
        if store is not None:
            records += [stored_kernel_record(store, k) for k in store.kernel_names() if k not in registered]
        return records
    records, seen, store, opened = [], set(), None, False
    for name in names:
        if ":" in name or name in registered:
            record = _registered_record(get_kernel(name), name)
        else:
            if not opened:
                store, opened = open_store(), True
            if store is None or name not in store.kernel_names():
                raise UnknownKernel(_unknown(name, registered, store))
            record = stored_kernel_record(store, name)
        if record["name"] not in seen:  # one kernel named twice (by name and by module:attr) is listed once
            seen.add(record["name"])
            records.append(record)
    return records


def _registered_record(spec, asked: str) -> dict[str, Any]:
    """A registered kernel's description with where it comes from: built in, an entry point, or a module path."""
    from zmlx_pipeline.kernels.builtin import BUILTIN

    source = "module" if ":" in asked else "built-in" if spec.name in BUILTIN else "entry point"
    return {**spec.describe(), "source": source}


def _unknown(name: str, registered: list[str], store) -> str:
    """The unknown-kernel message: the registered names, then those only the store holds."""
    text = f"unknown kernel {shown(name)}; known kernels: {', '.join(registered)}"
    if store is not None:
        stored = [k for k in store.kernel_names() if k not in registered]
        if stored:
            listed = ", ".join(k if len(k) <= SHOWN_CHARS else shown(k) for k in stored[:LISTED_NAMES])
            more = f" and {len(stored) - LISTED_NAMES} more" if len(stored) > LISTED_NAMES else ""
            text += f"; in the store {store.path}: {listed}{more}"
    return text + " (or give a module:attr path)"


def stored_kernel_record(store, kernel: str) -> dict[str, Any]:
    """What the store holds of a kernel no registered spec describes: its parameters and shape dims with the values
    seen, rows per device, and the imports (format, file) and collect runs its rows came from."""
    contents = store.kernel_contents(kernel)
    devices: dict[str, dict[str, Any]] = {}
    for row in contents["devices"]:
        device = devices.setdefault(row["device"], {"device": row["device"], "rows": 0, "by_status": {}, "dtypes": []})
        device["rows"] += row["measurements"]
        device["dtypes"].append(row["dtype"])
        for status, n in row["by_status"].items():
            device["by_status"][status] = device["by_status"].get(status, 0) + n
    imports, collected = [], []
    for run in contents["runs"]:
        settings = run["settings"] or {}
        if run["status"] == "imported":
            imports.append({"file": settings.get("file"), "format": settings.get("format"), "device": run["device_id"],
                            "rows": run["rows"], "run_id": run["run_id"], "imported_at": run["finished_at"],
                            "first_measured_at": run["first_measured_at"], "last_measured_at": run["last_measured_at"],
                            # an import that records nothing of it was stamped with its own time, as every one once was
                            "measured_at_from": settings.get("measured_at_from", "import")})
        else:
            collected.append(run)
    source = " and ".join(w for w, runs in (("imported", imports), ("collected", collected)) if runs)
    dims = _values_seen(contents["shapes"])
    return {
        "name": kernel, "source": source, "store": str(store.path),
        "parameters": _values_seen(contents["configs"]), "configs": len(contents["configs"]),
        "shape_dims": list(dims), "dim_values": dims, "shapes": contents["shapes"],
        "dtypes": sorted({d for device in devices.values() for d in device["dtypes"]}),
        "kernel_versions": len(contents["kernel_versions"]),
        "devices": list(devices.values()), "imports": imports,
        "collected_runs": len(collected), "collected_rows": sum(run["rows"] for run in collected),
    }


def _values_seen(objects: list[dict]) -> dict[str, list]:
    """Every key of `objects` (configs or shapes) with the distinct values it holds, numbers first and ascending."""
    seen: dict[str, dict[str, Any]] = {}
    for obj in objects:
        for key, value in obj.items():
            seen.setdefault(key, {}).setdefault(json.dumps(value, sort_keys=True), value)
    return {key: sorted(values.values(), key=_value_order) for key, values in seen.items()}


def _value_order(value: Any) -> tuple:
    """Numbers ascending, then booleans, text, null and anything else (as its JSON)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value, "")
    rank = 1 if isinstance(value, bool) else 2 if isinstance(value, str) else 3 if value is None else 4
    return (rank, 0, value if isinstance(value, str) else json.dumps(value, sort_keys=True))
