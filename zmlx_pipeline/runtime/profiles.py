"""The device-profile API kernel authors know from ZMLX, answered from the bundle's learned tables.

Every public name of `zmlx.device_profile` is here with its signature (`DeviceTuningProfile`, a
frozen dataclass with ZMLX's fields in its order; `get_device_profile(family, variant)`;
`get_current_device_profile()`, cached with `cache_clear()`; `get_threadgroup_candidates_for_shape
(profile, dim_size, kernel_type)`; `ALL_DEVICE_PROFILES`), so code written against it runs on this
module unchanged (`zmlx_pipeline.runtime` exports the same names), but the threadgroups come from what was measured on the chip (evidence
`measured`), what the model predicts from its specs (`predicted`), or, with neither, the
catalog's default (`default`); candidates depend on the size asked, not one fixed triple.

Where ZMLX answers a name it does not know with a default (an unknown family or variant gets M1's
figures, an unknown kernel_type the "general" candidates; neither is in its docstrings), this module
refuses it in one line naming the known ones: figures of another chip would be claimed as this one's.
A core limit never measured answers from its nearest measured limit, with its own core count.

Why one long module: it stands in for ZMLX's one `device_profile` module, so every name code written against that
module imports is here, with the profile records they all answer from.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from zmlx_pipeline.runtime.bundle import Bundle, active_bundle, on_change
from zmlx_pipeline.runtime.device import FALLBACK_THREADGROUP, catalog_row, current_device, registered_for_detected
from zmlx_pipeline.runtime.device import family_base_row, zmlx_names
from zmlx_pipeline.runtime.errors import (
    BadArgument,
    BadArgumentType,
    UnknownDeviceError,
    UnknownKernelType,
    expect_str,
    known,
    plain,
)

#: the seed's kernel types, and which learned kernel class answers each ("general": all classes pooled)
KERNEL_TYPES = {"general": "general", "reduction": "row_reduction", "simd": "general"}
#: evidence, weakest last: a profile answered for a chip from another's measurements claims at most `predicted`
_EVIDENCE_ORDER = ("measured", "predicted", "extrapolated", "default")


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
    #: the device whose profile answers for this one (a core limit never measured: the nearest measured one);
    #: None when the profile is the chip's own
    answered_from: str | None = None

    def __post_init__(self) -> None:
        # the fields the runtime reads to answer are checked here, so a profile built or replaced by the caller
        # with one it cannot use is refused in one line now, not with a TypeError deep in a later call
        cands = self.threadgroup_candidates
        if isinstance(cands, (str, bytes, Mapping)) or not isinstance(cands, Iterable):
            raise BadArgumentType(f"threadgroup_candidates must be threadgroup sizes such as (128, 256), "
                                  f"not {type(cands).__name__} ({cands!r:.60})")
        cands = tuple(cands)
        for c in cands:
            _whole("a threadgroup candidate", c)
        for name in ("default_threadgroup", "simd_width", "max_threads_per_threadgroup"):
            _whole(name, getattr(self, name))
        if self.learned is not None and not isinstance(self.learned, Mapping):
            raise BadArgumentType(f"learned must be a mapping of learned tables (or None), "
                                  f"not {type(self.learned).__name__} ({self.learned!r:.60})")
        object.__setattr__(self, "threadgroup_candidates", cands)
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


def _whole(name: str, value: Any) -> None:
    """BadArgumentType / BadArgument unless `value` is a whole number >= 1 (a threadgroup size, a SIMD width)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArgumentType(f"{name} must be a whole number >= 1, not {type(value).__name__} ({value!r:.60})")
    if value < 1:
        raise BadArgument(f"{name} must be >= 1 (got {value})")


def _seed_case(family: str, variant: str, vendor: str | None) -> tuple[str, str]:
    """ZMLX's spelling for Apple chips ("M3", "Max"; base chips have variant ""); others as catalogued."""
    return zmlx_names(family, variant, vendor)


def _from_record(rec: Mapping[str, Any]) -> DeviceTuningProfile:
    family, variant = _seed_case(str(rec.get("family") or ""), str(rec.get("variant") or ""), rec.get("vendor"))
    cands = tuple(int(c) for c in rec.get("threadgroup_candidates") or ()) or (128, 256, 512)
    cores = rec.get("gpu_cores")
    return DeviceTuningProfile(
        family=family, variant=variant, gpu_cores=int(cores) if cores else None,  # type: ignore[arg-type]
        memory_bandwidth_gbps=rec.get("memory_bandwidth_gbps") or None,  # type: ignore[arg-type]
        default_threadgroup=int(rec.get("default_threadgroup") or rec.get("catalog_default_threadgroup")
                                or FALLBACK_THREADGROUP),
        threadgroup_candidates=cands, simd_width=int(rec.get("simd_width") or 32),
        has_ray_tracing=rec.get("vendor") == "apple" and str(rec.get("family", "")).lower() not in ("m1", "m2"),
        device_id=rec.get("device_id"), name=rec.get("name"), evidence=str(rec.get("evidence") or "default"),
        max_threads_per_threadgroup=int(rec.get("max_threads_per_threadgroup") or 1024),
        learned={"classes": rec.get("classes") or {}, "general": rec.get("general") or {}},
        answered_from=rec.get("answered_from"),
    )


def _generic(family: str = "Unknown", variant: str = "", name: str | None = None) -> DeviceTuningProfile:
    """A chip nothing is known of: the default threadgroups, and no core count or bandwidth (None: 0 would claim
    one)."""
    return DeviceTuningProfile(family=family, variant=variant, gpu_cores=None,  # type: ignore[arg-type]
                               memory_bandwidth_gbps=None,  # type: ignore[arg-type]
                               default_threadgroup=FALLBACK_THREADGROUP,
                               threadgroup_candidates=(128, 256, 512), evidence="default", name=name)


def profile_records() -> dict[str, dict]:
    """Every device's profile record in the active bundle, by device id."""
    bundle = active_bundle()
    return dict(bundle.profiles) if bundle is not None else {}


def _check_id(device_id: str, what: str = "device") -> None:
    """BadLookup for a device id lookups refuse too (a control character, a malformed core limit)."""
    from zmlx_pipeline.runtime.lookup import check_device_id

    expect_str(device_id, what)
    check_device_id(active_bundle(), device_id, what)


def _named_as(device_id: str) -> str:
    """The id lookups answer a named device under (lookup.named_as: a registered device's for its name or alias)."""
    from zmlx_pipeline.runtime.lookup import named_as

    return named_as(device_id)


def _check_known(device_id: str, what: str = "device") -> None:
    """UnknownDeviceError for a named device lookups refuse too: no catalog id, core limit or bundle device, or a
    name that does not tell one chip (lookup.device_problem)."""
    from zmlx_pipeline.runtime.lookup import device_problem

    problem = device_problem(active_bundle(), device_id, what)
    if problem:
        raise UnknownDeviceError(problem)


def _limited_record(device_id: str, records: Mapping[str, dict]) -> dict | None:
    """The profile record of a core limit (`nvidia-h200@20sm`) the bundle holds none of, answered as lookups answer
    it: from the nearest held limit of the chip (or the chip itself), with the limit's own core count, evidence
    `predicted` at most and `answered_from` naming that device; from the catalog (evidence `default`) when the
    bundle holds none. None for an id that is no core limit."""
    from zmlx_pipeline.runtime.lookup import nearest_limit

    base, _, limit = device_id.partition("@")
    if not limit.endswith("sm") or not limit[:-2].isdigit():
        return None
    cores = int(limit[:-2])
    row = records.get(base) or catalog_row(base)
    # the nearest of those with a lookup table, as lookups choose (a whole chip's profile of catalog defaults is no
    # nearer evidence than a measured limit's), else the nearest profile
    bundle = active_bundle()
    tabled = [d for d in records if bundle is not None and d in bundle.tables]
    found = nearest_limit(tabled, base, device_id, row) or nearest_limit(records, base, device_id, row)
    if found is None:
        if row is None:
            return None
        rec = {**row, "device_id": device_id, "evidence": "default",
               "catalog_default_threadgroup": row.get("default_threadgroup")}
        rec["answered_from"] = None
    else:
        source = found[0]
        rec = {**records[source], "device_id": device_id, "answered_from": source}
        rec["evidence"] = _at_most_predicted(rec.get("evidence"))
        rec["classes"] = {c: {**v, "evidence": _at_most_predicted(v.get("evidence"))} if isinstance(v, dict) else v
                          for c, v in (rec.get("classes") or {}).items()}
        if isinstance(rec.get("general"), dict):
            rec["general"] = {**rec["general"], "evidence": _at_most_predicted(rec["general"].get("evidence"))}
        rec["fp32_tflops"] = None  # the whole chip's or another limit's figure is not this limit's
    whole = (row or {}).get("name") or base
    rec.update(gpu_cores=cores, core_limited_from=base, name=f"{whole} [{cores} SM{'' if cores == 1 else 's'}]")
    if isinstance(rec.get("seed"), dict):
        rec["seed"] = {**rec["seed"], "gpu_cores": cores}
    return rec


def _at_most_predicted(evidence: Any) -> Any:
    """`measured` becomes `predicted` (another device's measurements); weaker evidence stays as it is."""
    return "predicted" if evidence == "measured" else evidence


def profile_for_device(device_id: str) -> DeviceTuningProfile:
    """The profile of a catalog id (or reported name); catalog specs with default threadgroups if not in the bundle;
    a core limit the bundle holds no profile of answers from its nearest held limit (`_limited_record`).
    BadLookup for an id lookups refuse (a malformed core limit such as `nvidia-h200@0sm`)."""
    _check_id(device_id)
    records = profile_records()
    rec = records.get(_named_as(device_id))  # a registered device by its name or an alias too
    if rec is None and "@" in device_id:
        rec = _limited_record(device_id, records)
    if rec is None:
        row = catalog_row(device_id)
        if row is not None:
            rec = records.get(row["id"]) or {**row, "device_id": row["id"], "evidence": "default",
                                              "catalog_default_threadgroup": row.get("default_threadgroup")}
    return _from_record(rec) if rec is not None else _generic(device_id)


def _chips() -> list[tuple[str, str, str, int]]:
    """(family, variant, device id, cores) of every chip the bundle's profiles and the catalog know, families and
    variants lower case ("m3", "max"; "hopper", "h200-sxm"); the base chip's variant is "base"."""
    chips = [(str(r.get("family") or "").lower(), str(r.get("variant") or "").lower() or "base", d,
              int(r.get("gpu_cores") or 0)) for d, r in profile_records().items() if isinstance(r, dict)]
    try:
        from zmlx_pipeline.data.catalog import load_catalog

        chips += [(spec.family.lower(), spec.variant.lower() or "base", spec.id, spec.gpu_cores)
                  for spec in load_catalog()]
    except ImportError:
        pass
    return chips


def _spelled(family: str, variant: str, device_id: str) -> tuple[str, str]:
    """ZMLX's spelling of a (family, variant) pair, by the vendor of its chip."""
    rec = profile_records().get(device_id) or catalog_row(device_id) or {}
    return _seed_case(family, "" if variant == "base" else variant, rec.get("vendor"))


def _unknown_chip(family: str, variant: str) -> str:
    """get_device_profile's one line for a (family, variant) pair no chip has: the family's known variants, or the
    known families, or (a device id given a variant) the call that answers it."""
    fam = family.strip().lower()
    chips = _chips()
    variants = sorted({_spelled(f, v, d)[1] for f, v, d, _ in chips if f == fam})
    if variants:
        listed = ", ".join(f"{v!r}" + (" (the base chip)" if v in ("", "base") else "") for v in variants)
        return f"unknown variant {variant!r:.40} of chip family {family!r:.40}: its variants are {listed}"
    if catalog_row(family) is not None or family in profile_records():
        return (f"{family!r:.60} is a device id, which takes no variant (got {variant!r:.40}): call "
                f"get_device_profile({family!r:.60})")
    families = {_spelled(f, "base", d)[0] for f, _, d, _ in chips if f}
    return f"unknown chip family {family!r:.40} (variant {variant!r:.40}): known families are {known(families)}"


def get_device_profile(family: str, variant: str = "") -> DeviceTuningProfile:
    """The profile of a chip by family and variant ("M3", "Max"; "hopper", "h200-sxm"), or by catalog id.

    Binned variants (a 30- and a 40-core M3 Max) answer with the full chip, as in ZMLX. A (family, variant) pair
    no chip of the bundle or the catalog has raises UnknownDeviceError naming the family's variants (ZMLX's
    function answers an unknown pair with M1's figures, undocumented; a profile of figures no chip has would claim
    them). A `family` alone that is no chip family is a device as lookups take it: a catalog id, a core limit of
    one (answered from its nearest measured limit), a device of the bundle or a name that tells one chip, else
    UnknownDeviceError ("nvidia-h100", "apple-m3": several chips), never a generic profile.
    """
    expect_str(family, "family")
    expect_str(variant, "variant", optional=True)
    if not family.strip():
        from zmlx_pipeline.runtime.lookup import BadLookup

        raise BadLookup(f"family must be a chip family such as 'M3' or a device id such as 'nvidia-h200'; "
                        f"got {family!r:.40}")
    if not variant:  # then `family` may be a device id: refused as lookups refuse it
        _check_id(family, "family")
    else:  # a chip's family and variant: refused where a device id would be for the characters they hold
        from zmlx_pipeline.runtime.lookup import check_characters

        check_characters(family, "family", "a chip family such as 'M3'")
        check_characters(variant, "variant", "a variant such as 'Max'")
    records = profile_records()
    if family in records and not variant:
        return _from_record(records[family])
    fam = family.strip().lower()
    var = (variant or "").strip().lower() or "base"
    matches = [r for r in records.values()
               if str(r.get("family", "")).lower() == fam and str(r.get("variant", "")).lower() == var]
    if matches:
        return _from_record(max(matches, key=lambda r: (r.get("gpu_cores") or 0, r.get("device_id") or "")))
    if variant:  # a pair the bundle's profiles lack: the catalog's chip of that pair, else refused
        rows = [(cores, d) for f, v, d, cores in _chips() if f == fam and v == var]
        if not rows:
            raise UnknownDeviceError(plain(_unknown_chip(family, variant)))
        return profile_for_device(max(rows)[1])
    if "@" in family:  # a core limit the bundle holds no profile of: answered as lookups answer it
        _check_known(family, "family")
        return profile_for_device(family)
    row = family_base_row(fam)
    if row is None:
        _check_known(family, "family")
        row = catalog_row(family)
    if row is not None:
        return profile_for_device(row["id"])
    return profile_for_device(family)  # a device of the bundle (a core limit it holds no profile of)


def get_current_device_profile() -> DeviceTuningProfile:
    """The profile of this process's GPU (detected once; `get_current_device_profile.cache_clear()` forgets
    it, as in ZMLX); a generic default profile when it cannot be told (a GPU the catalog does not know). BadLookup
    or UnknownDeviceError when $ZMLX_PIPELINE_DEVICE names a device lookups refuse (empty or blank: unset)."""
    return _current_profile(active_bundle())


@functools.lru_cache(maxsize=1)
def _current_profile(_bundle: object) -> DeviceTuningProfile:
    """get_current_device_profile's answer, kept per bundle: a profile worked out from one bundle is never
    returned once another bundle is active (a load_bundle in another thread)."""
    device_id, _, from_env = current_device()
    if device_id:
        _check_id(device_id, "$ZMLX_PIPELINE_DEVICE")
        if from_env:
            _check_known(device_id, "$ZMLX_PIPELINE_DEVICE")
    elif isinstance(_bundle, Bundle):  # a GPU the catalog lacks that the bundle's store registered (devices add)
        device_id = registered_for_detected(_bundle.profiles)
    return profile_for_device(device_id) if device_id else _generic()


get_current_device_profile.cache_clear = _current_profile.cache_clear  # type: ignore[attr-defined]
get_current_device_profile.cache_info = _current_profile.cache_info  # type: ignore[attr-defined]
get_current_device_profile.cache_parameters = _current_profile.cache_parameters  # type: ignore[attr-defined]

#: the chips ZMLX lists in ALL_DEVICE_PROFILES: every family with every variant ("" is the base chip)
ZMLX_CHIPS = tuple((family, variant) for family in ("M1", "M2", "M3", "M4") for variant in ("", "Pro", "Max", "Ultra"))


def all_device_profiles() -> list[DeviceTuningProfile]:
    """The profiles of ZMLX's sixteen chips from the active bundle (ALL_DEVICE_PROFILES reads this on each access).
    A chip ZMLX lists that no catalog has (the M4 Ultra, "projected" there) keeps its place, as code written for
    ZMLX indexes the list by chip, with default threadgroups and no core count or bandwidth (None)."""
    out = []
    for family, variant in ZMLX_CHIPS:
        try:
            out.append(get_device_profile(family, variant))
        except UnknownDeviceError:
            out.append(_generic(family, variant, f"Apple {family} {variant} (not in the catalog)".replace("  ", " ")))
    return out


def __getattr__(name: str) -> Any:
    # ALL_DEVICE_PROFILES is computed on access, so it follows the bundle loaded at the time
    if name == "ALL_DEVICE_PROFILES":
        return all_device_profiles()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_threadgroup_candidates_for_shape(profile: DeviceTuningProfile, dim_size: int,
                                         kernel_type: str = "general") -> tuple[int, ...]:
    """The learned threadgroup candidates for a row of `dim_size` elements, best first.

    `dim_size` is read as lookups read a shape dimension (4096, 4096.0, numpy's integers and floats), 0 included.
    `kernel_type` is a learned kernel class (row_reduction, elementwise, row_topk, moe_combine,
    matmul: those of the active bundle's kernels and of the profile) or one of ZMLX's types: "reduction" (row
    reductions), "general" (all classes pooled), "simd" (pooled, multiples of the SIMD width only). Any other name
    raises UnknownKernelType naming the known ones (ZMLX's function answers one as "general", undocumented: a typo
    would then get pooled candidates silently). A known class this profile learned nothing of answers as "general".
    The nearest learned row length answers; without learned data, the profile's candidates are returned.
    """
    if not isinstance(profile, DeviceTuningProfile):
        raise BadArgumentType(f"profile must be a DeviceTuningProfile (get_device_profile), not {type(profile).__name__}")
    from zmlx_pipeline.runtime.lookup import row_length

    dim_size = row_length(dim_size, "dim_size")
    expect_str(kernel_type, "kernel_type")
    learned = profile.learned or {}
    classes = learned.get("classes") or {}
    if not isinstance(classes, Mapping):
        raise BadArgumentType(f"the profile's learned classes must be a mapping, not {type(classes).__name__}")
    if kernel_type not in KERNEL_TYPES and kernel_type not in classes and kernel_type not in _bundle_classes():
        raise UnknownKernelType(f"unknown kernel_type {plain(repr(kernel_type))[:60]}: known types are "
                                f"{known(set(KERNEL_TYPES) | set(classes) | _bundle_classes())}")
    name = KERNEL_TYPES.get(kernel_type, kernel_type)
    table = learned.get("general") if name == "general" else classes.get(name)
    if not table and name != "general":
        table = learned.get("general")
    if table and not isinstance(table, Mapping):
        raise BadArgumentType(f"the profile's learned table of {name!r} must be a mapping, not {type(table).__name__}")
    cands: tuple[int, ...] = ()
    try:
        if table:
            by_dim = table.get("by_dim") or {}
            if by_dim and dim_size and dim_size > 0:
                target = math.log2(dim_size)
                key = min(by_dim, key=lambda b: (abs(int(b) - target), int(b)))
                cands = tuple(int(c) for c in by_dim[key])
            if not cands:
                cands = tuple(int(c) for c in table.get("candidates") or ())
    except (TypeError, ValueError, AttributeError) as exc:  # learned tables of a profile the caller built
        raise BadArgumentType(f"the profile's learned table of {name!r} is not by_dim/candidates of threadgroup "
                              f"sizes ({type(exc).__name__}: {plain(exc)})"[:300]) from None
    if not cands:
        cands = tuple(profile.threadgroup_candidates)
    if kernel_type == "simd":
        cands = tuple(c for c in cands if c % max(1, profile.simd_width) == 0) or cands
    return within_thread_limit(profile, cands) or cands


def within_thread_limit(profile: DeviceTuningProfile, sizes: Iterable[int]) -> tuple[int, ...]:
    """The threadgroup sizes of `sizes`, in their order, the chip takes (max_threads_per_threadgroup at most)."""
    limit = int(profile.max_threads_per_threadgroup or 1024)
    return tuple(size for size in sizes if int(size) <= limit)


def _bundle_classes() -> set[str]:
    """The kernel classes of the active bundle's kernels (row_reduction, matmul, ...)."""
    bundle = active_bundle()
    kernels = bundle.kernels if bundle is not None else {}
    return {str(m["class"]) for m in kernels.values() if isinstance(m, dict) and m.get("class")}


def forget_current_profile(_bundle: object = None) -> None:
    """Work the current device's profile out again on the next call (after a new bundle is loaded)."""
    get_current_device_profile.cache_clear()


on_change(forget_current_profile)


def profile_table(devices: list[str] | None = None, bundle: str | None = None) -> list[dict]:
    """Profile records of the bundle (`bundle`, verified strictly, else the active one), all or some devices.

    An id that is not in the bundle is answered from the catalog with default threadgroups
    (evidence "default"), a core limit from the nearest the bundle holds (`answered_from`, evidence `predicted` at
    most, its own core count); an id in neither, or a name that does not tell one chip, raises UnknownDeviceError, a
    malformed one (`nvidia-h200@0sm`) BadLookup.
    """
    from zmlx_pipeline.runtime.lookup import load_strictly

    if devices is not None and (isinstance(devices, (str, bytes)) or not isinstance(devices, Iterable)):
        raise BadArgumentType(f"devices must be a list of device ids or None, not {type(devices).__name__} "
                              f"({devices!r:.60})")
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
        if (named := _named_as(device_id)) in records:  # a registered device's name or alias: its own record
            out.append({**records[named], "note": f"{device_id!r} read as {named}"})
            continue
        limited = _limited_record(device_id, records) if "@" in device_id else None
        if limited is not None:  # a core limit never measured: its nearest held limit's record, said so
            source = limited.get("answered_from")
            out.append({**limited, "note": f"not in the bundle: answered from {source}, the nearest in core count it holds"
                        if source else "not in the bundle: the catalog's figures"})
            continue
        row = catalog_row(device_id)
        if row is None:  # a core limit of a chip the bundle holds and the catalog does not
            out.append(profile_for_device(device_id).as_dict() | {"device_id": device_id, "note": "not in the bundle"})
            continue
        if row["id"] in records:  # a name of a chip the bundle holds ("NVIDIA H200"): that chip's own record
            out.append({**records[row["id"]], "note": f"{device_id!r} read as {row['id']}"})
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
