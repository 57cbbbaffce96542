"""`predicted_config` and `candidates`: a bundle's answer for (kernel, shape, dtype, device) in microseconds.

A shape maps to its bucket (each dimension rounded to the nearest power of two, in log2), a
bucket to the model's ranked configs for that device and dtype; a shape measured on that device
answers from the measurement itself. The first call for a given (kernel, shape, dtype, device)
resolves it (nearest bucket when the exact one was not published, candidates illegal for the
exact shape dropped); the answer is kept, so every later call is one dict lookup.

Evidence says how far an answer travelled: `measured` (this shape was timed on this device),
`predicted` (the model, from this device's measurements or, for a device never measured, from a
measured chip of its own architecture family: same vendor and family), `extrapolated` (from a
measured chip of another family or vendor: its expected regret is that of left-out families, None
when no other family was measured), `default` (the catalog's default threadgroup: device or table
not in the bundle) or `none` (no config is legal for this shape: config None). `note` says why.
A predicted time comes from the chip the answer travelled from, scaled by both chips' roofline
bounds (runtime/roofline.py); a shape outside every measured range is marked (`outside_range`) and
its time moved by the kernel's work, or left out.

An unknown kernel or dtype, and a malformed argument, raise the runtime's own errors
(runtime/errors.py), never a default answer.

No answer claims more than the bundle holds: a built-in kernel is never answered with a config the
built-in kernel lacks (the shipped bundle's record of its configs), `measured` needs the device among
those the bundle measured the kernel on, and a core limit no table holds answers from the nearest
limit of its chip that one does (evidence `predicted` at most).

Why one long module: the answer is resolved once per (kernel, shape, dtype, device) from the same
per-bundle tables (bucket, legality, travel from another chip, time, range); the steps share their
private table types, and the hot path after the first call is one dict lookup in this module.
"""

from __future__ import annotations

import math
import numbers
import operator
import threading
import unicodedata
from collections.abc import Set
from typing import Any, Iterable, Mapping, Sequence

from zmlx_pipeline.core.constraints import (
    ConstraintSet,
    UnsafeConstraint,
    compile_constraint,
    expression_names,
    limit_values,
)
from zmlx_pipeline.core.dtypes import DTYPE_BYTES
from zmlx_pipeline.core.errors import shown
from zmlx_pipeline.runtime.bundle import (
    POSITIONAL_SCHEMAS,
    Bundle,
    BundleError,
    BundleWarning,
    active_bundle,
    on_change,
)
from zmlx_pipeline.runtime.contents import MAX_DIM, table_problem
from zmlx_pipeline.runtime.device import (
    FALLBACK_THREADGROUP,
    catalog_candidates,
    catalog_hint,
    catalog_id_row,
    catalog_row,
    current_device,
    current_device_id,
    is_registered,
    mlx_not_on,
    registered_for_detected,
    registered_named,
)
from zmlx_pipeline.runtime.errors import (
    BadArgument,
    BadArgumentType,
    UnknownDeviceError,
    UnknownDtypeError,
    UnknownKernelError,
    caller_stacklevel,
    expect_str,
    known,
    plain,
    value_text,
)
from zmlx_pipeline.runtime.roofline import bound_s, scale, work

#: what an mlx dtype's name prints after (str(mlx.core.float16) is "mlx.core.float16")
MLX_DTYPE_PREFIX = "mlx.core."
EVIDENCE = ("measured", "predicted", "extrapolated", "default", "none")
#: candidates returned when the bundle gives no pruning k for a kernel
DEFAULT_PRUNE_K = 5
_MEMO_LIMIT = 200_000
#: the fields of a table entry (named in a bundle of schema 4 on; a list in this order before): the best config's
#: index into the kernel's configs, the ranked candidates' indices, the time in us (measured, or predicted), the
#: expected regret@1, the evidence, how many configs are legal there, and (only for a chip never measured) the
#: roofline bound its time was moved by ("bandwidth" or "compute")
ENTRY_FIELDS = ("best", "ranked", "time_us", "expected_regret", "evidence", "n_legal", "time_bound")

Items = tuple[tuple[str, Any], ...]


class BadLookup(BadArgument):
    "A lookup was asked with a shape, dtype or k it cannot use"


class Prediction:
    """One answer: the config to launch, its ranked candidates, evidence, expected regret and a note; `bucket` is
    the shape whose table entry answered (the shape itself when measured, else a published bucket's own shape)."""

    __slots__ = ("kernel", "device", "dtype", "shape", "bucket", "_config", "_ranked", "predicted_us",
                 "expected_regret", "evidence", "note", "threadgroup", "prune_k", "bundle_id", "kernel_version",
                 "outside_range")

    def __init__(self, kernel: str, device: str | None, dtype: str, shape: dict, bucket: dict | None,
                 ranked: Sequence[Items], predicted_us: float | None, expected_regret: float | None,
                 evidence: str, note: str, threadgroup: int | None, prune_k: int, bundle_id: str | None,
                 kernel_version: str | None = None, outside_range: Sequence[str] = ()) -> None:
        self.kernel = kernel
        self.device = device
        self.dtype = dtype
        self.shape = shape
        self.bucket = bucket
        self._ranked = tuple(ranked)
        self._config = self._ranked[0] if self._ranked else None
        self.predicted_us = predicted_us
        self.expected_regret = expected_regret
        self.evidence = evidence
        self.note = note
        self.threadgroup = threadgroup
        self.prune_k = prune_k
        self.bundle_id = bundle_id
        self.kernel_version = kernel_version
        #: the dims whose value lies outside every shape measured for this kernel (empty: inside)
        self.outside_range = tuple(outside_range)

    @property
    def config(self) -> dict[str, Any] | None:
        """The config to launch (a fresh dict: change it freely); None when no config is legal for the shape."""
        return dict(self._config) if self._config is not None else None

    def top(self, k: int | None = None) -> list[dict[str, Any]]:
        """The first k ranked candidates (k = the kernel's pruning k when None; k >= 1)."""
        n = self.prune_k if k is None else check_k(k)
        return [dict(items) for items in self._ranked[:n]]

    @property
    def candidates(self) -> list[dict[str, Any]]:
        """The pruned candidates: the configs an autotuner times."""
        return self.top(None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel, "device": self.device, "dtype": self.dtype, "shape": dict(self.shape),
            "config": self.config, "threadgroup": self.threadgroup, "evidence": self.evidence,
            "expected_regret": self.expected_regret, "predicted_us": self.predicted_us,
            "candidates": self.candidates, "bucket": dict(self.bucket) if self.bucket else None,
            "note": self.note, "bundle": self.bundle_id, "kernel_version": self.kernel_version,
            "outside_range": list(self.outside_range),
        }

    def __repr__(self) -> str:
        return (f"Prediction({self.kernel} {self.dtype} {self.shape} on {self.device}: {self.config}, "
                f"{self.evidence}, expected regret {self.expected_regret})")


# ------------------------------------------------------------------------------------------
# per-device tables, built from a bundle file the first time a device is asked for


class _Table:
    """One (device, kernel, dtype): measured shapes and model buckets, as ready answers; `between` holds the
    model's rankings at power-of-two points between the grid's buckets (only ever merged, never alone)."""

    __slots__ = ("measured", "buckets", "bucket_keys", "between", "_floor")

    def __init__(self, measured: dict, buckets: dict, between: dict | None = None) -> None:
        self.measured = measured
        self.buckets = buckets
        self.bucket_keys = sorted(buckets)
        self.between = between or {}
        self._floor: float | None = None

    def floor_us(self) -> float | None:
        """The least time the table quotes, measured or published (None when no entry has a time): over a chip's
        tables, about what a launch costs there however little work it is given."""
        if self._floor is None:
            times = [e.get("time_us") for part in (self.measured, self.buckets) for e in part.values()]
            self._floor = min((t for t in times if isinstance(t, (int, float)) and t > 0), default=0.0)
        return self._floor or None

    def nearest(self, values: tuple[int, ...], n: int = 1,
                weights: Sequence[float] | None = None) -> list[tuple[int, ...]]:
        """The n published buckets closest to the shape in log2 space, nearest first, from its exact
        log2, not its rounded bucket (18184 x 6144 is nearer 32768 x 4096 than 8192 x 4096); `weights`
        scale each dimension's squared distance (the kernel's published dim_weights)."""
        logs = [math.log2(v) for v in values]
        w = weights or (1.0,) * len(logs)
        return sorted(self.bucket_keys,
                      key=lambda key: sum(c * (a - b) * (a - b) for a, b, c in zip(key, logs, w)))[:n]


#: Kernel Tuner's thread block dimensions: a kernel with no threadgroup parameter launches their product of threads
BLOCK_DIMS = ("block_size_x", "block_size_y", "block_size_z")


def thread_rule(meta: Mapping[str, Any]) -> list[str]:
    """`<threadgroup param> <= max_threads` (else the product of the Kernel Tuner block dimensions it has, `block_size_x
    * block_size_y * block_size_z <= max_threads`) for a kernel whose published constraints never read the device's thread limit (imported
    measurements: the configs measured, on other devices), so no device is offered a threadgroup past its own limit
    (a device registered with 256 threads); [] where the constraints read it or no parameter is the threadgroup.
    Publish holds its tables to the same rule (publish/build.py)."""
    tg, params = meta.get("threadgroup_param"), meta.get("params") or ()
    threads = [tg] if isinstance(tg, str) and tg in params else [d for d in BLOCK_DIMS if d in params]
    if not threads:
        return []
    for text in meta.get("constraints") or ():
        try:
            if "max_threads" in expression_names(str(text)):
                return []
        except SyntaxError:
            continue
    return [" * ".join(threads) + " <= max_threads"]


class _Kernel:
    """A kernel's metadata from kernels.json, with its configs as item tuples and constraints compiled."""

    __slots__ = ("name", "dims", "configs", "tg_param", "order", "prune_k", "constraints", "regret", "version",
                 "trained", "dim_weights", "_constraints_text", "transfer", "work", "ranges", "bucket_shapes", "known",
                 "dtypes", "ordered")

    def __init__(self, name: str, meta: dict) -> None:
        self.name = name
        self.dims = tuple(meta["dims"])
        #: whether values given in order can be read as the dims (dims_in_order)
        self.ordered = dims_in_order(meta)
        self.configs = [tuple(sorted(c.items())) for c in meta["configs"]]
        self.tg_param = meta.get("threadgroup_param")
        self.order = list(meta.get("order") or range(len(self.configs)))
        self.prune_k = int(meta.get("prune_k") or DEFAULT_PRUNE_K)
        self.regret = meta.get("expected_regret") or {}
        self.version = meta.get("version")
        self.trained = frozenset(meta.get("trained_devices") or ())
        #: the dtypes the bundle has tables of for this kernel (None: a bundle that does not say)
        self.dtypes: tuple[str, ...] | None = tuple(meta["dtypes"]) if meta.get("dtypes") else None
        weights = meta.get("dim_weights") or {}
        self.dim_weights = tuple(float(weights.get(d, 1.0)) for d in self.dims) if weights else None
        self._constraints_text = list(meta.get("constraints") or ()) + thread_rule(meta)
        self.constraints: ConstraintSet | None = None
        self.transfer: dict[str, dict] = meta.get("transfer") or {}
        self.work: dict[str, dict] | None = meta.get("work")
        self.bucket_shapes: dict[str, dict] = meta.get("buckets") or {}
        ranges = meta.get("measured_range")
        if not ranges:  # a schema-1 bundle: the published buckets' shapes bound what was seen
            shapes = list(self.bucket_shapes.values())
            ranges = {d: [min(s[d] for s in shapes), max(s[d] for s in shapes)]
                      for d in self.dims if shapes and all(d in s for s in shapes)}
        self.ranges: dict[str, tuple[int, int]] = {d: (int(lo), int(hi)) for d, (lo, hi) in ranges.items()}
        #: the configs the built-in kernel of this name has (None: any config of the bundle), set by `_kernel`
        self.known: frozenset[Items] | None = None

    def legal(self, items: Items, shape: dict, limits: dict) -> bool:
        if self.known is not None and items not in self.known:
            return False  # a config the built-in kernel does not have (TG=-64, TG=96): no constraint makes it legal
        if not self._constraints_text:
            return True
        if self.constraints is None:
            self.constraints = ConstraintSet(self._constraints_text)
        return self.constraints.legal(dict(items), shape, limits)


class _State:
    """What lookups keep of one bundle: its parsed kernels and device tables and the answers resolved from it. A
    lookup takes one state and reads only from it, so a `load_bundle` in another thread never mixes two bundles."""

    __slots__ = ("bundle", "kernels", "tables", "memo", "remembered")

    def __init__(self, bundle: Bundle | None) -> None:
        self.bundle = bundle
        self.kernels: dict[str, _Kernel] = {}
        self.tables: dict[str, dict[tuple[str, str], _Table] | None] = {}
        self.memo: dict[tuple, dict[tuple, Prediction]] = {}
        self.remembered = 0


#: the state of the active bundle, replaced (never cleared in place) when another bundle is loaded
_STATE = _State(None)
_RESET_LOCK = threading.Lock()


def _reset(_bundle: Bundle | None = None) -> None:
    global _STATE
    # the bundle active now, not the one passed: of two load_bundle calls racing, the last state set is the last
    # bundle's (the lock orders the resets; lookups never take it)
    with _RESET_LOCK:
        _STATE = _State(active_bundle(load_default=False))


on_change(_reset)


def _state() -> _State:
    """The state of the active bundle (loading the default bundle when none is loaded yet)."""
    bundle = active_bundle()
    state = _STATE
    if state.bundle is not bundle:  # another thread's load_bundle between the two reads: this answer is resolved
        state = _State(bundle)      # from `bundle` alone and remembered nowhere
    return state


def _kernel(state: _State, name: str) -> _Kernel | None:
    k = state.kernels.get(name)
    if k is None and name in state.bundle.kernels:
        k = _Kernel(name, state.bundle.kernels[name])
        k.known = _builtin_configs(k)
        state.kernels[name] = k
    return k


def _builtin_configs(k: _Kernel) -> frozenset[Items] | None:
    """The configs of the built-in kernel named as `k` (the shipped bundle's record of it) when `k` holds one it
    lacks, so no answer is a config the kernel cannot run (a re-hashed bundle's TG=-64); None when every config of
    `k` is the built-in's, or no built-in kernel has its name (the bundle's configs are all that is known)."""
    from zmlx_pipeline.runtime.bundle import builtin_kernels

    builtin = builtin_kernels().get(k.name)
    configs = builtin.get("configs") if builtin is not None else None
    if not isinstance(configs, list):
        return None
    known = frozenset(tuple(sorted(c.items())) for c in configs if isinstance(c, dict))
    return None if known.issuperset(k.configs) else known


def named_entry(value: Any) -> dict:
    """A table entry with named fields (ENTRY_FIELDS), from a list of an older bundle or an entry already named."""
    if isinstance(value, dict):
        return value
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"a table entry is a list or an object, not {type(value).__name__}")
    return dict(zip(ENTRY_FIELDS, value))


def _same(value: dict) -> dict:
    return value


def _parse_key(text: str) -> tuple[int, ...]:
    """A shape's key ("4096,4096") as its values; "" is the empty shape of a kernel measured at no problem size."""
    return tuple(int(v) for v in text.split(",")) if text else ()


def _device_tables(state: _State, device: str) -> dict[tuple[str, str], _Table] | None:
    """(kernel, dtype) -> table for one device, parsed from its (verified) file on first use."""
    if device in state.tables:
        return state.tables[device]
    bundle = state.bundle
    name = bundle.tables.get(device)
    if name is None:
        state.tables[device] = None
        return None
    out: dict[tuple[str, str], _Table] = {}
    # an older bundle's entries are lists: named once here, so every later read is by name
    positional = bundle.schema_version in POSITIONAL_SCHEMAS
    entry = named_entry if positional else _same
    try:
        data = bundle.json(name)
        problem = table_problem(data, bundle.kernels, ENTRY_FIELDS if positional else None)
        if problem:
            raise BundleError(f"{plain(bundle.source)}: malformed table {plain(name)} of {plain(device)}: {problem}")
        for kernel, by_dtype in data["kernels"].items():
            for dtype, t in by_dtype.items():
                out[(kernel, dtype)] = _Table(
                    {_parse_key(k): entry(v) for k, v in (t.get("measured") or {}).items()},
                    {_parse_key(k): entry(v) for k, v in (t.get("buckets") or {}).items()},
                    {_parse_key(k): entry(v) for k, v in (t.get("between") or {}).items()},
                )
    except (BundleError, KeyError, TypeError, ValueError, AttributeError) as exc:
        if not isinstance(exc, BundleError):  # what the checks above did not foresee is a bad table all the same
            exc = BundleError(f"{plain(bundle.source)}: unusable table {plain(name)} of {plain(device)} "
                              f"({type(exc).__name__}: {plain(exc)})")
        if bundle.strict:
            raise exc from None
        import warnings

        warnings.warn(f"zmlx-pipeline: bundle {plain(bundle.bundle_id)}: the table of {plain(device)} is "
                      f"unusable ({exc}); "
                      "answering with catalog defaults", BundleWarning, stacklevel=caller_stacklevel())
        state.tables[device] = None
        return None
    state.tables[device] = out
    return out


# ------------------------------------------------------------------------------------------
# resolving one lookup


def bucket_of(values: Iterable[int]) -> tuple[int, ...]:
    """Each dimension rounded to the nearest power of two, as its log2 (1 -> 0, 4096 -> 12, 1408 -> 10);
    BadLookup / BadArgumentType for a value that is not a positive whole number."""
    if isinstance(values, (str, bytes, Mapping, Set)) or not isinstance(values, Iterable):
        raise BadArgumentType(f"bucket_of takes the shape's values in dim order (e.g. [4096, 4096]), "
                              f"not {type(values).__name__} ({value_text(values)})")
    return tuple(int(round(math.log2(_dim_value(f"d{i}", v)))) for i, v in enumerate(values))


def _dtype_name(dtype: Any) -> str:
    """A dtype's name ("float16"; an mlx dtype, or the `mlx.core.float16` it prints as, too); UnknownDtypeError for
    one without tables (another prefix, `mlx.junk.float16`, included)."""
    if not isinstance(dtype, str):
        text = str(dtype) if type(dtype).__module__.startswith("mlx") else None
        if text is None:
            raise BadArgumentType(f"dtype must be a name such as 'float16' or an mlx dtype, not {type(dtype).__name__} "
                                  f"({dtype!r:.60})")
    else:
        text = dtype
    name = text.removeprefix(MLX_DTYPE_PREFIX)
    if name not in DTYPE_BYTES:
        raise UnknownDtypeError(f"unknown dtype {text!r}: known dtypes are {known(DTYPE_BYTES)}")
    return name


def whole_number(value: Any) -> int | None:
    """`value` as an int when it is a whole number (an int, or a numpy or other integer with __index__); None for
    anything else, a bool above all (True is no count)."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    try:
        return operator.index(value)
    except TypeError:  # a float, a string, an array of several values
        return None


def check_k(k: Any) -> int:
    """`k` as a count of candidates: a whole number >= 1 (BadArgumentType / BadLookup otherwise); numpy's integers
    are taken as the ints they hold."""
    n = whole_number(k)
    if n is None:
        raise BadArgumentType(f"k must be a whole number >= 1, not {type(k).__name__} ({value_text(k)})")
    if n < 1:
        raise BadLookup(f"k must be >= 1 (got {value_text(n)}): the number of candidates to return")
    return n


def dim_int(v: Any) -> int:
    """The whole number a shape dimension's value holds: an int (numpy's, a 0-d array), a whole float of any float type
    (4096.0, numpy's float32); TypeError for a value of another kind (a bool, a str, a Decimal, an array of several
    values), ValueError for one that is not whole (2.5, inf, nan)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__index__"):
        if type(v).__module__ != "numpy" or not isinstance(v, numbers.Real):
            raise TypeError(f"not a number of elements: {type(v).__name__}")
        v = float(v)  # numpy's float16, float32, longdouble: read as the float they hold
    try:
        iv = int(v)  # TypeError for an array of several values, which has __index__ but no one value
        exact = bool(iv == v)
    except (OverflowError, ValueError):  # inf, nan
        raise ValueError("not a whole number") from None
    if not exact:
        raise ValueError("not a whole number")
    return iv


def _dim_value(name: str, v: Any) -> int:
    """One shape dimension as a positive int (4096.0 is 4096); the runtime's errors for anything else."""
    try:
        iv = dim_int(v)
    except TypeError:
        raise BadArgumentType(f"shape dimension {plain(name)}={value_text(v)} must be a positive integer, "
                              f"not {type(v).__name__}") from None
    except ValueError:
        raise BadLookup(f"shape dimension {plain(name)}={value_text(v)} must be a positive integer") from None
    if iv < 1:
        raise BadLookup(f"shape dimension {plain(name)}={value_text(v)} must be a positive integer")
    if iv > MAX_DIM:
        raise BadLookup(f"shape dimension {plain(name)}={value_text(v)} is larger than an array dimension can be "
                        f"({MAX_DIM})")
    return iv


def row_length(value: Any, what: str) -> int:
    """A row's length (`get_threadgroup_candidates_for_shape`'s dim_size) read as a shape dimension is, 0 (an empty
    row) allowed; the runtime's errors for anything else."""
    try:
        n = dim_int(value)
    except TypeError:
        raise BadArgumentType(f"{what} must be a whole number, not {type(value).__name__} "
                              f"({value_text(value)})") from None
    except ValueError:
        raise BadArgument(f"{what} must be a whole number from 0 to {MAX_DIM} (got {value_text(value)})") from None
    if not 0 <= n <= MAX_DIM:  # a row longer than an array dimension can be is a slip, not a shape
        raise BadArgument(f"{what} must be from 0 to {MAX_DIM} (got {value_text(value)})")
    return n


def in_order(shape: Any) -> Any:
    """A shape as given when it is a mapping, list or tuple; any other iterable's values read once into a tuple (an
    iterator can be read only once). BadArgumentType for one that has no order (a set) or is no shape at all."""
    if isinstance(shape, (Mapping, tuple, list)):
        return shape
    if isinstance(shape, (str, bytes, Set)) or not isinstance(shape, Iterable):
        unordered = " (a set has no order: give a list or a dict)" if isinstance(shape, Set) else ""
        raise BadArgumentType(f"shape must be a mapping of dims (e.g. {{'rows': 4096, 'cols': 4096}}) or their "
                              f"values in order, not {type(shape).__name__} ({shape!r:.60}){unordered}")
    try:
        return tuple(shape)
    except TypeError:  # iterable in name only (a 0-d array)
        raise BadArgumentType(f"shape must be a mapping of dims (e.g. {{'rows': 4096, 'cols': 4096}}) or their "
                              f"values in order, not {type(shape).__name__} ({shape!r:.60})") from None


def dims_in_order(meta: Mapping[str, Any]) -> bool:
    """Whether a bundle kernel's dims (kernels.json metadata) have an order to read values given in order: a registered
    spec's; an imported kernel's dims are only listed alphabetically (a Kernel Tuner file's x, y after filter_height)."""
    return meta.get("spec") != "measured configs only" or len(meta.get("dims") or ()) < 2


def unnamed_values_problem(kernel: str, dims: Sequence[str], count: int) -> str:
    """Why `count` values in order cannot be a shape of a kernel whose dims have no order (dims_in_order)."""
    return (f"kernel {kernel!r} was imported (no registered spec), so its dims ({', '.join(dims)}) have no order to "
            f"read {count} values in: name each, such as {','.join(f'{d}=N' for d in dims)}")


def _shape_dict(kernel: _Kernel | None, shape: Any) -> dict[str, int]:
    shape = in_order(shape)
    if isinstance(shape, Mapping):
        out = {str(k): v for k, v in shape.items()}
    else:
        values = list(shape)
        if kernel is None:
            out = {f"d{i}": v for i, v in enumerate(values)}
        elif not kernel.ordered:
            raise BadLookup(unnamed_values_problem(kernel.name, kernel.dims, len(values)))
        elif len(values) != len(kernel.dims):
            raise BadLookup(f"kernel {kernel.name!r} has dims {', '.join(kernel.dims)}; got {len(values)} values")
        else:
            out = dict(zip(kernel.dims, values))
    out = {k: _dim_value(k, v) for k, v in out.items()}
    if kernel is not None:
        missing = [d for d in kernel.dims if d not in out]
        extra = [d for d in out if d not in kernel.dims]
        if missing or extra:
            raise BadLookup(f"kernel {kernel.name!r} has dims {', '.join(kernel.dims)}; got "
                            f"{', '.join(map(plain, out)) or 'none'}")
        out = {d: out[d] for d in kernel.dims}  # the answer echoes the shape in the kernel's order, as its bucket
    return out


def _limits(bundle: Bundle | None, device: str | None, dtype: str) -> dict[str, int]:
    """The device's limits: its bundle profile's, else (a name such as "GTX 1080 Ti", a core limit of a chip the
    bundle holds no profile of) its chip's in the bundle or the catalog; Apple's only for a device neither knows,
    never for a chip whose architecture rules configs out (matmul on a pre-Ampere GPU)."""
    prof = (bundle.profiles.get(device) if bundle is not None and device else None) or {}
    if not prof and device:
        base = device.partition("@")[0]
        prof = (bundle.profiles.get(base) if bundle is not None else None) or catalog_row(device) or {}
    return {**limit_values(prof), "dtype_bytes": DTYPE_BYTES.get(dtype, 4)}


def _default_tg(bundle: Bundle | None, device: str | None) -> tuple[int, str]:
    """The catalog's default threadgroup for a device, and where it came from."""
    if device:
        prof = bundle.profiles.get(device) if bundle is not None else None
        if prof and prof.get("catalog_default_threadgroup"):
            return int(prof["catalog_default_threadgroup"]), f"the catalog default threadgroup of {device}"
        row = catalog_row(device)
        if row and row.get("default_threadgroup"):
            return int(row["default_threadgroup"]), f"the catalog default threadgroup of {row['id']}"
    return FALLBACK_THREADGROUP, "the catalog's default threadgroup"


def _no_legal(bundle: Bundle | None, kernel: str, k: _Kernel, device: str | None, dtype: str,
              shape: dict) -> Prediction:
    """The answer for a shape no config of the kernel is legal for: no config, and the constraints that rule
    (no_legal_reason)."""
    rules = no_legal_reason(k._constraints_text, k.configs, [(shape, _limits(bundle, device, dtype))])
    where = f" on {device}" if device else ""
    return Prediction(kernel, device, dtype, shape, None, (), None, None, "none",
                      _noted(bundle, f"no config of {kernel!r} is legal for {_shape_text(shape)} {dtype}{where} "
                                     f"({rules})"),
                      None, k.prune_k, bundle.bundle_id if bundle else None, k.version)


def no_legal_reason(constraints: Sequence[str], configs: Sequence[Any],
                    cases: Iterable[tuple[Mapping[str, int], Mapping[str, int]]]) -> str:
    """Why no config (a dict or item tuple each) is legal at any of these (shape, limits) cases, as a lookup words it:
    `every config breaks: A; B` (the constraints no config passes at any case: matmul's `cuda_arch >= 80` on a T4),
    else `constraints: ...` (all of them). Publish words a device left without entries the same way."""
    cases = [{**limits, **shape} for shape, limits in cases]
    every = [text for text in constraints if _broken_by_all(text, configs, cases)]
    return ("every config breaks: " + "; ".join(every) if every
            else "constraints: " + ("; ".join(constraints) or "none published"))


def _broken_by_all(text: str, configs: Sequence[Any], cases: Sequence[Mapping[str, int]]) -> bool:
    """Whether no config passes this one constraint at any case (False where it cannot be judged); each distinct
    value of what the constraint reads is judged once."""
    try:
        check = compile_constraint(text)
        names = expression_names(text)
    except (UnsafeConstraint, SyntaxError):
        return False
    seen: set[tuple] = set()
    for case in cases:
        key = tuple(sorted((n, v) for n, v in case.items() if n in names))
        if key in seen:
            continue
        seen.add(key)
        for items in configs:
            try:
                if check({**case, **dict(items)}):
                    return False
            except ZeroDivisionError:
                continue
            except (KeyError, TypeError, ValueError, OverflowError):
                return False
    return bool(seen)


def _shape_text(shape: Mapping[str, int]) -> str:
    return ",".join(f"{d}={v}" for d, v in shape.items())


def _default(bundle: Bundle | None, kernel: str, k: _Kernel | None, device: str | None, dtype: str,
             shape: dict, why: str) -> Prediction:
    tg, source = _default_tg(bundle, device)
    bundle_id = bundle.bundle_id if bundle is not None else None
    if k is None:
        ranked: list[Items] = [(("threadgroup", tg),)]
        return Prediction(kernel, device, dtype, shape, None, ranked, None, None, "default",
                          _noted(bundle, f"{why}: {source} ({tg})"), tg, 1, bundle_id)
    limits = _limits(bundle, device, dtype)
    legal = [k.configs[i] for i in k.order if k.legal(k.configs[i], shape, limits)]
    if not legal:
        return _no_legal(bundle, kernel, k, device, dtype, shape)
    if k.tg_param:
        legal.sort(key=lambda items: abs(math.log2(max(1, dict(items).get(k.tg_param, tg))) - math.log2(tg)))
    cfg = dict(legal[0])
    chosen = f"the config nearest {source} ({tg})" if k.tg_param else "the first legal config of the kernel's ranking"
    return Prediction(kernel, device, dtype, shape, None, legal[: max(k.prune_k, 1)], None, None, "default",
                      _noted(bundle, f"{why}: {chosen}"), cfg.get(k.tg_param) if k.tg_param else None,
                      k.prune_k, bundle_id, k.version, _outside(k, shape))


def _noted(bundle: Bundle | None, note: str) -> str:
    """An answer's note, led by why its bundle answers in place of the one asked for (a refused
    $ZMLX_PIPELINE_BUNDLE), so the answer itself says which bundle it came from."""
    why = bundle.stands_in if bundle is not None else ""
    return f"{why}. {note}".strip() if why else note


def _outside(k: _Kernel, shape: Mapping[str, int]) -> list[str]:
    """The dims of `shape` outside the range every measured shape of the kernel spans."""
    return [d for d, (lo, hi) in k.ranges.items() if d in shape and not lo <= shape[d] <= hi]


class Ranked:
    """A table's ranked candidates for one exact shape (what `_resolve` answers from, and what publish
    replays to measure the pruning k through this very path); `failure` names why there are none."""

    __slots__ = ("entry", "bucket_key", "ranked", "prune_k", "note", "from_overall", "failure")

    def __init__(self, entry=None, bucket_key=(), ranked=(), prune_k=0, note="", from_overall=False, failure=""):
        self.entry = entry
        self.bucket_key = bucket_key
        self.ranked = list(ranked)
        self.prune_k = prune_k
        self.note = note
        self.from_overall = from_overall
        self.failure = failure


def _order(entry: dict) -> list[int]:
    """An entry's candidates, its best first."""
    best = entry["best"]
    return [best] + [c for c in entry["ranked"] if c != best]


def rank_in_table(k: "_Kernel", table: "_Table", values: tuple[int, ...], shape_map: dict, limits: dict,
                  prune_k: int | None = None) -> Ranked:
    """The measured entry for this exact shape, else its bucket's, else both nearest buckets' interleaved
    (led by the model's ranking at the shape's own power-of-two point when the bundle has one there);
    candidates illegal for the exact shape dropped and, when too few are left, filled from the kernel's
    overall ranking. `prune_k` overrides the kernel's (publish tries several)."""
    prune_k = k.prune_k if prune_k is None else prune_k
    note = ""
    entry = table.measured.get(values)
    bucket_key = bucket_of(values)
    lists: list[list[int]] = []
    if entry is None:
        entry = table.buckets.get(bucket_key)
        if entry is None:
            near = table.nearest(values, 2, k.dim_weights)
            if not near:
                return Ranked(failure="no buckets")
            own = table.between.get(bucket_key)
            lists = [_order(e) for e in ([own] if own else []) + [table.buckets[b] for b in near]]
            if own:
                note += "the model's ranking at " + ", ".join(f"{d}~2^{e}" for d, e in zip(k.dims, bucket_key))
                note += ", merged with the nearest published buckets. "
                entry = own
            else:
                note += "nearest published bucket " + ", ".join(f"{d}~2^{e}" for d, e in zip(k.dims, near[0])) + ". "
                bucket_key = near[0]
                entry = table.buckets[near[0]]
    order = _order(entry)
    merged: list[int] = []
    if len(lists) > 1:
        # a shape between published buckets: its candidates are the top k of each list, interleaved
        # (the first list's first), so the tuner also times what every neighbour ranks
        heads = [lst[:prune_k] for lst in lists]
        merged = list(dict.fromkeys(lst[i] for i in range(prune_k) for lst in heads if i < len(lst)))
        order = list(dict.fromkeys(merged + order))
        note += "candidates from each, interleaved. " if len(lists) > 2 else "candidates from it and the next nearest. "
    legal = {i: k.legal(k.configs[i], shape_map, limits) for i in order}
    ranked = [k.configs[i] for i in order if legal[i]]
    prune_k = max(prune_k, sum(legal[i] for i in merged))

    def overall(exclude=()) -> list[Items]:
        """The kernel's overall ranking, legal for this exact shape."""
        return [c for c in (k.configs[i] for i in k.order) if c not in exclude and k.legal(c, shape_map, limits)]

    from_overall = False
    if len(ranked) < len(order):
        note += f"{len(order) - len(ranked)} candidate(s) illegal for this exact shape dropped. "
        if not ranked:
            ranked = overall()[: len(order)]
            if not ranked:
                return Ranked(failure="no legal config")
            note += "answered from the kernel's overall ranking. "
            from_overall = True
        if len(ranked) < prune_k:
            # the bucket's candidates are mostly illegal here (say, fewer experts than the bucket's):
            # fill up to k from the kernel's overall ranking, so a tuner still has k to time
            ranked += overall(set(ranked))[: prune_k - len(ranked)]
            note += "filled from the kernel's overall ranking. "
    return Ranked(entry, bucket_key, ranked, prune_k, note, from_overall)


def _family(row: Mapping[str, Any] | None) -> tuple[str, str]:
    row = row or {}
    return str(row.get("vendor") or "").lower(), str(row.get("family") or "").lower()


def _travel(bundle: Bundle, k: _Kernel, device: str, entry: dict) -> tuple[str, str | None, str | None, str]:
    """For a bucket entry of a device never measured: (evidence, source device, time bound, note)."""
    prof = bundle.profiles.get(device) or {}
    fam = _family(prof)
    trained_families = sorted({" ".join(_family(bundle.profiles.get(d))) for d in k.trained} - {" "})
    moved = k.transfer.get(device)
    if moved:  # schema 2: publish says where this device's answers come from
        evidence, source = str(moved.get("evidence") or entry["evidence"]), moved.get("from")
        basis = entry.get("time_bound")
    else:  # schema 1: work the family out here; no time was moved to this chip
        same = [d for d in sorted(k.trained) if _family(bundle.profiles.get(d)) == fam and fam != ("", "")]
        evidence, source, basis = ("predicted" if same else "extrapolated"), (same[0] if same else None), None
    if evidence == "extrapolated":
        note = (f"{device} was never measured, nor any {' '.join(fam) or 'chip'} of its family: extrapolated"
                f"{' from ' + source if source else ''} (measured families: {', '.join(trained_families) or 'none'}). ")
    else:
        note = f"{device} was never measured: predicted from {source or 'a measured chip'} of its own family ({' '.join(fam)}). "
    return evidence, source, basis, note


def _time_note(bundle: Bundle, device: str, source: str | None, basis: str | None, time_us: float | None,
               dropped: bool = False) -> str:
    """What the answer's time is: moved from the source chip by which bound, or why there is none."""
    if dropped:
        return ""  # the bucket's pick was not legal here: its time is not this config's, and none is quoted
    if time_us is None:
        whole = (bundle.profiles.get(source) or {}).get("core_limited_from") if source else None
        if whole:  # publish moves no time from a run on some of a chip's cores (MPS): its bandwidth reach is unknown
            return (f"no predicted time: {source} ran on part of {whole}'s cores, and how its times carry to another "
                    "chip is unknown. ")
        return "no predicted time: none could be moved to this chip. "
    if not source or not basis:
        return ""
    src, dst = bundle.profiles.get(source) or {}, bundle.profiles.get(device) or {}
    field, unit = ("memory_bandwidth_gbps", " GB/s") if basis == "bandwidth" else ("fp32_tflops", " TFLOPs")
    what = "memory bandwidth" if basis == "bandwidth" else "fp32 TFLOPs"
    return f"time scaled from {source} by {what} ({_num(dst.get(field))} / {_num(src.get(field))}{unit}). "


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def _anchored_time(bundle: Bundle, k: _Kernel, table: _Table, r: "Ranked", device: str, dtype: str,
                   shape: Mapping[str, int], time_us: float) -> float:
    """A published bucket's time, or its shape's measurement when that shape was measured with the same best config
    (the time model's guess can be far from it: matmul's 2048x4096x4096 bucket), moved to `shape` by the work."""
    if table.buckets.get(r.bucket_key) is not r.entry:
        return time_us
    rep = k.bucket_shapes.get(",".join(str(e) for e in r.bucket_key))
    measured = table.measured.get(tuple(rep.get(d) for d in k.dims)) if isinstance(rep, dict) else None
    if measured is None or measured.get("best") != r.entry.get("best") or not measured.get("time_us"):
        return time_us
    moved = _moved_by_work(k, dtype, measured["time_us"], rep, shape)
    return moved if moved else measured["time_us"]


def _moved_by_work(k: _Kernel, dtype: str, time_us: float | None, rep: Mapping[str, int] | None,
                   shape: Mapping[str, int]) -> float | None:
    """A time at `rep` moved to `shape` on the same chip: times the larger of the ratios of their bytes and of their
    flops, so the rate the chip reached at `rep` in the resource that grows most is kept (None without work terms).
    A roofline of the catalog's fp32 TFLOPs would not do here: a 16-bit matmul on tensor cores runs far past it, and
    a shape's bound could switch from bytes to that wrong ceiling."""
    terms = (k.work or {}).get(dtype) or {}
    if rep is None or not terms or time_us is None:
        return None
    ratios = []
    for kind in ("bytes", "flops"):
        at, to = work(terms.get(kind), rep), work(terms.get(kind), shape)
        if at and to and at > 0 and to > 0:
            ratios.append(to / at)
    return time_us * max(ratios) if ratios else None


def _check_names(kernel: Any, device: Any) -> None:
    expect_str(kernel, "kernel")
    expect_str(device, "device", optional=True)
    if device is not None and not device.strip():
        raise BadLookup("device must be a device id such as 'nvidia-h100-sxm', or None for this process's GPU; "
                        "got an empty string")


def check_device_id(bundle: Bundle | None, device: str, what: str = "device") -> None:
    """BadLookup for a device id that names no device: empty or blank, a control character or text NFKC writes
    otherwise (fullwidth), or a core limit other than `<chip>@<cores>sm` with 1 <= cores <= the chip's own (a device
    the bundle holds is taken as it is); UnknownDeviceError for a core limit no device has: of a chip whose cores
    are not SMs (Apple, AMD: MPS limits are NVIDIA's), of all the chip's SMs (that is the chip's own id), or of a
    device registered in the store (by its id or name: a limit is of a catalog chip, as import and ingest say)."""
    if not device.strip():
        raise BadLookup(f"{what} must be a device id such as 'nvidia-h100-sxm'; got {device!r:.40}")
    if bundle is not None and (device in bundle.tables or device in bundle.profiles):
        return
    check_characters(device, what, "a device id such as 'nvidia-h200'")
    if "@" not in device:
        return
    base, _, limit = device.partition("@")
    digits = limit[:-2] if limit.endswith("sm") else ""
    if device != device.strip() or not base or not (digits.isascii() and digits.isdigit()) or digits.startswith("0"):
        raise BadLookup(f"{what} {device!r:.80}: a core limit is written <device>@<cores>sm with cores >= 1 "
                        f"(e.g. nvidia-h200@66sm){_limit_slip(device, base, limit)}")
    if len(digits) > 6:  # past any chip's cores, and past what int() reads at 4,300 digits
        raise BadLookup(f"{what} {device!r:.80}: a core limit of {len(digits)} digits is more cores than any chip has "
                        f"(e.g. nvidia-h200@66sm)")
    prof = bundle.profiles.get(base) if bundle is not None else None
    mine = (base,) if is_registered(prof) else registered_name(bundle, base)
    if len(mine) == 1:  # as import and ingest refuse it: a core limit is of a catalog chip, whose count is known
        raise UnknownDeviceError(f"{what} {device!r} limits {mine[0]}, a device registered in the store; a core limit "
                                 f"(@<N>sm) is only of a catalog chip (give {mine[0]})")
    row = prof or catalog_row(base) or {}
    full = row.get("gpu_cores")
    if row and (row.get("core_unit") not in (None, "sms") or row.get("vendor") not in (None, "nvidia")):
        raise UnknownDeviceError(f"{what} {device!r}: {base}'s cores are not SMs, and a core limit "
                                 f"(@<N>sm, CUDA MPS) is only of an NVIDIA chip; give {base} itself")
    if isinstance(full, int) and int(digits) > full:  # well formed, but no device has it: LookupError, as below
        raise UnknownDeviceError(f"{what} {device!r}: {base} has {full} cores, so a core limit is at most "
                                 f"@{full - 1}sm (all {full} is the chip itself: {base})")
    if isinstance(full, int) and int(digits) == full:
        raise UnknownDeviceError(f"{what} {device!r} limits {base} to all of its {full} SMs; a core limit is below "
                                 f"the chip's count: give the chip's own id ({base}) for the whole chip")


def check_characters(text: str, what: str, example: str) -> None:
    """BadLookup for a name no chip or device is written with: a control character, or characters Unicode NFKC
    writes otherwise (fullwidth); `example` says what to give instead ("a device id such as 'nvidia-h200'")."""
    if not text.isprintable():
        raise BadLookup(f"{what} {text!r} holds a control character: give {example}")
    normal = unicodedata.normalize("NFKC", text)
    if normal != text:
        raise BadLookup(f"{what} {text!r} holds characters Unicode writes otherwise (as {normal!r}); write it in "
                        "plain characters")


def _limit_slip(device: str, base: str, limit: str) -> str:
    """What in a malformed core limit differs from the written form, where one slip explains it."""
    if device != device.strip():
        return "; it has white space at its start or end"
    if limit.lower().endswith("sm") and not limit.endswith("sm"):
        return f"; the unit is lower case: @{limit[:-2]}sm"
    if limit.endswith("sm") and limit[:-2].isdigit() and limit[:-2].startswith("0") and limit[:-2].lstrip("0"):
        return f"; the count is written without leading zeros: @{limit[:-2].lstrip('0')}sm"
    return ""


def nearest_limit(held: Iterable[str], base: str, device: str, row: Mapping[str, Any] | None) -> tuple[str, bool] | None:
    """Of the `held` ids that are `base` (the whole chip) or a core limit of it, the one nearest in core count (log2)
    to the core-limited `device` (check_device_id has checked its form), and whether it has the same count (`@132sm`
    of a 132-core chip is the chip); None when none is held. Lookups take `held` from the bundle's tables, profiles
    from its profiles, so both answer a limit never measured from the same nearest one."""
    def cores(table_id: str) -> int | None:
        if table_id == base:
            full = (row or {}).get("gpu_cores")
            return full if isinstance(full, int) and full > 0 else None
        limit = table_id.partition("@")[2]
        return int(limit[:-2]) if limit.endswith("sm") and limit[:-2].isdigit() and int(limit[:-2]) > 0 else None

    candidates = [(t, cores(t)) for t in held if t == base or t.startswith(base + "@")]
    if not candidates:
        return None
    wanted = cores(device)
    if wanted is None:
        return (base, False) if any(t == base for t, _ in candidates) else (min(candidates)[0], False)
    table, n = min(candidates, key=lambda tc: (abs(math.log(tc[1] / wanted)) if tc[1] else math.inf, tc[0]))
    return table, n == wanted


def _measured_on(bundle: Bundle, k: _Kernel, device: str) -> bool:
    """Whether the bundle says `device` was measured for this kernel (its trained_devices, else the manifest's
    measured_devices); an entry marked `measured` for any other device claims what was never timed."""
    listed = k.trained or frozenset(bundle.manifest.get("measured_devices") or ())
    return not listed or device in listed  # a bundle naming no measured device at all: nothing to check against


def _resolve(kernel: str, shape: Any, dtype: Any, device: str | None, named: bool = True,
             state: _State | None = None) -> Prediction:
    """One answer, wholly from one bundle's state (the active one when None); `named` False for a device this
    process detected rather than one a caller named (a GPU the catalog does not know then answers with the default
    instead of being refused)."""
    _check_names(kernel, device)
    if state is None:
        state = _state()
    bundle = state.bundle
    dtype_name = _dtype_name(dtype)
    k = _kernel(state, kernel) if bundle is not None else None
    if bundle is not None and k is None:
        raise UnknownKernelError(f"unknown kernel {shown(kernel)}: bundle {bundle.bundle_id} has {known(bundle.kernels)}")
    if k is not None and k.dtypes is not None and dtype_name not in k.dtypes:
        raise UnknownDtypeError(f"kernel {shown(kernel)} has no {dtype_name} tables in bundle {bundle.bundle_id}: "
                                f"it was measured in {known(k.dtypes)} only")
    shape_map = _shape_dict(k, shape)
    read_as = ""  # a detected GPU the catalog lacks, found among the devices the bundle's store registered
    if device is None:
        device_id, why_not, from_env = current_device()
        if device_id is not None:
            check_device_id(bundle, device_id, "$ZMLX_PIPELINE_DEVICE")
            if from_env:
                _check_known_device(bundle, device_id, "$ZMLX_PIPELINE_DEVICE")
        elif bundle is not None and (found := registered_for_detected(bundle.profiles)) is not None:
            device_id = found
            read_as = (f"{why_not.partition(' is not in the catalog')[0]} is {found}, a device registered in the store "
                       f"bundle {bundle.bundle_id} was published from. ")
    else:
        device_id, why_not = device, ""
        check_device_id(bundle, device_id)
        if named:
            _check_known_device(bundle, device_id)
    mine = registered_name(bundle, device_id) if device_id is not None and not read_as else ()
    if len(mine) == 1:  # a registered device's name or alias: answered under its id, as a catalog chip's name is
        read_as, device_id = f"device {device_id!r} read as {mine[0]}. ", mine[0]
    if bundle is None or k is None:
        return _default(None, kernel, None, device_id, dtype_name, shape_map, "no bundle loaded")
    if device_id is None:
        return _default(bundle, kernel, k, None, dtype_name, shape_map, why_not)
    tables = _device_tables(state, device_id)
    note = read_as
    limited = ""  # a core limit no table holds: what the answer says of it
    if tables is None:
        if device_id in bundle.tables:  # held, but its table failed its checks (warned as it was read)
            return _default(bundle, kernel, k, device_id, dtype_name, shape_map,
                            f"the table of {device_id!r} in bundle {bundle.bundle_id} failed its checks and is not used")
        row = catalog_row(device_id)
        base = row["id"] if row else device_id.partition("@")[0]
        found = None
        if base != device_id:
            found = (nearest_limit(bundle.tables, base, device_id, row) if "@" in device_id
                     else (base, True) if bundle.tables.get(base) else None)
        if found is None:  # a name of one catalog chip is answered as that chip (the catalog's id)
            chip = base if row and "@" not in device_id else device_id
            not_on = mlx_not_on(row) if row else ""
            if not_on:
                return _default(bundle, kernel, k, chip, dtype_name, shape_map,
                                f"MLX does not run on device {device_id!r} ({not_on}), so bundle {bundle.bundle_id} "
                                "has no table for it")
            known_where = "in the catalog but not" if row else "not in the catalog, nor"
            return _default(bundle, kernel, k, chip, dtype_name, shape_map,
                            f"device {device_id!r} is {known_where} in bundle {bundle.bundle_id}")
        source, same = found
        tables = _device_tables(state, source)
        if tables is None:
            return _default(bundle, kernel, k, device_id, dtype_name, shape_map,
                            f"device {device_id!r} is not in bundle {bundle.bundle_id}, and the table of {source} "
                            "it would answer from failed its checks")
        note = (f"device {device_id!r} read as {source}. " if same and "@" not in device_id
                else f"device {device_id!r} is not in the bundle; answering for {source}. ")
        if not same:
            limited = (f"no table was made for {device_id}'s core count: {source}'s ranking, with no predicted "
                       "time and no expected regret. ")
        device_id = source
    table = tables.get((kernel, dtype_name))
    if table is None:
        return _default(bundle, kernel, k, device_id, dtype_name, shape_map,
                        f"bundle {bundle.bundle_id} has no {dtype_name} table of {kernel!r} for {device_id}")
    values = tuple(shape_map[d] for d in k.dims)
    limits = _limits(bundle, device_id, dtype_name)
    r = rank_in_table(k, table, values, shape_map, limits)
    if r.failure == "no buckets":
        return _default(bundle, kernel, k, device_id, dtype_name, shape_map,
                        f"bundle {bundle.bundle_id} has no buckets of {kernel!r} for {device_id}")
    if r.failure == "no legal config":
        return _no_legal(bundle, kernel, k, device_id, dtype_name, shape_map)
    note += r.note
    ranked, bucket_key, prune_k = r.ranked, r.bucket_key, r.prune_k
    time_us, regret, evidence = r.entry["time_us"], r.entry["expected_regret"], r.entry["evidence"]
    if r.from_overall:
        evidence = "predicted" if evidence == "measured" else evidence
    unmeasured = evidence == "measured" and not _measured_on(bundle, k, device_id)
    if unmeasured:  # a table claiming a measurement the bundle never made: its ranking taken as the model's, its
        # time and regret (a measured entry's 1.0) dropped, since nothing says where they came from
        evidence, time_us, regret = "predicted", None, None
        note += (f"the table marks this entry measured, but bundle {bundle.bundle_id} measured no {kernel} on "
                 f"{device_id}: taken as a prediction, with no predicted time and no expected regret. ")
    dropped = r.from_overall or ranked[0] != k.configs[r.entry["best"]]  # the entry's time is another config's
    if dropped:
        time_us = None
    elif evidence != "measured" and time_us is not None:
        time_us = _anchored_time(bundle, k, table, r, device_id, dtype_name, shape_map, time_us)
    if evidence != "measured" and device_id not in k.trained:
        evidence, source, basis, why = _travel(bundle, k, device_id, {**r.entry, "evidence": evidence})
        if bundle.schema_version < 2:
            time_us = None  # a schema-1 time is the time model's guess for this chip, never scaled to it
        if unmeasured:
            pass  # the note says why there is no regret and no time
        elif evidence == "extrapolated":
            regret = r.entry["expected_regret"] if k.transfer.get(device_id) else None
            if regret is None:
                why += "no expected regret: no architecture family was left out to validate such a jump. "
        elif regret is None:
            why += "no expected regret: no measured device was left out to validate it. "
        note += why + _time_note(bundle, device_id, source, basis, time_us, dropped or bool(limited) or unmeasured)
    if limited:  # another chip's evidence: its ranking is the best guess, its time and regret are not this one's
        evidence = "predicted" if evidence == "measured" else evidence
        time_us, regret = None, None
        note += limited
    outside, under = _outside(k, shape_map), ""
    if outside and time_us is not None and evidence != "measured":
        # the time this lookup quotes at the nearest point inside the range (the shape clamped into it), moved by
        # the work: never a bucket's of another size of the other dims, nor the time model's guess beyond the range
        near = {d: min(max(v, k.ranges[d][0]), k.ranges[d][1]) if d in k.ranges else v for d, v in shape_map.items()}
        edge = _resolve(kernel, near, dtype, device, named, state).predicted_us
        time_us = _moved_by_work(k, dtype_name, edge, near, shape_map) if edge else None
        floor = min((f for f in (t.floor_us() for t in tables.values()) if f is not None), default=None)
        if time_us is not None and floor is not None and time_us < floor:
            # a launch's fixed cost, which no shape this small was measured to show, rules below the least time any
            # kernel is quoted on this chip: the work alone would quote picoseconds for a 1x1x1 matmul
            time_us = None
            under = (f"moved by the work it would take less than the least time quoted for any kernel on "
                     f"{device_id} ({floor:.4g} us), a launch's fixed cost, which no shape this small measured. ")
    if outside:
        spans = ", ".join(f"{d} {k.ranges[d][0]}-{k.ranges[d][1]}" for d in outside)
        note += (f"outside the measured range ({spans}): "
                 + ("time moved by the kernel's work. " if time_us is not None
                    else f"no predicted time: {under}" if under else "no predicted time. "))
        # a published bucket's regret was validated on held-out shapes of that bucket; a shape that rounds to no
        # bucket of the range (rows=2**31 against 1-32768) has none
        past = [d for d in outside if d in k.ranges
                and not bucket_of([k.ranges[d][0]])[0] <= bucket_of([shape_map[d]])[0] <= bucket_of([k.ranges[d][1]])[0]]
        if past and regret is not None:
            regret = None
            note += (f"no expected regret: {', '.join(past)} round{'s' if len(past) == 1 else ''} to no bucket of the "
                     "measured range, where no held-out shape was scored. ")
    cfg = dict(ranked[0])
    return Prediction(
        kernel, device_id, dtype_name, shape_map, _answered_at(k, table, values, shape_map, r.entry, bucket_key),
        ranked, None if time_us is None else float(f"{time_us:.4g}"), regret, evidence, _noted(bundle, note.strip()),
        cfg.get(k.tg_param) if k.tg_param else None, prune_k, bundle.bundle_id, k.version, outside,
    )


def _answered_at(k: "_Kernel", table: "_Table", values: tuple[int, ...], shape_map: dict, entry: Any,
                 bucket_key: tuple[int, ...]) -> dict:
    """The shape whose entry answered (a Prediction's `bucket`): the shape itself when it was measured, a published
    bucket's own shape (matmul's K=14336, not the 16384 it rounds to), else the power-of-two point ranked there."""
    if entry is not None and entry is table.measured.get(values):
        return dict(shape_map)
    own = k.bucket_shapes.get(",".join(str(e) for e in bucket_key))
    if table.buckets.get(bucket_key) is entry and isinstance(own, Mapping) and set(own) == set(k.dims):
        return {d: own[d] for d in k.dims}
    return dict(zip(k.dims, (1 << e if e >= 0 else 1 for e in bucket_key)))


# ------------------------------------------------------------------------------------------
# public API


def predicted_config(kernel: str, shape: Mapping[str, int] | Sequence[int], dtype: Any = "float32",
                     device: str | None = None) -> Prediction:
    """The config to launch `kernel` with on this shape and dtype (and device: None = this process's GPU).

    `shape` is a mapping of the kernel's dims ({"rows": 4096, "cols": 4096}) or their values in
    dim order. The answer carries `.config` (None when no config is legal for the shape),
    `.evidence` (measured / predicted / extrapolated / default / none), `.expected_regret`,
    `.predicted_us`, `.candidates`, `.outside_range` and a `.note` saying how far it travelled.
    Raises UnknownKernelError / UnknownDtypeError (LookupError) for a kernel or dtype the bundle
    does not know, BadLookup (ValueError) or BadArgumentType (TypeError) for a malformed argument
    (a device id with a control character or a malformed core limit too), and BundleError when the
    device's table of a bundle loaded with strict=True fails its checks.

    A device named here or in $ZMLX_PIPELINE_DEVICE must be a catalog id, a core limit of one
    (`nvidia-h200@66sm`), a device the active bundle has a profile or table for, or a name that tells one
    catalog chip; anything else (`nvidia-h100`, `M3 Max`: several chips) raises UnknownDeviceError
    (LookupError), never a default answer. A $ZMLX_PIPELINE_DEVICE that is empty or blank is treated as
    unset. The device this process detects is never refused: a GPU the catalog does not know answers
    with the catalog default (evidence `default`).
    """
    # Remembered answers: one small dict per (kernel, dtype, device, dim names), keyed by the dims' values, in the
    # state of the bundle they were resolved from (taken once: a load_bundle meanwhile replaces it, never changes it).
    memo = _STATE.memo
    try:
        try:
            if type(shape) is not dict and isinstance(shape, Mapping):
                shape = dict(shape.items())  # names and values from one pass: its iteration may differ from values()
            values = tuple(shape.values())  # type: ignore[union-attr]
            names = tuple(shape)
        except AttributeError:
            if type(shape) is not tuple and type(shape) is not list:
                shape = in_order(shape)
            values = tuple(shape)
            names = None
        inner = memo.get((kernel, dtype, device, names))
        hit = inner.get(values) if inner is not None else None
    except TypeError:  # not iterable, or unhashable: _resolve says what is wrong with it
        return _resolve(kernel, shape, dtype, device)
    if hit is None:
        return _remember(kernel, shape, dtype, device, names, values)
    for v in values:
        if type(v) is not int:  # True, Decimal(1) or 1.0 find the answer of 1: only a valid value may use it
            _check_values(names, values)
            break
    return hit


def predicted_or_default(kernel: str, shape: Mapping[str, int] | Sequence[int], dtype: Any = "float32",
                         device: str | None = None, *, detected: bool = False) -> Prediction:
    """predicted_config, except that a kernel the bundle does not rank answers with the catalog default
    (evidence `default`): the autotuner times kernels of their own that no bundle knows. `detected`: `device` is
    the GPU this process detected, not one a caller named, so one the catalog does not know answers with the
    default rather than being refused (answered anew, never remembered for a named lookup)."""
    shape = in_order(shape)
    try:
        if detected and device is not None:
            return _resolve(kernel, shape, dtype, device, named=False)
        return predicted_config(kernel, shape, dtype, device)
    except UnknownKernelError as exc:
        device_id = device if device is not None else current_device_id()[0]
        if device is not None and not detected:
            check_device(device)
        elif device is None and current_device()[2]:
            check_device(device_id, "$ZMLX_PIPELINE_DEVICE")
        return _default(active_bundle(), kernel, None, device_id, _dtype_name(dtype), _shape_dict(None, shape), str(exc))


def _check_values(names: tuple | None, values: tuple) -> None:
    """The runtime's error for a remembered shape's value that is not a valid dimension (a bool, a Decimal)."""
    for i, v in enumerate(values):
        _dim_value(str(names[i]) if names else f"d{i}", v)


def _remember(kernel: str, shape: Any, dtype: Any, device: str | None, names, values) -> Prediction:
    """Resolve an answer and keep it in the state of the bundle it came from (only that bundle's lookups read it)."""
    state = _state()
    hit = _resolve(kernel, shape, dtype, device, state=state)
    if state.remembered >= _MEMO_LIMIT:
        state.memo.clear()
        state.remembered = 0
    try:
        state.memo.setdefault((kernel, dtype, device, names), {})[values] = hit
    except TypeError:  # a value that is no dict key (a 0-d array): answered, each time anew
        return hit
    state.remembered += 1
    return hit


def candidates(kernel: str, shape: Mapping[str, int] | Sequence[int], dtype: Any = "float32",
               k: int | None = None, device: str | None = None) -> list[dict[str, Any]]:
    """The model's top-k configs for this case, best first (k = the kernel's pruning k when None; k >= 1)."""
    if k is not None:
        k = check_k(k)
    return predicted_config(kernel, shape, dtype, device).top(k)


def clear_cache() -> None:
    """Drop every remembered answer and parsed table (the bundle stays loaded)."""
    _reset()


def lookup(kernel: str, shape: Mapping[str, int] | Sequence[int], dtype: Any = "float32",
           device: str | None = None, bundle: str | None = None, k: int | None = None) -> dict[str, Any]:
    """predicted_config as a JSON-able dict (from `bundle` when given, verified strictly; else the active one).

    `candidates` holds the top k (default: the kernel's pruning k); raises BundleError for a bad bundle
    and the runtime's errors for an unknown kernel or dtype or a malformed argument.
    """
    if k is not None:
        k = check_k(k)
    load_strictly(bundle)
    if device is not None:
        check_device(device)
    elif current_device_id()[0] is not None:  # named by $ZMLX_PIPELINE_DEVICE (a detected GPU is a catalog id)
        check_device(current_device_id()[0], "$ZMLX_PIPELINE_DEVICE")
    pred = predicted_config(kernel, shape, dtype, device)
    out = pred.as_dict()
    out["candidates"] = pred.top(k)
    out["prune_k"] = pred.prune_k
    return out


def load_strictly(bundle: str | None) -> None:
    """Load `bundle`, else the one $ZMLX_PIPELINE_BUNDLE names, refusing a bad one with BundleError (a command
    answers from the bundle it was pointed at, never silently from the default)."""
    import os

    from zmlx_pipeline.runtime.bundle import load_bundle

    if bundle is not None:
        load_bundle(bundle, strict=True)
        return
    env = os.environ.get("ZMLX_PIPELINE_BUNDLE")
    if env and env.strip() and active_bundle(load_default=False) is None:  # empty or blank: unset
        try:
            load_bundle(env, strict=True)
        except BundleError as exc:
            raise BundleError(f"{exc} ($ZMLX_PIPELINE_BUNDLE): point it at a published bundle or unset it") from None


def check_device(device: Any, what: str = "device") -> None:
    """UnknownDeviceError for a device the caller named that neither the active bundle nor the catalog knows, or a
    name that does not tell one chip (a typo gets no default, nor does a guess), BadLookup for a malformed one
    (check_device_id)."""
    expect_str(device, what)
    bundle = active_bundle()
    check_device_id(bundle, device, what)
    _check_known_device(bundle, device, what)


def _held(bundle: Bundle | None, device: str) -> bool:
    return bundle is not None and (device in bundle.tables or device in bundle.profiles)


def device_problem(bundle: Bundle | None, device: str, what: str = "device") -> str:
    """Why a named device (check_device_id has checked its form) answers for no one chip, in one line; "" when it
    does: a device the bundle holds, a catalog id or a core limit of either, or a name that tells one catalog chip."""
    if _held(bundle, device):
        return ""
    base = device.partition("@")[0]
    mine = registered_name(bundle, device) if base == device else ()
    if base != device:  # a core limit: of a chip the bundle holds or of a catalog id, never of a mere name
        if _held(bundle, base) or catalog_id_row(base) is not None:
            return ""
    elif catalog_row(device) is not None or len(mine) == 1:
        return ""
    ids = catalog_candidates(base) or mine
    if len(ids) > 1:
        more = f" and {len(ids) - 8} more" if len(ids) > 8 else ""
        return f"{what} {shown(device)} does not name one chip; it may be {', '.join(ids[:8])}{more}"
    hint = catalog_hint(base)
    where = f"bundle {plain(bundle.bundle_id)}" if bundle is not None else "the bundle"
    return (f"unknown {what} {shown(device)}: neither a catalog id, a core limit of one (nvidia-h200@66sm) nor a "
            f"device of {where}" + (f"; catalog ids like it: {', '.join(hint)}" if hint else
                                   "; see zmlx-pipeline devices"))


def registered_name(bundle: Bundle | None, device: str) -> tuple[str, ...]:
    """The ids of the bundle's registered devices (`devices add`) that a named device is a name or alias of, where it
    is no device id the bundle holds and tells no catalog chip (catalog chips come first, as in the store): one is
    the device answered under its id, several a name that does not tell one."""
    if bundle is None or _held(bundle, device) or catalog_row(device) is not None or catalog_candidates(device):
        return ()
    return registered_named(bundle.profiles, device)


def named_as(device: str) -> str:
    """The id a named device is answered under in the active bundle: a registered device's for its name or alias,
    else the device as given."""
    mine = registered_name(active_bundle(), device)
    return mine[0] if len(mine) == 1 else device


def _check_known_device(bundle: Bundle | None, device: str, what: str = "device") -> None:
    problem = device_problem(bundle, device, what)
    if problem:
        raise UnknownDeviceError(problem)
