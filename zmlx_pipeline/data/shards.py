"""Parquet shards: one self-contained file per collector, merged into the central store by ingest.

The SQL lives in store.py; these are the entry points the CLI calls. Before a shard goes in, every row is
checked here for what the store's own checks cannot see (names, dtypes, shape and config values, a built-in
kernel's dims, parameters and constraints, the spread of its timings and its repeats, its device's figures, kind
and core limit): a shard with one bad row is refused, naming the file, the row and why, and nothing of any shard is
ingested.

Why one long module: every row check is one entry of one table (_CHECKS, _ROW_CHECKS) that ingest, export and the
store's reads of devices and measurements all run, so the checks and that table stay together.
"""

from __future__ import annotations

import json
import math
import os
import re
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from zmlx_pipeline.core.constraints import limit_values
from zmlx_pipeline.core.dtypes import DTYPE_BYTES
from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.core.keys import RepeatedJSONKey, canonical_json, unique_keys
from zmlx_pipeline.data.catalog import BACKENDS, CORE_UNIT_WORDS, CORE_UNITS, VENDORS, UnknownDevice, get_device
from zmlx_pipeline.data.importers.builtin_kernels import BUILTIN_KERNELS
from zmlx_pipeline.data.paths import UnreadableFolder, files_below, not_regular
from zmlx_pipeline.data.records import (
    DTYPES,
    config_problem,
    device_id_problem,
    fold_name,
    name_problem,
    shape_problem,
    shortened,
)
from zmlx_pipeline.data.store import (
    FUTURE_SKEW,
    MEASURED_FLOOR,
    SHARD_COLUMNS,
    SHARD_REQUIRED,
    BadShard,
    Store,
    bad_row,
    check_shard_columns,
    query_shards,
)

__all__ = [
    "SHARD_COLUMNS",
    "SHARD_REQUIRED",
    "BadShard",
    "check_shard",
    "check_shards",
    "export_shard",
    "ingest_shard",
    "ingest_shards",
    "query_shards",
    "shard_filename",
    "shard_paths",
]


def shard_filename(device_id: str, when: datetime | None = None) -> str:
    """A file name for a device's shard: `<device slug>-<UTC timestamp>.parquet`."""
    when = when or datetime.now(timezone.utc)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device_id).strip("-").lower() or "device"
    return f"{slug}-{when.strftime('%Y%m%dT%H%M%SZ')}.parquet"


def export_shard(store: Store, path: str | os.PathLike, device: str | None = None) -> int:
    """Write the store's measurements (one device or all) as one zstd Parquet shard; returns rows."""
    return store.export_shard(path, device=device)


def ingest_shard(store: Store, path: str | os.PathLike) -> dict:
    """Merge one shard into the store in one transaction; returns {'rows', 'added', 'skipped'} (and
    'replaced': keys re-measured since the store's timing, whose newest timing wins); the store checks its rows."""
    return store.ingest_shard(path)


def shard_paths(source: str | os.PathLike) -> list[Path]:
    """The shards a path names: the *.parquet files below a directory (paths.files_below: in every subfolder,
    sorted; hidden ones left out; one that is not a regular file, or a folder that cannot be read, refused), or the
    file itself."""
    source = Path(source)
    if source.is_dir():
        try:
            found, odd = files_below(source, (".parquet",))
        except UnreadableFolder as err:
            raise BadShard(f"{err}, so its shards would be left out; make it readable or name the shards to ingest; "
                           "nothing was ingested, the store is unchanged") from None
        if odd is not None:
            raise BadShard(f"{odd[0]}: {odd[1]}, not a shard file; remove it from {source} or name the shards to "
                           "ingest; nothing was ingested, the store is unchanged")
        if not found:
            raise BadShard(f"{source}: no .parquet shard in this directory or below it (hidden files and folders "
                           "left out)")
        return found
    if source.is_file():
        return [source]
    try:
        kind = not_regular(source.stat().st_mode)
    except OSError:
        kind = None
    if kind is not None:
        raise BadShard(f"{source}: {kind}, not a shard file or a directory of them")
    raise BadShard(f"{source}: no such shard file or directory")


def ingest_shards(store: Store, sources: Iterable[str | os.PathLike]) -> dict:
    """Ingest every shard the sources name, all or nothing (one transaction); returns totals and per-file counts. A
    shard named twice (itself and its folder, or by two paths) is read once, as import reads a file named twice."""
    shards, seen = [], set()
    for shard in (shard for source in sources for shard in shard_paths(source)):
        if shard.resolve() not in seen:
            seen.add(shard.resolve())
            shards.append(shard)
    return store.ingest_shards(shards)  # which checks every row first


def check_shards(shards: Iterable[str | os.PathLike]) -> None:
    """check_shard each shard; shards of one fleet share most of their keys, so each is judged once. What the
    checks held is let go before the store reads the shards."""
    verdicts: dict = {}
    for shard in shards:
        check_shard(shard, verdicts)
    pa.default_memory_pool().release_unused()


# --------------------------------------------------------------------------------------------
# Row checks


# The device columns a shard gives the limits its kernels' constraints read, by the device row's names.
_LIMIT_COLUMNS = {"max_threads_per_threadgroup": "device_max_threads_per_threadgroup",
                  "simd_width": "device_simd_width", "threadgroup_memory_bytes": "device_threadgroup_memory_bytes",
                  "architecture": "device_architecture"}
_NOT_JSON = object()


@lru_cache(maxsize=1 << 16)
def _json(text: Any) -> Any:
    """A JSON column's value parsed (the same text once; never changed by its readers); _NOT_JSON when it does
    not parse."""
    if not isinstance(text, str):
        return _NOT_JSON
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


class _NotFinite(ZmlxPipelineError, ValueError):
    """A JSON number that is no finite float (NaN, Infinity, 1e999): strict JSON has none."""


def _finite_float(token: str) -> float:
    if not math.isfinite(float(token)):
        raise _NotFinite(token)
    return float(token)


def _json_object_problem(name: str, text: Any) -> str | None:
    """Why a JSON text column's value (null, or an object) cannot be stored: text that is not JSON, not an object, or
    holds a number that is not finite (NaN, Infinity, 1e999), which strict JSON, as the store writes it, has not."""
    if text is None:
        return None
    try:
        value = json.loads(text, parse_constant=_finite_float, parse_float=_finite_float) \
            if isinstance(text, str) else None
    except _NotFinite as err:
        return (f"{name} holds the number {str(err)[:40]}, which is not finite: write it as strict JSON (finite "
                "numbers, no NaN or inf), as export does")
    except (ValueError, RecursionError):  # not JSON, nested too deep, or a number past int's digit limit
        value = None
    return None if isinstance(value, dict) else f"{name} must be a JSON object, not {text!r:.40}"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _dtype(dtype: Any) -> str | None:
    if dtype not in DTYPES:
        shown = shortened(dtype) if isinstance(dtype, str) else repr(dtype)
        return f"dtype {shown} is not one the store holds ({', '.join(DTYPES)})"
    return None


def _repeated_key(name: str, text: str) -> str | None:
    """Why a JSON object column's text cannot be read as written: an object in it naming a key twice, of which a
    JSON reader keeps the last and drops the rest unsaid (export never writes one)."""
    try:
        json.loads(text, object_pairs_hook=unique_keys)  # text _json has parsed
    except RepeatedJSONKey as exc:
        return (f"{name} names the key {shortened(exc.args[0])} twice: {text!r:.200}; write each key once, as export "
                "does")
    return None


def _shape(text: Any) -> str | None:
    shape = _json(text)
    if not isinstance(shape, dict):
        return f"shape is not a JSON object: {text!r:.200}"
    return _repeated_key("shape", text) or shape_problem(shape)


def _config(text: Any) -> str | None:
    config = _json(text)
    if not isinstance(config, dict):
        return f"config is not a JSON object: {text!r:.200}"
    return _repeated_key("config", text) or config_problem(config)


def _unsampled(table: pa.Table) -> pa.Array:
    """Rows of status ok timed by no sample: their median is no timing (a null or negative count is the store's
    to refuse)."""
    return pc.and_(pc.equal(table["status"], "ok"), pc.equal(table["samples"], 0))


def _out_of_spread(table: pa.Table) -> pa.Array:
    """Rows whose median_us is not between their p10_us and p90_us (a missing, non-finite or non-positive
    timing is the store's to refuse, saying which)."""
    median, p10, p90 = table["median_us"], table["p10_us"], table["p90_us"]
    usable = [pc.and_(pc.is_finite(t), pc.greater(t, 0)) for t in (median, p10, p90)]
    return pc.and_(pc.and_(pc.and_(*usable[:2]), usable[2]), pc.or_(pc.less(median, p10), pc.greater(median, p90)))


#: how far a repeat's median may lie from its row's, either way: the same config timed again on the same chip
#: differs by its noise (a few percent, 2x at the noisiest), never by three orders of magnitude
REPEAT_RATIO = 1000.0


def _repeats(text: Any, run_id: Any = None, median_us: Any = None) -> str | None:
    """Why a row's repeats (a JSON list of {run_id, median_us, measured_at}, as export writes them) are unusable: a
    repeat is another run's timing of the row's key, stamped as rows are (from 2000 to now), and near its median."""
    if text is None:
        return None
    repeats = _json(text)
    if not isinstance(repeats, list):
        return f"repeats is not a JSON list: {text!r:.200}"
    latest = datetime.now(timezone.utc).replace(tzinfo=None) + FUTURE_SKEW
    for rep in repeats:
        named = isinstance(rep, dict) and name_problem("run_id", rep.get("run_id")) is None
        if not named or not isinstance(rep.get("measured_at"), str):
            return f"a repeat is not an object of run_id, median_us and measured_at: {rep!r:.200}"
        when = _timestamp(rep["measured_at"])
        if when is None:
            return f"a repeat's measured_at is not a timestamp: {rep['measured_at']!r:.60}"
        if when < datetime.fromisoformat(MEASURED_FLOOR):
            return (f"a repeat's measured_at {rep['measured_at']:.40} is before {MEASURED_FLOOR}, earlier than any "
                    "timing this tool made")
        if when > latest:
            return f"a repeat's measured_at {rep['measured_at']:.40} is in the future"
        if not _finite(rep.get("median_us")) or rep["median_us"] <= 0:
            return f"a repeat needs a finite positive median_us, not {rep.get('median_us')!r}"
        if rep["run_id"] == run_id:
            return (f"a repeat's run_id {shortened(run_id)} is the row's own run: a repeat is the key timed again "
                    "in another run")
        if _finite(median_us) and median_us > 0 and not 1 / REPEAT_RATIO <= rep["median_us"] / median_us <= REPEAT_RATIO:
            return (f"a repeat's median_us {rep['median_us']!r} is more than {REPEAT_RATIO:g}x from the row's "
                    f"{median_us!r}: no timing of the same config on the same chip differs that much")
    return None


@lru_cache(maxsize=1)
def _builtin_folded() -> dict[str, str]:
    return {fold_name(name): name for name in BUILTIN_KERNELS}


def _kernel(kernel: Any) -> str | None:
    """Why a kernel name cannot name a row: name_problem's reasons, or a name that differs from a built-in kernel's
    only in case, white space or NFKC form (its rows would pass for another kernel's, unchecked against its
    constraints)."""
    problem = name_problem("kernel", kernel)
    if problem is not None:
        return problem
    builtin = _builtin_folded().get(fold_name(kernel))
    if builtin is not None and builtin != kernel:
        return (f"kernel {kernel!r} differs from the built-in kernel {builtin!r} only in case, white space or Unicode "
                "compatibility form (NFKC)")
    return None


def _timestamp(text: str) -> datetime | None:
    """The naive UTC time a text stamps (None when it is no ISO timestamp); an offset is taken into UTC."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when.astimezone(timezone.utc).replace(tzinfo=None) if when.tzinfo else when


def _builtin(kernel: Any, shape: Any, config: Any) -> str | None:
    builtin = BUILTIN_KERNELS.get(kernel)
    if builtin is None:
        return None
    return builtin.mismatch(_json(shape), _json(config), every_param=False)


@lru_cache(maxsize=256)
def _limits(dtype: str, *device: Any) -> dict[str, int]:
    """The limit names a constraint reads, for one dtype on a device of these shard columns (_LIMIT_COLUMNS)."""
    return {**limit_values(dict(zip(_LIMIT_COLUMNS, device))), "dtype_bytes": DTYPE_BYTES[dtype]}


def _legal(kernel: Any, status: Any, dtype: Any, shape: Any, config: Any, *device: Any) -> str | None:
    """Why an ok row of a built-in kernel could not have run: a config its constraints exclude on that shape,
    dtype and device (a failed row may hold one: that is why it failed)."""
    builtin = BUILTIN_KERNELS.get(kernel)
    if builtin is None or status != "ok":
        return None
    shape, config = _json(shape), _json(config)
    broken = builtin.broken({**shape, **config, **_limits(dtype, *device)})
    if broken is None:
        return None
    return (f"an ok row of {kernel} whose config {canonical_json(config)} breaks its constraint {broken!r} "
            f"on shape {canonical_json(shape)}")


#: a shard's device figures: each, when given, a finite number above 0 (a chip of -3 cores, or clocked at inf,
#: would reach every later step that reads the device)
_DEVICE_NUMBERS = tuple(f"device_{c}" for c in (
    "gpu_cores", "memory_bandwidth_gbps", "max_threads_per_threadgroup", "simd_width", "threadgroup_memory_bytes",
    "l2_bytes", "clock_mhz", "memory_gb", "default_threadgroup"))
#: a shard's JSON objects about its device and run (null, or an object)
_DEVICE_OBJECTS = ("device_reported", "run_settings")
_MAX_DEVICE_NUMBER = 1e15  # above any real figure: bytes of L2 or threadgroup memory, MHz, GB/s


def _device(*values: Any) -> str | None:
    """Why a row's device figures or device and run JSON cannot be stored, or None."""
    numbers, objects = values[:len(_DEVICE_NUMBERS)], values[len(_DEVICE_NUMBERS):]
    for name, v in zip(_DEVICE_NUMBERS, numbers):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                              or not 0 < v <= _MAX_DEVICE_NUMBER):
            return f"{name} must be a finite number above 0, not {v!r:.40}"
    for name, v in zip(_DEVICE_OBJECTS, objects):
        problem = _json_object_problem(name, v)
        if problem is not None:
            return problem
    return None


#: the device columns a shard of a catalog chip gives as the catalog does, or leaves empty: every writer (collect's
#: detection, import) copies them from the catalog row, so another value is a relabelled chip or a hand edit, and
#: would pass for the chip's own figures to every later step (the first shard of a device decides its stored row)
_CATALOG_COLUMNS = ("vendor", "backend", "family", "architecture", "core_unit", "max_threads_per_threadgroup",
                    "simd_width", "threadgroup_memory_bytes", "l2_bytes", "default_threadgroup",
                    "memory_bandwidth_gbps", "clock_mhz", "memory_gb")
_CORE_LIMIT = re.compile(r"(.+)@([1-9][0-9]*)sm")


def _catalog_row(device_id: str):
    """The catalog row of a device id, or None for a device the catalog does not have (yet)."""
    try:
        return get_device(device_id)
    except UnknownDevice:
        return None


def _differs(value: Any, expected: Any) -> bool:
    if isinstance(value, (int, float)) and isinstance(expected, (int, float)):
        return not math.isclose(value, expected, rel_tol=1e-9)
    return value != expected


def _catalog(device_id: Any, gpu_cores: Any, core_limited_from: Any, name: Any, reported_name: Any,
             *values: Any) -> str | None:
    """Why a row's device columns contradict the catalog row of its device id (`<id>` or `<id>@<N>sm`, the chip
    limited to N of its SMs, fewer than it has, and naming the chip it is limited from): the shard's value and the
    catalog's; None for a device the catalog does not have. Its name is the catalog's, a core limit's that name or
    the reported one followed by ` [N SMs]` (as collect and import write them)."""
    limited = _CORE_LIMIT.fullmatch(device_id)
    base, cores = (limited.group(1), int(limited.group(2))) if limited else (device_id, None)
    spec = _catalog_row(base)
    if spec is None:
        return None
    fix = "a shard of a catalog device gives the catalog's figures (or none): correct its device_id or that column"
    if cores is not None and (spec.core_unit != "sms" or spec.vendor != "nvidia"):
        return (f"device_id {device_id!r} limits {base} to {cores} SMs, but its cores are {CORE_UNIT_WORDS.get(spec.core_unit, spec.core_unit)}, not "
                "SMs; a core limit (@<N>sm, CUDA MPS) is only of an NVIDIA chip")
    if cores is not None and cores >= spec.gpu_cores:
        return (f"device_id {device_id!r} limits {base} to {cores} SMs, but it has {spec.gpu_cores}; a core limit "
                "is below the chip's count (the whole chip is its own id)")
    if cores is not None and core_limited_from != base:
        return (f"device_core_limited_from is {core_limited_from!r:.40}, but {device_id} is limited from {base}; a "
                "core-limited device names the chip it is limited from")
    expected = {"gpu_cores": spec.gpu_cores if cores is None else cores,
                "core_limited_from": None if cores is None else base,
                **{c: getattr(spec, c) for c in _CATALOG_COLUMNS}}
    given = {"gpu_cores": gpu_cores, "core_limited_from": core_limited_from, **dict(zip(_CATALOG_COLUMNS, values))}
    for column in (*_CATALOG_COLUMNS[:5], "gpu_cores", "core_limited_from", *_CATALOG_COLUMNS[5:]):
        value = given[column]
        if value is not None and _differs(value, expected[column]):
            return (f"device_{column} is {value!r:.40}, but the catalog gives {device_id} {expected[column]!r}; "
                    f"{fix}")
    names = [spec.name] if cores is None else [f"{n} [{cores} SMs]" for n in dict.fromkeys((spec.name, reported_name))
                                               if isinstance(n, str)]
    if name is not None and name not in names:
        return (f"device_name is {name!r:.60}, but the catalog names {device_id} {' or '.join(map(repr, names))}; "
                f"{fix}")
    return None


#: the device columns of a kind of chip, and the catalog's values of each: the runtime reads no other
_KIND_COLUMNS = (("vendor", VENDORS), ("backend", BACKENDS), ("core_unit", CORE_UNITS))


def _kind(device_id: Any, core_limited_from: Any, *values: Any) -> str | None:
    """Why a row's vendor, backend or core unit (each, when given, one of the catalog's) or core_limited_from cannot
    be stored, for any device, in the catalog or not: a core limit (`<id>@<N>sm`) names the device it is limited
    from, and a device that is no core limit names none. Bundle loading refuses a profile of other values."""
    for (column, choices), value in zip(_KIND_COLUMNS, values):
        if value is not None and value not in choices:
            return (f"device_{column} is {shortened(value) if isinstance(value, str) else repr(value)}, none of the "
                    f"catalog's ({', '.join(choices)})")
    limited = _CORE_LIMIT.fullmatch(device_id)
    base = limited.group(1) if limited else None
    if core_limited_from == base:
        return None
    shown = shortened(core_limited_from) if isinstance(core_limited_from, str) else repr(core_limited_from)
    if base is None:
        return (f"device_core_limited_from is {shown}, but {device_id} is no core limit (<id>@<N>sm); only a "
                "core-limited device names the device it is limited from")
    return (f"device_core_limited_from is {shown}, but {device_id} is limited from {base}; a core-limited device "
            "names the device it is limited from")


# (columns, check): each check takes a row's values of its columns and gives the reason it is refused, or None;
# in this order, so that a later check sees only values the earlier ones passed.
_CHECKS: tuple[tuple[tuple[str, ...], Callable[..., str | None]], ...] = (
    (("run_id",), lambda v: name_problem("run_id", v)),
    (("device_id",), device_id_problem),
    (("kernel",), _kernel),
    (("kernel_version",), lambda v: name_problem("kernel_version", v)),
    (("dtype",), _dtype),
    (("shape",), _shape),
    (("config",), _config),
    (("extra",), lambda v: _json_object_problem("extra", v)),
    (("repeats", "run_id", "median_us"), _repeats),
    (("kernel", "shape", "config"), _builtin),
    (("kernel", "status", "dtype", "shape", "config", *_LIMIT_COLUMNS.values()), _legal),
    ((*_DEVICE_NUMBERS, *_DEVICE_OBJECTS), _device),
    (("device_id", "device_gpu_cores", "device_core_limited_from", "device_name", "device_reported_name",
      *(f"device_{c}" for c in _CATALOG_COLUMNS)),
     _catalog),
    (("device_id", "device_core_limited_from", *(f"device_{c}" for c, _ in _KIND_COLUMNS)), _kind),
)
# (columns, rows, reason): checks of every row at once, after those above; `rows` marks the bad rows of the table,
# `reason` takes a bad row's values of the columns.
_ROW_CHECKS: tuple[tuple[tuple[str, ...], Callable[[pa.Table], pa.Array], Callable[..., str]], ...] = (
    (("samples",), _unsampled, lambda samples: f"an ok row is timed by 1 sample or more, not {samples!r}"),
    (("p10_us", "median_us", "p90_us"), _out_of_spread,
     lambda p10, median, p90: f"p10_us <= median_us <= p90_us does not hold ({p10!r}, {median!r}, {p90!r})"),
)


# every column a check reads
_READ = tuple(dict.fromkeys([*(c for columns, _ in _CHECKS for c in columns), "status",
                             *(c for columns, _, _ in _ROW_CHECKS for c in columns)]))


def _read(path: Path) -> pa.Table | None:
    """The columns the checks read (an absent optional one as nulls); None for a file that is not readable Parquet
    or lacks shard columns: the store refuses it, saying so."""
    try:
        present = set(pq.read_schema(path).names)
        if not set(SHARD_REQUIRED) <= present:
            return None
        table = pq.read_table(path, columns=[c for c in _READ if c in present])
    except (pa.ArrowException, OSError):
        return None
    for column in _READ:
        if column not in present:
            table = table.append_column(column, pa.nulls(table.num_rows, pa.string()))
    return table


_NAN = object()  # a NaN's place in a key: NaN equals nothing, not even itself, so it could name no row


def _key(values: tuple) -> tuple:
    """A row's values as a key that finds its row again: each NaN as one marker (NaN != NaN)."""
    return tuple(_NAN if isinstance(v, float) and math.isnan(v) else v for v in values)


def check_shard(path: str | os.PathLike, verdicts: dict | None = None) -> None:
    """Refuse a shard holding a row the store must not take: BadShard names the file, the row and why.

    Each check of _CHECKS runs once per distinct combination of the values of the columns it reads (in this
    shard, and in the others checked with the same `verdicts`); those of _ROW_CHECKS on every row at once.
    """
    path = Path(path)
    if path.is_file():  # a missing one is the store's to refuse, naming it
        check_shard_columns(path)
    table = _read(path)
    if table is None:
        return
    verdicts = {} if verdicts is None else verdicts
    try:
        for columns, check in _CHECKS:
            distinct = table.select(list(columns)).group_by(list(columns), use_threads=False).aggregate([])
            keys = zip(*(distinct[c].to_pylist() for c in columns))
            known = verdicts.setdefault(columns, {})
            bad = {_key(key): reason for key in keys
                   if (reason := known[_key(key)] if _key(key) in known else known.setdefault(_key(key), check(*key)))
                   is not None}
            if bad:
                rows = [_key(row) for row in zip(*(table[c].to_pylist() for c in columns))]
                found = [i for i, key in enumerate(rows) if key in bad]
                raise BadShard(bad_row(path, found[0], bad[rows[found[0]]], len(found)))
        for columns, marks, reason in _ROW_CHECKS:
            found = pc.indices_nonzero(pc.fill_null(marks(table), False))
            if len(found):
                first = found[0].as_py()
                raise BadShard(bad_row(path, first, reason(*(table[c][first].as_py() for c in columns)), len(found)))
    except pa.ArrowException as err:
        why = " ".join(str(err).split())[:200]
        raise BadShard(f"{path} has columns of other types than a shard's ({why}): re-export it with "
                       "zmlx-pipeline export; nothing was ingested, the store is unchanged") from None
