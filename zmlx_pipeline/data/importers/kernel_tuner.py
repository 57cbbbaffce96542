"""Kernel Tuner cache JSON and T4 JSON files (gzipped or not) read into the store.

Each file becomes one run (status "imported", settings naming the file and its sha256) of
one kernel on one catalog device. Every entry becomes a measurement: timed configs as `ok`
with median/p10/p90 from their repetitions, failed ones with the status of their failure, each
dated when the file says it was timed (`timestamps.py`), else at the import (the settings say which).
Every file is parsed and checked completely before anything is written, so a malformed one
stores nothing; all go in in one transaction (a stopped import stores nothing); re-importing adds nothing.

The format is told by content: a gzip stream is decompressed first, then a JSON object with
`cache` is a Kernel Tuner cache file, one with `results` a T4 file, one with `Metadata` and
`Results` KTT's own output (`ktt.py`), one with `version_number` and `data` (or devices of
problem sizes of records) Kernel Tuner's results file (`results_file.py`, a section per device and
problem size); a parameter that picks the data type becomes each case's dtype (`dtypes.py`).
A cache entry holds its parameter values, or (as Kernel Tuner's own keys do) only the key: the
values joined by "," in `tune_params_keys` order (else `tune_params` order). A cache file of a run that was
stopped is left open by Kernel Tuner (no closing braces), and one that was killed may end
inside an entry: such a file is read entry by entry, and every complete entry is imported.
T4 files name neither the kernel, the device nor the problem size: those come
from a T1 search-space description beside the data (`<folder>/../search-spaces/<folder>.json`,
as the FAIR benchmark hub lays it out), the file's folder and its file name (`A100_T4.json.gz`
-> A100), a T4 metadata file beside it (`X-metadata.json.gz`, nvidia-smi or rocm-smi output, for
`X-results.json.gz` or `X.json.gz`), or the import's options.

Why one long module: every layout goes through the same failure markers, time units, problem-size
and device-name rules defined here (ktt.py and results_file.py reuse them); kept together, no two
readers can come to read one measurement two ways.
"""

from __future__ import annotations

import csv
import fnmatch
import functools
import gzip
import hashlib
import io
import json
import math
import os
import posixpath
import re
import tomllib
import warnings
import zlib
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import repeat
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from zmlx_pipeline.core.errors import ZmlxPipelineError, shown, shown_number
from zmlx_pipeline.data.catalog import (
    AmbiguousDevice,
    DeviceSpec,
    UnknownDevice,
    devices_named_within,
    get_device,
    hidden_character_problem,
    load_catalog,
    name_tokens,
    resolve_device,
)
from zmlx_pipeline.core.constraints import expression_names
from zmlx_pipeline.core.files import GIT_LFS_POINTER
from zmlx_pipeline.core.keys import canonical_json, digest
from zmlx_pipeline.data.importers.builtin_kernels import BUILTIN_KERNELS
from zmlx_pipeline.data.importers.dtypes import split_dtype
from zmlx_pipeline.data.records import (
    MAX_DIM,
    Measurement,
    config_problem,
    dim_problem,
    name_problem,
    shape_problem,
    twin_problem,
)
from zmlx_pipeline.data.paths import UnreadableFolder, files_below, not_regular
from zmlx_pipeline.data.importers.timestamps import read_timestamp
from zmlx_pipeline.data.store import Store, StoreError, measured_at_problem

DTYPE = "float32"  # both hub kernels (and Kernel Tuner's usual float inputs) are single precision
FORMAT_CACHE = "kernel_tuner_cache"
FORMAT_T4 = "t4"
FORMAT_KTT = "ktt"
FORMAT_RESULTS = "kernel_tuner_results"
_GZIP_MAGIC = b"\x1f\x8b"
# How other compressed files start: such a file is named for what it is, not called text that is not UTF-8.
_COMPRESSED_MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"\xfd7zXZ\x00": "xz", b"BZh": "bzip2",
                     b"PK\x03\x04": "zip"}
# The most bytes a file read for an import may hold, gunzipped: a benchmark hub T4 file of 11,130 configs is 19 MB,
# so this holds a space a hundred times larger; a bigger file is refused, never read to its end.
MAX_FILE_BYTES = 2 * 1024**3
_DIM_NAMES = ("x", "y", "z")
# The ErrorConfig names Kernel Tuner writes (kernel_tuner/util.py): in "time", in the objective's field, or
# (newer versions) in "__error__". InvalidConfig marks a config its restrictions exclude: never run, no row.
_CACHE_FAILURES = {"RuntimeFailedConfig": "launch_error", "CompilationFailedConfig": "compile_error"}
_CACHE_SKIPPED = {"InvalidConfig"}
_ERROR_FIELD = "__error__"
# T4 invalidity values (schema 1.0.0); "constraints" marks a config outside the space: not a measurement.
_T4_STATUS = {"correct": "ok", "compile": "compile_error", "runtime": "launch_error",
              "timeout": "timeout", "correctness": "wrong_result"}
_T4_SKIPPED = {"constraints"}
_TIME_UNITS_US = {
    **dict.fromkeys(("miliseconds", "milliseconds", "millisecond", "ms", "msec", "msecs"), 1e3),
    **dict.fromkeys(("seconds", "second", "s", "sec", "secs"), 1e6),
    **dict.fromkeys(("microseconds", "microsecond", "us", "\u00b5s", "usec", "usecs"), 1.0),
    **dict.fromkeys(("nanoseconds", "nanosecond", "ns", "nsec", "nsecs"), 1e-3),
}
_DEFAULT_TIME_UNIT = "milliseconds"  # Kernel Tuner's unit: caches and T4 files without a timeunit use it
# Kernel Tuner writes an entry's time as the mean of its repetitions (exactly, in every file of the benchmark
# hub); one further off than this was written over afterwards.
_TIME_MEAN_TOLERANCE = 0.01
# Old Kernel Tuner versions stored a failed config as a huge time (1e20) instead of a marker.
_FAILED_TIME_MS = 1e20
# Words in a data file's name that describe the file, not the GPU (A100_T4.json.gz, A6000_original.json.gz).
_FILE_NAME_WORDS = ("t4", "original", "extended", "results", "metadata", "cache", "output")
#: the key of a `key=value` file-name word that limits the GPU (`H100_SXM_sms=66`): part of the device, never dropped
_LIMIT_KEY = re.compile(r"(?i)(n|num)?(sms?|mps|cores?|cus?|ctas?|gpcs?|tpcs?|mig|partition|limit|percentage|pct|percent)")
#: words that make a chip another part wherever they stand in a file name (`notebook_RTX_4070` is no desktop card)
_QUALIFIER_WORDS = frozenset({"notebook", "laptop", "mobile", "maxq", "oem", "mig", "gcd", "embedded", "engineering"})
_RUN_WORD = re.compile(r"(?i)(run|rep|repeat|trial|try|iter|seed|take)\d*")  # `..._run1.json`: a run of the file
# Where a T4 metadata file (Kernel Tuner's store_metadata_file) names the GPU: nvidia-smi's product name,
# or one of rocm-smi's card fields (their spelling varies between rocm-smi versions).
_ROCM_NAME_FIELDS = ("card series", "device name", "marketing name")
#: where Kernel Tuner and T4 write when a config was timed: each cache entry's and T4 result's own field, and a T4
#: file's metadata (KTT's T4 writer)
_STAMP_FIELD = "timestamp"
# Where the shape of a file that names no usable problem size comes from: nowhere (its shape is empty).
NO_PROBLEM_SIZE = "none"
# What Kernel Tuner writes for a problem size it cannot write (a function of the parameters).
_UNUSABLE_PROBLEM_SIZES = ("callable",)


class ImportFileError(ZmlxPipelineError, ValueError):
    "A file could not be imported; nothing of it was stored"


class NothingToImport(ImportFileError):
    "A file that holds no measurement (a run stopped before its first config ended); beside others, it is reported"


class CompanionFile(ImportFileError):
    "A T4 metadata file: read for the results file beside it, not imported on its own"


class UnmatchedDevice(ImportFileError, UnknownDevice):
    "The file's device is not in the catalog, or its name fits several rows; pass --device or --device-map"


@dataclass
class ParsedFile:
    """One file, read and checked completely, ready to be written (run_id still empty)."""

    path: Path
    sha256: str
    format: str
    kernel: str
    kernel_version: str
    device: DeviceSpec
    reported_device: str
    shape: dict[str, int]
    measurements: list[Measurement]
    skipped: int = 0
    source: dict[str, Any] = field(default_factory=dict)
    #: the kernel name the file gives, where its config space is stored under another (kernel_spaces.py), and why
    renamed_from: str | None = None
    note: str | None = None

    @property
    def failed(self) -> int:
        return sum(m.status != "ok" for m in self.measurements)


# ------------------------------------------------------------------------------------------
# reading


def _fail(path: Path, reason: str) -> ImportFileError:
    """The one-line error for a file that cannot be imported."""
    reason = " ".join(str(reason).split())
    return ImportFileError(f"cannot import {path}: {reason}; nothing of it was stored")


_CACHE_OPENING = re.compile(r'"cache"\s*:\s*\{')
#: digits of an integer json reads as one; a longer one (past Python's own limit on int conversion) reads as an
#: infinite number, which every check then refuses as no time and no size, naming it
_MAX_INT_DIGITS = 4000


class _TooLarge(float):
    """A JSON number too large to read (an integer past _MAX_INT_DIGITS digits, or a number past a float's range):
    +-inf, kept with its text, so that a message names it as written, cut short, never as inf."""

    text: str

    def __repr__(self) -> str:
        return shown_number(self.text)


def _too_large(text: str) -> _TooLarge:
    value = _TooLarge("-inf" if text.startswith("-") else "inf")
    value.text = text
    return value


def _int_or_inf(text: str) -> int | float:
    """A JSON integer: int, or +-inf (_TooLarge) past _MAX_INT_DIGITS digits (a file no tuner wrote, refused by the
    checks)."""
    if len(text) - text.startswith("-") <= _MAX_INT_DIGITS:
        return int(text)
    return _too_large(text)


class _InexactWhole(float):
    """A JSON number with a fraction or an exponent whose float is a whole number ("4096.0000000000001", "1e3"): kept
    with its text, so that a problem size is never rounded to a whole number it was not written as."""

    text: str

    def __repr__(self) -> str:
        return self.text  # what the file wrote, in a message that quotes it


#: how a whole number may be written as a JSON float in a problem size: its digits and a fraction of zeros ("4096.0",
#: as Python writes a whole float); "4096.0000000000001" (which a float holds as 4096) and "1e3" are not sizes
_WHOLE_FLOAT = re.compile(r"-?[0-9]+\.0*")


def _float(text: str) -> float:
    """A JSON float: float, or _InexactWhole for a whole number not written as one (see _WHOLE_FLOAT)."""
    value = float(text)
    if math.isinf(value):  # digits or an exponent past a float's range (JSON writes no inf)
        return _too_large(text)
    if value.is_integer() and not _WHOLE_FLOAT.fullmatch(text):
        value = _InexactWhole(value)
        value.text = text
    return value


class RepeatedKey(ZmlxPipelineError, ValueError):
    """A JSON object naming one key twice with different values, which json would resolve by keeping the last."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears twice in one JSON object, with different values (only one value "
                         "of a key can be kept: remove the other)")
        self.key = key


def _same_value(a: Any, b: Any) -> bool:
    """Whether two JSON values are written alike (1 and 1.0, true and 1 differ; key order does not count)."""
    return json.dumps(a, sort_keys=True, default=repr) == json.dumps(b, sort_keys=True, default=repr)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """json's object_pairs_hook: the object as a dict, RepeatedKey for a key it names twice with different values
    (a copy of an entry written twice over, as a cache appended to again can hold, says nothing new)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen and not _same_value(seen[key], value):
                raise RepeatedKey(key)
            seen.setdefault(key, value)
    return obj


def _json_loads(text: str) -> Any:
    """json.loads, reading an integer of thousands of digits as an infinite number rather than raising ValueError,
    a whole float not written as one as _InexactWhole, and refusing an object that names a key twice (RepeatedKey)."""
    return json.loads(text, parse_int=_int_or_inf, parse_float=_float, object_pairs_hook=_unique_keys)


_DECODER = json.JSONDecoder(parse_int=_int_or_inf, parse_float=_float, object_pairs_hook=_unique_keys)


class _OpenCache(NamedTuple):
    """A cache file Kernel Tuner left open, read entry by entry: its document and the cut-off tail dropped."""

    data: dict
    dropped: str


def _cut_off(text: str, err: json.JSONDecodeError) -> bool:
    """Whether a parse error in a cache entry is the file ending inside that entry, not damage in it.

    A run killed mid-write leaves a last entry that stops short: the decoder runs out of text (or of a
    string it never saw closed), or stops on the start of a word or number the cut left unfinished
    (`tr`, `3.`). An error with anything else after it is damage: the file is refused, not shortened.
    """
    if err.msg.startswith("Unterminated string"):
        return True
    tail = text[err.pos:].strip()
    return (not tail or re.fullmatch(r"[-+.eE0-9]*", tail) is not None
            or any(word.startswith(tail) for word in ("true", "false", "null", "NaN", "Infinity", "-Infinity")))


def _read_open_cache(text: str) -> _OpenCache | None:
    """A cache file that does not parse as a whole, read as Kernel Tuner's writer leaves it; None if not one.

    Kernel Tuner writes the header and `"cache": {`, then appends each entry and a comma, and closes the
    braces only when tuning ends: a stopped run leaves `..."cache": {`, `...},` or `...}` at the end, and
    a killed one may leave its last entry cut off. Every complete entry is kept, in order; a cut-off
    last entry is dropped (it holds no finished measurement); anything else that does not parse is not
    an open cache.
    """
    opening = _CACHE_OPENING.search(text)
    if opening is None:
        return None
    try:
        data = _json_loads(text[: opening.start()] + '"cache": {}}')
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    cache: dict[str, Any] = {}
    pos, end = opening.end(), len(text)
    while True:
        while pos < end and (text[pos].isspace() or text[pos] == ","):
            pos += 1
        if pos >= end:
            break  # the end of the file: every complete entry is in
        if text[pos] == "}":  # the cache object closed: only the document's own closing brace may follow
            if text[pos + 1:].strip() not in ("", "}"):
                return None  # a second document or garbage after a complete one: not a cut-off
            break
        start = pos
        try:
            key, pos = _DECODER.raw_decode(text, pos)
            while pos < end and text[pos].isspace():
                pos += 1
            if not isinstance(key, str) or pos >= end or text[pos] != ":":
                raise json.JSONDecodeError("Expecting ':' after an entry's key", text, pos)
            pos += 1
            while pos < end and text[pos].isspace():
                pos += 1
            value, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            if not _cut_off(text, err):
                return None
            return _OpenCache({**data, "cache": cache}, text[start:].strip())
        if key in cache and not _same_value(cache[key], value):
            raise RepeatedKey(key)
        cache.setdefault(key, value)
    return _OpenCache({**data, "cache": cache}, "")


class _Unreadable(ZmlxPipelineError):
    """Why a file cannot be read (its caller names the file in its own words)."""


def _read_regular(path: Path, limit: int | None = None) -> bytes:
    """The bytes of a regular file of at most `limit` (MAX_FILE_BYTES) bytes; _Unreadable for anything else.

    The file is opened without blocking and checked before a byte is read, so a FIFO or a device is refused
    at once, and a file that grows past the limit while it is read is refused too.
    """
    limit = MAX_FILE_BYTES if limit is None else limit
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        raise _Unreadable(err.strerror or str(err)) from err
    with os.fdopen(fd, "rb") as fh:
        try:
            kind = not_regular(os.fstat(fd).st_mode)
            if kind is not None:
                raise _Unreadable(f"{kind}, not a regular file to read")
            raw = fh.read(limit + 1)
        except OSError as err:
            raise _Unreadable(err.strerror or str(err)) from err
    if len(raw) > limit:
        raise _Unreadable(f"larger than {limit} bytes, the most a file read here may hold")
    return raw


def _gunzip(raw: bytes, limit: int) -> bytes:
    """A gzip stream's content (every member), refused once it is past `limit` bytes: a small file may unpack
    to far more than memory holds."""
    with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
        out = stream.read(limit + 1)
    if len(out) > limit:
        raise _Unreadable(f"its gzip stream unpacks to more than {limit} bytes, the most a file read here may hold")
    return out


def _read_json(path: Path) -> tuple[Any, str, _OpenCache | None]:
    """The file's JSON (gunzipped when it is a gzip stream), the sha256 of its bytes, and how it was read when
    it is a cache file Kernel Tuner left open (None when the file parses as a whole)."""
    try:
        raw = _read_regular(path)
        sha = hashlib.sha256(raw).hexdigest()
        gunzipped = raw[:2] == _GZIP_MAGIC
        if gunzipped:
            raw = _gunzip(raw, MAX_FILE_BYTES)
    except _Unreadable as err:
        raise _fail(path, str(err)) from None
    except EOFError as err:
        raise _fail(path, f"truncated gzip stream ({err})") from err
    except (OSError, zlib.error) as err:
        raise _fail(path, f"corrupt gzip stream ({err})") from err
    packed = next((kind for magic, kind in _COMPRESSED_MAGIC.items() if raw.startswith(magic)), None)
    if packed is not None:
        twice = gunzipped and packed == "gzip"
        raise _fail(path, "gzip-compressed twice: decompress it once (gunzip) and import the result" if twice else
                    f"{packed}-compressed data, not JSON: decompress it and import the result (gzip is read as it is)")
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark, as editors on Windows write, is not JSON
    except UnicodeDecodeError as err:
        raise _fail(path, f"not UTF-8 text ({err})") from err
    if not text.strip():
        raise _fail(path, "the file is empty")
    try:
        data, opened = _parse_document(path, text)
    except RepeatedKey as err:
        raise _fail(path, str(err)) from None
    return data, sha, opened


def _parse_document(path: Path, text: str) -> tuple[Any, _OpenCache | None]:
    """The JSON of a file's text and how it was read when it is a cache left open (_read_json); a key an object
    names twice raises RepeatedKey, anything else unreadable _fail."""
    try:
        return _json_loads(text), None
    except RecursionError:
        raise _fail(path, "not valid JSON: nested deeper than a tuning file can be") from None
    except json.JSONDecodeError as err:
        try:
            opened = _read_open_cache(text)
        except RecursionError:
            raise _fail(path, "not valid JSON: nested deeper than a tuning file can be") from None
        if opened is not None:
            return opened.data, opened
        if text.startswith(GIT_LFS_POINTER):
            raise _fail(path, "it is a Git LFS pointer, not the tuning file it stands for: fetch the file with `git lfs "
                              "pull` in its repository, then import it") from None
        _refuse_other_tables(path, text)
        at_end = err.pos >= len(text.rstrip()) - 1 or err.msg.startswith("Unterminated string")
        hint = " (truncated?)" if at_end else ""
        what = ("more text after the end of its JSON document (a second document, or garbage)"
                if err.msg == "Extra data" else err.msg)
        raise _fail(path, f"not valid JSON{hint}: {what} at offset {err.pos} (line {err.lineno}, "
                          f"column {err.colno})") from err


def _refuse_other_tables(path: Path, text: str) -> None:
    """Refuse, saying what to write instead, the tables tuners write besides JSON: KTT's XML, and CSV (KTT's mixes
    tuning parameters with profiling counters; neither KTT's nor BAT's names the device or the unit of its times)."""
    head = text.lstrip()
    if head.startswith("<"):
        raise _fail(path, "XML, not JSON (KTT's XML output?); write the results as JSON (KTT: OutputFormat::JSON) "
                          "and import that")
    if not head.startswith(("{", "[")) and _looks_like_csv(head):
        raise _fail(path, "a CSV table, not JSON (KTT's or BAT's CSV output?): its columns name no device or time "
                          "unit, nor which are tuning parameters; write the results as JSON (KTT: OutputFormat::JSON) "
                          "and import that")


#: lines read to tell a CSV table from other text
CSV_SNIFF_LINES = 20


def _looks_like_csv(text: str) -> bool:
    """Whether text reads as a table: its first lines (two at least) split into the same number of fields, two or
    more, at commas or at semicolons; source code or prose splits unevenly, and is only called not JSON."""
    lines = [line for line in text.splitlines()[:CSV_SNIFF_LINES] if line.strip()]
    if len(lines) < 2:
        return False
    for delimiter in ",;":
        try:
            widths = {len(row) for row in csv.reader(lines, delimiter=delimiter)}
        except csv.Error:
            continue
        if len(widths) == 1 and min(widths) >= 2:
            return True
    return False


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    """Median, 10th and 90th percentile (linear interpolation, as numpy's default)."""
    ordered = sorted(values)
    last = len(ordered) - 1

    def at(q: float) -> float:
        pos = q * last
        lo = int(pos)
        hi = min(lo + 1, last)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    return at(0.5), at(0.1), at(0.9)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive(value: Any) -> bool:
    return _number(value) and not _huge_integer(value) and math.isfinite(value) and value > 0


def _huge_integer(value: Any) -> bool:
    """Whether a JSON number is an integer past a float's range (10**400): no time a tuner writes, and float() of it
    raises; one past _MAX_INT_DIGITS digits reads as _TooLarge, its text all digits."""
    if isinstance(value, _TooLarge):
        return not any(c in value.text for c in ".eE")
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    try:
        float(value)
    except OverflowError:
        return True
    return False


def _check_not_huge(path: Path, where: str, what: str, value: Any) -> None:
    """Refuse an integer time past a float's range, naming it cut short (a 401-digit time is one short line)."""
    if _huge_integer(value):
        shown_as = repr(value) if isinstance(value, _TooLarge) else shown_number(str(value))
        raise _fail(path, f"{where}: {what} {shown_as}, an integer past a float's range: neither a time nor a "
                          "failure marker")


def _timing(path: Path, where: str, times: Any, fallback: Any, scale: float) -> tuple[float, float, float, int]:
    """(median, p10, p90, samples) in microseconds from repetitions, else from one summary time.

    An ok row's times must all be finite and positive: anything else is refused, naming the entry.
    """
    if isinstance(times, list) and times:
        for t in times:
            _check_not_huge(path, where, "its times hold", t)
        bad = [t for t in times if not _positive(t)]
        if bad:
            raise _fail(path, f"{where}: its times hold {bad[0]!r}, not a positive finite time")
        med, p10, p90 = _quantiles(times)
        _check_least_time(path, where, min(times), scale)
        return med * scale, p10 * scale, p90 * scale, len(times)
    if times not in (None, []) and not isinstance(times, list):
        raise _fail(path, f"{where}: its times are not a list")
    if _number(fallback):
        _check_not_huge(path, where, "time", fallback)
        if not _positive(fallback):
            raise _fail(path, f"{where}: time {fallback!r} is not a positive finite time")
        _check_least_time(path, where, fallback, scale)
        t = float(fallback) * scale
        return t, t, t, 1
    raise _fail(path, f"{where}: no times")


#: the least time a measurement may hold, in microseconds: 1 ns, under any kernel launch on any GPU
LEAST_TIME_US = 1e-3


def _check_least_time(path: Path, where: str, value: Any, scale: float) -> None:
    """Refuse a time under LEAST_TIME_US: no kernel ran that fast; it would be the case's best config, and a time so
    small is a wrong unit or a damaged file."""
    if float(value) * scale < LEAST_TIME_US:
        raise _fail(path, f"{where}: time {value!r} is {float(value) * scale:.3g} us, under 1 ns, faster than any "
                          "kernel launch: the file's time unit may be wrong, or the entry damaged")


def _size_items(problem_size: Any) -> list[tuple[Any, Any]]:
    """A problem size's (dim name, value) pairs: its own names, else x, y, z for up to three dims, p0, p1, ...
    beyond."""
    if isinstance(problem_size, Mapping):
        return list(problem_size.items())
    dims = list(problem_size) if isinstance(problem_size, (list, tuple)) else [problem_size]
    names = _DIM_NAMES if len(dims) <= len(_DIM_NAMES) else [f"p{i}" for i in range(len(dims))]
    return list(zip(names, dims))


def _whole(value: Any) -> Any:
    """4096.0 (as Python's json writes a whole float) as 4096; anything else as it is (4096.5, or 1e3 and
    4096.0000000000001 as read: _InexactWhole, which no size is)."""
    if isinstance(value, float) and value.is_integer() and not isinstance(value, _InexactWhole):
        return int(value)
    return value


def _inexact_problem(name: Any, value: Any) -> str | None:
    """Why a dim read as a whole float is no size: it was written with an exponent or a fraction that is not zero."""
    if isinstance(value, _InexactWhole):
        return (f"{name}={value.text} is not written as a whole number (a size is an integer such as "
                f"{int(value) if math.isfinite(value) else 4096}, never rounded to one)")
    return None


def _too_large_problem(name: Any, value: Any) -> str | None:
    """Why a dim past MAX_DIM is no size, its digits cut short when many (a 5,000-digit size reads as _TooLarge)."""
    if isinstance(value, _TooLarge) and value > 0:
        return f"{name}={value!r} is larger than an array dimension can be ({MAX_DIM})"
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_DIM:
        return f"{name}={shown_number(str(value))} is larger than an array dimension can be ({MAX_DIM})"
    return None


def _size_shown(value: Any) -> str:
    """A problem size as a message repeats it: as repr writes it, but a number of many digits cut short (shown_number)
    and a long text by its start (shown)."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_size_shown(k)}: {_size_shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_size_shown(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, int) and not isinstance(value, bool):
        return shown_number(str(value))
    return shown(value) if isinstance(value, str) else repr(value)


def shape_from_problem_size(problem_size: Any) -> dict[str, int]:
    """A Kernel Tuner problem size as a shape; ValueError (one line) unless every dim is named and a whole number
    from 1 to MAX_DIM, as every stored shape must be (written as an integer, or as digits and ".0")."""
    shape = {}
    for name, value in _size_items(problem_size):
        problem = _inexact_problem(name, value) or _too_large_problem(name, value) or dim_problem(name, _whole(value))
        if problem is not None:
            raise ValueError(f"problem size {_size_shown(problem_size)}: {problem}")
        shape[name] = _whole(value)
    if not shape:
        raise ValueError(f"problem size {_size_shown(problem_size)} is empty")
    return shape


def _of_parameters(problem_size: Any, params: Iterable[str]) -> bool:
    """Whether a problem size is one Kernel Tuner computes from the tuned parameters: text dims (alone, or beside
    sizes) each an expression of tuned parameters only, as Kernel Tuner evaluates them (["block_size_x * 4", 8])."""
    dims = [value for _, value in _size_items(problem_size)]
    if not any(isinstance(d, str) for d in dims):
        return False
    for dim in dims:
        if not isinstance(dim, str):
            if dim_problem("dim", _whole(dim)) is not None:
                return False
            continue
        try:
            names = expression_names(dim)
        except (SyntaxError, ValueError, RecursionError):
            return False
        if not names or not names <= set(params):
            return False
    return True


#: --problem-size's form besides JSON: whole numbers in ASCII digits split by commas ("4096,4096", "4096, 4096")
_SIZE_LIST = re.compile(r" *[0-9]+( *, *[0-9]+)* *", re.ASCII)
#: a problem size written as text in a tuner's file: dims in ASCII digits joined by "x" or "X" (store_results'
#: "4096x4096"), commas or spaces, in brackets or not ("(4096, 4096)")
_SIZE_TEXT = re.compile(r"[\s(\[]*[0-9]+([\s,xX)\]]+[0-9]+)*[\s)\]]*", re.ASCII)


def _json_problem_size(text: str) -> Any:
    """A problem size written as JSON; json.JSONDecodeError when it is not JSON, ValueError when it cannot be one."""
    try:
        return _json_loads(text)
    except RecursionError:
        raise ValueError(f"problem size {text[:40]!r}... is nested too deep to be a problem size") from None
    except RepeatedKey as err:
        raise ValueError(f"problem size {shown(text)}: {err}") from None


def parse_problem_size(text: str) -> Any:
    """A --problem-size: JSON (a list, one integer, or an object of named dims) or whole numbers in ASCII digits
    split by commas; ValueError (one line, naming the forms) for anything else ("4096x4096", "+4096", "4096,,4096")."""
    text = text.strip()
    try:
        value = _json_problem_size(text)
    except json.JSONDecodeError:
        if _SIZE_LIST.fullmatch(text) is None:
            raise ValueError(f"problem size {shown(text)} is neither JSON nor integers split by commas: write whole "
                             "numbers in ASCII digits, e.g. 4096,4096, or JSON, e.g. [25000, 2048, 1]") from None
        value = [_int_or_inf(p.strip(" ")) for p in text.split(",")]
    shape_from_problem_size(value)
    return value


def _problem_size_text(text: str) -> Any:
    """A problem size a tuner's file writes as text: JSON ("[25000, 2048, 1]") or dims joined as _SIZE_TEXT reads
    them ("4096x4096"); ValueError for anything else."""
    text = text.strip()
    try:
        value = _json_problem_size(text)
    except json.JSONDecodeError:
        if _SIZE_TEXT.fullmatch(text) is None:
            raise ValueError(f"problem size {text!r} is neither JSON nor whole numbers joined by x or commas") from None
        value = [int(p) for p in re.findall(r"[0-9]+", text)]
    shape_from_problem_size(value)
    return value


def kernel_version(kernel: str, params: Iterable[str]) -> str:
    """The version of a kernel known only by name and parameters (there is no source to hash)."""
    return digest(canonical_json({"kernel": kernel, "params": sorted(params)}))


def _t1_path(path: Path) -> Path:
    return path.parent.parent / "search-spaces" / f"{path.parent.name}.json"


def _t1_description(path: Path) -> dict | None:
    """The T1 search-space description of the file's folder (`../search-spaces/<folder>.json`), if any."""
    candidate = _t1_path(path)
    if not candidate.is_file():
        return None
    try:
        data = _json_loads(_read_regular(candidate).decode("utf-8"))
    except (_Unreadable, UnicodeDecodeError, json.JSONDecodeError, RepeatedKey) as err:
        raise _fail(path, f"its search-space description {candidate} is unreadable ({err})") from err
    except RecursionError:
        raise _fail(path, f"its search-space description {candidate} is unreadable (nested too deep)") from None
    return data if isinstance(data, dict) else None


def _file_stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name


def _run_setting(word: str) -> bool:
    """A `key=value` word of a file name that describes the run (`f=bruteforce`, `i=0`), not one that limits its GPU."""
    key, eq, _ = word.partition("=")
    return bool(eq) and not _LIMIT_KEY.fullmatch(key)


def _names_from_file_name(path: Path) -> list[str]:
    """The GPU a file is named after: `A100_T4.json.gz` -> A100, `A6000_original.json.gz` -> A6000,
    `A4000_f=bruteforce_i=0.json` -> A4000.

    Only words that describe the file are dropped, never a word of the name: `RTX_3060_laptop`
    stays the laptop chip (its own catalog row, never the desktop RTX 3060). A name left of one such word is no
    GPU's: `t4_cache.json` and `T4.json` may describe the T4 format as well as the T4 GPU (`T4_T4.json` is the GPU).
    """
    stem = _file_stem(path)
    words = [w for w in re.split(r"[-_\s]+", stem) if w]
    dropped: set[str] = set()
    while len(words) > 1 and (words[-1].lower() in _FILE_NAME_WORDS or _run_setting(words[-1])):
        dropped.add(words.pop().lower())  # "=" marks a run's setting (A100_f=bruteforce_i=0.json), never a GPU's
    if len(words) == 1 and words[0].lower() in _FILE_NAME_WORDS and words[0].lower() not in dropped:
        return []
    return list(dict.fromkeys([stem, " ".join(words)]))


# ------------------------------------------------------------------------------------------
# devices


def device_from_option(device: str, registered: tuple[DeviceSpec, ...] = ()) -> DeviceSpec:
    """The row of a --device value (a catalog id, a core-limited id such as nvidia-h200@66sm, a name, or a device
    `registered` in the store); ImportFileError saying what to give instead."""
    problem = hidden_character_problem(device)
    if problem is not None:
        raise ImportFileError(f"--device {problem}")
    try:
        return resolve_device(device, registered)
    except AmbiguousDevice as err:
        raise ImportFileError(f"--device {device!r} does not name one catalog device (it may be "
                              f"{', '.join(err.candidates)}); give its id") from None
    except UnknownDevice as err:
        raise ImportFileError(f"--device {err}; `zmlx-pipeline devices` lists them, and `zmlx-pipeline devices add "
                              "RECORD` registers a chip the catalog lacks") from None


@dataclass(frozen=True)
class DeviceMap:
    """A --device-map file: file-name globs or reported device names, each to a catalog row."""

    path: Path
    entries: tuple[tuple[str, DeviceSpec], ...]

    def lookup(self, file: Path, reported: str) -> tuple[DeviceSpec, str] | None:
        """(row, key) for a data file: a glob matching its name or path first, else its reported device name.

        Keys matching it (globs, or a glob and its reported name) that name different devices are refused: the map
        would be guessing.
        """
        hits = self.hits(file, reported)
        if len({spec.id for _, spec in hits}) > 1:
            listed = ", ".join(f"{key!r} -> {spec.id}" for key, spec in hits)
            raise _fail(file, f"--device-map {self.path} gives it several devices ({listed}); make one key match it")
        return (hits[0][1], hits[0][0]) if hits else None

    def hits(self, file: Path, reported: str | None) -> list[tuple[str, DeviceSpec]]:
        """Every (key, row) matching a data file: globs matching its name or path, then keys naming its device."""
        names = map_names(file)
        globs = [(key, spec) for key, spec in self.entries  # ./a.json is a.json
                 if any(fnmatch.fnmatchcase(n, key) or fnmatch.fnmatchcase(n, posixpath.normpath(key)) for n in names)]
        wanted = set(name_tokens(reported or ""))
        return globs + [(key, spec) for key, spec in self.entries
                        if wanted and set(name_tokens(key)) == wanted and (key, spec) not in globs]

    def unmatched(self, files: Sequence[Path], reported: Sequence[str | None]) -> list[str]:
        """The keys matching none of `files` (by name or path) nor any of the device names they report."""
        matched = {key for f in files for key, _ in self.hits(f, None)}
        wanted = [set(name_tokens(name)) for name in reported if name and name_tokens(name)]
        return [key for key, _ in self.entries if key not in matched and set(name_tokens(key)) not in wanted]


def map_names(file: Path) -> tuple[str, ...]:
    """What a --device-map key is matched against for a file: its name, its name without suffixes, its path as given
    and that path normalised (`./runs/../a.json` is `a.json`)."""
    return file.name, _file_stem(file), file.as_posix(), posixpath.normpath(file.as_posix())


def _check_map_used(mapping: DeviceMap, parsed: Sequence["ParsedFile"]) -> None:
    """Refuse an import where a file the --device-map does not match would go in under the device it reports while a
    key of the map that matches no file looks meant for it: the key matches it but for case (`a.json` for `A.json`),
    or is a path ending in its name (`runs/A.json` with the file given as `A.json`). Other keys (a map written for a
    whole data set, imported a file at a time) only warn (_warn_unmatched)."""
    used = {p.source.get("matched_device_name") for p in parsed if p.source.get("device_from") == "--device-map"}
    unused = [key for key, _ in mapping.entries if key not in used]
    for p in parsed:
        if p.source.get("device_from") == "--device-map" or not unused:
            continue
        names = [n.casefold() for n in map_names(p.path)]
        meant = [key for key in unused
                 if any(fnmatch.fnmatchcase(n, pattern.casefold()) for n in names
                        for pattern in (key, posixpath.normpath(key), posixpath.basename(key)))]
        if meant:
            raise _fail(p.path, (
                f"the key {meant[0]!r} of --device-map {mapping.path} looks meant for it but does not match it (it "
                f"would be stored as {p.device.id}, the device "
                f"{'it reports' if p.source.get('device_from') == 'reported' else 'its file name names'}): a key is "
                "matched, case-sensitive, against each file's name, its name without suffixes and its path as given; "
                "fix the key, or import that file without the map"))


def _warn_unmatched(mapping: DeviceMap, files: Sequence[Path], parsed: Sequence["ParsedFile"]) -> None:
    """One warning naming the keys of the --device-map that match no file of the import (a typo goes unnoticed
    else); not an error, as one map may be written for a whole data set and imported a file at a time."""
    keys = mapping.unmatched(files, [p.source.get("device_name") for p in parsed])
    if not keys:
        return
    given = ", ".join(str(f) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    warnings.warn(f"--device-map {mapping.path}: {'the key' if len(keys) == 1 else 'the keys'} "
                  f"{', '.join(map(repr, keys))} {'matches' if len(keys) == 1 else 'match'} no file of this import "
                  f"({given}) nor the GPU name one reports; a key is matched, case-sensitive, against each file's "
                  "name, its name without suffixes and its path as given", stacklevel=3)


def read_json_or_toml(path: Path) -> Any:
    """A small settings file's content, JSON or TOML by its .toml suffix, read as device maps are: a regular file (a
    byte-order mark allowed), an object naming a key twice refused; ImportFileError (the reason, one line) else."""
    kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
    try:
        text = _read_regular(path).decode("utf-8-sig")  # a byte-order mark, as a tuning file may carry
    except (_Unreadable, UnicodeDecodeError) as err:
        raise ImportFileError(str(err)) from None
    try:
        return tomllib.loads(text) if kind == "TOML" else _json_loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        raise ImportFileError(f"not valid {kind} ({' '.join(str(err).split())})") from None
    except RepeatedKey as err:
        raise ImportFileError(str(err)) from None
    except RecursionError:
        raise ImportFileError(f"not valid {kind} (nested too deep)") from None


def load_device_map(path: str | os.PathLike, registered: tuple[DeviceSpec, ...] = ()) -> DeviceMap:
    """Read a --device-map file (JSON, or TOML by its .toml suffix): {"glob or device name": "catalog id or name"};
    a value may also name a device `registered` in the store."""
    path = Path(path)

    def bad(reason: str) -> ImportFileError:
        return ImportFileError(f"--device-map {path}: {reason}")

    try:
        data = read_json_or_toml(path)
    except ImportFileError as err:
        raise bad(str(err)) from None
    if not isinstance(data, dict) or not data:
        raise bad('expected a non-empty object of "file glob or device name": "catalog id"')
    entries = []
    for key, value in data.items():
        if not key.strip():
            raise bad("an empty key matches no file and no device name")
        if key != key.strip():
            raise bad(f"the key {key!r} has white space at its start or end, which no file name has; remove it")
        if not isinstance(value, str):
            raise bad(f"{key!r} maps to {value!r}, not a catalog id")
        problem = hidden_character_problem(key) or hidden_character_problem(value)
        if problem is not None:
            raise bad(problem)
        try:
            entries.append((key, resolve_device(value, registered)))
        except AmbiguousDevice as err:
            raise bad(f"{key!r} -> {value!r} does not name one catalog device (it may be "
                      f"{', '.join(err.candidates)}); give its id") from None
        except UnknownDevice as err:
            raise bad(f"{key!r} -> {err}; `zmlx-pipeline devices` lists them") from None
    return DeviceMap(path, tuple(entries))


# nvidia-smi's name for a MIG instance: the GPU's name, "MIG" and the profile ("1g.5gb", "3g.40gb").
_MIG_NAME = re.compile(r"^(.*?)\s+MIG\s+\d+g\.\d+gb\b", re.IGNORECASE)


def _alternatives(name: str) -> list[str]:
    """The names a name written as alternatives stands for: "AMD Instinct MI50/MI60" -> MI50 and MI60, each with
    the words before the first (ROCm names several boards of one die so); [] for a name without "/"."""
    parts = [p.strip() for p in name.split("/")]
    if len(parts) < 2 or not all(parts):
        return []
    prefix = parts[0].split()[:-1]
    return [parts[0]] + [" ".join(prefix + [p]) if len(p.split()) == 1 else p for p in parts[1:]]


def _chips_of_alternatives(name: str) -> list[str]:
    """Catalog ids of every chip a name written as alternatives may be (never one picked among them)."""
    ids: list[str] = []
    for alternative in _alternatives(name):
        try:
            ids.append(resolve_device(alternative).id)
        except AmbiguousDevice as err:
            ids.extend(err.candidates)
        except UnknownDevice:
            continue
    return list(dict.fromkeys(ids))


def _device_of_file_name(path: Path) -> str | None:
    """The catalog id a file's name tells, if it tells one."""
    for name in _names_from_file_name(path):
        try:
            return resolve_device(name).id
        except UnknownDevice:  # AmbiguousDevice too: a hint names one chip or none
            continue
    return None


def _resolve_device(path: Path, reported: str, device: DeviceSpec | None, device_map: DeviceMap | None,
                    kernel: str = "", registered: tuple[DeviceSpec, ...] = ()) -> tuple[DeviceSpec, str, str]:
    """(row, the name or key it was found by, how) for a file: --device, else the map, else the file itself (a
    catalog chip, else a device `registered` in the store)."""
    if device is not None:
        return device, device.id, "--device"
    if device_map is not None:
        hit = device_map.lookup(path, reported)
        if hit is not None:
            return hit[0], hit[1], "--device-map"
    reported = reported.strip()
    names, how = ([reported], "reported") if reported else (_names_from_file_name(path), "file name")
    if not names:
        raise UnmatchedDevice(
            f"cannot import {path}: it names no GPU, and its file name {_file_stem(path)!r} may stand for the T4 "
            "format as well as the T4 GPU; pass --device <catalog id> or --device-map FILE; nothing of it was stored")
    for name in names:
        try:
            return resolve_device(name, registered), name, how  # binned variants (Apple M1 Pro): AmbiguousDevice
        except AmbiguousDevice as err:
            raise UnmatchedDevice(
                f"cannot import {path}: device {name!r} does not name one catalog device (it may be "
                f"{', '.join(err.candidates)}); pass --device <its id> or map the file in --device-map; "
                "nothing of it was stored"
            ) from None
        except UnknownDevice:
            continue
    mig = _MIG_NAME.match(reported)
    if mig:
        try:
            whole = f" of {resolve_device(mig.group(1)).id}"
        except UnknownDevice:
            whole = ""
        raise UnmatchedDevice(
            f"cannot import {path}: device {reported!r} is a MIG instance (a slice{whole} with part of its SMs and "
            "memory), which the catalog has no row for; pass --device <catalog id> to record its timings as that "
            "device's; nothing of it was stored"
        )
    several = _chips_of_alternatives(reported)
    if several:
        raise UnmatchedDevice(
            f"cannot import {path}: device {reported!r} names several chips (it may be {', '.join(several)}); "
            "pass --device <its id> or map the file in --device-map; nothing of it was stored"
        )
    named = reported or _file_stem(path)
    within = devices_named_within(named)
    hint = f" (catalog devices whose names hold it: {', '.join(within)})" if within else ""
    if reported and not within:  # a test name ("arm", "Testing") in a file named for its GPU: say so, never take it
        by_file_name = _device_of_file_name(path)
        if by_file_name is not None:
            hint = f" (its file name names {by_file_name}: pass --device {by_file_name} if it ran there)"
    if not reported:  # `convolution_MI250X.json`: the kernel's name beside the GPU's; a hint, never a match
        word = _chip_word_of_file_name(path, kernel)
        hint = f" (its word {word[0]!r} is {word[1]}: pass --device {word[1]} if it ran there)" if word else hint
        raise UnmatchedDevice(
            f"cannot import {path}: the file names no GPU (its device name is empty or absent), and its file name "
            f"{named!r} is no catalog device{hint}; pass --device <catalog id> or --device-map FILE "
            "(`zmlx-pipeline devices` lists the ids); nothing of it was stored"
        )
    raise UnmatchedDevice(
        f"cannot import {path}: device {named!r} is not in the catalog{hint}; pass --device <catalog id> or "
        "--device-map FILE (`zmlx-pipeline devices` lists the ids) where it is a catalog chip named otherwise: "
        "another chip's id would file its timings as that chip's; a chip the catalog lacks is registered with "
        "`zmlx-pipeline devices add RECORD` (its figures, each with its source) and then imported under its own id; "
        "nothing of it was stored"
    )


def _chip_word_of_file_name(path: Path, kernel: str = "") -> tuple[str, str] | None:
    """(words, catalog id) where the file name ends in a run of words that names one chip, every word before it is
    foreign to device names (`convolution_MI250X` -> MI250X, amd-mi250x) and every word after it describes the file
    or is the kernel's (`gemm_RTX_2070_SUPER_run1`); None otherwise. Any other word after the chip may qualify it
    (`RTX_4070_Notebook`, `H100_SXM_66sm`, `RTX_4090_D`, `MI250X_GCD` are other parts), and one before it that device
    names use may too (`laptop_RTX_3050`). A hint for a message only, so it never names a chip it is not sure of."""
    words = [w for w in re.split(r"[-_\s]+", _file_stem(path)) if w]
    kernel_words = [w.lower() for w in re.split(r"[-_\s]+", kernel) if w]
    while words:
        n = len(kernel_words)
        if n and len(words) > n and [w.lower() for w in words[-n:]] == kernel_words:  # all of the kernel's name
            del words[-n:]
        elif words[-1].lower() in _FILE_NAME_WORDS or _run_setting(words[-1]) or _RUN_WORD.fullmatch(words[-1]):
            words.pop()
        else:
            break
    vocabulary = _device_name_words()
    for size in (4, 3, 2, 1):  # the longest run that names a chip: "RTX 2070 SUPER", never its "2070 SUPER"
        if size > len(words):
            continue
        run, before = " ".join(words[-size:]), words[:-size]
        if any(not name_tokens(w) or set(name_tokens(w)) & vocabulary or w.lower() in _QUALIFIER_WORDS
               or ("=" in w and not _run_setting(w)) for w in before):
            return None
        try:
            return run, resolve_device(run).id
        except UnknownDevice:  # AmbiguousDevice too
            continue
    return None


@functools.lru_cache(maxsize=1)
def _device_name_words() -> frozenset[str]:
    """Every word of a catalog device's name or alias, as name_tokens writes it."""
    return frozenset(t for spec in load_catalog() for label in (spec.name, *spec.aliases) for t in name_tokens(label))


# ------------------------------------------------------------------------------------------
# entries


def _defaults_for_subspace(configs: list[dict], t1: dict | None) -> dict[str, Any]:
    """Defaults of the described parameters a file does not tune, when it measured a subspace.

    A file that tunes only some of its benchmark's parameters ran the others at their default
    (the hub's A6000 convolution file: use_shmem, use_cmem and the filter size); filling them
    in gives its configs the same identity as those of the files measured on the whole space.
    """
    if not configs or not t1:
        return {}
    parameters = (t1.get("ConfigurationSpace") or {}).get("TuningParameters") or []
    described = {p.get("Name"): p.get("Default") for p in parameters if isinstance(p, dict)}
    tuned = set(configs[0])
    if not tuned < set(described):
        return {}
    missing = {name: described[name] for name in described if name not in tuned}
    return {} if any(v is None for v in missing.values()) else missing


def _split_shape_params(configs: list[dict]) -> list[str]:
    """Tunable parameters that are really problem size: `filter_*` with one value throughout, a size."""
    if not configs:
        return []
    names = [k for k in configs[0] if k.startswith("filter_") and dim_problem(k, configs[0][k]) is None]
    return [k for k in names if len({json.dumps(c.get(k)) for c in configs}) == 1]


def blank_name(what: str, value: Any) -> str:
    """`what` when a file gives a name as blank text (there, but empty), else "": a name given empty is refused
    where it would name the kernel, not replaced by the folder's name as an absent one is."""
    return what if isinstance(value, str) and not value.strip() else ""


def _module_attr_problem(what: str, name: str) -> str | None:
    """Why an imported kernel's name holds no ':': `kernels -k` and the other commands read `a:b` as a module:attr
    path to load from Python, so a kernel stored under it could never be listed or trained by its name."""
    if ":" in name:
        return f"{what} {shown(name)} holds ':', which names a module:attr kernel, not an imported one"
    return None


def name_field(path: Path, what: str, value: Any) -> str:
    """A name a file gives (a kernel's): "" when it gives none (absent, null or blank); refused when it is not text."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _fail(path, f"{what} is {value!r}, not a name")
    return value.strip()


def _check_rows(path: Path, kernel: str, shape: dict, configs: list[dict]) -> None:
    """Refuse a section whose rows the store must not hold (records.py's checks of a shape and a config), or rows
    under a built-in kernel's name without its shape dims and parameters (every stage would read them as its)."""
    problem = shape_problem(shape)
    builtin = BUILTIN_KERNELS.get(kernel)
    for config in configs:
        problem = problem or config_problem(config) or (
            builtin.mismatch(shape, config, every_param=True) if builtin is not None else None)
        if problem is not None:
            break
    if problem is not None and builtin is not None and problem.startswith(f"kernel {kernel!r} is built in"):
        problem += ("; an imported kernel may take a built-in kernel's name only with its shape dims and "
                    "parameters: give it a name of its own (its kernel_name, or import --kernel)")
    if problem is not None:
        raise _fail(path, problem)


class _Entries(NamedTuple):
    """What a file says: configs, their (status, timing, error), names, problem size, how it was laid out, and
    how many entries' times were written over their repetitions."""

    configs: list[dict]
    outcomes: list[tuple]
    kernel_name: str
    device_name: str
    problem_size: Any
    skipped: int
    layout: str
    time_rewritten: int = 0
    section: dict | None = None
    labels: tuple[str, ...] = ()  # what names each config in messages ("cache entry '16,1'"), when not its number
    blank_name: str = ""  # the field that gives the kernel's name as blank text ("its kernel_name"), if one does
    stamps: tuple = ()  # each config's timestamp as the file writes it (None where it gives none), when it gives any
    file_stamp: tuple[Any, str] | None = None  # the file's one timestamp and where it is, for configs without one
    time_unit_assumed: str | None = None  # the unit its times were read in where the file names none (a T4 file)


def _param_names(path: Path, data: dict) -> tuple[list[str], str]:
    """The tuned parameters, in the order Kernel Tuner joins them into keys, and where that order comes from."""
    keys = data.get("tune_params_keys")
    if isinstance(keys, list) and keys:
        if not all(isinstance(k, str) and k for k in keys):
            raise _fail(path, "'tune_params_keys' is not a list of parameter names")
        return keys, "tune_params_keys"
    if keys not in (None, []):
        raise _fail(path, "'tune_params_keys' is not a list of parameter names")
    tune = data.get("tune_params")
    if isinstance(tune, dict) and tune:
        return list(tune), "tune_params"
    raise _fail(path, "it names no tuned parameters (no 'tune_params_keys' and no 'tune_params'), "
                      "so its entries' configurations cannot be told")


def _key_value(text: str, allowed: Any) -> Any:
    """One value of a cache key as its parameter's value: the tune_params value Kernel Tuner wrote as this
    text (str(value), as it builds keys), else the literal (int, float, True/False, or the text)."""
    if isinstance(allowed, list) and allowed:
        for value in allowed:
            if str(value) == text:
                return value
        raise ValueError("is not among its tune_params values")
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)


def _entry_value(value: Any, allowed: Any) -> Any:
    """An entry's parameter value, text read as its key's text is (Kernel Tuner tells configs apart by str(value),
    so "16" and 16 are one config): the tune_params value it names, else the literal; other values as they are."""
    if not isinstance(value, str):
        return value
    try:
        return _key_value(value.strip(), allowed)
    except ValueError:
        return _key_value(value.strip(), None)


def _kind(value: Any) -> str:
    """What sort of value a parameter holds, for the rule that one parameter's values are of one sort."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    return f"a {type(value).__name__}"


def _check_param_kinds(path: Path, configs: Iterable[dict], labels: Iterable[str],
                      seen: dict[str, tuple[str, Any, str]] | None = None) -> None:
    """Refuse a parameter holding values of two sorts (16 in one config, "x" or true in another): their keys would
    tell one config apart as two, and no model can read the column. Null ("no limit") goes with any sort. `seen`
    carries the first value of each parameter over several files (and the store) of one kernel version."""
    seen = {} if seen is None else seen
    for config, label in zip(configs, labels):
        for name, value in config.items():
            if value is None:
                continue
            first = seen.setdefault(name, (_kind(value), value, label))
            if first[0] != _kind(value):
                raise _fail(path, f"{label}: {name} is {value!r} ({_kind(value)}), but {first[2]} gives it "
                                  f"{first[1]!r} ({first[0]}); a parameter's values must all be of one sort")


def _key_names(text: str, value: Any) -> bool:
    """Whether one value of a cache key names an entry's value: as util.py builds keys (str(value): float, True,
    None), or as the cache module (kernel_tuner/cache/cache.py) builds line ids (compact JSON: "float", true, null)."""
    if str(value) == text:
        return True
    try:
        return json.dumps(value, separators=(",", ":")) == text
    except (TypeError, ValueError):
        return False


def _cache_config(path: Path, key: str, entry: dict, names: list[str], source: str,
                  tune: dict) -> tuple[dict, str]:
    """An entry's config and the layout it was read from ("entries": its own fields, "keys": its key)."""
    where = f"cache entry {key!r}"
    present = [k for k in names if k in entry]
    parts = str(key).split(",")
    if len(present) == len(names):
        config = {k: entry[k] for k in names}
        if len(parts) == len(names):
            for name, part in zip(names, parts):
                if not _key_names(part.strip(), config[name]):
                    raise _fail(path, f"{where}: its key gives {name}={part.strip()} but the entry holds "
                                      f"{name}={config[name]!r}")
        return {k: _entry_value(v, tune.get(k)) for k, v in config.items()}, "entries"
    if present:
        missing = [k for k in names if k not in entry]
        raise _fail(path, f"{where} lacks parameters {', '.join(missing)}")
    if len(parts) != len(names):
        raise _fail(path, f"{where}: its key splits into {len(parts)} values on ',' but {source} names "
                          f"{len(names)} parameters ({', '.join(names)})")
    config = {}
    for name, part in zip(names, parts):
        try:
            config[name] = _key_value(part.strip(), tune.get(name))
        except ValueError as err:
            raise _fail(path, f"{where}: value {part.strip()!r} of {name} {err}") from None
    return config, "keys"


def _cache_outcome(path: Path, where: str, entry: dict, objective: str) -> tuple | None:
    """(status, timing, error) of one cache entry; None for a config that was never run (InvalidConfig)."""
    fields = [_ERROR_FIELD, "time"] + ([objective] if objective not in ("", "time") else [])
    markers = [entry[f] for f in fields if isinstance(entry.get(f), str)]
    # a failure Kernel Tuner wrote into any other result (a metric of a config that failed) fails it too
    markers += [v for k, v in entry.items() if k not in fields and isinstance(v, str)
                and (v in _CACHE_FAILURES or v in _CACHE_SKIPPED)]
    if markers:
        marker = markers[0]
        if marker in _CACHE_SKIPPED:
            return None
        status = _CACHE_FAILURES.get(marker)
        if status is None:
            known = ", ".join(sorted(_CACHE_SKIPPED | set(_CACHE_FAILURES)))
            raise _fail(path, f"{where}: unknown failure marker {marker!r} (Kernel Tuner writes {known})")
        return status, None, marker
    if "time" not in entry:
        tuned_for = "" if objective in ("", "time") else f" (the file was tuned for {objective!r}, not a kernel time)"
        raise _fail(path, f"{where} has no 'time'{tuned_for}")
    time = entry["time"]
    if not _number(time):
        raise _fail(path, f"{where}: 'time' is neither a number nor a failure marker")
    _check_not_huge(path, where, "'time'", time)
    if math.isnan(time):
        raise _fail(path, f"{where}: 'time' is NaN, neither a time nor a failure marker")
    if time >= _FAILED_TIME_MS:
        return "launch_error", None, f"failed (time recorded as {time:g})"
    times = None if _time_rewritten(entry) else entry.get("times")
    return "ok", _timing(path, where, times, time, 1e3), None


def _time_rewritten(entry: dict) -> bool:
    """Whether an entry's time is not the mean of its repetitions, as Kernel Tuner writes it, but a value
    written over it afterwards; the time is then the entry's timing and the stale repetitions are not.

    The benchmark hub's converter from KTT results (autotuning_methodology's ktt_values_to_kerneltuner.py)
    replaces `time` with KTT's duration and leaves Kernel Tuner's `times` as they were.
    """
    time, times = entry.get("time"), entry.get("times")
    if not _positive(time) or not isinstance(times, list) or not times or not all(_positive(t) for t in times):
        return False
    mean = sum(times) / len(times)
    return abs(time - mean) > _TIME_MEAN_TOLERANCE * mean


#: the major version of the Kernel Tuner cache and T4 schemas read here (cache 1.0.0, 1.0.1, 1.1.0; T4 1.0.0):
#: a minor version adds fields, which are read as the entries' other fields are; a new major one may
#: change what a field means, so it is refused rather than guessed
SCHEMA_MAJOR = 1


def _check_schema(path: Path, data: dict, kind: str) -> None:
    """Refuse a file whose `schema_version` is not of a schema this reader knows (absent: an early cache)."""
    version = data.get("schema_version")
    if version is None:
        return
    if not isinstance(version, str):
        raise _fail(path, f"its schema_version is {type(version).__name__} {shown(json.dumps(version))}, not text "
                          "naming a version such as \"1.1.0\"")
    match = re.fullmatch(r"([0-9]+)(\.[0-9]+){0,2}", version)
    if match is None:
        raise _fail(path, f"its schema_version {shown(version)} is not a version number such as \"1.1.0\"")
    major = int(match.group(1))
    if major != SCHEMA_MAJOR:
        fix = ("upgrade zmlx-pipeline, or write the file with a Kernel Tuner of schema 1.x" if major > SCHEMA_MAJOR
               else "write the file again with a Kernel Tuner of schema 1.x")
        raise _fail(path, f"Kernel Tuner {kind} schema {shown(version)}, which this importer does not read (it reads "
                          f"schema {SCHEMA_MAJOR}.x): {fix}")


def _entries_cache(path: Path, data: dict) -> _Entries:
    """Configs and (status, timing, error) per entry of a Kernel Tuner cache file."""
    cache = data["cache"]
    if not isinstance(cache, dict):
        raise _fail(path, "'cache' is not an object")
    if not cache:
        raise NothingToImport(str(_fail(path, "its 'cache' has no entries")))
    names, source = _param_names(path, data)
    tune = data.get("tune_params") if isinstance(data.get("tune_params"), dict) else {}
    objective = data.get("objective") if isinstance(data.get("objective"), str) else "time"
    configs, outcomes, skipped, layouts, rewritten, labels, stamps = [], [], 0, set(), 0, [], []
    for key, entry in cache.items():
        where = f"cache entry {key!r}"
        if not isinstance(entry, dict):
            raise _fail(path, f"{where} is not an object")
        config, layout = _cache_config(path, key, entry, names, source, tune)
        outcome = _cache_outcome(path, where, entry, objective)
        if outcome is None:
            skipped += 1
            continue
        layouts.add(layout)
        configs.append(config)
        outcomes.append(outcome)
        labels.append(where)
        stamps.append(entry.get(_STAMP_FIELD))
        rewritten += outcome[0] == "ok" and _time_rewritten(entry)
    return _Entries(configs, outcomes, name_field(path, "its kernel_name", data.get("kernel_name")),
                    _cache_device_name(path, data),
                    data.get("problem_size"), skipped, "+".join(sorted(layouts)) or "entries", rewritten,
                    labels=tuple(labels), blank_name=blank_name("its kernel_name", data.get("kernel_name")),
                    stamps=tuple(stamps))


def _cache_device_name(path: Path, data: dict) -> str:
    """The GPU a cache names: its `device_name`, or the one name of the list Kernel Tuner's parallel runner writes
    there (one name per GPU it tuned on); a list of different GPUs is refused (their timings cannot be told apart)."""
    name = data.get("device_name")
    if isinstance(name, list):
        names = list(dict.fromkeys(str(n).strip() for n in name if str(n).strip()))
        if len(names) > 1:
            raise _fail(path, f"it was tuned on several GPUs at once ({', '.join(names)}), whose timings it does not "
                              "tell apart; import a cache of one GPU model")
        return names[0] if names else ""
    return str(name or "")


def _companion_metadata(path: Path) -> Path | None:
    """The T4 metadata file written beside a results file: `W7800-metadata.json.gz` for `W7800-results.json.gz`
    (the benchmark hub), `vector_add-metadata.json` for `vector_add.json` (Kernel Tuner's README example)."""
    stem = _file_stem(path)
    match = re.match(r"^(.*?)([-_])results$", stem, re.IGNORECASE)
    stems = ([f"{match.group(1)}{match.group(2)}metadata"] if match else []) + [f"{stem}-metadata"]
    for name in stems:
        for suffix in (".json.gz", ".json"):
            candidate = path.with_name(f"{name}{suffix}")
            if candidate.is_file():
                return candidate
    return None


def _rocm_card_name(values: list[str]) -> str:
    """The name of one rocm-smi card among its name fields: the first that names one catalog row, else the first
    that names several (so the refusal lists them), else the first.

    rocm-smi versions fill these fields differently: a marketing name ("AMD Instinct MI250X"), pci.ids text
    with the board in brackets ("Navi 31 [Radeon Pro W7800]": the bracketed part is tried first), or a
    PCI id ("0x740c"), which names nothing.
    """
    names = []
    for value in values:
        inner = re.fullmatch(r".*\[(.+)\]\s*", value)
        names += [inner.group(1).strip(), value] if inner else [value]
    partial = None
    for name in names:
        try:
            resolve_device(name)
            return name
        except AmbiguousDevice:
            partial = partial or name
        except UnknownDevice:
            if partial is None and _chips_of_alternatives(name):
                partial = name
    return partial or (names[0] if names else "")


def _device_in_metadata(data: Any) -> str:
    """The GPU a T4 metadata document names (nvidia-smi or rocm-smi output); "" when none, or several differ."""
    metadata = data.get("metadata") if isinstance(data, dict) else None
    query = ((metadata or {}).get("environment") or {}).get("device_query") if isinstance(metadata, dict) else None
    if not isinstance(query, dict):
        return ""
    names = []
    gpus = ((query.get("nvidia-smi") or {}).get("nvidia_smi_log") or {}).get("gpu")
    for gpu in gpus if isinstance(gpus, list) else [gpus]:
        if isinstance(gpu, dict) and gpu.get("product_name"):
            names.append(str(gpu["product_name"]).strip())
    for card in (query.get("rocm-smi") or {}).values():
        if isinstance(card, dict):
            fields = {str(k).strip().lower(): v for k, v in card.items()}
            name = _rocm_card_name([str(fields[f]).strip() for f in _ROCM_NAME_FIELDS if fields.get(f)])
            if name:
                names.append(name)
    distinct = set(names)
    return names[0] if len(distinct) == 1 else ""


def _time_measurement(result: Any) -> dict:
    """A T4 result's time measurement: the one named "time", else the one its first objective names when that
    one carries a time unit (KTT's converter writes its objective "TotalDuration" in "Microseconds"); {} if none."""
    if not isinstance(result, dict):
        return {}
    measurements = [m for m in result.get("measurements") or [] if isinstance(m, dict)]
    named = next((m for m in measurements if m.get("name") == "time"), None)
    if named is not None:
        return named
    objectives = result.get("objectives") or []
    first = str(objectives[0]) if isinstance(objectives, list) and objectives else None
    timed = next((m for m in measurements if first is not None and m.get("name") == first), None)
    if timed is not None and str(timed.get("unit") or "").strip().lower() in _TIME_UNITS_US:
        return timed
    return {}


def _time_unit(result: Any) -> Any:
    """The unit a T4 result gives its time measurement; None when it gives none (or "", as converters write)."""
    return _time_measurement(result).get("unit") or None


def _t4_scale(path: Path, metadata: dict, results: list, result: Any = None) -> float:
    """Microseconds per time unit: the metadata's timeunit, else the unit of this result's time measurement
    (results of one file may differ: "ms" beside "s"), else that of the first result that gives one, else
    milliseconds (Kernel Tuner's)."""
    unit = metadata.get("timeunit")
    if unit is None:
        unit = _time_unit(result) or next((u for r in results if (u := _time_unit(r))), None)
    unit = _DEFAULT_TIME_UNIT if unit is None else unit
    scale = _TIME_UNITS_US.get(str(unit).strip().lower())
    if scale is None:
        raise _fail(path, f"unknown time unit {unit!r}")
    return scale


def _entries_t4(path: Path, data: dict, t1: dict | None, named: bool = False) -> _Entries:
    """Configs and (status, timing, error) per result of a T4 file. `named`: the import names the GPU (--device), so
    a metadata file beside it that cannot be read is passed over, not refused."""
    results = data["results"]
    if not isinstance(results, list):
        raise _fail(path, "'results' is not a list")
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise _fail(path, "'metadata' is not an object")
    scale = _t4_scale(path, metadata, results)
    configs, outcomes, skipped, labels, stamps = [], [], 0, [], []
    for i, result in enumerate(results):
        where = f"result {i}"
        if not isinstance(result, dict) or not isinstance(result.get("configuration"), dict):
            raise _fail(path, f"{where} has no 'configuration' object")
        if not result["configuration"]:
            raise _fail(path, f"{where} has an empty configuration")
        invalidity = str(result.get("invalidity", "correct")).strip().lower()
        if invalidity in _T4_SKIPPED:
            skipped += 1
            continue
        status = _T4_STATUS.get(invalidity)
        if status is None:
            raise _fail(path, f"{where}: unknown invalidity {result.get('invalidity')!r} "
                              f"(T4 writes {', '.join(sorted(_T4_STATUS) + sorted(_T4_SKIPPED))})")
        if status == "ok":
            times = result.get("times") if isinstance(result.get("times"), dict) else {}
            value = _time_measurement(result).get("value")
            runtimes = times.get("runtimes")
            if not runtimes and isinstance(value, list):
                runtimes, value = value, None  # the T4 schema lets a measurement hold every repetition
            if not runtimes and not _number(value):
                objectives = [str(o) for o in result.get("objectives") or [] if str(o) != "time"]
                tuned_for = f" (it was tuned for {objectives[0]!r}, not a kernel time)" if objectives else ""
                raise _fail(path, f"{where} is correct but has no runtimes and no time measurement{tuned_for}")
            own = scale if metadata.get("timeunit") is not None else _t4_scale(path, metadata, results, result)
            outcomes.append(("ok", _timing(path, where, runtimes, value, own), None))
        else:
            outcomes.append((status, None, f"invalidity: {invalidity}"))
        configs.append(result["configuration"])
        labels.append(where)
        stamps.append(result.get(_STAMP_FIELD))
    layout = "t4"
    if str(metadata.get("autotuner") or "").strip().lower() == "ktt":
        configs = [{k: _ktt_text_value(v) for k, v in c.items()} for c in configs]
        layout = "t4 (KTT: values written as text)"
    params = list(dict.fromkeys(k for c in configs for k in c))
    for i, config in enumerate(configs):
        missing = [k for k in params if k not in config]
        if missing:
            raise _fail(path, f"result {i} lacks parameters {', '.join(missing)} that other results set")
    spec = (t1 or {}).get("KernelSpecification") or {}
    kernel = (name_field(path, "its metadata's kernel_name", metadata.get("kernel_name"))
              or name_field(path, "its metadata's kernel", metadata.get("kernel"))
              or name_field(path, "its search-space description's KernelName", spec.get("KernelName")))
    device = str(metadata.get("device_name") or metadata.get("device") or _device_in_metadata(data) or "")
    companion = _companion_metadata(path) if not device else None
    if companion is not None:
        try:
            device = _device_in_metadata(_read_json(companion)[0])
        except ImportFileError:
            if not named:
                raise
    blank = "" if kernel else blank_name("its metadata's kernel_name", metadata.get("kernel_name"))
    file_stamp = (metadata[_STAMP_FIELD], f"its metadata's {_STAMP_FIELD}") if _STAMP_FIELD in metadata else None
    named_unit = metadata.get("timeunit") is not None or any(_time_unit(r) for r in results if isinstance(r, dict))
    return _Entries(configs, outcomes, kernel, device, metadata.get("problem_size"), skipped, layout,
                    labels=tuple(labels), blank_name=blank, stamps=tuple(stamps), file_stamp=file_stamp,
                    time_unit_assumed=None if named_unit else _DEFAULT_TIME_UNIT)


def _ktt_text_value(value: Any) -> Any:
    """A configuration value KTT's T4 writer wrote as text, read back as KTT's own T4 reader reads it: "true" and
    "false" as booleans, text with ".", "e" or "E" as a float, digits as an integer, anything else as text."""
    if not isinstance(value, str):
        return value
    if value in ("true", "false"):
        return value == "true"
    try:
        if any(c in value for c in ".eE"):
            return float(value)
        return int(value)
    except ValueError:
        return value


def _problem_size(path: Path, from_file: Any, t1: dict | None, option: Any,
                  params: Iterable[str]) -> tuple[dict[str, int], str]:
    """The shape and where it came from: the file, else the T1 description beside it, else --problem-size,
    else none: a file that names no usable problem size ("callable", a size computed from the tuned
    `params`, none at all) is one case of unknown size, its shape empty.

    A problem size that is none of these (a size of 0, -5, true or 2**70, a name no parameter has) is refused,
    as is a --problem-size that disagrees with the file's own rather than silently ignored.
    """
    found: list[tuple[Any, str]] = []
    if from_file is not None and from_file not in _UNUSABLE_PROBLEM_SIZES:
        found.append((from_file, "file"))
    described = ((t1 or {}).get("KernelSpecification") or {}).get("ProblemSize")
    if described is not None:
        found.append((described, "search-space description"))
    shape, source = None, None
    for value, where in found:
        try:
            # written as text: "4096x4096", "[25000, 2048, 1]"
            sized = _problem_size_text(value) if isinstance(value, str) else value
            shape, source = shape_from_problem_size(sized), where
            break
        except ValueError as err:
            if _of_parameters(value, params):
                continue  # a size of the parameters (["block_size_x", 8]): as good as none
            reason = str(err)
            if any(isinstance(d, str) for _, d in _size_items(value)):
                reason = (f"problem size {value!r} is neither sizes nor an expression of the tuned parameters "
                          f"({', '.join(params) or 'none'})")
            raise _fail(path, f"{reason} (in its {where})") from None
    if option is not None:
        try:
            wanted = shape_from_problem_size(option)
        except ValueError as err:
            raise ImportFileError(f"--problem-size: {err}") from None
        if shape is not None and shape != wanted:
            raise _fail(path, f"--problem-size {option!r} disagrees with the problem size of its {source} "
                              f"({shape}); import it in a command of its own without --problem-size (the option "
                              "gives every file of a command its size)")
        return wanted, "--problem-size" if shape is None else source
    if shape is None:
        return {}, NO_PROBLEM_SIZE
    return shape, source


def _sections_of(path: Path, data: Any, t1: dict | None, named: bool = False) -> tuple[str, list[_Entries]]:
    """The format of a document and its sections (one for every format but Kernel Tuner's results file), told by
    content; a layout that cannot be read completely is refused saying what to import instead."""
    if isinstance(data, list):
        if len(data) == 2 and isinstance(data[0], list) and isinstance(data[1], dict) and "device_name" in data[1]:
            raise _fail(path, "the results and environment tune_kernel returns, saved as JSON: its entries do not "
                              "say which fields are tuned parameters; import the cache file of the run "
                              "(tune_kernel's cache=) or its T4 output (store_output_file)")
        if data and all(isinstance(entry, dict) and "time" in entry for entry in data):
            raise _fail(path, "the results tune_kernel returns, saved as JSON: its entries do not say which fields "
                              "are tuned parameters, nor which GPU ran them; import the cache file of the run "
                              "(tune_kernel's cache=) or its T4 output (store_output_file)")
        raise _fail(path, "the top level is not a JSON object")
    if not isinstance(data, dict):
        raise _fail(path, "the top level is not a JSON object")
    if "cache" in data:
        _check_schema(path, data, "cache")
        return FORMAT_CACHE, [_entries_cache(path, data)]
    if "results" in data:
        _check_schema(path, data, "T4")
        return FORMAT_T4, [_entries_t4(path, data, t1, named)]
    if "Results" in data and isinstance(data.get("Metadata"), dict):
        from zmlx_pipeline.data.importers.ktt import entries_ktt

        return FORMAT_KTT, [entries_ktt(path, data)]
    if "version_number" in data and "data" in data:
        from zmlx_pipeline.data.importers.results_file import sections

        return FORMAT_RESULTS, sections(path, data)
    if "tune_params" in data or "kernel_name" in data:
        raise _fail(path, "a Kernel Tuner cache file without 'cache'")
    if isinstance(data.get("ConfigurationSpace"), dict) or isinstance(data.get("KernelSpecification"), dict):
        raise CompanionFile(f"{path} is a T1 search-space description: it is read for the files of its benchmark")
    if isinstance(data.get("metadata"), dict):
        raise CompanionFile(f"{path} is a T4 metadata file: it is read for the results file beside it")
    from zmlx_pipeline.data.importers.results_file import is_legacy, legacy_sections

    if is_legacy(data):
        return FORMAT_RESULTS, legacy_sections(path, data)
    raise _fail(path, "neither a Kernel Tuner cache file (no 'cache') nor a T4 file (no 'results')")


def parse_sections(path: str | os.PathLike, device: str | DeviceSpec | None = None, kernel: str | None = None,
                   problem_size: Any = None, device_map: DeviceMap | None = None,
                   registered: tuple[DeviceSpec, ...] = ()) -> list[ParsedFile]:
    """Read and check one file completely: one ParsedFile per device and problem size it holds (one, but for
    Kernel Tuner's results file); ImportFileError (one line, naming the file) if any part cannot be used.

    The kernel is named by `kernel`, else the benchmark name of a T1 description beside the
    data, else the file's own kernel name, else its folder's name. The device is `device` (a
    catalog id or name), else what `device_map` gives the file, else the name the file reports,
    else its file name; a name no catalog chip takes may be one of the devices `registered` in the store. The problem
    size is the file's, else the T1 description's, else `problem_size`.
    """
    path = Path(path)
    if isinstance(device, str):
        device = device_from_option(device, registered)
    data, sha, was_open = _read_json(path)
    t1 = _t1_description(path)
    fmt, sections = _sections_of(path, data, t1, named=device is not None)
    if not sections:
        raise NothingToImport(str(_fail(path, "no measurements in it")))
    parsed = [_parse_section(path, sha, fmt, entries, t1, device, kernel, problem_size, device_map, registered)
              for entries in sections]
    if was_open is not None:
        for item in parsed:
            item.source["closed_open_cache"] = True
            if was_open.dropped:
                item.source["dropped_cut_off_entry"] = was_open.dropped[:200]
    return parsed


def parse_file(path: str | os.PathLike, device: str | DeviceSpec | None = None, kernel: str | None = None,
               problem_size: Any = None, device_map: DeviceMap | None = None,
               registered: tuple[DeviceSpec, ...] = ()) -> ParsedFile:
    """Read and check a file of one device and problem size (see parse_sections); a file of several is refused."""
    parsed = parse_sections(path, device=device, kernel=kernel, problem_size=problem_size, device_map=device_map,
                            registered=registered)
    if len(parsed) != 1:
        raise _fail(Path(path), f"it holds {len(parsed)} devices or problem sizes; read it with parse_sections")
    return parsed[0]


def _parse_section(path: Path, sha: str, fmt: str, entries: _Entries, t1: dict | None, device: DeviceSpec | None,
                   kernel: str | None, problem_size: Any, device_map: DeviceMap | None,
                   registered: tuple[DeviceSpec, ...] = ()) -> ParsedFile:
    """One section of a file (its entries of one device and problem size) as measurements, checked."""
    configs, outcomes, reported = entries.configs, entries.outcomes, entries.device_name
    benchmark = name_field(path, "its search-space description's BenchmarkName",
                           ((t1 or {}).get("General") or {}).get("BenchmarkName"))
    if not (kernel or benchmark) and entries.blank_name:
        raise _fail(path, f"{entries.blank_name} is empty; give the file a kernel_name, or pass --kernel NAME")
    name = kernel or benchmark or entries.kernel_name or path.absolute().parent.name
    problem = name_problem("kernel name", name) or _module_attr_problem("kernel name", name)
    if problem is not None:
        raise _fail(path, f"{problem}; give the file a kernel_name, or pass --kernel NAME")
    spec, matched_name, device_from = _resolve_device(path, reported, device, device_map, name, registered)
    shape, shape_from = _problem_size(path, entries.problem_size, t1, problem_size,
                                      list(dict.fromkeys(k for c in configs for k in c)))
    filled = _defaults_for_subspace(configs, t1)
    if filled:
        configs = [{**c, **filled} for c in configs]
    try:
        split = split_dtype(configs, DTYPE)
    except ValueError as err:
        raise _fail(path, str(err)) from None
    configs = split.configs
    shape_params = _split_shape_params(configs)
    for p in shape_params:
        shape[p] = configs[0][p]
    if shape_params:
        configs = [{k: v for k, v in c.items() if k not in shape_params} for c in configs]
    params = list(configs[0]) if configs else []
    labels = entries.labels or [f"its config {i + 1}" for i in range(len(configs))]
    _check_param_kinds(path, configs, labels)
    _check_rows(path, name, shape, configs)
    timed_at, dating = _timed_at(path, entries, labels)
    version = kernel_version(name, params)
    measurements, seen = [], {}
    for i, (config, dtype, (status, timing, error), when) in enumerate(zip(configs, split.dtypes, outcomes,
                                                                             timed_at)):
        key = (dtype, canonical_json(config))
        if key in seen:
            raise _fail(path, f"{labels[seen[key]]} and {labels[i]} are the same config ({key[1]}, {dtype}): which "
                              "of their timings is the config's cannot be told; keep one of them in the file")
        seen[key] = i
        med, p10, p90, n = timing or (None, None, None, 0)
        measurements.append(Measurement(
            run_id="", device_id=spec.id, kernel=name, kernel_version=version, dtype=dtype,
            shape=shape, config=config, status=status, median_us=med, p10_us=p10, p90_us=p90,
            samples=n, error=error, measured_at=when,
        ))
    if not measurements:
        raise NothingToImport(str(_fail(path, "no measurements in it (every entry is a config its restrictions "
                                              "exclude)" if entries.skipped else "no measurements in it")))
    source = {"kernel_name": entries.kernel_name or None, "device_name": reported or None,
              "matched_device_name": matched_name, "device_from": device_from,
              "problem_size_from": shape_from, "layout": entries.layout, **dating}
    if entries.section is not None:
        source["section"] = entries.section
    if split.parameter is not None:
        source["dtype_from"] = split.parameter
    else:  # no parameter picks it: Kernel Tuner's usual single precision, said so in the run's settings
        source["dtype_assumed"] = DTYPE
    if shape_from == NO_PROBLEM_SIZE and entries.problem_size is not None:
        source["problem_size_in_file"] = entries.problem_size
    if filled:
        source["filled_from_defaults"] = filled
    if entries.time_rewritten:
        source["entries_timed_by_time_not_times"] = entries.time_rewritten
    if entries.time_unit_assumed is not None:  # a T4 file naming no unit: Kernel Tuner's, said so as a dtype is
        source["time_unit_assumed"] = entries.time_unit_assumed
    return ParsedFile(path=path, sha256=sha, format=fmt, kernel=name, kernel_version=version, device=spec,
                      reported_device=reported, shape=shape, measurements=measurements, skipped=entries.skipped,
                      source=source)


#: where an imported row's measured_at comes from (a run's settings say it): its own timestamp in the file, the
#: file's one timestamp, or none (the file holds no date: the time of the import)
DATED_BY_ENTRIES, DATED_BY_FILE, DATED_BY_IMPORT = "entries", "file", "import"


def _timed_at(path: Path, entries: _Entries, labels: Sequence[str]) -> tuple[list[datetime | None], dict]:
    """When each config was timed, as the file says (its own timestamp, else the file's), None where it says nothing
    (the store stamps the import's time), and what the run's settings record of it; a timestamp that is no time, in
    the future or before 2000 refuses the file, naming the row."""
    naive = False

    def read(value: Any, where: str) -> datetime | None:
        nonlocal naive
        try:
            stamp = read_timestamp(value)
        except ValueError as err:
            raise _fail(path, f"{where}: its timestamp {err}; correct it, or remove it to import the row at the time "
                              "of the import") from None
        if stamp is None:
            return None
        problem = measured_at_problem(stamp.at)
        if problem is not None:
            zone = "" if stamp.zone_given else " (it names no time zone and was read as UTC)"
            raise _fail(path, f"{where}: its timestamp {shown(str(value))} gives {problem}{zone}; correct it, or "
                              "remove it to import the row at the time of the import")
        naive |= not stamp.zone_given
        return stamp.at

    file_at = read(*entries.file_stamp) if entries.file_stamp is not None else None
    own = [read(value, label) for value, label in zip(entries.stamps, labels)] or [None] * len(labels)
    timed = [at if at is not None else file_at for at in own]
    dated = sum(at is not None for at in own)
    undated_from = DATED_BY_FILE if file_at is not None else DATED_BY_IMPORT
    dating: dict[str, Any] = {"measured_at_from": DATED_BY_ENTRIES if dated else undated_from}
    if dated and dated < len(own):
        dating.update(undated_entries=len(own) - dated, undated_entries_from=undated_from)
    if naive:
        dating["measured_at_zone"] = "none given: read as UTC"
    return timed, dating


# ------------------------------------------------------------------------------------------
# writing


def expand_paths(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Files as given; a directory stands for the *.json and *.json.gz files below it (paths.files_below: in every
    subfolder, as the benchmark hub lays out one folder per kernel; hidden ones left out; one that is not a regular
    file, or a folder that cannot be read, refused); a file named twice is read once."""
    out, seen = [], set()
    for p in map(Path, paths):
        if p.is_dir():
            try:
                found, odd = files_below(p, (".json", ".json.gz"))
            except UnreadableFolder as err:
                raise ImportFileError(f"cannot import {p}: {err}, so its files would be left out; make it readable or "
                                      "name the files to import; nothing was stored") from None
            if odd is not None:
                raise ImportFileError(f"cannot import {p}: {odd[0]} is {odd[1]}, not a file to read; remove it or name "
                                      "the files to import; nothing was stored")
            if not found:
                raise ImportFileError(f"no Kernel Tuner files to import in {p}: it holds no .json or .json.gz file "
                                      "(hidden files and folders left out)")
        else:
            found = [p]
        for f in found:
            if f.resolve() not in seen:
                seen.add(f.resolve())
                out.append(f)
    return out


def write_parsed(store: Store, parsed: ParsedFile, replacing: Iterable[tuple[str, str, str]] = ()) -> dict:
    """Store one parsed file as a run of its own, in one transaction (a stopped write leaves no trace); a file whose
    every key is stored adds nothing. A device fact the file does not give (its reported name) keeps the stored one.
    `replacing`: the (dtype, shape_key, config_key) keys whose stored results this file's replace (import --replace)."""
    from zmlx_pipeline import __version__

    spec = parsed.device
    row = {"file": str(parsed.path), "device": spec.id, "kernel": parsed.kernel,
           "rows": len(parsed.measurements), "added": 0, "failed": parsed.failed,
           "skipped": parsed.skipped, "run_id": None}
    if parsed.renamed_from is not None:
        row.update(renamed_from=parsed.renamed_from, note=parsed.note)
    replacing = set(replacing)
    stored = store.measured_keys(spec.id, parsed.kernel, parsed.kernel_version)
    if not replacing and all((m.dtype, m.shape_key, m.config_key) in stored for m in parsed.measurements):
        return row
    with store.atomic():
        store.upsert_device({**spec.as_row(), "device_id": spec.id, "in_catalog": _in_catalog(spec),
                             "flagged_unknown": False, "reported_name": parsed.reported_device or None},
                            keep_known=True)
        settings = {"file": parsed.path.name, "sha256": parsed.sha256, "format": parsed.format,
                    "kernel": parsed.kernel, "shape": parsed.shape, **parsed.source}
        if replacing:
            settings["replaced_stored_results"] = len(replacing)
        timed = [m.measured_at for m in parsed.measurements if m.measured_at is not None]
        run_id = store.start_run(spec.id, host=None, backend=spec.backend, mlx_version=None,
                                 pipeline_version=__version__, settings=settings,
                                 started_at=min(timed) if timed else None)  # its rows are timed during it
        if replacing:
            store.delete_measurements([(spec.id, parsed.kernel, parsed.kernel_version, *key) for key in replacing],
                                      repeats=True)
        added = store.record([replace(m, run_id=run_id) for m in parsed.measurements])
        store.finish_run(run_id, "imported")
    row = {**row, "added": added - len(replacing), "run_id": run_id}
    return {**row, "replaced": len(replacing)} if replacing else row


def _in_catalog(spec: DeviceSpec) -> bool:
    """Whether a device is a catalog chip (or a core limit of one), not one registered in a store."""
    try:
        get_device(spec.core_limited_from or spec.id)
    except UnknownDevice:
        return False
    return True


def _result(m: Measurement) -> tuple:
    """What a measurement found, as Store.stored_results gives a stored one."""
    return (m.status, m.median_us, m.p10_us, m.p90_us, int(m.samples))


def _result_text(result: tuple) -> str:
    status, median = result[0], result[1]
    return f"{median:.6g} us" if status == "ok" and median is not None else status


def _check_times_apart(store: Store, parsed: list[ParsedFile], replace_stored: bool) -> list[set]:
    """Refuse a key that a file gives another result than the store holds (unless `replace_stored`: then its keys
    are returned, per file, for write_parsed to replace) or than an earlier file of this import gives: the first
    stored result would stay and the other be dropped unsaid, so the order files came in would decide. A key given
    the same result again is the idempotent re-import, and passes."""
    stored_of: dict[tuple[str, str, str], dict] = {}
    given: dict[tuple, tuple[tuple, Path]] = {}
    replacing: list[set] = []
    for item in parsed:
        owner = (item.device.id, item.kernel, item.kernel_version)
        if owner not in stored_of:
            stored_of[owner] = store.stored_results(*owner)
        stored, mine = stored_of[owner], set()
        for m in item.measurements:
            key, result = (m.dtype, m.shape_key, m.config_key), _result(m)
            what = f"config {m.config_json} ({m.dtype}, shape {m.shape_json}) of {item.kernel} on {item.device.id}"
            earlier = given.setdefault((owner, key), (result, item.path))
            if earlier[0] != result:
                raise _fail(item.path, f"{what} is given {_result_text(result)} here but {_result_text(earlier[0])} by "
                                       f"{earlier[1]}, imported with it; import one of them (and then the other with "
                                       "--replace, should its results replace the first's)")
            if key in stored and stored[key] != result:
                if not replace_stored:
                    raise _fail(item.path, f"{what} is stored with {_result_text(stored[key])}, and this file gives "
                                           f"{_result_text(result)}; pass --replace to replace the stored results with "
                                           "this file's, or leave the file out")
                mine.add(key)
        replacing.append(mine)
    return replacing


def _check_unknown_sizes_apart(store: Store, parsed: list[ParsedFile]) -> None:
    """Refuse a second file of unknown problem size for a kernel and device that already has one.

    Files of unknown size all get the empty shape, so two of them (two problem sizes, as far as anyone
    knows) would share keys and one's timings would replace the other's. The same file imported again,
    or grown by a resumed run, keeps its name and goes in as before.
    """
    owners: dict[tuple[str, str], str] = {}
    for run in store.runs():
        settings = run.get("settings") or {}
        if settings.get("problem_size_from") == NO_PROBLEM_SIZE:
            owners.setdefault((run["device_id"], str(settings.get("kernel"))), str(settings.get("file")))
    for item in parsed:
        if item.source.get("problem_size_from") != NO_PROBLEM_SIZE:
            continue
        owner = owners.setdefault((item.device.id, item.kernel), item.path.name)
        if owner != item.path.name:
            raise _fail(item.path, f"it names no problem size, and {owner} (kernel {item.kernel} on {item.device.id} "
                                   "too) is imported without one; import each in its own command with its own "
                                   "--problem-size, to tell their sizes apart")


def _check_kernel_names_apart(store: Store, parsed: list[ParsedFile]) -> None:
    """Refuse a kernel name that differs from a stored, a built-in or another file's kernel name only in case, white
    space or NFKC form ("RMSNorm", fullwidth "ｒｍｓｎｏｒｍ" beside rmsnorm): its rows would pass for that kernel's."""
    names = [*store.kernel_names(), *BUILTIN_KERNELS, *dict.fromkeys(item.kernel for item in parsed)]
    for item in parsed:
        problem = twin_problem("kernel", item.kernel, names)
        if problem is not None:
            raise _fail(item.path, f"{problem}; import it under that name or one of its own (its kernel_name)")


def _check_kinds_apart(store: Store, parsed: list[ParsedFile]) -> None:
    """Refuse a file whose parameter holds values of another sort than another file's, or the store's, of the same
    kernel version: one parameter stays of one sort however many files it came from."""
    seen: dict[tuple[str, str], dict] = {}
    for item in parsed:
        key = (item.kernel, item.kernel_version)
        if key not in seen:
            seen[key] = {}
            stored = store.stored_config(item.kernel, item.kernel_version)
            if stored is not None:
                _check_param_kinds(item.path, [stored], [f"the store (kernel {item.kernel})"], seen[key])
        _check_param_kinds(item.path, [m.config for m in item.measurements], repeat(item.path.name), seen[key])


def import_files(store: Store, paths: Iterable[str | os.PathLike], device: str | None = None,
                 kernel: str | None = None, problem_size: Any = None,
                 device_map: str | os.PathLike | DeviceMap | None = None, replace: bool = False) -> list[dict]:
    """Import Kernel Tuner cache / T4 files; every file is parsed and checked before any is written.

    `device` (a catalog id or name, or a device registered in the store) applies to every file; `device_map` (a
    file, see load_device_map) gives each its own; not both; a file's own GPU name finds a registered device too.
    A refused file stores nothing of any file, and every file is written in one transaction: should the store fail
    while writing, or the import be stopped, nothing is stored.
    A key stored with another result than a file gives is refused, unless `replace`: then the file's result
    replaces it (the row's `replaced` counts them). A file whose kernel name holds another parameter set or other
    dims is stored under a name of its own (kernel_spaces.py; refused when the name is `kernel`). Returns one row per
    file: file, device, kernel, rows, added, failed, skipped, run_id (and renamed_from, note for a renamed one); a
    T4 metadata file, or one that holds no measurement (the header a run stopped before its first config left),
    beside others is a row of nothing (device and kernel None).
    """
    if device is not None and device_map is not None:
        raise ImportFileError("give --device (one device for every file) or --device-map, not both")
    if kernel:
        problem = _module_attr_problem("--kernel", kernel)
        if problem is not None:
            raise ImportFileError(f"{problem}; give a name without ':'")
    registered = store.registered_devices()
    chosen = device_from_option(device, registered) if device is not None else None
    mapping = device_map
    if device_map is not None and not isinstance(device_map, DeviceMap):
        mapping = load_device_map(device_map, registered)
    files = expand_paths(paths)
    if not files:
        raise ImportFileError("no Kernel Tuner files to import")
    parsed: list[ParsedFile] = []
    companions: list[Path] = []
    empty: list[NothingToImport] = []
    for p in files:
        try:
            parsed.extend(parse_sections(p, device=chosen, kernel=kernel, problem_size=problem_size,
                                         device_map=mapping, registered=registered))
        except CompanionFile:
            companions.append(p)
        except NothingToImport as err:
            empty.append(err)
            companions.append(p)
    if not parsed:
        if empty:
            raise empty[0]
        raise ImportFileError(f"no measurements to import: {', '.join(map(str, companions))} only describe "
                              "the machine of a T4 results file or a benchmark's search space; import the results "
                              "or cache files")
    if mapping is not None:
        _check_map_used(mapping, parsed)
        _warn_unmatched(mapping, files, parsed)
    _check_kernel_names_apart(store, parsed)
    from zmlx_pipeline.data.importers.kernel_spaces import keep_spaces_apart

    parsed = keep_spaces_apart(store, parsed, named=bool(kernel))
    _check_unknown_sizes_apart(store, parsed)
    _check_kinds_apart(store, parsed)
    replacing = _check_times_apart(store, parsed, replace)
    rows: list[dict] = []
    try:
        with store.atomic():  # every file or none: a failure or a stop midway leaves the store as it was
            for item, keys in zip(parsed, replacing):
                rows.append(write_parsed(store, item, keys))
    except StoreError as err:
        failed = str(parsed[len(rows)].path) if len(rows) < len(parsed) else ", ".join(str(p.path) for p in parsed)
        raise ImportFileError(f"cannot store {failed}: {' '.join(str(err).split())}; nothing of any file was "
                              "stored, the store is as it was") from err
    return rows + [{"file": str(p), "device": None, "kernel": None, "rows": 0, "added": 0, "failed": 0,
                    "skipped": 0, "run_id": None} for p in companions]
