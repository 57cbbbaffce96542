"""Kernel Tuner cache JSON and T4 JSON files (gzipped or not) read into the store.

Each file becomes one run (status "imported", settings naming the file and its sha256) of
one kernel on one catalog device. Every entry becomes a measurement: timed configs as `ok`
with median/p10/p90 from their repetitions, failed ones as `launch_error`/`compile_error`.
A file is parsed completely before anything is written, so a malformed one stores nothing,
and its measurements go in with one `Store.record` transaction; re-importing adds nothing.

The format is told by content: a gzip stream is decompressed first, then a JSON object with
`cache` is a Kernel Tuner cache file, one with `results` a T4 file. T4 files name neither the
kernel, the device nor the problem size: those come from a T1 search-space description beside
the data (`<folder>/../search-spaces/<folder>.json`, as the FAIR benchmark hub lays it out),
the file's folder and its file name (`A100_T4.json.gz` -> A100).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple

from zmlx_pipeline.data.catalog import DeviceSpec, UnknownDevice, get_device, match_device
from zmlx_pipeline.data.keys import canonical_json, digest
from zmlx_pipeline.data.records import Measurement
from zmlx_pipeline.data.store import Store

DTYPE = "float32"  # both hub kernels (and Kernel Tuner's usual float inputs) are single precision
FORMAT_CACHE = "kernel_tuner_cache"
FORMAT_T4 = "t4"
_GZIP_MAGIC = b"\x1f\x8b"
_DIM_NAMES = ("x", "y", "z")
# Kernel Tuner's failure markers in a cache entry's "time"; InvalidConfig entries were never run.
_CACHE_FAILURES = {"RuntimeFailedConfig": "launch_error", "CompilationFailedConfig": "compile_error"}
_CACHE_SKIPPED = {"InvalidConfig"}
# T4 invalidity values (schema 1.0.0); "constraints" marks a config outside the space: not a measurement.
_T4_STATUS = {"correct": "ok", "compile": "compile_error", "runtime": "launch_error",
              "timeout": "timeout", "correctness": "wrong_result"}
_T4_SKIPPED = {"constraints"}
_TIME_UNITS_US = {
    "miliseconds": 1e3, "milliseconds": 1e3, "ms": 1e3,
    "seconds": 1e6, "s": 1e6,
    "microseconds": 1.0, "us": 1.0,
    "nanoseconds": 1e-3, "ns": 1e-3,
}
# Old Kernel Tuner versions stored a failed config as a huge time instead of a marker.
_FAILED_TIME_MS = 1e20


class ImportFileError(ValueError):
    "A file could not be imported; nothing of it was stored"


class UnmatchedDevice(ImportFileError, UnknownDevice):
    "The file's device is not in the catalog; pass --device"


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
    duplicates: int = 0
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return sum(m.status != "ok" for m in self.measurements)


# ------------------------------------------------------------------------------------------
# reading


def _fail(path: Path, reason: str) -> ImportFileError:
    """The one-line error for a file that cannot be imported."""
    reason = " ".join(str(reason).split())
    return ImportFileError(f"cannot import {path}: {reason}; nothing of it was stored")


def _read_json(path: Path) -> tuple[Any, str]:
    """The file's JSON (gunzipped when it is a gzip stream) and the sha256 of its bytes."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise _fail(path, err.strerror or str(err)) from err
    sha = hashlib.sha256(raw).hexdigest()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except EOFError as err:
            raise _fail(path, f"truncated gzip stream ({err})") from err
        except (OSError, zlib.error) as err:
            raise _fail(path, f"corrupt gzip stream ({err})") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _fail(path, f"not UTF-8 text ({err})") from err
    if not text.strip():
        raise _fail(path, "the file is empty")
    try:
        return json.loads(text), sha
    except json.JSONDecodeError as err:
        at_end = err.pos >= len(text.rstrip()) - 1 or err.msg.startswith("Unterminated string")
        hint = " (truncated?)" if at_end else ""
        raise _fail(path, f"not valid JSON{hint}: {err.msg} (line {err.lineno}, column {err.colno})") from err


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


def _timing(path: Path, where: str, times: Any, fallback: Any, scale: float) -> tuple[float, float, float, int]:
    """(median, p10, p90, samples) in microseconds from repetitions, else from one summary time."""
    if isinstance(times, list) and times:
        if not all(_number(t) for t in times):
            raise _fail(path, f"{where}: non-numeric times")
        med, p10, p90 = _quantiles(times)
        return med * scale, p10 * scale, p90 * scale, len(times)
    if _number(fallback):
        t = float(fallback) * scale
        return t, t, t, 1
    raise _fail(path, f"{where}: no times")


def shape_from_problem_size(problem_size: Any) -> dict[str, int]:
    """A Kernel Tuner problem size as a shape: x, y, z for up to three dims, p0, p1, ... beyond."""
    if isinstance(problem_size, Mapping):
        items = list(problem_size.items())
    else:
        dims = list(problem_size) if isinstance(problem_size, (list, tuple)) else [problem_size]
        names = _DIM_NAMES if len(dims) <= len(_DIM_NAMES) else [f"p{i}" for i in range(len(dims))]
        items = list(zip(names, dims))
    shape = {}
    for name, value in items:
        if not _number(value) or float(value) != int(value):
            raise ValueError(f"problem size {problem_size!r} is not a list of integers")
        shape[str(name)] = int(value)
    if not shape:
        raise ValueError("empty problem size")
    return shape


def kernel_version(kernel: str, params: Iterable[str]) -> str:
    """The version of a kernel known only by name and parameters (there is no source to hash)."""
    return digest(canonical_json({"kernel": kernel, "params": sorted(params)}))


def _t1_description(path: Path) -> dict | None:
    """The T1 search-space description of the file's folder (`../search-spaces/<folder>.json`), if any."""
    candidate = path.parent.parent / "search-spaces" / f"{path.parent.name}.json"
    if not candidate.is_file():
        return None
    try:
        data = json.loads(candidate.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _fail(path, f"its search-space description {candidate} is unreadable ({err})") from err
    return data if isinstance(data, dict) else None


def _device_from_filename(path: Path) -> str:
    """The GPU a file is named after: `A100_T4.json.gz` -> A100, `A6000_original.json` -> A6000."""
    name = path.name
    for suffix in (".gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def _resolve_device(path: Path, reported: str, override: str | None) -> tuple[DeviceSpec, str]:
    """The catalog row of the file's device (or of --device); UnmatchedDevice naming it otherwise."""
    if override:
        try:
            return get_device(override), override
        except UnknownDevice:
            spec = match_device(override)
            if spec is None:
                raise UnmatchedDevice(
                    f"cannot import {path}: --device {override!r} is neither a catalog id nor a catalog "
                    "device name (see `zmlx-pipeline devices`); nothing of it was stored"
                ) from None
            return spec, override
    # the name the file reports; only a file that reports none is taken to be named after its GPU
    stem = _device_from_filename(path)
    if reported.strip():
        tried = [reported.strip()]
    else:
        parts = [p for p in re.split(r"[_\s]+", stem) if p]
        tried = [stem] + [" ".join(parts[:n]) for n in range(len(parts) - 1, 0, -1)]
    for name in tried:
        spec = match_device(name)
        if spec is not None:
            return spec, name
    named = reported.strip() or stem
    raise UnmatchedDevice(
        f"cannot import {path}: device {named!r} is not in the catalog; pass --device <catalog id> "
        "(see `zmlx-pipeline devices`); nothing of it was stored"
    )


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
    """Tunable parameters that are really problem size: `filter_*` with one value throughout."""
    if not configs:
        return []
    names = [k for k in configs[0] if k.startswith("filter_")]
    return [k for k in names if len({json.dumps(c.get(k)) for c in configs}) == 1]


class _Entries(NamedTuple):
    """What a file says: configs, their (status, timing, error), names and problem size."""

    configs: list[dict]
    outcomes: list[tuple]
    kernel_name: str
    device_name: str
    problem_size: Any
    skipped: int


def _entries_cache(path: Path, data: dict) -> _Entries:
    """Configs and (status, timing, error) per entry of a Kernel Tuner cache file."""
    cache = data["cache"]
    if not isinstance(cache, dict):
        raise _fail(path, "'cache' is not an object")
    keys = data.get("tune_params_keys")
    if not isinstance(keys, list) or not keys:
        if not cache:
            raise _fail(path, "no 'tune_params_keys' and an empty 'cache'")
        first = next(iter(cache.values()))
        keys = [k for k in first if k not in ("time", "times")] if isinstance(first, dict) else []
    if "problem_size" not in data:
        raise _fail(path, "no 'problem_size'")
    configs, outcomes, skipped = [], [], 0
    for key, entry in cache.items():
        where = f"cache entry {key!r}"
        if not isinstance(entry, dict):
            raise _fail(path, f"{where} is not an object")
        missing = [k for k in keys if k not in entry]
        if missing:
            raise _fail(path, f"{where} lacks parameters {', '.join(missing)}")
        if "time" not in entry:
            raise _fail(path, f"{where} has no 'time'")
        time = entry["time"]
        if isinstance(time, str):
            if time in _CACHE_SKIPPED:
                skipped += 1
                continue
            status = _CACHE_FAILURES.get(time)
            if status is None:
                raise _fail(path, f"{where}: unknown time marker {time!r}")
            outcomes.append((status, None, time))
        elif not _number(time):
            raise _fail(path, f"{where}: 'time' is neither a number nor a failure marker")
        elif time >= _FAILED_TIME_MS:
            outcomes.append(("launch_error", None, "failed (time recorded as infinite)"))
        else:
            outcomes.append(("ok", _timing(path, where, entry.get("times"), time, 1e3), None))
        configs.append({k: entry[k] for k in keys})
    return _Entries(configs, outcomes, str(data.get("kernel_name") or ""), str(data.get("device_name") or ""),
                    data["problem_size"], skipped)


def _entries_t4(path: Path, data: dict, t1: dict | None) -> _Entries:
    """Configs and (status, timing, error) per result of a T4 file."""
    results = data["results"]
    if not isinstance(results, list):
        raise _fail(path, "'results' is not a list")
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise _fail(path, "'metadata' is not an object")
    unit = str(metadata.get("timeunit", "milliseconds")).lower()
    if unit not in _TIME_UNITS_US:
        raise _fail(path, f"unknown time unit {metadata.get('timeunit')!r}")
    scale = _TIME_UNITS_US[unit]
    configs, outcomes, skipped = [], [], 0
    for i, result in enumerate(results):
        where = f"result {i}"
        if not isinstance(result, dict) or not isinstance(result.get("configuration"), dict):
            raise _fail(path, f"{where} has no 'configuration' object")
        invalidity = result.get("invalidity", "correct")
        if invalidity in _T4_SKIPPED:
            skipped += 1
            continue
        status = _T4_STATUS.get(invalidity)
        if status is None:
            raise _fail(path, f"{where}: unknown invalidity {invalidity!r}")
        if status == "ok":
            times = (result.get("times") or {}).get("runtimes")
            value = next((m.get("value") for m in result.get("measurements") or []
                          if isinstance(m, dict) and m.get("name") == "time"), None)
            outcomes.append(("ok", _timing(path, where, times, value, scale), None))
        else:
            outcomes.append((status, None, f"invalidity: {invalidity}"))
        configs.append(result["configuration"])
    names = {frozenset(c) for c in configs}
    if len(names) > 1:
        raise _fail(path, "its results do not all have the same parameters")
    spec = (t1 or {}).get("KernelSpecification") or {}
    kernel = str(metadata.get("kernel_name") or metadata.get("kernel") or spec.get("KernelName") or "")
    device = str(metadata.get("device_name") or metadata.get("device") or "")
    problem = metadata.get("problem_size", spec.get("ProblemSize"))
    if problem is None:
        raise _fail(path, "a T4 file names no problem size and no search-space description "
                          f"({path.parent.parent / 'search-spaces' / (path.parent.name + '.json')}) gives one")
    return _Entries(configs, outcomes, kernel, device, problem, skipped)


def parse_file(path: str | os.PathLike, device: str | None = None, kernel: str | None = None) -> ParsedFile:
    """Read and check one file completely; ImportFileError (one line, naming the file) if it cannot be used.

    The kernel is named by `kernel`, else the benchmark name of a T1 description beside the
    data, else the file's own kernel name, else its folder's name.
    """
    path = Path(path)
    data, sha = _read_json(path)
    if not isinstance(data, dict):
        raise _fail(path, "the top level is not a JSON object")
    t1 = _t1_description(path)
    if "cache" in data:
        fmt, entries = FORMAT_CACHE, _entries_cache(path, data)
    elif "results" in data:
        fmt, entries = FORMAT_T4, _entries_t4(path, data, t1)
    elif "tune_params" in data or "kernel_name" in data:
        raise _fail(path, "a Kernel Tuner cache file without 'cache'")
    else:
        raise _fail(path, "neither a Kernel Tuner cache file (no 'cache') nor a T4 file (no 'results')")
    configs, outcomes, reported = entries.configs, entries.outcomes, entries.device_name
    benchmark = ((t1 or {}).get("General") or {}).get("BenchmarkName")
    name = kernel or benchmark or entries.kernel_name or path.parent.name
    spec, matched_name = _resolve_device(path, reported, device)
    try:
        shape = shape_from_problem_size(entries.problem_size)
    except ValueError as err:
        raise _fail(path, str(err)) from err
    filled = _defaults_for_subspace(configs, t1)
    if filled:
        configs = [{**c, **filled} for c in configs]
    shape_params = _split_shape_params(configs)
    for p in shape_params:
        shape[p] = configs[0][p]
    if shape_params:
        configs = [{k: v for k, v in c.items() if k not in shape_params} for c in configs]
    params = list(configs[0]) if configs else []
    version = kernel_version(name, params)
    measurements, seen, duplicates = [], set(), 0
    for config, (status, timing, error) in zip(configs, outcomes):
        key = canonical_json(config)
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        med, p10, p90, n = timing or (None, None, None, 0)
        measurements.append(Measurement(
            run_id="", device_id=spec.id, kernel=name, kernel_version=version, dtype=DTYPE,
            shape=shape, config=config, status=status, median_us=med, p10_us=p10, p90_us=p90,
            samples=n, error=error,
        ))
    if not measurements:
        raise _fail(path, "no measurements in it")
    source = {"kernel_name": entries.kernel_name or None, "device_name": reported or None,
              "matched_device_name": matched_name}
    if filled:
        source["filled_from_defaults"] = filled
    return ParsedFile(path=path, sha256=sha, format=fmt, kernel=name, kernel_version=version, device=spec,
                      reported_device=reported, shape=shape, measurements=measurements, skipped=entries.skipped,
                      duplicates=duplicates, source=source)


# ------------------------------------------------------------------------------------------
# writing


def expand_paths(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Files as given; a directory stands for its *.json and *.json.gz files (sorted)."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith((".json", ".json.gz")))
        else:
            out.append(p)
    return out


def write_parsed(store: Store, parsed: ParsedFile) -> dict:
    """Store one parsed file as a run of its own; a file whose every key is stored adds nothing."""
    from zmlx_pipeline import __version__

    spec = parsed.device
    row = {"file": str(parsed.path), "device": spec.id, "kernel": parsed.kernel,
           "rows": len(parsed.measurements), "added": 0, "failed": parsed.failed,
           "skipped": parsed.skipped + parsed.duplicates, "run_id": None}
    stored = store.measured_keys(spec.id, parsed.kernel, parsed.kernel_version)
    if all((m.dtype, m.shape_key, m.config_key) in stored for m in parsed.measurements):
        return row
    store.upsert_device({**spec.as_row(), "device_id": spec.id, "in_catalog": True, "flagged_unknown": False,
                         "reported_name": parsed.reported_device or None})
    run_id = store.start_run(
        spec.id, host=None, backend=spec.backend, mlx_version=None, pipeline_version=__version__,
        settings={"file": parsed.path.name, "sha256": parsed.sha256, "format": parsed.format,
                  "kernel": parsed.kernel, "shape": parsed.shape, **parsed.source},
    )
    try:
        added = store.record([replace(m, run_id=run_id) for m in parsed.measurements])
    except BaseException:
        store.finish_run(run_id, "failed")
        raise
    store.finish_run(run_id, "imported")
    return {**row, "added": added, "run_id": run_id}


def import_files(store: Store, paths: Iterable[str | os.PathLike], device: str | None = None,
                 kernel: str | None = None) -> list[dict]:
    """Import Kernel Tuner cache / T4 files; all are parsed before any is written.

    Returns one row per file: file, device, kernel, rows, added, failed, skipped, run_id.
    """
    files = expand_paths(paths)
    if not files:
        raise ImportFileError("no Kernel Tuner files to import")
    parsed = [parse_file(p, device=device, kernel=kernel) for p in files]
    return [write_parsed(store, p) for p in parsed]
