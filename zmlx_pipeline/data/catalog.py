"""The device catalog (catalog.json) as typed rows, and name matching that never picks a wrong chip.

Why one long module: every way a name becomes a row (an id, a core-limited id, a name as people write it, a
reported name with a core count) shares the catalog's indexes and the rule that a name telling no one chip
resolves to none; split apart, one path could guess where another refuses.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import unicodedata
import urllib.parse
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, NamedTuple

from zmlx_pipeline.core.chips import binned_variants
from zmlx_pipeline.core.errors import ZmlxPipelineError

VENDORS = ("apple", "nvidia", "amd")
BACKENDS = ("metal", "cuda", "rocm")
CORE_UNITS = ("gpu_cores", "sms", "cus")
#: a core unit as a message says it
CORE_UNIT_WORDS = {"gpu_cores": "GPU cores", "sms": "SMs", "cus": "compute units"}
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


class UnknownDevice(ZmlxPipelineError, LookupError):
    "No catalog row matches this device"


class CatalogError(ZmlxPipelineError, ValueError):
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
        """A spec from one `devices` entry of catalog.json (an unknown or a missing field is an error, naming it)."""
        if not isinstance(row, dict):
            raise CatalogError(f"a device is a JSON object of its fields, not {type(row).__name__}")
        fields = dataclasses.fields(cls)
        extra = set(row) - {f.name for f in fields}
        if extra:
            raise CatalogError(f"device {row.get('id')!r}: unknown fields {sorted(extra)}")
        missing = [f.name for f in fields if f.name not in row and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise CatalogError(f"device {row.get('id')!r}: missing field{'s' if len(missing) > 1 else ''} "
                               f"{', '.join(missing)}")
        data = dict(row)
        for key, kind in (("aliases", list), ("sources", dict)):
            if not isinstance(data.get(key, kind()), kind):
                raise CatalogError(f"device {row.get('id')!r}: {key} is {type(data[key]).__name__}, not a JSON "
                                   f"{'list of names' if kind is list else 'object of field: source'}")
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


@lru_cache(maxsize=1)
def _name_rules() -> dict[str, Any]:
    """device_names.json: brand and form-factor words, the memory and gfx patterns, token rewrites."""
    text = resources.files("zmlx_pipeline.data").joinpath("device_names.json").read_text(encoding="utf-8")
    raw = json.loads(text)
    return {
        "brands": dict(raw["brand_words"]),
        "forms": frozenset(raw["form_factor_words"]),
        "memory": re.compile(raw["memory_pattern"]),
        "gfx": re.compile(raw["gfx_pattern"]),
        "rewrites": tuple((re.compile(r["pattern"]), r["replace"]) for r in raw["token_rewrites"]),
    }


def name_tokens(name: str) -> list[str]:
    """The words of a device name as people write it, split and rewritten, brand words dropped anywhere.

    "NVIDIA GeForce GTX 1080Ti" and "GTX 1080 Ti" both give gtx, 1080, ti (device_names.json says how).
    """
    rules = _name_rules()
    pending = list(reversed(normalize_name(name).split()))
    tokens: list[str] = []
    while pending:
        word = pending.pop()
        for pattern, replace in rules["rewrites"]:
            rewritten = pattern.sub(replace, word)
            if rewritten != word:
                pending.extend(reversed(rewritten.split()))
                break
        else:
            if word not in rules["brands"]:
                tokens.append(word)
    return tokens


def _vendors_named(name: str) -> frozenset[str]:
    """The vendors a name's brand words say it is from (NVIDIA, GeForce, Tesla -> nvidia); empty when none."""
    brands = _name_rules()["brands"]
    words = re.split(r"[^a-z0-9]+", name.lower())
    return frozenset(brands[w] for w in words if w in brands)


def _token_key(name: str) -> str:
    """Order-free form of a name's tokens (brand words dropped, suffixes split), for the token-set fallback."""
    return " ".join(sorted(set(name_tokens(name))))


def _qualified(tokens: list[str]) -> tuple[str, int | None, frozenset[str]]:
    """(base key, memory in GB, form factors) of a name's tokens: what the chip is, and what narrows it."""
    rules = _name_rules()
    memory, forms, base = None, set(), set()
    for token in tokens:
        size = rules["memory"].match(token)
        if size:
            memory = int(size.group(1))
        elif token in rules["forms"]:
            forms.add("pcie" if token == "pci" else token)
        else:
            base.add(token)
    return " ".join(sorted(base)), memory, frozenset(forms)


def _form_fits(asked: frozenset[str], row_forms: frozenset[str]) -> bool:
    """A row fits the asked form factors when it names none, or names each one asked (sxm fits sxm2/sxm4/sxm5)."""
    if not asked or not row_forms:
        return True
    return all(any(r == a or (a == "sxm" and r.startswith("sxm")) for r in row_forms) for a in asked)


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


def mlx_runs_on(row: Any) -> bool:
    """Whether MLX runs on a chip (a catalog, registered or store row: its `backend` and `architecture`): a backend
    MLX has and, on CUDA, a compute capability its CUDA build supports (catalog.json's `mlx`). Publish makes lookup
    tables only for such chips; a bundle answers any other with the default config, saying why."""
    from zmlx_pipeline.core.constraints import cuda_arch

    get = row.get if isinstance(row, dict) else lambda name: getattr(row, name, None)
    rule = _load()[0]["mlx"]["backends"].get(get("backend"))
    if rule is None:
        return False
    least = rule.get("min_compute_capability")
    return least is None or cuda_arch(get("architecture")) >= least


def mlx_chips_text() -> str:
    """The chips MLX runs on, as a message says it: `metal and cuda at sm_75 or newer`."""
    parts = [f"{backend} at sm_{rule['min_compute_capability']} or newer" if rule.get("min_compute_capability")
             else backend for backend, rule in _load()[0]["mlx"]["backends"].items()]
    return " and ".join(parts)


def mlx_not_on(row: dict[str, Any]) -> str:
    """Why MLX does not run on a row's chip, as a message says it: `cuda sm_61; MLX runs on metal and cuda at sm_75 or
    newer`; '' when it runs there."""
    if mlx_runs_on(row):
        return ""
    chip = " ".join(str(row[k]) for k in ("backend", "architecture") if row.get(k)) or "no backend"
    return f"{chip}; MLX runs on {mlx_chips_text()}"


@lru_cache(maxsize=1)
def _by_id() -> dict[str, DeviceSpec]:
    return {spec.id: spec for spec in load_catalog()}


@lru_cache(maxsize=8)
def _indexes(rows: tuple[DeviceSpec, ...] | None = None) -> tuple[
        dict[str, tuple[DeviceSpec, ...]], dict[str, tuple[DeviceSpec, ...]], dict[str, tuple[DeviceSpec, ...]],
        dict[str, frozenset[str]]]:
    """Indexes over the names and aliases of `rows` (the catalog's when None): normalised name, token set, and base
    (token set without form factor and memory, each row with the form factors its labels name); a key may hold
    binned variants."""
    exact: dict[str, list[DeviceSpec]] = {}
    tokens: dict[str, list[DeviceSpec]] = {}
    base: dict[str, list[DeviceSpec]] = {}
    forms: dict[str, set[str]] = {}
    for spec in load_catalog() if rows is None else rows:
        for label in (spec.name, *spec.aliases):
            base_key, _, label_forms = _qualified(name_tokens(label))
            forms.setdefault(spec.id, set()).update(label_forms)
            for index, key in ((exact, normalize_name(label)), (tokens, _token_key(label)), (base, base_key)):
                bucket = index.setdefault(key, [])
                if spec not in bucket:
                    bucket.append(spec)
    frozen = [{k: tuple(v) for k, v in index.items()} for index in (exact, tokens, base)]
    return (*frozen, {k: frozenset(v) for k, v in forms.items()})


class AmbiguousDevice(UnknownDevice):
    """A name that does not tell one catalog row; `candidates` holds the ids it may stand for."""

    def __init__(self, name: str, candidates: tuple[DeviceSpec, ...]) -> None:
        self.name = name
        self.candidates = tuple(dict.fromkeys(spec.id for spec in candidates))
        super().__init__(f"{name!r} does not name one catalog device (it may be {', '.join(self.candidates)})")


def _labelled_qualifiers(spec: DeviceSpec) -> tuple[bool, bool]:
    """Whether every label of a row names its memory size, and whether every label names a form factor."""
    qualified = [_qualified(name_tokens(label)) for label in (spec.name, *spec.aliases)]
    return all(q[1] is not None for q in qualified), all(q[2] for q in qualified)


def _candidates(name: str, rows: tuple[DeviceSpec, ...] | None = None) -> tuple[tuple[DeviceSpec, ...], bool]:
    """(rows the name may stand for, among `rows` (the catalog's when None), whether the name tells them): the first
    rule that finds any decides.

    In order: the whole normalised name or alias; its token set (order, brand words, joined suffixes
    ignored); an AMD gfx architecture name (gfx90a: every board built on that die, so never told);
    the chip without form factor and memory, narrowed by the form factor and memory the name gives,
    told only when the name gives each one the row is always named with. Brand words narrow every
    rule to their vendor. Never a substring: "RTX 3060 Laptop" is not an RTX 3060.
    """
    if not name or not name.strip():
        return (), False
    exact, tokens, base, forms = _indexes(rows)
    vendors = _vendors_named(name)

    def of_vendor(found) -> tuple[DeviceSpec, ...]:
        return tuple(spec for spec in found or () if not vendors or spec.vendor in vendors)

    found = of_vendor(exact.get(normalize_name(name))) or of_vendor(tokens.get(_token_key(name)))
    if found:
        return found, True
    words = name_tokens(name)
    if words and _name_rules()["gfx"].match(words[0]):
        return of_vendor(spec for spec in (load_catalog() if rows is None else rows)
                         if spec.architecture == words[0]), False
    base_key, memory, asked = _qualified(words)
    found = of_vendor(
        spec for spec in base.get(base_key, ())
        if (memory is None or round(spec.memory_gb) == memory) and _form_fits(asked, forms[spec.id])
    )
    if len({spec.name for spec in found}) != 1:
        return found, False
    needs_memory, needs_form = _labelled_qualifiers(found[0])
    return found, (memory is not None or not needs_memory) and (bool(asked) or not needs_form)


def device_candidates(name: str) -> tuple[DeviceSpec, ...]:
    """Every catalog row a reported name may stand for (see _candidates for the rules)."""
    return _candidates(name)[0]


def get_device(device_id: str) -> DeviceSpec:
    """The row with this id; UnknownDevice (naming close ids) when there is none."""
    try:
        return _by_id()[device_id]
    except KeyError:
        close = difflib.get_close_matches(device_id, list(_by_id()), n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownDevice(f"no catalog device with id {device_id!r}{hint}") from None


def _pick(candidates: tuple[DeviceSpec, ...], gpu_cores: int | None, full_chip: bool = False) -> DeviceSpec | None:
    """One row among a name's candidates: binned variants are told apart by core count; without one, None (a
    name of binned variants does not tell which), or the full chip when the caller asks for it (`full_chip`)."""
    if len(candidates) == 1 and candidates[0].vendor != "apple":
        if gpu_cores is not None and gpu_cores > candidates[0].gpu_cores:
            return None  # more cores than the chip has: another chip of that name (match_device_by_cores)
        return candidates[0]  # a reported core count below the row's is a core limit, handled by detect
    if gpu_cores is None:
        if len(candidates) == 1 or full_chip:
            return max(candidates, key=lambda spec: spec.gpu_cores)
        return None
    matching = [spec for spec in candidates if spec.gpu_cores == gpu_cores]
    return matching[0] if len(matching) == 1 else None


def devices_named_within(name: str, limit: int = 6) -> tuple[str, ...]:
    """Ids of rows whose name or an alias holds every word of `name` but its memory and form factor ("RTX 6000"
    -> the RTX 6000 Ada, "P100 12GB" -> the P100 rows): a hint for an unknown name, never a match."""
    words = set(_qualified(name_tokens(name))[0].split())
    vendors = _vendors_named(name)
    if not words:
        return ()
    found = [spec.id for spec in load_catalog() if (not vendors or spec.vendor in vendors)
             and any(words <= set(name_tokens(label)) for label in (spec.name, *spec.aliases))]
    return tuple(dict.fromkeys(found))[:limit]


def match_device(name: str, gpu_cores: int | None = None) -> DeviceSpec | None:
    """The one row this reported name stands for; None when it fits none, or does not tell which.

    Without a core count, a name of binned variants ("Apple M3 Max": 30 or 40 cores) gives the full chip: what
    detection records when the core count cannot be read. resolve_device, which resolves what a person or a file
    names, refuses such a name instead (and so does the runtime for a device its caller names).
    """
    candidates, told = _candidates(name)
    if not candidates or not told or len({spec.name for spec in candidates}) > 1:
        return None
    return _pick(candidates, gpu_cores, full_chip=True)


def match_device_by_cores(name: str, gpu_cores: int | None) -> DeviceSpec | None:
    """The row among the chips a name fits (told or not) whose full core count is the one the driver reports: the
    driver names both H800s "NVIDIA H800", and only their SM counts (132, 114) tell them apart. None when no row or
    several have that count; a count below every row's (an MPS limit) tells nothing."""
    if gpu_cores is None:
        return None
    candidates, _ = _candidates(name)
    _, _, base, _ = _indexes()
    vendors = _vendors_named(name)
    # then the rows named with a memory size the driver leaves out ("GeForce GTX 1050" for the 3GB board)
    alike = tuple(spec for spec in base.get(_qualified(name_tokens(name))[0], ())
                  if not vendors or spec.vendor in vendors)
    for rows in (candidates, alike):
        same = {spec.id: spec for spec in rows if spec.vendor != "apple" and spec.gpu_cores == gpu_cores}
        if same:
            return next(iter(same.values())) if len(same) == 1 else None
    return None


#: a core-limited device id: a catalog id and the SMs the run was limited to (CUDA MPS), `nvidia-h200@66sm`
CORE_LIMITED_ID = re.compile(r"(.+)@([1-9][0-9]*)sm")


def core_limited_device(device_id: str, registered: tuple[DeviceSpec, ...] = ()) -> DeviceSpec | None:
    """The row of a core-limited id (`<catalog id>@<N>sm`, as collect names an MPS-limited run: with_core_limit; the
    chip may be named as people write it, `NVIDIA H200@66sm`); None for text of another form; UnknownDevice when its
    base names no one catalog chip (saying so of a device `registered` in the store), a core-limited id (a limit is of
    a chip), a chip whose cores are not SMs (Apple, AMD: an MPS limit is NVIDIA's), or N is not below its count."""
    limited = CORE_LIMITED_ID.fullmatch(device_id)
    if limited is None:
        return None
    try:
        base = get_device(limited.group(1))
    except UnknownDevice as no_id:  # the chip by its name as people write it (`NVIDIA H200@66sm`), as summary reads it
        try:
            base = resolve_device(limited.group(1))
        except AmbiguousDevice:
            raise
        except UnknownDevice:
            mine = _registered_device(limited.group(1), registered)
            if mine is not None:
                raise UnknownDevice(f"{device_id[:80]!r} limits {mine.id}, a device registered in the store; a core "
                                    f"limit (@<N>sm) is only of a catalog chip (give {mine.id})") from None
            raise no_id from None  # the id's own message, with the ids close to it
    if len(limited.group(2)) > 6:  # past any chip's cores, and past what int() reads at 4,300 digits
        raise UnknownDevice(f"{device_id[:80]!r} limits {base.id} to a number of {len(limited.group(2))} digits, more "
                            f"SMs than any chip has; it has {base.gpu_cores} (a core limit is below that)")
    cores = int(limited.group(2))
    if base.core_limited_from is not None:  # `nvidia-h200@66sm@32sm`: a limit of a limit would be stored as a device
        raise UnknownDevice(f"{device_id[:80]!r} limits {base.id}, which is already core-limited; a core limit is of "
                            f"a chip (give {base.core_limited_from}@{cores}sm)")
    if base.core_unit != "sms" or base.vendor != "nvidia":
        raise UnknownDevice(f"{device_id!r} limits {base.id} to {cores} SMs, but its cores are {CORE_UNIT_WORDS.get(base.core_unit, base.core_unit)}, not "
                            "SMs; a core limit (@<N>sm, CUDA MPS) is only of an NVIDIA chip (give the chip's own id)")
    if cores >= base.gpu_cores:
        raise UnknownDevice(f"{device_id!r} limits {base.id} to {cores} SMs, but it has {base.gpu_cores}; a core "
                            "limit is below the chip's count (give the chip's own id for the whole chip)")
    return base.with_core_limit(cores)


def hidden_character_problem(text: str) -> str | None:
    """Why a device name or id as a person gives it cannot be matched as written: it holds a control or format
    character (Unicode Cc, Cf: a NUL, a zero-width space), or text that Unicode normalisation (NFKC) writes
    otherwise ("ｎｖｉｄｉａ", fullwidth); the name rules would drop such characters and match what is left."""
    hidden = [c for c in text if unicodedata.category(c) in ("Cc", "Cf")]
    if hidden:
        return (f"{text!r} holds a control or format character (U+{ord(hidden[0]):04X}); write the name or id "
                "without it")
    plain = unicodedata.normalize("NFKC", text)
    if plain != text:
        return f"{text!r} holds characters Unicode writes otherwise (as {plain!r}); write it in plain characters"
    return None


def resolve_device(name_or_id: str, registered: tuple[DeviceSpec, ...] = ()) -> DeviceSpec:
    """The row of a catalog id, a core-limited catalog id (`nvidia-h200@66sm`) or a device name as people write it.

    UnknownDevice when nothing fits, AmbiguousDevice (listing the ids) when the name does not tell
    which row: a name is never resolved to a guess, nor is one of binned variants ("Apple M1 Pro": 14 or 16
    cores) to the full chip. A name the catalog lists as an alias is that row ("H100 SXM5"); no alias is a
    family name of several chips (a bare "A100" is any of four). `registered`: devices the catalog lacks, registered
    in a store, tried by their id and names only where no catalog chip fits, so they never stand for one.
    """
    try:
        return get_device(name_or_id)
    except UnknownDevice:
        pass
    limited = core_limited_device(name_or_id, registered)
    if limited is not None:
        return limited
    candidates, told = _candidates(name_or_id)
    if not candidates:
        spec = _registered_device(name_or_id, registered)
        if spec is not None:
            return spec
        within = devices_named_within(name_or_id)
        hint = f" (catalog devices whose names hold it: {', '.join(within)})" if within else ""
        also = ", nor one registered in the store" if registered else ""
        raise UnknownDevice(f"{name_or_id!r} is neither a catalog id nor a catalog device name{also}{hint}")
    spec = _pick(candidates, None) if told and len({spec.name for spec in candidates}) == 1 else None
    if spec is None:
        raise AmbiguousDevice(name_or_id, candidates)
    return spec


def _registered_device(name_or_id: str, registered: tuple[DeviceSpec, ...]) -> DeviceSpec | None:
    """The registered device of this id, or of this name by the catalog's name rules over the registered rows; None
    when none fits, AmbiguousDevice when the name does not tell one of them."""
    if not registered:
        return None
    for spec in registered:
        if spec.id == name_or_id:
            return spec
    candidates, told = _candidates(name_or_id, tuple(registered))
    if not candidates:
        return None
    spec = _pick(candidates, None) if told and len({spec.name for spec in candidates}) == 1 else None
    if spec is None:
        raise AmbiguousDevice(name_or_id, candidates)
    return spec


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
    only when it names one chip (its binned variants: the full chip, as match_device does without cores).
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


class Problem(NamedTuple):
    """One thing wrong with catalog rows (or a device's record): what, and how to put it right."""

    text: str
    fix: str


#: the text fields of a row (each a non-empty string)
TEXT_FIELDS = ("id", "name", "vendor", "family", "variant", "backend", "architecture", "core_unit")
#: the figures that count things: whole numbers (the store holds them as integers)
WHOLE_FIELDS = ("gpu_cores", "max_threads_per_threadgroup", "simd_width", "threadgroup_memory_bytes", "l2_bytes",
                "default_threadgroup")
#: the most a count may be (a 32-bit integer, as the store holds it)
MAX_COUNT = 2**31 - 1
_CHOICES = (("vendor", VENDORS), ("backend", BACKENDS), ("core_unit", CORE_UNITS))
#: each vendor's backend and core unit (a row pairing them otherwise describes no chip a backend runs)
VENDOR_KIND = {"apple": ("metal", "gpu_cores"), "nvidia": ("cuda", "sms"), "amd": ("rocm", "cus")}
#: the fields a row's `sources` may cite: each but its id and what cites or derives (sources, core_limited_from)
CITED_FIELDS = frozenset(f.name for f in dataclasses.fields(DeviceSpec)) - {"id", "sources", "core_limited_from"}
#: the most characters of an id, name or alias (the catalog's longest name has 55): one a message can repeat
NAME_CHARS = 120


def _text_problem(spec: DeviceSpec) -> Problem | None:
    """The first field of a row that is not of its kind (text, a list of names, a map of field to source id)."""
    where = f"device {spec.id!r}"
    for fname in TEXT_FIELDS:
        value = getattr(spec, fname)
        if not isinstance(value, str) or not value.strip():
            return Problem(f"{where}: {fname} must be text, got {value!r:.60}", f"give {fname} as a non-empty string")
    for fname in ("notes", "gpu_arch"):
        if getattr(spec, fname) is not None and not isinstance(getattr(spec, fname), str):
            return Problem(f"{where}: {fname} must be text, got {getattr(spec, fname)!r:.60}",
                           f"give {fname} as a string, or leave it out")
    bad = next((a for a in spec.aliases if not isinstance(a, str) or not a.strip()), None)
    if bad is not None:
        return Problem(f"{where}: alias {bad!r:.60} is not a name", "list each alias as a non-empty string")
    for fname, value in (*((f, getattr(spec, f)) for f in TEXT_FIELDS), *(("alias", a) for a in spec.aliases)):
        # a zero-width or fullwidth name would read as another (a catalog chip's) once the name rules fold it
        hidden = next((c for c in value if unicodedata.category(c) == "Cf"), None)
        if hidden is not None:
            return Problem(f"{where}: {fname} {value!r:.60} holds a format character (U+{ord(hidden):04X}, "
                           "zero-width)", f"write {fname} without it")
        if not value.isprintable():  # a newline or an escape would break every one-line message that names it
            return Problem(f"{where}: {fname} {value!r:.60} holds a control character",
                           f"write {fname} in printable characters")
        plain = unicodedata.normalize("NFKC", value)
        if plain != value:
            return Problem(f"{where}: {fname} {value!r:.60} holds characters Unicode compatibility form (NFKC) "
                           f"writes otherwise (as {plain!r:.60})", f"write {fname} in plain characters")
        if len(value) > NAME_CHARS:
            return Problem(f"{where}: {fname} {value[:40]!r}... has {len(value)} characters",
                           f"give {fname} in at most {NAME_CHARS} characters")
    bad = next(((k, v) for k, v in spec.sources.items() if not isinstance(v, str) or not v.strip()), None)
    if bad is not None:
        return Problem(f"{where}: sources.{bad[0]} is {bad[1]!r:.60}, not the id of a source",
                       f"cite a declared source for {bad[0]}")
    return None


def catalog_problems(devices: tuple[DeviceSpec, ...], sources: dict[str, Any]) -> list[Problem]:
    """Problems in catalog rows and their declared sources, each with its fix: ids, text fields, figures (finite,
    above 0, counts whole), their citations, names and aliases that name another row, and `gpu_arch`."""
    problems: list[Problem] = []
    seen_ids: set[str] = set()
    label_owner: dict[str, DeviceSpec] = {}
    alias_owner: dict[str, DeviceSpec] = {}
    for spec in devices:
        where = f"device {spec.id!r}"
        wrong = _text_problem(spec)
        if wrong is not None:
            problems.append(wrong)
            continue
        if spec.id in seen_ids:
            problems.append(Problem(f"{where}: duplicate id", "give the device an id of its own"))
        seen_ids.add(spec.id)
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", spec.id):
            problems.append(Problem(f"{where}: id is not a slug",
                                    "write the id in lower-case letters and digits joined by hyphens (acme-x1)"))
        for fname, allowed in _CHOICES:
            if getattr(spec, fname) not in allowed:
                problems.append(Problem(f"{where}: {fname} {getattr(spec, fname)!r} is not one of "
                                        f"{', '.join(allowed)}", f"give {fname} as one of them"))
        kind = VENDOR_KIND.get(spec.vendor)
        if kind is not None and (spec.backend, spec.core_unit) != kind and spec.backend in BACKENDS \
                and spec.core_unit in CORE_UNITS:
            problems.append(Problem(f"{where}: an {spec.vendor} chip runs backend {kind[0]} with core_unit {kind[1]}, "
                                    f"not {spec.backend} with {spec.core_unit}",
                                    f"give backend {kind[0]!r} and core_unit {kind[1]!r}"))
        for fname in NUMERIC_FIELDS:
            value = getattr(spec, fname)
            if value is None and fname == "fp32_tflops":
                continue
            if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                    or value <= 0):
                problems.append(Problem(f"{where}: {fname} must be a positive number, got {value!r:.60}",
                                        f"give {fname} as a finite number above 0"))
            elif fname in WHOLE_FIELDS and not isinstance(value, int):
                problems.append(Problem(f"{where}: {fname} must be a whole number, got {value!r}",
                                        f"give {fname} as a whole number, without a decimal point"))
            elif fname in WHOLE_FIELDS and value > MAX_COUNT:
                problems.append(Problem(f"{where}: {fname} {value} is past any chip's (at most {MAX_COUNT})",
                                        f"give the chip's own {fname}"))
            elif fname not in spec.sources:
                problems.append(Problem(f"{where}: {fname} cites no source",
                                        f"cite where the figure comes from under sources.{fname}"))
        problems += _limit_problems(spec)
        if "architecture" not in spec.sources:
            problems.append(Problem(f"{where}: architecture cites no source",
                                    "cite where it comes from under sources.architecture"))
        for fname in spec.sources:
            if fname not in CITED_FIELDS:
                problems.append(Problem(f"{where}: sources.{fname:.60} names no field of a device",
                                        "cite each figure under its own field's name (gpu_cores, clock_mhz), or leave "
                                        "it out"))
        for fname, source_id in spec.sources.items():
            if source_id not in sources:
                problems.append(Problem(f"{where}: {fname} cites undeclared source {source_id!r}",
                                        "cite a declared source (its title and url) or declare this one"))
        for label in (spec.name, *spec.aliases):
            for key in {normalize_name(label), f"tokens:{spec.vendor}:{_token_key(label)}"}:
                owner = label_owner.setdefault(key, spec)
                # Only binned variants of one chip (same name, different core counts) may share a label.
                if owner is not spec and not binned_variants(owner.name, owner.gpu_cores, spec.name, spec.gpu_cores):
                    problems.append(Problem(f"{where}: name/alias {label!r} also names {owner.id!r}",
                                            f"give the device a name of its own (if it is {owner.id}, use that id)"))
        for alias in spec.aliases:
            if alias_owner.setdefault(alias, spec) is not spec:
                problems.append(Problem(f"alias {alias!r} is listed by more than one device",
                                        "list it under one device"))
    problems += _gpu_arch_problems(tuple(s for s in devices if _text_problem(s) is None))
    for source_id, source in sources.items():
        if not isinstance(source, dict) or not source.get("title"):
            problems.append(Problem(f"source {source_id!r}: no title", "give the source a title (and its url)"))
        elif source.get("url") is not None and not is_https(source["url"]):
            problems.append(Problem(f"source {source_id!r}: url {source['url']!r:.60} is not an https:// address",
                                    "give the https:// address of the page the figure comes from"))
    return list(dict.fromkeys(problems))


def is_https(url: Any) -> bool:
    """Whether a source's url is an https:// address of a host (not javascript:, ftp:, a file, or text with spaces)."""
    if not isinstance(url, str) or not url.isprintable() or any(c.isspace() for c in url):
        return False
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "https" and bool(parts.hostname)


#: each backend's architecture names, as catalog.json writes them, and how to write one: CUDA's sm_ and a compute
#: capability of 3.0 or more (an optional a, b or f suffix), Metal's GPU family, ROCm's gfx target
ARCHITECTURES = {
    "cuda": (re.compile(r"sm_([1-9][0-9]{1,2})[abf]?"), "sm_ and the compute capability, 30 or more (sm_75, sm_90a)"),
    "metal": (re.compile(r"apple([1-9][0-9]?)"), "apple and the Metal GPU family (apple9)"),
    "rocm": (re.compile(r"gfx([1-9][0-9a-f]{2,3})"), "the gfx target (gfx1100, gfx90a)"),
}


def _limit_problems(spec: DeviceSpec) -> list[Problem]:
    """Limits of a row that contradict each other or its backend: a SIMD width that is no power of two, a default
    threadgroup above the most threads a threadgroup holds or of no whole number of SIMD groups, an architecture
    that is no name of its backend's."""
    where, problems = f"device {spec.id!r}", []
    simd, most, default = spec.simd_width, spec.max_threads_per_threadgroup, spec.default_threadgroup
    whole = [v for v in (simd, most, default) if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    if len(whole) == 3:
        fits = min(256, most - most % simd) or most  # a default to suggest: one the chip can launch
        if simd & (simd - 1):
            problems.append(Problem(f"{where}: simd_width {simd} is not a power of two",
                                    "give the chip's SIMD width (32 on NVIDIA and Apple chips, 32 or 64 on AMD's)"))
        if default > most:
            problems.append(Problem(f"{where}: default_threadgroup {default} is above max_threads_per_threadgroup "
                                    f"{most}", f"give a default threadgroup the chip can launch ({fits})"))
        elif default % simd:
            problems.append(Problem(f"{where}: default_threadgroup {default} is not a multiple of simd_width {simd}",
                                    f"give a whole number of SIMD groups ({fits})"))
    pattern, form = ARCHITECTURES.get(spec.backend, (None, ""))
    found = pattern.fullmatch(spec.architecture) if pattern is not None else None
    if pattern is not None and (found is None or (spec.backend == "cuda" and int(found.group(1)) < 30)):
        problems.append(Problem(f"{where}: architecture {spec.architecture!r:.60} is no {spec.backend} architecture",
                                f"write it as {form}"))
    return problems


def validate_catalog(devices: tuple[DeviceSpec, ...] | None = None, sources: dict[str, Any] | None = None) -> list[str]:
    """Problems in the catalog (empty when sound): ids, aliases, figures and their citations."""
    devices = load_catalog() if devices is None else devices
    sources = catalog_sources() if sources is None else sources
    return [p.text for p in catalog_problems(devices, sources)]


def registration_problems(spec: DeviceSpec, sources: dict[str, Any],
                          registered: tuple[DeviceSpec, ...] = ()) -> list[Problem]:
    """Why `spec`, a device the catalog lacks, cannot be registered beside the catalog and the devices registered
    before it: the catalog's checks of its rows (catalog_problems) over all of them, `sources` declared beside the
    catalog's, then an id or name of it that the catalog's name rules take for a catalog chip, which it would never
    be found by (resolve_device tries the catalog first)."""
    rows = (*load_catalog(), *registered)
    # what the rows before it already show is no matter of this record (a registered device a later catalog row
    # clashes with, one citing sources its own record declares)
    known = set(catalog_problems(rows, catalog_sources()))
    found = [p for p in catalog_problems((*rows, spec), {**catalog_sources(), **sources}) if p not in known]
    if _text_problem(spec) is not None:
        return found
    for what, label in (("id", spec.id), *(("name", label) for label in (spec.name, *spec.aliases))):
        chips = tuple(dict.fromkeys(s.id for s in device_candidates(label)))
        if chips and not any(f"name/alias {label!r} also names" in p.text for p in found):
            found.append(Problem(
                f"device {spec.id!r}: its {what} {label!r} is read as catalog chip {' or '.join(chips)}",
                f"give it {'an id' if what == 'id' else 'a name'} of its own (if it is {chips[0]}, use that id)"))
    return found


def _gpu_arch_problems(devices: tuple[DeviceSpec, ...]) -> list[Problem]:
    """`gpu_arch`: on every Apple row and no other, well formed, cited, one generation per family, and one
    row per (generation, core count), which is what match_gpu_arch relies on."""
    problems: list[Problem] = []
    family_generation: dict[str, int] = {}
    owner: dict[tuple[int, int], DeviceSpec] = {}
    for spec in devices:
        where = f"device {spec.id!r}"
        if spec.vendor != "apple":
            if spec.gpu_arch is not None:
                problems.append(Problem(f"{where}: gpu_arch is for Apple rows only", "leave gpu_arch out"))
            continue
        generation = arch_generation(spec.gpu_arch)
        if generation is None or spec.gpu_arch != spec.gpu_arch.lower():
            problems.append(Problem(f"{where}: gpu_arch must look like 'applegpu_g15s', got {spec.gpu_arch!r}",
                                    "give gpu_arch as Metal reports it (MTLDevice.architecture.name)"))
            continue
        if "gpu_arch" not in spec.sources:
            problems.append(Problem(f"{where}: gpu_arch cites no source",
                                    "cite where it comes from under sources.gpu_arch"))
        if family_generation.setdefault(spec.family, generation) != generation:
            problems.append(Problem(f"{where}: gpu_arch generation {generation} differs from the rest of family "
                                    f"{spec.family!r} ({family_generation[spec.family]})",
                                    "give the family's generation, or another family"))
        other = owner.setdefault((generation, spec.gpu_cores), spec)
        if other is not spec:
            problems.append(Problem(f"{where}: generation {generation} with {spec.gpu_cores} cores also names "
                                    f"{other.id!r}", f"if it is {other.id}, use that id"))
    return problems
