"""The autotuner: time only the configs the model could not rule out, check each, remember the winner.

    @autotune("rmsnorm", warmup=3, iters=10)
    def rmsnorm(x, w, config=None):
        ...launch with config["TG"], config["VEC"], config["ROWS"]...

On a call with no explicit config, the wrapper's shape and dtype are looked up in the autotune
cache (`~/.cache/zmlx/autotune_v3.json`, this chip and MLX version); on a miss, the bundle's
pruned candidates for that case (top k, at most a fifth of the legal configs) are checked
against the kernel's reference and timed with the collect harness, and the fastest correct one
is written to the cache (when the disk cannot keep it, it is launched all the same, with one warning). `device_aware=False` times every legal config instead (what an
autotuner without a model has to do). Without a GPU backend nothing is timed: the bundle's
predicted config is used, with one warning (when it is one of the case's legal configs; else the
first legal one of its ranking, so no answer is a config the kernel cannot run).

With no kernel named (ZMLX's plain `@autotune(warmup=..., iters=..., device_aware=True)` on a
function taking `threadgroup=`), there is no reference to check against, so nothing is timed:
the wrapper gets the learned threadgroup for the current chip and the row length of its first
array argument.

A chip may refuse a config the legality model allowed (on Metal a compiled pipeline can allow
fewer than 1024 threads per threadgroup). The wrapper, and `launch_ranked` for code that launches
by itself, then fall back through the ranked candidates, warn once per kernel, device and config,
and remember the refusal in-process and in the cache file, so no later call or process launches
that config on that device again (and the tuner no longer times it).

Why one long module: tuning, the decorator and the refusal fallback share the remembered
refusals and the cache file's device key; a launch that a chip refuses must be seen by the tuner's
next candidate list in the same process, so they live beside each other.
"""

from __future__ import annotations

import functools
import importlib
import json
import keyword
import math
import numbers
import operator
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from zmlx_pipeline.core.constraints import Limits, pipeline_thread_limit, refusal_text
from zmlx_pipeline.core.errors import UnknownKernel
from zmlx_pipeline.core.providers import Measure, kernel_provider
from zmlx_pipeline.runtime import cache as cache_file
from zmlx_pipeline.runtime.errors import (
    BadArgument,
    BadArgumentType,
    RuntimeAPIError,
    UnknownKernelError,
    caller_stacklevel,
    expect_str,
    home_expanded,
    plain,
    value_text,
)
from zmlx_pipeline.runtime.lookup import MLX_DTYPE_PREFIX, check_k, predicted_or_default, whole_number

#: the pruned autotuner never times more than this share of a case's legal configs
MAX_FRACTION = 0.2
#: the most warm-up launches and timed samples per candidate that tune and autotune take: far past real use (the
#: defaults are 3 and 10, collect takes at most 100 and 1,000), short of a count that would never finish
MAX_WARMUP = 10_000
MAX_ITERS = 10_000
#: the harness's timers (kernels/timing.py's TIMERS, which the runtime does not import)
TIMERS = ("auto", "gpu", "chain")
#: the statuses a measurer returns (data/records.py's STATUSES, which the runtime does not import)
MEASURE_STATUSES = ("ok", "wrong_result", "launch_error", "compile_error", "timeout")


class AutotuneError(RuntimeAPIError, RuntimeError):
    "The autotuner cannot run as configured (unknown kernel, no shape for the call, ...)"


class UnknownTunedKernel(AutotuneError, UnknownKernelError):
    "A kernel to tune that no registry or module path names (an UnknownKernelError as every lookup raises)"


class LaunchRefused(AutotuneError):
    "Every candidate config of a launch was refused on this device"


class RefusedConfigWarning(UserWarning):
    "A config was refused at launch; the next ranked one was used instead"


class TuneResult:
    """What one tune gave: the config, how it was chosen (`source`: cache, timed, or, when nothing was
    timed, predicted or default), every candidate timed."""

    __slots__ = ("kernel", "shape", "dtype", "config", "source", "median_us", "timed", "legal", "wall_s", "key", "note")

    def __init__(self, kernel: str, shape: dict, dtype: str, config: dict, source: str,
                 median_us: float | None = None, timed: list[dict] | None = None, legal: int = 0,
                 wall_s: float = 0.0, key: str = "", note: str = "") -> None:
        self.kernel, self.shape, self.dtype, self.config, self.source = kernel, shape, dtype, config, source
        self.median_us = median_us
        self.timed = timed or []  # {"config", "status", "median_us"} per candidate, in timing order
        self.legal = legal        # legal configs of this case
        self.wall_s = wall_s
        self.key = key
        self.note = note

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return (f"TuneResult({self.kernel} {self.dtype} {self.shape}: {self.config} from {self.source}, "
                f"{len(self.timed)} of {self.legal} legal configs timed)")


# ------------------------------------------------------------------------------------------
# the device and the default measurer (both import MLX; only called when something is timed)


_DEVICES: dict[str | None, tuple[str, str, dict]] = {}
_MEASURERS: dict[tuple[int, int], "Measure"] = {}


def _device_and_mlx(device: str | None) -> tuple[str, str, dict]:
    """(chip id, MLX version, metadata for the cache section), worked out once per device per process; a registered
    device named by its name or an alias is its id (lookup.named_as). A device the catalog lacks that the active
    bundle's store registered (`devices add`; named, or this process's GPU as lookups find it) is that device, with
    the limits and metadata of the bundle's profile of it, as a catalog chip has the catalog's."""
    if device is not None:
        from zmlx_pipeline.runtime.device import catalog_row
        from zmlx_pipeline.runtime.lookup import named_as

        device = named_as(device)
        row = catalog_row(device) if "@" not in device else None
        if row is not None:  # a name of one catalog chip (`NVIDIA-H200`) is its id, as lookups answer it
            device = row["id"]
    if device not in _DEVICES:
        _DEVICES[device] = _detect_device_and_mlx(device)
    chip, version, meta = _DEVICES[device]
    if not meta["limits_row"]:  # no catalog row: read anew for the bundle active now
        found = _registered_profile(chip, detected=device is None)
        if found is not None:
            return found[0], version, _device_meta(found[0], found[1], version)
    return chip, version, dict(meta)


def _registered_profile(chip: str, *, detected: bool) -> tuple[str, dict] | None:
    """(id, profile as a catalog row) of the device the active bundle registered that `chip` is: `chip` itself, or,
    for this process's GPU (`detected`), the registered device lookups answer it as; None for any other."""
    from zmlx_pipeline.runtime.device import current_device, is_registered, registered_for_detected

    try:
        from zmlx_pipeline.runtime.bundle import active_bundle

        bundle = active_bundle()
    except Exception:  # noqa: BLE001 - no bundle to read: the default limits, as before
        return None
    if bundle is None:
        return None
    if detected:
        current_device()  # detection of a GPU the catalog lacks, which registered_for_detected reads
        chip = registered_for_detected(bundle.profiles) or ""
    prof = bundle.profiles.get(chip)
    if not is_registered(prof):
        return None
    # the catalog's default threadgroup, as a catalog row holds it (the profile's own is the learned one)
    catalog_tg = prof.get("catalog_default_threadgroup") or prof.get("default_threadgroup")
    return chip, {**prof, "default_threadgroup": catalog_tg}


def _detect_device_and_mlx(device: str | None) -> tuple[str, str, dict]:
    try:
        import mlx.core as mx

        mlx_version = str(getattr(mx, "__version__", "unknown"))
    except Exception:  # noqa: BLE001
        mlx_version = "unknown"
    row: dict = {}
    if device is None:
        try:
            from zmlx_pipeline.data.detect import detect_device

            detected = detect_device()
            device = detected.device_id
            row = detected.spec.as_row() if detected.spec is not None else {}
        except Exception:  # noqa: BLE001
            device = "unknown"
    if not row:
        from zmlx_pipeline.runtime.device import catalog_row

        row = catalog_row(device) or {}
    return device, mlx_version, _device_meta(device, row, mlx_version)


def _device_meta(device: str, row: Mapping[str, Any], mlx_version: str) -> dict:
    """The cache section's metadata of a device from its catalog row (or registered profile), with the row itself
    under `limits_row` (what legality reads)."""
    from zmlx_pipeline.runtime.profiles import _seed_case

    family, variant = _seed_case(str(row.get("family") or ""), str(row.get("variant") or ""), row.get("vendor"))
    meta = {"device_id": device, "family": family, "variant": variant, "gpu_cores": row.get("gpu_cores"),
            "memory_bandwidth_gbps": row.get("memory_bandwidth_gbps"),
            "default_threadgroup": row.get("default_threadgroup"), "mlx_version": mlx_version}
    return {**meta, "limits_row": dict(row)}


def harness_measure(warmup: int, iters: int, rotate_bytes: int = 0, timer: str = "chain") -> Measure:
    """A measurer that checks and times a config with the collect harness on this process's GPU (one per setting):
    (status, median us, error text).

    `rotate_bytes`: rotate through enough input sets to exceed this many bytes, as collect does with
    twice the device's L2, so a config is timed reading memory as the training data were.
    `timer`: "chain" (MLX only), or "gpu"/"auto" for CUPTI kernel durations (imports torch when
    timing; see kernels/timing.py), the timer collect uses where it can.
    """
    key = (warmup, iters, int(rotate_bytes), timer)
    if key not in _MEASURERS:
        _MEASURERS[key] = kernel_provider().measurer(warmup, iters, int(rotate_bytes), timer)
    return _MEASURERS[key]


# ------------------------------------------------------------------------------------------
# tuning one case


#: what the tuner reads of a kernel spec besides its `name` and `legal_configs`
SPEC_PARTS = ("shape_grid", "params", "version", "threadgroup_param", "launch")


def _looks_like_spec(obj: Any) -> bool:
    """A named instance with legal_configs, not a class: meant as a KernelSpec."""
    return not isinstance(obj, type) and callable(getattr(obj, "legal_configs", None)) \
        and isinstance(getattr(obj, "name", None), str)


def _missing_parts(obj: Any) -> list[str]:
    """The parts of a kernel spec the tuner reads that `obj` lacks (shape_grid.dims counts as one)."""
    missing = [part for part in SPEC_PARTS if not hasattr(obj, part)]
    if "shape_grid" not in missing and not hasattr(obj.shape_grid, "dims"):
        missing.append("shape_grid.dims")
    if "launch" not in missing and not callable(obj.launch):
        missing.append("a callable launch")
    return missing


def _is_spec(obj: Any) -> bool:
    """A KernelSpec (or an object that works as one): a named instance with everything the tuner reads."""
    try:
        return _looks_like_spec(obj) and not _missing_parts(obj)
    except Exception:  # noqa: BLE001 - a property that raises: not a spec
        return False


def _bundle_kernels() -> dict:
    """The kernels of the active bundle; empty when none can be loaded (a message then says less, nothing breaks)."""
    try:
        from zmlx_pipeline.runtime.bundle import active_bundle

        return active_bundle().kernels
    except Exception:  # noqa: BLE001 - only a message depends on it
        return {}


def _spec(kernel: Any):
    if _is_spec(kernel):
        return kernel
    if _looks_like_spec(kernel):
        try:
            missing = ", ".join(_missing_parts(kernel)) or "a part that raised when read"
        except Exception:  # noqa: BLE001 - a property that raises
            missing = "a part that raised when read"
        raise BadArgumentType(f"kernel {kernel.name!r:.60} ({type(kernel).__name__}) is not a KernelSpec: it lacks "
                              f"{missing}; pass a KernelSpec, a registered name or a module:attr path")
    expect_str(kernel, "kernel (a registered name, module:attr or KernelSpec)")
    if ":" in kernel:
        return _spec_at(kernel)
    try:
        spec = kernel_provider().get_kernel(kernel)
    except UnknownKernel as exc:
        if kernel in _bundle_kernels():  # imported data (Kernel Tuner): ranked in the bundle, no source here
            raise UnknownTunedKernel(
                f"kernel {plain(kernel)} is in the bundle from imported measurements, with no source here to compile "
                "and time: predicted_config, candidates and `zmlx-pipeline lookup` answer it; tune takes a kernel "
                "this package can launch (a registered name, a module:attr path or a KernelSpec)") from None
        raise UnknownTunedKernel(str(exc)) from None
    if not _is_spec(spec):
        raise UnknownTunedKernel(f"kernel {kernel!r} resolves to a {type(spec).__name__}, not a KernelSpec")
    return spec


def _spec_at(path: str):
    """The KernelSpec a `module:attr` path names (attr defaults to SPEC), taken only if it is one: nothing found
    there is called, so a path such as sys:exit is refused, never run."""
    module_name, _, attr = path.partition(":")
    if not module_name.strip() or module_name.startswith("."):
        raise UnknownTunedKernel(f"kernel path {path!r} names no module: write it as package.module:ATTR")
    try:
        module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - whatever importing it raised, SystemExit included
        reason = " ".join(str(exc).split())[:200]
        raise UnknownTunedKernel(f"cannot import {module_name!r} for kernel {path!r} ({type(exc).__name__}"
                                 f"{': ' + plain(reason) if reason else ''}); fix that, or give an importable "
                                 "package.module:ATTR") from None
    try:
        obj = getattr(module, attr or "SPEC", None)
    except Exception:  # noqa: BLE001 - a module __getattr__ that fails names no spec
        obj = None
    if not _is_spec(obj):
        what = "a function" if callable(obj) and not isinstance(obj, type) else type(obj).__name__
        raise UnknownTunedKernel(f"kernel path {path!r} names {what}, not a KernelSpec: name the spec object "
                                 "itself (the runtime calls nothing a path names)")
    return obj


def _count(name: str, value: Any, least: int, most: int | None = None) -> int:
    """`value` as an int from `least` to `most` (None: no bound; numpy's integers taken as the ints they hold); the
    runtime's errors otherwise."""
    n = whole_number(value)
    if n is None:
        raise BadArgumentType(f"{name} must be a whole number >= {least}, not {type(value).__name__} ({value!r:.60})")
    if n < least:
        raise BadArgument(f"{name} must be >= {least} (got {value_text(n)})")
    if most is not None and n > most:
        raise BadArgument(f"{name} must be at most {most} (got {value_text(n)}): more would keep the GPU busy for "
                          "no better pick")
    return n


def _optional(name: str, value: Any, kinds: tuple[type, ...] | None, what: str) -> None:
    """BadArgumentType unless `value` is None or of `kinds` (callable when `kinds` is None)."""
    if value is not None and not (callable(value) if kinds is None else isinstance(value, kinds)):
        raise BadArgumentType(f"{name} must be {what} or None, not {type(value).__name__} ({value!r:.60})")


def _check_takes(fn: Callable, name: str) -> None:
    """AutotuneError, when the function is decorated, for a config_arg the function cannot take as a keyword (it
    used to be a bare TypeError at its first call); a function whose signature cannot be read is taken on trust."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    if name not in params or params[name].kind not in kinds:
        raise AutotuneError(f"{getattr(fn, '__name__', 'the function')} takes no keyword argument {name!r}, which "
                            "config_arg names: give config_arg the name of its config (or threadgroup) parameter")


def _check_options(*, warmup: Any = 3, iters: Any = 10, k: Any = None, configs: Any = None, threadgroups: Any = None,
                   device: Any = None, cache_path: Any = None, measure: Any = None, precompile: Any = None,
                   timer: Any = "chain", shape: Any = None, dtype: Any = None, config_arg: Any = None,
                   use_cache: Any = True, device_aware: Any = True) -> None:
    """The runtime's errors for a tuning option that cannot be used (what tune and autotune take alike)."""
    _count("warmup", warmup, 0, MAX_WARMUP)
    _count("iters", iters, 1, MAX_ITERS)
    for name, value in (("use_cache", use_cache), ("device_aware", device_aware)):
        if not isinstance(value, bool):
            raise BadArgumentType(f"{name} must be True or False, not {type(value).__name__} ({value!r:.60})")
    if k is not None:
        check_k(k)
    for name, value in (("measure", measure), ("precompile", precompile), ("shape", shape), ("dtype", dtype)):
        _optional(name, value, None, "a function")
    _optional("device", device, (str,), "a device id")
    _optional("config_arg", config_arg, (str,), "a keyword name")
    if config_arg is not None and (not config_arg.isidentifier() or keyword.iskeyword(config_arg)):
        raise BadArgumentType(f"config_arg must name a keyword argument of the function, such as 'config'; got "
                              f"{config_arg!r:.60}")
    _optional("cache_path", cache_path, (str, os.PathLike), "a file path")
    if cache_path is not None:
        cache_file.checked_path(cache_path)
    if device is not None:  # a device the caller names: refused as lookups refuse it (UnknownDeviceError, BadLookup)
        from zmlx_pipeline.runtime.lookup import check_device

        check_device(device)
    if timer not in TIMERS:
        raise BadArgument(f"timer must be one of {', '.join(TIMERS)}, not {timer!r:.60}")
    for name, value in (("configs", configs), ("threadgroups", threadgroups)):
        if isinstance(value, (list, tuple)) and not value:  # None searches them all; an empty list, none
            raise BadArgument(f"{name} is empty: give at least one, or None to search every legal config")
    if configs is not None:
        for config in _items("configs", configs, "configs (dicts of parameters)"):
            config_id(_config("configs", config))
    if threadgroups is not None:
        for t in _items("threadgroups", threadgroups, "threadgroup sizes (or (x, y, z) tuples)"):
            _count("a threadgroup size", t[0] if isinstance(t, (tuple, list)) and t else t, 1)


def _items(name: str, value: Any, what: str) -> list:
    """A list or tuple's items; BadArgumentType for anything else (a number, a string, a dict)."""
    if not isinstance(value, (list, tuple)):
        raise BadArgumentType(f"{name} must be a list of {what}, not {type(value).__name__} ({value!r:.60})")
    return list(value)


def _config(name: str, config: Any) -> Mapping[str, Any]:
    """A config: a mapping of parameter names to numbers or strings (BadArgumentType otherwise)."""
    if not isinstance(config, Mapping) or not all(
            isinstance(key, str) and (value is None or isinstance(value, (str, int, float)))
            for key, value in config.items()):
        raise BadArgumentType(f"each of {name} must be a dict of parameter names to numbers, not {config!r:.80}")
    return config


def _refusals(refusals: Any) -> tuple[type, ...]:
    """`refusals` as a tuple of exception classes (one class alone is taken too); BadArgumentType otherwise."""
    items = (refusals,) if isinstance(refusals, type) else refusals
    if not isinstance(items, (list, tuple)) or not all(isinstance(c, type) and issubclass(c, Exception) for c in items):
        raise BadArgumentType(f"refusals must be a tuple of exception classes such as (RuntimeError, ValueError), "
                              f"not {refusals!r:.60}")
    return tuple(items)


def _checked_shape(spec, shape: Any) -> dict[str, int]:
    """The shape as the kernel's dims, positive ints; the lookups' errors for a malformed one."""
    from zmlx_pipeline.runtime.lookup import BadLookup, _dim_value

    if not isinstance(shape, Mapping):
        raise BadArgumentType(f"shape must be a mapping of dims such as {{'rows': 4096, 'cols': 4096}}, "
                              f"not {type(shape).__name__} ({shape!r:.60})")
    if set(map(str, shape)) != set(spec.shape_grid.dims):
        raise BadLookup(f"kernel {spec.name!r} has dims {', '.join(spec.shape_grid.dims)}; got "
                        f"{', '.join(plain(str(d)) for d in shape) or 'none'}")
    return {d: _dim_value(d, shape[d]) for d in spec.shape_grid.dims}


def _checked_dtype(dtype: Any) -> str:
    from zmlx_pipeline.runtime.lookup import _dtype_name

    return _dtype_name(dtype)


def pruned_candidates(spec, shape: Mapping[str, int], dtype: str, legal: list[dict], k: int | None = None,
                      device: str | None = None, *, detected: bool = False) -> tuple[list[dict], str]:
    """The bundle's top-k legal configs for this case, capped at a fifth of the legal ones; and a note. `detected`:
    `device` is this process's GPU, not a device the caller named (one the catalog does not know answers)."""
    pred = predicted_or_default(spec.name, dict(shape), dtype, device=device, detected=detected)
    cap = max(1, int(len(legal) * MAX_FRACTION))
    want = min(cap, k if k is not None else pred.prune_k)
    legal_keys = {tuple(sorted(c.items())): c for c in legal}
    ranked = [legal_keys[t] for t in (tuple(sorted(c.items())) for c in pred.top(10_000)) if t in legal_keys]
    note = ""
    if pred.evidence == "default" or not ranked:
        # the lookup's own default ranking comes first (so the tuner agrees with predicted_config),
        # then the other legal configs nearest the default threadgroup, to fill k
        tg_param = spec.threadgroup_param
        target = pred.threadgroup or 256
        ranked += sorted(legal, key=lambda c: (abs((c.get(tg_param) or target).bit_length() - target.bit_length()),))
        note = f"no model ranking ({pred.note}); timing the configs nearest the default threadgroup"
    elif pred.kernel_version and pred.kernel_version != spec.version:
        note = f"bundle ranks {spec.name} version {pred.kernel_version}, this kernel is {spec.version}"
    seen: set = set()
    out = []
    for c in ranked:
        t = tuple(sorted(c.items()))
        if t not in seen:
            seen.add(t)
            out.append(c)
        if len(out) >= want:
            break
    return out, note


def tune(kernel: Any, shape: Mapping[str, int], dtype: str, *, k: int | None = None, device_aware: bool = True,
         configs: Sequence[Mapping[str, Any]] | None = None, warmup: int = 3, iters: int = 10,
         use_cache: bool = True, device: str | None = None, measure: Measure | None = None,
         cache_path: str | None = None, threadgroups: Sequence[int] | None = None, timer: str = "chain",
         precompile: Callable | None = None) -> TuneResult:
    """The best config for one case: from the cache, else by timing the pruned candidates (or all, or `configs`).

    `kernel` is a registered name, a KernelSpec, or a `module:attr` path to a KernelSpec object (nothing
    found there is called). Every option is checked first: the runtime's errors for one it cannot use.
    `warmup` (0 to MAX_WARMUP, 10,000) and `iters` (1 to MAX_ITERS, 10,000): launches before timing and timed samples
    per candidate.
    `threadgroups` keeps only legal configs with one of these threadgroup sizes (ZMLX's candidate list).
    Configs refused at launch on this device before are left out; with `use_cache`, a candidate the
    pipeline refuses for its thread limit while timed is remembered as refused too. A cached entry that is no
    answer (no legal config of every parameter, a `tg` that is not the threadgroup its config launches with, a median
    that is no time) is a miss, warned about once per file.
    `timer` is the harness's timer when `measure` is not given ("chain", "gpu" or "auto").
    `precompile(spec, configs, shape, dtype)` compiles every candidate before the first is timed
    (default: the measurer's own `precompile`, which the harness measurer has on CUDA: NVRTC in
    parallel threads through the on-disk compiled-kernel cache, shared with collect).
    """
    _check_options(warmup=warmup, iters=iters, k=k, configs=configs, threadgroups=threadgroups, device=device,
                   cache_path=cache_path, measure=measure, precompile=precompile, timer=timer, use_cache=use_cache,
                   device_aware=device_aware)
    warmup, iters, k = whole_number(warmup), whole_number(iters), None if k is None else check_k(k)
    if device is None:
        from zmlx_pipeline.runtime.device import current_device

        named, _, explicit = current_device()
        if explicit:  # $ZMLX_PIPELINE_DEVICE names this process's device as lookups read it (an MPS core limit, which
            from zmlx_pipeline.runtime.lookup import check_device  # the GPU does not report): refused as they refuse it

            check_device(named, "$ZMLX_PIPELINE_DEVICE")
            device = named
    spec = _spec(kernel)
    dtype = _checked_dtype(dtype)
    shape = _checked_shape(spec, shape)
    if use_cache and cache_path is not None:
        cache_file.writable_path(cache_path)  # refused now, not after every candidate was timed
    chip, mlx_version, meta = _device_and_mlx(device)
    row = meta.pop("limits_row")
    dkey, *also = cache_file.device_keys(chip, mlx_version)
    legal = every = spec.legal_configs(shape, dtype, Limits.from_device_row(row))
    if threadgroups is not None:
        sizes = {int(t[0] if isinstance(t, (tuple, list)) else t) for t in threadgroups}
        legal = [c for c in legal if c.get(spec.threadgroup_param) in sizes]
    refused = refused_configs(spec.name, dkey, cache_path)
    runnable = [c for c in legal if config_id(c) not in refused]
    if not runnable:
        why = (f" ({len(legal)} refused at launch on {dkey})" if legal
               else f" (of threadgroup {', '.join(map(str, sorted(sizes)))})" if every and threadgroups is not None
               else _rules_broken(spec, shape, dtype, Limits.from_device_row(row)))
        raise AutotuneError(f"{spec.name}: no legal config for {shape} {dtype} on {chip}{why}")
    legal = runnable
    given: list[dict] | None = None
    if configs is not None:
        # each given config as the legal config it equals, so 128.0 is launched and kept as the kernel's 128 (a
        # bool is no number here: True stands for no 1)
        legal_keys = {_given_key(c): c for c in legal}
        picked = dict.fromkeys(t for t in (_given_key(c) for c in configs) if t in legal_keys)
        given = [dict(legal_keys[t]) for t in picked]  # a config given twice is timed once
        if not given:
            kept = {_given_key(c) for c in every}  # legal here, but left out by `threadgroups` or refused at launch
            why = ("" if not any(_given_key(c) in kept for c in configs) else
                   f" of threadgroup {', '.join(map(str, sorted(sizes)))}" if threadgroups is not None
                   else f" not refused at launch on {dkey}")
            raise AutotuneError(f"{spec.name}: none of the {len(configs)} given configs is a legal config{why} for "
                                f"{shape} {dtype}")
    # a search narrowed by `configs` or `threadgroups` answers from the cache only with one of its own configs, and
    # its winner never replaces a usable entry, nor answers a wider search later (its entry says `restricted`)
    restricted = configs is not None or threadgroups is not None
    held = None  # the config of a usable cached entry this search does not take
    key = cache_file.entry_key(spec.name, spec.version, shape, spec.shape_grid.dims, dtype, list(spec.params))
    if use_cache:
        hit = cache_file.load_entries(dkey, cache_path, tuple(also)).get(key)
        config = cache_file.config_of(hit, spec.params)
        problem = _cache_entry_problem(hit, config, spec, shape, every) if hit is not None else ""
        if problem:  # a miss: timed again below, and the new winner replaces the entry
            _warn_bad_entry(cache_path, f"{spec.name} {shape} {dtype} on {dkey}", problem)
        elif config is not None:
            narrower = hit.get("restricted") is True and not restricted
            if not narrower and config_id(config) in {config_id(c) for c in (given or legal)}:
                return TuneResult(spec.name, shape, dtype, config, "cache", hit.get("median_us"), legal=len(legal),
                                  key=key)
            if restricted:
                held = config
    if use_cache and cache_path is None:  # the default ($ZMLX_CACHE_DIR): refused now, as a given path is
        cache_file.writable_path(None)
    note = ""
    if given is not None:
        cands = given
    elif device_aware:
        cands, note = pruned_candidates(spec, shape, dtype, legal, k=k, device=chip, detected=device is None)
    else:
        cands = list(legal)
    start = time.perf_counter()
    try:
        # inputs rotated over twice the L2, as collect times: the models and the bundle ranked configs
        # by those timings, and with inputs left in L2 a mid-size shape can rank them differently
        measure = measure or harness_measure(warmup, iters, rotate_bytes=kernel_provider().rotate_bytes_for(row),
                                             timer=timer)
    except Exception as exc:  # noqa: BLE001 - no GPU backend: answer from the bundle, time nothing
        pred = predicted_or_default(spec.name, shape, dtype, device=chip, detected=device is None)
        config, how = _untimed_choice(pred, legal, cands[0] if pred.evidence == "default" else None)
        warnings.warn(f"zmlx-pipeline autotune: nothing timed ({exc}); using {how}", stacklevel=caller_stacklevel())
        return TuneResult(spec.name, shape, dtype, config, _untimed_source(pred), legal=len(legal), key=key,
                          note=str(exc))
    ahead = precompile or getattr(measure, "precompile", None)
    if ahead is not None:
        try:
            ahead(spec, [dict(c) for c in cands], dict(shape), dtype)
        except Exception:  # noqa: BLE001 - a candidate that cannot compile fails its own measurement
            pass
    timed, over_limit = [], []
    for cfg in cands:
        status, median, *error = _measured(measure(spec, cfg, shape, dtype), cfg)
        timed.append({"config": cfg, "status": status, "median_us": median})
        if use_cache and status == "launch_error" and error and pipeline_thread_limit(str(error[0])):
            over_limit.append((cfg, str(error[0])))
    for cfg, error in over_limit:  # kept once every result was read: a malformed one stores nothing
        # the chip's pipeline refuses this config at any shape: never launch or time it again here
        remember_refusal(spec.name, dkey, cfg, error, cache_path)
    wall = time.perf_counter() - start
    ok = [t for t in timed if t["status"] == "ok" and t["median_us"] is not None]
    if not ok:
        pred = predicted_or_default(spec.name, shape, dtype, device=chip, detected=device is None)
        why = ("no candidate passed the reference check with a time above 0 us" if any(
            t["status"] == "bad_time" for t in timed) else "no candidate passed the reference check")
        config, how = _untimed_choice(pred, legal)
        return TuneResult(spec.name, shape, dtype, config, _untimed_source(pred), None, timed, len(legal), wall, key,
                          f"{why}; using {how} (not cached)")
    best = min(ok, key=lambda t: t["median_us"])
    if use_cache and held is not None:
        kept = " ".join(f"{name}={value}" for name, value in sorted(held.items()))
        note = (note + "; " if note else "") + (f"not cached: the cache keeps {kept} for this case, another "
                                                 "search's winner")
    elif use_cache:
        launch = spec.launch(best["config"], shape)
        value = cache_file.entry_value(best["config"], dtype, launch.threadgroup, median_us=best["median_us"],
                                       candidates_timed=len(timed), legal_configs=len(legal), source="autotune",
                                       grid=list(launch.grid), tuned_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
                                       **({"restricted": True} if restricted else {}))
        try:
            cache_file.save_entries(dkey, {key: value}, meta, cache_path, tuple(also))
        except OSError as exc:  # a full disk: the winner is still launched, only not kept for the next process
            note = (note + "; " if note else "") + _warn_not_saved(cache_path, f"{spec.name} {shape} {dtype} on {dkey}",
                                                                   exc)
    return TuneResult(spec.name, shape, dtype, dict(best["config"]), "timed", best["median_us"], timed, len(legal),
                      wall, key, note)


def _given_key(config: Mapping[str, Any]) -> tuple:
    """A config as `configs` matches it against the legal ones: by value, a bool apart from the number it equals."""
    return tuple(sorted((name, isinstance(value, bool), value) for name, value in config.items()))


def _rules_broken(spec, shape: Mapping[str, int], dtype: str, limits: Limits) -> str:
    """The constraints every config this device can run breaks on this case, as a lookup names them (`(TG // ROWS) *
    VEC <= cols` for an 8 x 8 rmsnorm); all of them where no one constraint rules every such config out."""
    broken = [set(spec.violations(c, shape, dtype, limits)) for c in spec.configs()]
    # among the configs this device runs at some shape (those passing every constraint that reads no dim)
    free = {t for t in spec.constraints if not set(compile(t, "<constraint>", "eval").co_names) & set(shape)}
    pool = [b for b in broken if not b & free] or broken
    every = [text for text in spec.constraints if pool and all(text in b for b in pool)]
    return (f" (every config breaks: {'; '.join(every)})" if every
            else f" (constraints: {'; '.join(spec.constraints) or 'none'})")


def _untimed_source(pred: Any) -> str:
    """A TuneResult's source when nothing was timed: "default" where the bundle had no ranking for the case (the
    warning and note say the default config), else "predicted"."""
    return "default" if pred.evidence == "default" else "predicted"


def _untimed_choice(pred: Any, legal: list[dict], first: dict | None = None) -> tuple[dict, str]:
    """The config to use when nothing was timed (or none passed), and how it was chosen: `first` when given (the
    tuner's own first candidate), else the predicted config when it is one of this case's legal configs, else the
    first legal one in the model's ranking, else the first legal one; never a config outside `legal` (a bundle's
    pick may be illegal here: other limits, configs refused at launch, `threadgroups`). `legal` is never empty."""
    by_id = {config_id(c): c for c in legal}
    if first is not None and config_id(first) in by_id:
        return dict(by_id[config_id(first)]), f"the {pred.evidence} config"
    if pred.config is not None and config_id(pred.config) in by_id:
        return dict(by_id[config_id(pred.config)]), f"the {pred.evidence} config"
    for c in pred.top(10_000):
        if config_id(c) in by_id:
            return dict(by_id[config_id(c)]), (f"the first legal config of the {pred.evidence} ranking (its "
                                               f"pick {pred.config} is not legal here)")
    return dict(legal[0]), f"the first legal config (no {pred.evidence} pick is legal here)"


def _cache_entry_problem(hit: Any, config: dict | None, spec: Any, shape: Mapping[str, int],
                         legal: list[dict]) -> str:
    """Why a cache entry cannot be this case's answer ("" if it can): no complete config, a config that is not legal
    for the kernel and shape, a `tg` that is not the threadgroup that config launches with on this shape, a
    `restricted` mark that is not true or false (which searches it answers cannot be told), or a `median_us` that is
    no time (ZMLX's own entries have none, which is fine)."""
    params = spec.params
    if config is None:
        return cache_file.contradiction(hit) or "it holds no config with every parameter of the kernel"
    if set(config) != set(params):
        return f"its config {config!r:.80} does not set exactly the kernel's parameters {', '.join(sorted(params))}"
    if config_id(config) not in {config_id(c) for c in legal}:
        return f"its config {config!r:.80} is not legal for this kernel and shape"
    disagreement = cache_file.threadgroup_disagreement(hit, spec.launch(config, shape).threadgroup)
    if disagreement:
        return disagreement
    if not isinstance(hit.get("restricted", False), bool):
        return f"its restricted {hit.get('restricted')!r:.40} is not true or false"
    median = hit.get("median_us")
    if median is None:
        return ""
    try:
        usable = isinstance(median, numbers.Real) and not isinstance(median, bool) and 0 < float(median) < math.inf
    except OverflowError:  # a whole number past the largest float
        usable = False
    return "" if usable else f"its median_us {median!r:.40} is no time"


#: cache files (resolved paths) whose unusable entries were warned about in this process
_BAD_ENTRY_WARNED: set[str] = set()


def _warn_bad_entry(cache_path: str | None, case: str, problem: str) -> None:
    """Say once per cache file that an entry of it is not used (later ones in the same file are re-tuned quietly)."""
    where = _path_key(cache_path)
    if where not in _BAD_ENTRY_WARNED:
        _BAD_ENTRY_WARNED.add(where)
        warnings.warn(f"zmlx-pipeline autotune: {plain(where)}: the cached entry of {case} is not used "
                      f"({problem}); timing "
                      "it again, and the new winner replaces it (other such entries of this file are not warned about)",
                      stacklevel=caller_stacklevel())


#: cache files (resolved paths) a winner could not be saved to in this process (warned about once each)
_NOT_SAVED_WARNED: set[str] = set()


def _warn_not_saved(cache_path: str | None, case: str, exc: OSError) -> str:
    """Say once per cache file that a winner could not be written to it (a full disk); returns the result's note."""
    where = _path_key(cache_path)
    why = plain(exc.strerror or exc)
    if where not in _NOT_SAVED_WARNED:
        _NOT_SAVED_WARNED.add(where)
        warnings.warn(f"zmlx-pipeline autotune: {plain(where)}: the winner of {case} was not cached ({why}); it "
                      "is used all the same, and timed again by the next process (later winners this file cannot "
                      "keep are not warned about)", stacklevel=caller_stacklevel())
    return f"not cached: {why}"


def _measured(result: Any, config: Mapping[str, Any]) -> tuple:
    """A measurer's (status, median us, error...) with a median that is no time (NaN, inf, <= 0) as a failed
    candidate ("bad_time", None): never cached or chosen. AutotuneError for a result of another form or a status
    that is none of MEASURE_STATUSES."""
    if not isinstance(result, (tuple, list)) or len(result) < 2 or not isinstance(result[0], str) \
            or not (result[1] is None or isinstance(result[1], numbers.Real) and not isinstance(result[1], bool)):
        raise AutotuneError(f"measure returned {result!r:.80} for config {dict(config)}: it must return "
                            "(status, median_us or None[, error]), such as ('ok', 12.5)")
    status, median, *error = result
    if status not in MEASURE_STATUSES:  # ("OK", 5.0) would otherwise be a failed candidate, and every config failed
        raise AutotuneError(f"measure returned status {status!r:.40} for config {dict(config)}: a status is "
                            f"one of {', '.join(MEASURE_STATUSES)}")
    if median is not None:
        try:
            median = float(median)
        except OverflowError:  # a whole number (or fraction) past the largest float: no time either
            median = math.inf
        if not math.isfinite(median) or median <= 0:
            if status == "ok":
                return "bad_time", None, f"measure gave a median of {median!r} us, which is no time"
            median = None
    return status, median, *error


# ------------------------------------------------------------------------------------------
# configs the chip refused, and launching past them


#: (cache file, device key) -> ids ("<kernel> <config json>") refused there, as read from the file and seen since
_REFUSED: dict[tuple[str, str], set[str]] = {}
_WARNED: set[tuple[str, str, str]] = set()
_CONFIRMED: set[tuple[str, str, str]] = set()  # launches evaluated once in this process without an error


def config_id(config: Mapping[str, Any]) -> str:
    """A config's identity: canonical JSON (sorted keys, tuples as lists), as it reads back from the cache file;
    BadArgumentType for anything but a mapping of parameter names to values."""
    if not isinstance(config, Mapping):
        raise BadArgumentType(f"a config must be a mapping of parameter names to values, not {type(config).__name__} "
                              f"({config!r:.60})")
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"), default=str)


def _path_key(cache_path: str | None) -> str:
    if cache_path is None:
        return str(cache_file.cache_path())
    return str(Path(home_expanded(os.fspath(cache_path), "cache_path")).resolve())


def refused_configs(kernel: str, dkey: str, cache_path: str | None = None) -> set[str]:
    """The config ids of `kernel` refused on this device: from the cache file (read once per process) and since;
    BadArgumentType for a kernel, device key or cache path that is not text (a path)."""
    expect_str(kernel, "kernel")
    expect_str(dkey, "dkey")
    _optional("cache_path", cache_path, (str, os.PathLike), "a file path")
    where = (_path_key(cache_path), dkey)
    if where not in _REFUSED:
        _REFUSED[where] = {f"{r.get('kernel')} {config_id(r['config'])}" for r in cache_file.load_refusals(dkey, cache_path)
                           if isinstance(r.get("config"), Mapping)}
    prefix = f"{kernel} "
    return {i[len(prefix):] for i in _REFUSED[where] if i.startswith(prefix)}


def remember_refusal(kernel: str, dkey: str, config: Mapping[str, Any], error: str,
                     cache_path: str | None = None) -> str:
    """Keep a refusal in-process and in the cache file; returns "" or why the file could not keep it.
    BadArgumentType, keeping nothing, for an argument of another type (an `error` that is not text)."""
    ident = config_id(config)
    expect_str(error, "error")
    refused_configs(kernel, dkey, cache_path)
    _REFUSED[(_path_key(cache_path), dkey)].add(f"{kernel} {ident}")
    try:
        cache_file.save_refusal(dkey, kernel, config, error, cache_path)
    except (OSError, BadArgument) as exc:
        return f"not saved to the cache file: {exc}"
    return ""


def forget_refusals() -> None:
    """Read refusals from the cache file again and warn again (tests; a new driver may lift a limit)."""
    _REFUSED.clear()
    _WARNED.clear()
    _CONFIRMED.clear()
    _BAD_ENTRY_WARNED.clear()
    _NOT_SAVED_WARNED.clear()


def _evaluate(out: Any) -> None:
    """Evaluate MLX arrays in a launch's result: a Metal pipeline's thread limit is checked when the
    launch is evaluated, not when it is queued, so a refusal surfaces only here."""
    mx = sys.modules.get("mlx.core")
    if mx is None:
        return
    leaves = list(out.values()) if isinstance(out, Mapping) else list(out) if isinstance(out, (list, tuple)) else [out]
    arrays = [a for a in leaves if isinstance(a, mx.array)]
    if arrays:
        mx.eval(arrays)


def _refuse(kernel: str, dkey: str, config: dict, error: str, cache_path: str | None) -> None:
    """Remember a refusal and warn about it once per kernel, device and config."""
    not_saved = remember_refusal(kernel, dkey, config, error, cache_path)
    ident = config_id(config)
    if (kernel, dkey, ident) not in _WARNED:
        _WARNED.add((kernel, dkey, ident))
        warnings.warn(f"zmlx-pipeline: {kernel} config {config} was refused on {dkey} ({error}); launched the next "
                      f"ranked config instead, and will not launch this one again on this device"
                      + (f" ({not_saved})" if not_saved else ""), RefusedConfigWarning, stacklevel=caller_stacklevel())


def _launch_ranked(fn: Callable, candidates: Any, args: tuple, kwargs: dict, *, kernel: str, dkey: str,
                   config_arg: str, as_arg: Callable[[dict], Any] | None, cache_path: str | None,
                   refusals: tuple) -> tuple[Any, dict]:
    """The launch and the config it ran with. A refusal naming the pipeline's thread limit is remembered at
    once; any other error only once a later config ran, since an error every config raises (bad inputs, a
    broken device) says nothing about the configs. A config that ran here before is never taken as refused."""
    refused = refused_configs(kernel, dkey, cache_path)
    seen: set[str] = set()
    pending: list[tuple[dict, str]] = []
    last: BaseException | None = None
    if isinstance(candidates, (str, bytes, Mapping)) or not hasattr(candidates, "__iter__"):
        raise BadArgumentType(f"candidates must be configs (dicts), best first, not {type(candidates).__name__} "
                              f"({candidates!r:.60})")
    for config in candidates:
        config = dict(_config("candidates", config))
        ident = config_id(config)
        if ident in refused or ident in seen:
            continue
        seen.add(ident)
        confirmed = (kernel, dkey, ident) in _CONFIRMED
        try:
            out = fn(*args, **{**kwargs, config_arg: as_arg(config) if as_arg else config})
            if not confirmed:
                _evaluate(out)
                _CONFIRMED.add((kernel, dkey, ident))
        except refusals as exc:
            if confirmed:
                raise
            last, error = exc, refusal_text(exc)
            if pipeline_thread_limit(str(exc)):
                _refuse(kernel, dkey, config, error, cache_path)
            else:
                pending.append((config, error))
            continue
        for earlier, error in pending:
            _refuse(kernel, dkey, earlier, error, cache_path)
        return out, config
    tail = f"; last error: {refusal_text(last)}" if last is not None else ""
    raise LaunchRefused(f"{kernel}: no candidate config launched on {dkey} ({len(seen)} tried, "
                        f"{len(refused)} refused before{tail})") from last


def launch_ranked(fn: Callable, candidates: Any, *args: Any, kernel: str, device: str | None = None,
                  config_arg: str = "config", as_arg: Callable[[dict], Any] | None = None,
                  cache_path: str | None = None, refusals: tuple = (RuntimeError, ValueError), **kwargs: Any) -> Any:
    """`fn(*args, **kwargs, <config_arg>=config)` with the first of `candidates` (configs, best first) that runs.

    A launch raising one of `refusals` (MLX raises ValueError or RuntimeError for a launch the device
    refuses; anything else is a bug and propagates) makes it launch the next candidate. The refusal is
    remembered for this kernel, device and config, in-process and in the cache file, and warned about
    once (RefusedConfigWarning): at once when MLX names the pipeline's thread limit, else when a later
    config runs (an error every config raises is not the configs' fault, and nothing is remembered).
    Configs refused before are skipped without a launch. `as_arg` turns a config into what `fn` takes
    (say, a threadgroup tuple). Raises LaunchRefused, from the last error, when none runs.
    """
    if not callable(fn):
        raise BadArgumentType(f"fn must be the function that launches the kernel, not {type(fn).__name__} ({fn!r:.60})")
    _optional("as_arg", as_arg, None, "a function")
    expect_str(kernel, "kernel")
    _check_options(device=device, cache_path=cache_path, config_arg=config_arg)
    refusals = _refusals(refusals)
    chip, mlx_version, _ = _device_and_mlx(device)
    out, _ = _launch_ranked(fn, candidates, args, kwargs, kernel=kernel, dkey=cache_file.device_key(chip, mlx_version),
                            config_arg=config_arg, as_arg=as_arg, cache_path=cache_path, refusals=refusals)
    return out


# ------------------------------------------------------------------------------------------
# the decorator


def _dtype_name(dtype: Any) -> str:
    """An array's dtype as its name: an mlx dtype prints as `mlx.core.float16`; any other text is left for the lookup
    to refuse."""
    return str(dtype).removeprefix(MLX_DTYPE_PREFIX)


def _first_array(args: tuple, kwargs: dict):
    for value in list(args) + list(kwargs.values()):
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            return value
    return None


def _row_length(n: Any) -> int:
    """An array argument's last dim as an int (0: an empty row); the lookups' errors for one that is no size."""
    from zmlx_pipeline.runtime.lookup import _dim_value

    try:
        if operator.index(n) == 0:
            return 0
    except TypeError:
        pass
    return _dim_value("shape[-1]", n)


def _array_dims(arr: Any) -> tuple:
    """An array argument's shape as a tuple (empty for none, or for a `.shape` that is no sequence, such as None)."""
    try:
        return tuple(arr.shape) if arr is not None else ()
    except TypeError:
        return ()


def ranked_configs(spec, shape: Mapping[str, int], dtype: str, device: str | None = None) -> list[dict]:
    """Every legal config of a case on this device, the bundle's ranking first: what a refused launch falls back through."""
    chip, _, meta = _device_and_mlx(device)
    legal = spec.legal_configs(dict(shape), dtype, Limits.from_device_row(meta["limits_row"]))
    by_id = {config_id(c): c for c in legal}
    pred = predicted_or_default(spec.name, dict(shape), dtype, device=chip, detected=device is None)
    order = list(dict.fromkeys(i for i in (config_id(c) for c in pred.top(10_000)) if i in by_id))
    return [by_id[i] for i in order] + [c for i, c in by_id.items() if i not in set(order)]


def _fallbacks(spec, shape: dict, dtype: str, result: TuneResult | None, device: str | None):
    """After the tuned config: the other candidates that passed, fastest first, then every legal config ranked."""
    if result is not None and result.shape == shape and result.dtype == dtype:
        ok = [t for t in result.timed if t["status"] == "ok" and t["median_us"] is not None]
        yield from (t["config"] for t in sorted(ok, key=lambda t: t["median_us"]))
    yield from ranked_configs(spec, shape, dtype, device=device)


class AutotunedKernel:
    """A kernel wrapper whose config keyword is filled with the tuned (or learned) config."""

    def __init__(self, fn: Callable, kernel: Any = None, *, warmup: int = 3, iters: int = 10,
                 device_aware: bool = True, k: int | None = None, shape: Callable[..., Mapping[str, int]] | None = None,
                 dtype: Callable[..., Any] | None = None, configs: Sequence[Mapping[str, Any]] | None = None,
                 config_arg: str | None = None, measure: Measure | None = None, cache_path: str | None = None,
                 device: str | None = None, threadgroups: Sequence[Any] | None = None,
                 refusals: Sequence[type] = (RuntimeError, ValueError)) -> None:
        if not callable(fn):
            raise BadArgumentType(f"@autotune decorates a kernel wrapper function, not {type(fn).__name__} "
                                  f"({fn!r:.60})")
        _check_options(warmup=warmup, iters=iters, k=k, configs=configs, threadgroups=threadgroups, device=device,
                       cache_path=cache_path, measure=measure, shape=shape, dtype=dtype, config_arg=config_arg,
                       device_aware=device_aware)
        refusals = _refusals(refusals)
        if kernel is not None and not isinstance(kernel, str) and not _is_spec(kernel):
            raise BadArgumentType(f"kernel must be a registered name, a module:attr path or a KernelSpec, "
                                  f"not {type(kernel).__name__} ({kernel!r:.60})")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.kernel = kernel
        self.warmup, self.iters, self.device_aware, self.k = warmup, iters, device_aware, k
        self.shape_fn, self.dtype_fn, self.configs = shape, dtype, configs
        self.config_arg = config_arg
        if config_arg is not None:
            _check_takes(fn, config_arg)
        self.measure, self.cache_path, self.device = measure, cache_path, device
        self.threadgroups = threadgroups
        self.refusals = tuple(refusals)
        self._spec = None
        self._memo: dict[tuple, Any] = {}
        self.last: TuneResult | None = None

    def _arg_name(self) -> str:
        if self.config_arg is None:
            import inspect

            params = inspect.signature(self.fn).parameters
            for name in ("config", "threadgroup"):
                if name in params:
                    self.config_arg = name
                    break
            else:
                raise AutotuneError(f"{self.fn.__name__} takes neither a config= nor a threadgroup= keyword; "
                                    "pass config_arg= to @autotune")
        return self.config_arg

    def _case(self, args: tuple, kwargs: dict) -> tuple[dict, str]:
        spec = self._spec
        if self.shape_fn is not None:
            shape = self.shape_fn(*args, **kwargs)
            if not isinstance(shape, Mapping):
                raise BadArgumentType(f"{self.fn.__name__}: its shape= function returned a {type(shape).__name__} "
                                      f"({shape!r:.60}), not a mapping of dims such as {{'rows': 4096, 'cols': 4096}}")
            shape = _checked_shape(spec, shape)  # the dims as ints (a 0-d array too), so they key the memo
        else:
            from zmlx_pipeline.runtime.lookup import _dim_value

            sizes = _array_dims(_first_array(args, kwargs))
            dims = spec.shape_grid.dims if spec is not None else ("rows", "cols")
            if not sizes or len(dims) != 2:
                raise AutotuneError(f"{self.fn.__name__}: cannot tell the {'/'.join(dims)} shape of this call; "
                                    "pass shape=lambda *args, **kw: {...} to @autotune")
            rows = 1
            for i, n in enumerate(sizes[:-1]):
                rows *= _dim_value(f"shape[{i}]", n)
            shape = {dims[0]: rows, dims[1]: _dim_value(f"shape[{len(sizes) - 1}]", sizes[-1])}
        if self.dtype_fn is not None:
            dtype = _dtype_name(self.dtype_fn(*args, **kwargs))
        else:
            arr = _first_array(args, kwargs)
            dtype = _dtype_name(arr.dtype) if arr is not None else "float32"
        return shape, dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self._arg_name()
        if kwargs.get(name) is not None:
            return self.fn(*args, **kwargs)
        if self.kernel is None:
            sizes = _array_dims(_first_array(args, kwargs))
            dim = _row_length(sizes[-1]) if sizes else 0
            memo_key: tuple = ("tg", dim)
        else:
            if self._spec is None:
                self._spec = _spec(self.kernel)
            shape, dtype = self._case(args, kwargs)
            memo_key = (tuple(sorted(shape.items())), dtype)
        known = self._memo.get(memo_key)
        if known is not None:  # this config launched here before: no fallback needed
            return self.fn(*args, **{**kwargs, name: known})
        if self.kernel is None:
            kernel, device, first, rest, as_arg = self._learned_case(dim, name)
        else:
            spec, device = self._spec, self.device
            self.last = tune(spec, shape, dtype, k=self.k, device_aware=self.device_aware,
                             configs=self.configs, warmup=self.warmup, iters=self.iters, device=device,
                             measure=self.measure, cache_path=self.cache_path, threadgroups=self.threadgroups)
            kernel, first = spec.name, self.last.config
            rest = functools.partial(_fallbacks, spec, shape, dtype, self.last, device)
            as_arg = (lambda c: tuple(spec.launch(c, shape).threadgroup)) if name == "threadgroup" else None
        chip, mlx_version, _ = _device_and_mlx(device)

        def ranked():
            yield first
            yield from rest()

        out, used = _launch_ranked(self.fn, ranked(), args, kwargs, kernel=kernel,
                                   dkey=cache_file.device_key(chip, mlx_version), config_arg=name, as_arg=as_arg,
                                   cache_path=self.cache_path, refusals=self.refusals)
        self._memo[memo_key] = as_arg(used) if as_arg else used
        return out

    def _learned_case(self, dim: int, name: str):
        """(kernel, device, first config, the rest, as_arg) of a wrapper without a kernel spec: the learned
        threadgroups for the current chip and a row of `dim` elements."""
        from zmlx_pipeline.runtime.device import current_device_id
        from zmlx_pipeline.runtime.profiles import (
            get_current_device_profile,
            get_threadgroup_candidates_for_shape,
            within_thread_limit,
        )

        profile = get_current_device_profile()
        cands = list(get_threadgroup_candidates_for_shape(profile, dim, "general")) if self.device_aware else []
        ranked = list(within_thread_limit(profile, cands + [int(profile.default_threadgroup)]
                                          + list(profile.threadgroup_candidates)))
        ranked = ranked or [int(profile.max_threads_per_threadgroup or 1024)]  # never past the chip's thread limit
        device = self.device or current_device_id()[0]  # None: this process's GPU, as detection (and its bundle) tell it
        as_arg = (lambda c: (int(c["TG"]), 1, 1)) if name == "threadgroup" else None
        kernel = f"{self.fn.__module__}.{self.fn.__qualname__}"
        return kernel, device, {"TG": int(ranked[0])}, lambda: ({"TG": int(t)} for t in ranked[1:]), as_arg

    def clear_cache(self) -> None:
        """Forget this wrapper's in-process answers (the cache file is kept)."""
        self._memo.clear()


def autotune(kernel: Any = None, *, warmup: int = 3, iters: int = 10, device_aware: bool = True,
             k: int | None = None, shape: Callable[..., Mapping[str, int]] | None = None,
             dtype: Callable[..., Any] | None = None, configs: Sequence[Mapping[str, Any]] | None = None,
             threadgroups: Sequence[Any] | None = None, config_arg: str | None = None,
             measure: Measure | None = None, cache_path: str | None = None, device: str | None = None,
             refusals: Sequence[type] = (RuntimeError, ValueError)):
    """Decorate a kernel wrapper so that its `config=` (or `threadgroup=`) keyword is tuned per shape and dtype.

    `kernel`: a registered kernel name, a `module:attr` path or a KernelSpec (its configs, reference
    and launch are what is timed). `warmup`/`iters`: launches before timing and timed samples per
    candidate (at most 10,000 each, as tune). `device_aware`: time the bundle's pruned candidates for this chip (True) or every
    legal config (False). `k`: candidates to time (default: the kernel's pruning k). `shape`/`dtype`:
    functions of the call's arguments giving the kernel's shape dict and dtype (default: the first
    array argument, rows x cols). `configs`: an explicit candidate list; `threadgroups`: only
    configs with these threadgroup sizes. A launch raising one of `refusals` falls back to the next
    ranked config and is never launched again on this device (see `launch_ranked`).
    """
    if callable(kernel) and not isinstance(kernel, str) and not _is_spec(kernel):
        return AutotunedKernel(kernel)  # bare @autotune
    _check_options(warmup=warmup, iters=iters, k=k, configs=configs, threadgroups=threadgroups, device=device,
                   cache_path=cache_path, measure=measure, shape=shape, dtype=dtype, config_arg=config_arg,
                   device_aware=device_aware)
    _refusals(refusals)

    def decorator(fn: Callable) -> AutotunedKernel:
        return AutotunedKernel(fn, kernel, warmup=warmup, iters=iters, device_aware=device_aware, k=k, shape=shape,
                               dtype=dtype, configs=configs, config_arg=config_arg, measure=measure,
                               cache_path=cache_path, device=device, threadgroups=threadgroups,
                               refusals=refusals)

    return decorator
