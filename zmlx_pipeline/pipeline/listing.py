"""Rows for the listing commands (devices), kept out of the CLI so they can be tested and reused."""

from __future__ import annotations

from typing import Any


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


def device_listing(vendor: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The catalog rows (optionally one vendor's), each with `current` set on the row this machine matches."""
    from zmlx_pipeline.data.catalog import load_catalog

    current = current_device()
    rows = []
    for spec in load_catalog():
        if vendor and spec.vendor != vendor:
            continue
        row = {"current": spec.id == current.get("catalog_id"), **spec.as_row(), "aliases": list(spec.aliases)}
        rows.append(row)
    return rows, current
