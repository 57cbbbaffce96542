"""The device-profile API kernel authors know from ZMLX, answered from the bundle's learned tables.

Every public name of `zmlx.device_profile` is here with its signature (`DeviceTuningProfile`, a
frozen dataclass with ZMLX's fields in its order; `get_device_profile(family, variant)`;
`get_current_device_profile()`, cached with `cache_clear()`; `get_threadgroup_candidates_for_shape
(profile, dim_size, kernel_type)`; `ALL_DEVICE_PROFILES`), so code written against it runs on this
module unchanged (`zmlx_pipeline.runtime` exports the same names), but the threadgroups come from what was measured on the chip (evidence
`measured`), what the model predicts from its specs (`predicted`), or, with neither, the
catalog's default (`default`); candidates depend on the size asked, not one fixed triple.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from zmlx_pipeline.runtime.bundle import active_bundle, on_change
from zmlx_pipeline.runtime.device import FALLBACK_THREADGROUP, catalog_row, current_device, zmlx_names
from zmlx_pipeline.runtime.errors import BadArgument, BadArgumentType, UnknownDeviceError, expect_str

#: the seed's kernel types, and which learned kernel class answers each ("general": all classes pooled)
KERNEL_TYPES = {"general": "general", "reduction": "row_reduction", "simd": "general"}


@dataclass(frozen=True)
class DeviceTuningProfile:
    """A chip's tuning profile: ZMLX's fields, in its order, then ours (catalog id, name, evidence, thread
    limit, the learned tables), so code written against `zmlx.device_profile` reads it unchanged."""

    family: str
    variant: str
    gpu_cores: int
    memory_bandwidth_gbps: float
    default_threadgroup: int
    threadgroup_candidates: tuple[int, ...] = (128, 256)
    simd_width: int = 32
    has_ray_tracing: bool = False
    autotune_warmup: int = 3
    autotune_iterations: int = 10
    device_id: str | None = None
    name: str | None = None
    evidence: str = "default"
    max_threads_per_threadgroup: int = 1024
    learned: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "threadgroup_candidates", tuple(self.threadgroup_candidates))
        object.__setattr__(self, "learned", dict(self.learned or {}))

    @property
    def chip_id(self) -> str:
        """The chip as ZMLX names it: `M3_Max`, `M3`."""
        return f"{self.family}_{self.variant}" if self.variant else self.family

    @property
    def full_name(self) -> str:
        if self.name:
            return self.name
        return f"{self.family} {self.variant}".strip()

    def is_high_end(self) -> bool:
        return self.variant.lower() in ("pro", "max", "ultra")

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["threadgroup_candidates"] = list(self.threadgroup_candidates)
        out["full_name"] = self.full_name
        out["learned"] = dict(self.learned)
        return out


def _seed_case(family: str, variant: str, vendor: str | None) -> tuple[str, str]:
    """ZMLX's spelling for Apple chips ("M3", "Max"; base chips have variant ""); others as catalogued."""
    return zmlx_names(family, variant, vendor)


def _from_record(rec: Mapping[str, Any]) -> DeviceTuningProfile:
    family, variant = _seed_case(str(rec.get("family") or ""), str(rec.get("variant") or ""), rec.get("vendor"))
    cands = tuple(int(c) for c in rec.get("threadgroup_candidates") or ()) or (128, 256, 512)
    return DeviceTuningProfile(
        family=family, variant=variant, gpu_cores=int(rec.get("gpu_cores") or 0),
        memory_bandwidth_gbps=rec.get("memory_bandwidth_gbps") or 0,
        default_threadgroup=int(rec.get("default_threadgroup") or rec.get("catalog_default_threadgroup")
                                or FALLBACK_THREADGROUP),
        threadgroup_candidates=cands, simd_width=int(rec.get("simd_width") or 32),
        has_ray_tracing=rec.get("vendor") == "apple" and str(rec.get("family", "")).lower() not in ("m1", "m2"),
        device_id=rec.get("device_id"), name=rec.get("name"), evidence=str(rec.get("evidence") or "default"),
        max_threads_per_threadgroup=int(rec.get("max_threads_per_threadgroup") or 1024),
        learned={"classes": rec.get("classes") or {}, "general": rec.get("general") or {}},
    )


def _generic(family: str = "Unknown", variant: str = "") -> DeviceTuningProfile:
    return DeviceTuningProfile(family=family, variant=variant, gpu_cores=0, memory_bandwidth_gbps=0,
                               default_threadgroup=FALLBACK_THREADGROUP,
                               threadgroup_candidates=(128, 256, 512), evidence="default")


def profile_records() -> dict[str, dict]:
    """Every device's profile record in the active bundle, by device id."""
    bundle = active_bundle()
    return dict(bundle.profiles) if bundle is not None else {}


def _check_id(device_id: str, what: str = "device") -> None:
    """BadLookup for a device id lookups refuse too (a control character, a malformed core limit)."""
    from zmlx_pipeline.runtime.lookup import check_device_id

    check_device_id(active_bundle(), device_id, what)


def _check_known(device_id: str, what: str = "device") -> None:
    """UnknownDeviceError for a named device lookups refuse too: no catalog id, core limit or bundle device, or a
    name that does not tell one chip (lookup.device_problem)."""
    from zmlx_pipeline.runtime.lookup import device_problem

    problem = device_problem(active_bundle(), device_id, what)
    if problem:
        raise UnknownDeviceError(problem)


def _family_base_row(family: str) -> dict | None:
    """The catalog row of a chip family's base chip ("M3": the full M3 of its binned variants), as ZMLX's
    `get_device_profile("M3")` means it; None when the catalog has no base chip of that family."""
    try:
        from zmlx_pipeline.data.catalog import load_catalog
    except ImportError:
        return None
    rows = [spec for spec in load_catalog()
            if spec.family.lower() == family and spec.variant.lower() in ("", "base")]
    return max(rows, key=lambda spec: spec.gpu_cores).as_row() if rows else None


def profile_for_device(device_id: str) -> DeviceTuningProfile:
    """The profile of a catalog id (or reported name); catalog specs with default threadgroups if not in the bundle.
    BadLookup for an id lookups refuse (a malformed core limit such as `nvidia-h200@0sm`)."""
    _check_id(device_id)
    records = profile_records()
    rec = records.get(device_id)
    if rec is None:
        row = catalog_row(device_id)
        if row is not None:
            rec = records.get(row["id"]) or {**row, "device_id": row["id"], "evidence": "default",
                                              "catalog_default_threadgroup": row.get("default_threadgroup")}
    return _from_record(rec) if rec is not None else _generic(device_id)


def get_device_profile(family: str, variant: str = "") -> DeviceTuningProfile:
    """The profile of a chip by family and variant ("M3", "Max"; "hopper", "h200-sxm"), or by catalog id.

    Binned variants (a 30- and a 40-core M3 Max) answer with the full chip, as in ZMLX; an unknown
    (family, variant) pair gets a generic profile with the catalog's default threadgroup (evidence
    "default"). A `family` alone that is no chip family is a device as lookups take it: a catalog id, a core
    limit of one, a device of the bundle or a name that tells one chip, else UnknownDeviceError
    ("nvidia-h100", "apple-m3": several chips), never a generic profile.
    """
    expect_str(family, "family")
    expect_str(variant, "variant", optional=True)
    if not family.strip():
        from zmlx_pipeline.runtime.lookup import BadLookup

        raise BadLookup(f"family must be a chip family such as 'M3' or a device id such as 'nvidia-h200'; "
                        f"got {family!r:.40}")
    if not variant:  # then `family` may be a device id: refused as lookups refuse it
        _check_id(family, "family")
    records = profile_records()
    if family in records and not variant:
        return _from_record(records[family])
    fam = family.strip().lower()
    var = (variant or "").strip().lower() or "base"
    matches = [r for r in records.values()
               if str(r.get("family", "")).lower() == fam and str(r.get("variant", "")).lower() == var]
    if not matches:
        if variant:
            return _generic(family, variant)
        row = _family_base_row(fam)
        if row is None:
            _check_known(family, "family")
            row = catalog_row(family)
        if row is not None:
            return profile_for_device(row["id"])
        return profile_for_device(family)  # a device of the bundle (a core limit it holds no profile of)
    return _from_record(max(matches, key=lambda r: (r.get("gpu_cores") or 0, r.get("device_id") or "")))


@functools.lru_cache(maxsize=1)
def get_current_device_profile() -> DeviceTuningProfile:
    """The profile of this process's GPU (detected once; `get_current_device_profile.cache_clear()` forgets
    it, as in ZMLX); a generic default profile when it cannot be told (a GPU the catalog does not know). BadLookup
    or UnknownDeviceError when $ZMLX_PIPELINE_DEVICE names a device lookups refuse (empty or blank: unset)."""
    device_id, _, from_env = current_device()
    if device_id:
        _check_id(device_id, "$ZMLX_PIPELINE_DEVICE")
        if from_env:
            _check_known(device_id, "$ZMLX_PIPELINE_DEVICE")
    return profile_for_device(device_id) if device_id else _generic()


#: the chips ZMLX lists in ALL_DEVICE_PROFILES: every family with every variant ("" is the base chip)
ZMLX_CHIPS = tuple((family, variant) for family in ("M1", "M2", "M3", "M4") for variant in ("", "Pro", "Max", "Ultra"))


def all_device_profiles() -> list[DeviceTuningProfile]:
    """The profiles of ZMLX's sixteen chips from the active bundle (ALL_DEVICE_PROFILES reads this on each access)."""
    return [get_device_profile(family, variant) for family, variant in ZMLX_CHIPS]


def __getattr__(name: str) -> Any:
    # ALL_DEVICE_PROFILES is computed on access, so it follows the bundle loaded at the time
    if name == "ALL_DEVICE_PROFILES":
        return all_device_profiles()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_threadgroup_candidates_for_shape(profile: DeviceTuningProfile, dim_size: int,
                                         kernel_type: str = "general") -> tuple[int, ...]:
    """The learned threadgroup candidates for a row of `dim_size` elements, best first.

    `kernel_type` is a learned kernel class (row_reduction, elementwise, row_topk, moe_combine,
    matmul) or one of ZMLX's types: "reduction" (row reductions), "general" (all classes pooled),
    "simd" (pooled, multiples of the SIMD width only). Any other name answers as "general", as ZMLX's
    function does for a type it does not know. The nearest learned row length answers; without learned
    data, the profile's candidates (a default triple) are returned.
    """
    if not isinstance(profile, DeviceTuningProfile):
        raise BadArgumentType(f"profile must be a DeviceTuningProfile (get_device_profile), not {type(profile).__name__}")
    if isinstance(dim_size, bool) or not isinstance(dim_size, int):
        raise BadArgumentType(f"dim_size must be a whole number, not {type(dim_size).__name__} ({dim_size!r:.60})")
    if dim_size < 0:
        raise BadArgument(f"dim_size must be >= 0 (got {dim_size})")
    expect_str(kernel_type, "kernel_type")
    learned = profile.learned or {}
    name = KERNEL_TYPES.get(kernel_type, kernel_type)
    table = learned.get("general") if name == "general" else (learned.get("classes") or {}).get(name)
    if not table and name != "general":
        table = learned.get("general")
    cands: tuple[int, ...] = ()
    if table:
        by_dim = table.get("by_dim") or {}
        if by_dim and dim_size and dim_size > 0:
            target = math.log2(dim_size)
            key = min(by_dim, key=lambda b: (abs(int(b) - target), int(b)))
            cands = tuple(int(c) for c in by_dim[key])
        if not cands:
            cands = tuple(int(c) for c in table.get("candidates") or ())
    if not cands:
        cands = tuple(profile.threadgroup_candidates)
    if kernel_type == "simd":
        cands = tuple(c for c in cands if c % max(1, profile.simd_width) == 0) or cands
    limit = profile.max_threads_per_threadgroup or 1024
    return tuple(c for c in cands if c <= limit) or cands


def forget_current_profile(_bundle: object = None) -> None:
    """Work the current device's profile out again on the next call (after a new bundle is loaded)."""
    get_current_device_profile.cache_clear()


on_change(forget_current_profile)


def profile_table(devices: list[str] | None = None, bundle: str | None = None) -> list[dict]:
    """Profile records of the bundle (`bundle`, verified strictly, else the active one), all or some devices.

    An id that is not in the bundle is answered from the catalog with default threadgroups
    (evidence "default"); an id in neither, or a name that does not tell one chip, raises UnknownDeviceError, a
    malformed one (`nvidia-h200@0sm`) BadLookup.
    """
    from zmlx_pipeline.runtime.lookup import load_strictly

    load_strictly(bundle)
    records = profile_records()
    if devices is None:
        return [records[d] for d in sorted(records)]
    out = []
    for device_id in devices:
        _check_id(device_id)
        if device_id in records:
            out.append(records[device_id])
            continue
        problem = _device_problem(device_id)
        if problem:
            raise UnknownDeviceError(problem)
        row = catalog_row(device_id)
        if row is None:  # a core limit of a chip the bundle holds and the catalog does not
            out.append(profile_for_device(device_id).as_dict() | {"device_id": device_id, "note": "not in the bundle"})
            continue
        out.append(profile_for_device(row["id"]).as_dict() | {"device_id": row["id"], "note": "not in the bundle"})
    return out


def _device_problem(device_id: str) -> str:
    """profile_table's one line for a device it cannot answer (lookup.device_problem, worded as the table says it)."""
    from zmlx_pipeline.runtime.lookup import device_problem

    problem = device_problem(active_bundle(), device_id)
    if problem.startswith("unknown device "):
        hint = problem.partition("; ")[2]
        from zmlx_pipeline.core.errors import shown

        return f"no device {shown(device_id)} in the bundle or the catalog" + (f"; {hint}" if hint else "")
    return problem
