"""The device catalog (catalog.json) as typed rows, and name matching that never picks a wrong chip."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

VENDORS = ("apple", "nvidia", "amd")
BACKENDS = ("metal", "cuda", "rocm")
CORE_UNITS = ("gpu_cores", "sms", "cus")
NUMERIC_FIELDS = (
    "gpu_cores",
    "memory_bandwidth_gbps",
    "max_threads_per_threadgroup",
    "simd_width",
    "threadgroup_memory_bytes",
    "l2_bytes",
    "clock_mhz",
    "fp32_tflops",
    "memory_gb",
    "default_threadgroup",
)
# Leading words that say who made the chip, not which chip it is.
VENDOR_PREFIXES = ("nvidia", "amd", "apple")
# Apple's GPU architecture name as Metal reports it (MTLDevice.architecture.name, MLX's
# device_info()["architecture"]): "applegpu_g" + generation (13 = M1 ... 17 = M5) + tier letter
# (p phone, g base, s Pro and Max, c M1 Max, d Ultra; notes/apple-gpu-arch.md).
GPU_ARCH = re.compile(r"applegpu_g(\d{2})([a-z])")


class UnknownDevice(LookupError):
    "No catalog row matches this device"


class CatalogError(ValueError):
    "The catalog data is inconsistent"


@dataclass(frozen=True)
class DeviceSpec:
    """One catalog row: what a device is and the spec figures the model uses as features."""

    id: str
    name: str
    vendor: str
    family: str
    variant: str
    backend: str
    architecture: str
    gpu_cores: int
    core_unit: str
    memory_bandwidth_gbps: float
    max_threads_per_threadgroup: int
    simd_width: int
    threadgroup_memory_bytes: int
    l2_bytes: int
    clock_mhz: int
    memory_gb: float
    default_threadgroup: int
    fp32_tflops: float | None = None
    aliases: tuple[str, ...] = ()
    notes: str | None = None
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    core_limited_from: str | None = None
    gpu_arch: str | None = None  # Apple rows: the architecture name Metal reports, e.g. "applegpu_g15s"

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> "DeviceSpec":
        """A spec from one `devices` entry of catalog.json (unknown keys are an error)."""
        known = {f.name for f in dataclasses.fields(cls)}
        extra = set(row) - known
        if extra:
            raise CatalogError(f"device {row.get('id')!r}: unknown fields {sorted(extra)}")
        data = dict(row)
        data["aliases"] = tuple(data.get("aliases", ()))
        data["sources"] = dict(data.get("sources", {}))
        return cls(**data)

    def as_row(self) -> dict[str, Any]:
        """Flat spec fields for the store's `devices` table (no sources, aliases or notes)."""
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in ("aliases", "sources", "notes"):
            row.pop(key)
        return row

    def with_core_limit(self, cores: int, reported_name: str | None = None) -> "DeviceSpec":
        """This device limited to `cores` SMs/cores (e.g. CUDA MPS), recorded as a device of its own."""
        if cores <= 0:
            raise ValueError(f"core limit must be positive, got {cores}")
        return dataclasses.replace(
            self,
            id=f"{self.id}@{cores}sm",
            name=f"{reported_name or self.name} [{cores} SMs]",
            gpu_cores=cores,
            aliases=(),
            core_limited_from=self.id,
        )


def normalize_name(name: str) -> str:
    """Lower-case words of a device name, punctuation and leading vendor words removed."""
    text = name.lower().replace("(tm)", " ").replace("(r)", " ")
    words = [w.strip(".") for w in re.split(r"[^a-z0-9.]+", text) if w.strip(".")]
    while words and words[0] in VENDOR_PREFIXES:
        words = words[1:]
    return " ".join(words)


def arch_generation(gpu_arch: str | None) -> int | None:
    """The GPU generation of an Apple architecture name ("applegpu_g15s" -> 15); None for any other text."""
    found = GPU_ARCH.fullmatch(str(gpu_arch or "").strip().lower())
    return int(found.group(1)) if found else None


def _token_key(name: str) -> str:
    """Order-free form of a normalised name (vendor words dropped anywhere), for the token-set fallback."""
    return " ".join(sorted(set(normalize_name(name).split()) - set(VENDOR_PREFIXES)))


@lru_cache(maxsize=1)
def _load() -> tuple[dict[str, Any], tuple[DeviceSpec, ...]]:
    """The parsed JSON and its rows, read once from the installed package data."""
    text = resources.files("zmlx_pipeline.data").joinpath("catalog.json").read_text(encoding="utf-8")
    raw = json.loads(text)
    if raw.get("schema") != 1:
        raise CatalogError(f"unsupported catalog schema {raw.get('schema')!r}")
    return raw, tuple(DeviceSpec.from_json(row) for row in raw["devices"])


def load_catalog() -> tuple[DeviceSpec, ...]:
    """Every catalog row, in file order (cached)."""
    return _load()[1]


def catalog_sources() -> dict[str, dict[str, Any]]:
    """The catalog's declared sources, by id."""
    return _load()[0]["sources"]


@lru_cache(maxsize=1)
def _by_id() -> dict[str, DeviceSpec]:
    return {spec.id: spec for spec in load_catalog()}


@lru_cache(maxsize=1)
def _indexes() -> tuple[dict[str, tuple[DeviceSpec, ...]], dict[str, tuple[DeviceSpec, ...]]]:
    """Normalised-name and token-set indexes over names and aliases; a key may hold binned variants."""
    exact: dict[str, list[DeviceSpec]] = {}
    tokens: dict[str, list[DeviceSpec]] = {}
    for spec in load_catalog():
        for label in (spec.name, *spec.aliases):
            for index, key in ((exact, normalize_name(label)), (tokens, _token_key(label))):
                bucket = index.setdefault(key, [])
                if spec not in bucket:
                    bucket.append(spec)
    return ({k: tuple(v) for k, v in exact.items()}, {k: tuple(v) for k, v in tokens.items()})


def get_device(device_id: str) -> DeviceSpec:
    """The row with this id; UnknownDevice (naming close ids) when there is none."""
    try:
        return _by_id()[device_id]
    except KeyError:
        close = difflib.get_close_matches(device_id, list(_by_id()), n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownDevice(f"no catalog device with id {device_id!r}{hint}") from None


def _pick(candidates: tuple[DeviceSpec, ...], gpu_cores: int | None) -> DeviceSpec | None:
    """One row among a name's candidates: binned variants are told apart by core count."""
    if len(candidates) == 1 and candidates[0].vendor != "apple":
        return candidates[0]  # a reported core count below the row's is a core limit, handled by detect
    if gpu_cores is None:
        return max(candidates, key=lambda spec: spec.gpu_cores)
    matching = [spec for spec in candidates if spec.gpu_cores == gpu_cores]
    return matching[0] if len(matching) == 1 else None


def match_device(name: str, gpu_cores: int | None = None) -> DeviceSpec | None:
    """The row whose name or alias is this reported name (whole-name match, never a substring); else None."""
    if not name or not name.strip():
        return None
    exact, tokens = _indexes()
    candidates = exact.get(normalize_name(name)) or tokens.get(_token_key(name))
    return _pick(candidates, gpu_cores) if candidates else None


@lru_cache(maxsize=1)
def _by_generation() -> dict[int, tuple[DeviceSpec, ...]]:
    """Apple rows by the generation of their `gpu_arch`."""
    index: dict[int, list[DeviceSpec]] = {}
    for spec in load_catalog():
        generation = arch_generation(spec.gpu_arch)
        if generation is not None:
            index.setdefault(generation, []).append(spec)
    return {k: tuple(v) for k, v in index.items()}


def match_gpu_arch(gpu_arch: str, gpu_cores: int | None = None) -> DeviceSpec | None:
    """The Apple row a reported architecture name and core count identify; None when they name no row or several.

    Within a generation every row has its own core count (validate_catalog checks it), so generation and
    cores decide; the tier letter is not needed for that, which keeps a chip whose letter differs from
    the catalog's (Pro and Max share "s") matched. Without a core count only the exact name counts, and
    only when it names one chip (its binned variants: the full chip, as match_device does).
    """
    generation = arch_generation(gpu_arch)
    rows = _by_generation().get(generation, ()) if generation is not None else ()
    if gpu_cores is not None:
        same = [spec for spec in rows if spec.gpu_cores == gpu_cores]
        return same[0] if len(same) == 1 else None
    exact = [spec for spec in rows if spec.gpu_arch == gpu_arch.strip().lower()]
    if not exact or len({spec.name for spec in exact}) > 1:
        return None
    return max(exact, key=lambda spec: spec.gpu_cores)


def validate_catalog(devices: tuple[DeviceSpec, ...] | None = None, sources: dict[str, Any] | None = None) -> list[str]:
    """Problems in the catalog (empty when sound): ids, aliases, figures and their citations."""
    devices = load_catalog() if devices is None else devices
    sources = catalog_sources() if sources is None else sources
    problems: list[str] = []
    seen_ids: set[str] = set()
    label_owner: dict[str, DeviceSpec] = {}
    for spec in devices:
        where = f"device {spec.id!r}"
        if spec.id in seen_ids:
            problems.append(f"{where}: duplicate id")
        seen_ids.add(spec.id)
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", spec.id):
            problems.append(f"{where}: id is not a slug")
        if spec.vendor not in VENDORS or spec.backend not in BACKENDS or spec.core_unit not in CORE_UNITS:
            problems.append(f"{where}: bad vendor/backend/core_unit")
        for fname in NUMERIC_FIELDS:
            value = getattr(spec, fname)
            if value is None and fname == "fp32_tflops":
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                problems.append(f"{where}: {fname} must be a positive number, got {value!r}")
            elif fname not in spec.sources:
                problems.append(f"{where}: {fname} cites no source")
        if "architecture" not in spec.sources:
            problems.append(f"{where}: architecture cites no source")
        for fname, source_id in spec.sources.items():
            if source_id not in sources:
                problems.append(f"{where}: {fname} cites undeclared source {source_id!r}")
        for label in (spec.name, *spec.aliases):
            for key in {normalize_name(label), "tokens:" + _token_key(label)}:
                owner = label_owner.setdefault(key, spec)
                # Only binned variants of one chip (same name, different core counts) may share a label.
                if owner is not spec and (owner.name != spec.name or owner.gpu_cores == spec.gpu_cores):
                    problems.append(f"{where}: name/alias {label!r} also names {owner.id!r}")
    all_aliases = [alias for spec in devices for alias in spec.aliases]
    for alias in sorted({a for a in all_aliases if all_aliases.count(a) > 1}):
        problems.append(f"alias {alias!r} is listed by more than one device")
    problems += _gpu_arch_problems(devices)
    for source_id, source in sources.items():
        if not source.get("title"):
            problems.append(f"source {source_id!r}: no title")
    return problems


def _gpu_arch_problems(devices: tuple[DeviceSpec, ...]) -> list[str]:
    """`gpu_arch`: on every Apple row and no other, well formed, cited, one generation per family, and one
    row per (generation, core count), which is what match_gpu_arch relies on."""
    problems: list[str] = []
    family_generation: dict[str, int] = {}
    owner: dict[tuple[int, int], DeviceSpec] = {}
    for spec in devices:
        where = f"device {spec.id!r}"
        if spec.vendor != "apple":
            if spec.gpu_arch is not None:
                problems.append(f"{where}: gpu_arch is for Apple rows only")
            continue
        generation = arch_generation(spec.gpu_arch)
        if generation is None or spec.gpu_arch != spec.gpu_arch.lower():
            problems.append(f"{where}: gpu_arch must look like 'applegpu_g15s', got {spec.gpu_arch!r}")
            continue
        if "gpu_arch" not in spec.sources:
            problems.append(f"{where}: gpu_arch cites no source")
        if family_generation.setdefault(spec.family, generation) != generation:
            problems.append(f"{where}: gpu_arch generation {generation} differs from the rest of family "
                            f"{spec.family!r} ({family_generation[spec.family]})")
        other = owner.setdefault((generation, spec.gpu_cores), spec)
        if other is not spec:
            problems.append(f"{where}: generation {generation} with {spec.gpu_cores} cores also names {other.id!r}")
    return problems
