"""Which device a lookup is for: the one given, else this process's GPU (detected once, MLX imported lazily)."""

from __future__ import annotations

import functools
import os
from typing import Any

#: the project's hand-made chip default (catalog.json's `default_threadgroup` is 256 on every chip)
FALLBACK_THREADGROUP = 256

_CURRENT: list = []  # [device_id or None, why-not text]


def current_device_id() -> tuple[str | None, str]:
    """(catalog id of this process's GPU, "") or (None, why it is unknown); $ZMLX_PIPELINE_DEVICE overrides."""
    if _CURRENT:
        return _CURRENT[0], _CURRENT[1]
    explicit = os.environ.get("ZMLX_PIPELINE_DEVICE")
    if explicit:
        result: tuple[str | None, str] = (explicit, "")
    else:
        try:
            from zmlx_pipeline.data.detect import detect_device

            detected = detect_device()
            if detected.backend == "cpu":
                result = (None, "no Metal or CUDA device in this process (MLX runs on the CPU)")
            elif not detected.known:
                result = (None, f"this GPU ({detected.reported_name or detected.device_id}) is not in the catalog")
            else:
                result = (detected.device_id, "")
        except Exception as exc:  # noqa: BLE001 - no MLX, no backend: the lookup still answers, with a default
            result = (None, f"the device could not be detected ({type(exc).__name__}: {exc})")
    _CURRENT[:] = list(result)
    return result


def forget_current_device() -> None:
    """Detect again on the next lookup (tests, or after changing $ZMLX_PIPELINE_DEVICE)."""
    _CURRENT.clear()


def catalog_row(device_id: str) -> dict[str, Any] | None:
    """The catalog row of a device id or reported name (a core-limited id falls back to its base chip)."""
    try:
        from zmlx_pipeline.data.catalog import UnknownDevice, get_device, match_device
    except ImportError:
        return None
    for candidate in (device_id, device_id.split("@", 1)[0]):
        try:
            return get_device(candidate).as_row()
        except UnknownDevice:
            pass
    spec = match_device(device_id)
    return spec.as_row() if spec is not None else None


def zmlx_names(family: str, variant: str, vendor: str | None) -> tuple[str, str]:
    """ZMLX's spelling of a chip: ("M3", "Max") for Apple, base chips with variant ""; others as catalogued."""
    if vendor == "apple":
        return family.upper(), "" if variant in ("", "base") else variant.capitalize()
    return family, variant


@functools.lru_cache(maxsize=None)
def zmlx_chip(device_id: str) -> str:
    """The chip part of ZMLX's cache key for a catalog id: `M3_Max`, `M3` on Apple chips (every binned core
    count of a chip shares it, as ZMLX's detection cannot tell them apart); the id itself elsewhere."""
    return zmlx_chips(device_id)[0]


@functools.lru_cache(maxsize=None)
def zmlx_chips(device_id: str) -> tuple[str, ...]:
    """Every chip name ZMLX may key this device's cache section by, the one it means first (`M3_Max`).

    ZMLX 0.10.0's detection takes the first name of its table found inside the CPU brand string, and
    the table lists "Apple M3" before "Apple M3 Max": on a Pro, Max or Ultra it reports the base chip,
    so its cache section there is `M3_<mlx>`; that name follows (a fixed detection would use the first)."""
    row = catalog_row(device_id) if device_id else None
    if row is None or row.get("vendor") != "apple":
        return (device_id,)
    family, variant = zmlx_names(str(row.get("family") or ""), str(row.get("variant") or ""), "apple")
    return (f"{family}_{variant}", family) if variant else (family,)
