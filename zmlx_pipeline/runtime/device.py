"""Which device a lookup is for: the one given, else this process's GPU (detected once, MLX imported lazily)."""

from __future__ import annotations

import functools
import os
from typing import Any, Mapping

#: the project's hand-made chip default (catalog.json's `default_threadgroup` is 256 on every chip)
FALLBACK_THREADGROUP = 256

_CURRENT: list = []  # [device_id or None, why-not text, named by $ZMLX_PIPELINE_DEVICE]


def current_device_id() -> tuple[str | None, str]:
    """(catalog id of this process's GPU, "") or (None, why it is unknown); $ZMLX_PIPELINE_DEVICE overrides.

    A $ZMLX_PIPELINE_DEVICE that is empty or blank (only spaces) is treated as unset: the GPU is detected."""
    return current_device()[:2]  # type: ignore[return-value]


def current_device() -> tuple[str | None, str, bool]:
    """current_device_id and whether $ZMLX_PIPELINE_DEVICE named the device (a named device is checked as a given
    one: an unknown name is refused; a detected GPU the catalog does not know answers with the default)."""
    if _CURRENT:
        return _CURRENT[0], _CURRENT[1], _CURRENT[2]
    explicit = os.environ.get("ZMLX_PIPELINE_DEVICE")
    if explicit and explicit.strip():
        result: tuple[str | None, str, bool] = (explicit, "", True)
    else:
        try:
            from zmlx_pipeline.data.detect import detect_device

            detected = detect_device()
            if detected.backend == "cpu":
                result = (None, "no Metal or CUDA device in this process (MLX runs on the CPU)", False)
            elif not detected.known:
                result = (None, f"this GPU ({detected.reported_name or detected.device_id}) is not in the catalog",
                          False)
                _DETECTED[:] = [(detected.reported_name or "", detected.backend,
                                 getattr(detected, "gpu_cores", None))]
            else:
                result = (detected.device_id, "", False)
        except Exception as exc:  # noqa: BLE001 - no MLX, no backend: the lookup still answers, with a default
            result = (None, f"the device could not be detected ({type(exc).__name__}: {exc})", False)
    _CURRENT[:] = list(result)
    return result


def forget_current_device() -> None:
    """Detect again on the next lookup (tests, or after changing $ZMLX_PIPELINE_DEVICE)."""
    _CURRENT.clear()
    _DETECTED.clear()


#: (reported name, backend, core count) of the GPU this process detected when the catalog does not know it
_DETECTED: list[tuple[str, str, int | None]] = []


def registered_for_detected(profiles: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The id of the device a bundle holds as registered in its store (`devices add`: is_registered) under the name
    this process's GPU reports, by the device's name or an alias as the catalog compares names, of the GPU's backend
    and core count: the device whose tables a lookup then answers from. None when the GPU was not
    detected as one the catalog lacks, or no one such device fits."""
    if not _DETECTED:
        return None
    reported, backend, cores = _DETECTED[0]
    fits = [device_id for device_id in registered_named(profiles, reported)
            if profiles[device_id].get("backend") == backend
            and (cores is None or profiles[device_id].get("gpu_cores") == cores)]
    return fits[0] if len(fits) == 1 else None


def is_registered(profile: Any) -> bool:
    """Whether a bundle's profile is of a device registered in its store (`devices add`): of no catalog chip, listing
    its aliases (publish lists them, maybe none, for a registered device only; a GPU measured without a registration
    lists none), and no core limit (a limit is of a catalog chip). The one rule for lookups, detection, tune and the
    bundle's name checks (contents.registered_problem)."""
    return isinstance(profile, Mapping) and profile.get("in_catalog") is False \
        and isinstance(profile.get("aliases"), list) and not profile.get("core_limited_from")


def registered_named(profiles: Mapping[str, Mapping[str, Any]], name: str) -> tuple[str, ...]:
    """The ids of the registered devices (is_registered) of a bundle's profiles whose name or an alias is `name`,
    compared as the catalog compares names (catalog.normalize_name: case, punctuation and leading vendor words
    aside), in the profiles' order."""
    try:
        from zmlx_pipeline.data.catalog import normalize_name
    except ImportError:
        return ()
    wanted = normalize_name(name)
    if not wanted:
        return ()
    return tuple(device_id for device_id, p in profiles.items() if is_registered(p) and wanted in {
        normalize_name(n) for n in [p.get("name"), *(p.get("aliases") or ())] if isinstance(n, str)})


def catalog_id_row(device_id: str) -> dict[str, Any] | None:
    """The catalog row of this exact id (no name matching); None when the catalog has no such id."""
    try:
        from zmlx_pipeline.data.catalog import UnknownDevice, get_device
    except ImportError:
        return None
    try:
        return get_device(device_id).as_row()
    except UnknownDevice:
        return None


def mlx_not_on(row: Mapping[str, Any]) -> str:
    """Why MLX does not run on a catalog row's chip, as a message says it (its backend and architecture, and the chips
    MLX runs on); '' when it runs there. Publish makes lookup tables only for chips MLX runs on."""
    try:
        from zmlx_pipeline.data.catalog import mlx_not_on as why
    except ImportError:
        return ""
    return why(dict(row))


def catalog_candidates(name: str) -> tuple[str, ...]:
    """The ids of every catalog row a device name may stand for ("M3 Max": both binned M3 Max rows), in catalog order;
    the runtime's own reading, whatever the catalog's matcher picks among them."""
    try:
        from zmlx_pipeline.data import catalog
    except ImportError:
        return ()
    find = getattr(catalog, "device_candidates", None)
    try:
        if find is not None:
            return tuple(dict.fromkeys(spec.id for spec in find(name)))
        spec = catalog.match_device(name)
    except LookupError as exc:  # a matcher that refuses an ambiguous name says which ids it may be
        return tuple(getattr(exc, "candidates", ()) or ())
    return (spec.id,) if spec is not None else ()


def catalog_row(device_id: str) -> dict[str, Any] | None:
    """The catalog row of a device id or reported name (a core-limited id falls back to its base chip); None for a
    name that does not tell one chip ("M3 Max" is a 30- or a 40-core chip): never a guess among several."""
    for candidate in (device_id, device_id.split("@", 1)[0]):
        row = catalog_id_row(candidate)
        if row is not None:
            return row
    ids = catalog_candidates(device_id)
    if len(ids) != 1:
        return None
    try:
        from zmlx_pipeline.data.catalog import match_device

        spec = match_device(device_id)
    except (ImportError, LookupError):
        return None
    return spec.as_row() if spec is not None and spec.id == ids[0] else None


def family_base_row(family: str) -> dict | None:
    """The catalog row of a chip family's base chip ("M3": the full M3 of its binned variants), as ZMLX's
    `get_device_profile("M3")` means it; None when the catalog has no base chip of that family."""
    try:
        from zmlx_pipeline.data.catalog import load_catalog
    except ImportError:
        return None
    rows = [spec for spec in load_catalog()
            if spec.family.lower() == family and spec.variant.lower() in ("", "base")]
    return max(rows, key=lambda spec: spec.gpu_cores).as_row() if rows else None


def catalog_hint(text: str, limit: int = 3) -> tuple[str, ...]:
    """A few catalog ids for a device the catalog does not know: those holding its text, else those whose names
    hold its words, else the closest spellings."""
    try:
        from zmlx_pipeline.data.catalog import devices_named_within, load_catalog
    except ImportError:
        return ()
    ids = [spec.id for spec in load_catalog()]
    needle = text.strip().lower()
    found = [i for i in ids if needle and needle in i]
    if not found:
        try:
            found = list(devices_named_within(text, limit))
        except Exception:  # noqa: BLE001 - a hint only
            found = []
    if not found:
        import difflib

        found = difflib.get_close_matches(needle, ids, n=limit, cutoff=0.6)
    return tuple(found[:limit])


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
