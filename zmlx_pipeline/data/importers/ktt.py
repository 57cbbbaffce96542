"""KTT's own JSON output (the Kernel Tuning Toolkit, HiPerCoRe/KTT) read as the entries of one kernel on one device.

KTT writes `{"Metadata": {"Device", "TimeUnit", ...}, "Results": [...]}`; each result holds its
`Configuration` as a list of `{"Name", "Value"}` pairs, its `Status` and its `TotalDuration` (the
sum of its kernels' durations, in the metadata's time unit): one timing per config, no repetitions.
It names no problem size; newer KTT versions stamp the metadata and each result with the time (`Timestamp`). Its
statuses and what they become are in `_KTT_STATUS`. KTT's profile-based searcher times each config, then
runs it again under the profiler (that result's computations carry `ProfilingData`); the profiled repeat is
no timing of the kernel as it runs, so a config timed both ways keeps its plain run, and one only ever
profiled keeps its last profiled result (a profile of several passes writes a result per pass).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zmlx_pipeline.data.importers.kernel_tuner import (
    _TIME_UNITS_US,
    _Entries,
    _fail,
    _timing,
    name_field,
)

#: where KTT writes when it ran a config (each result) and when it tuned (Metadata): "2026-04-21 07:19:6 UTC"
_STAMP_FIELD = "Timestamp"
# KTT's ResultStatus names (Source/Output/JsonConverters.h); DeviceLimitsExceeded is a launch the device refused
_KTT_STATUS = {"Ok": "ok", "ComputationFailed": "launch_error", "ValidationFailed": "wrong_result",
               "CompilationFailed": "compile_error", "DeviceLimitsExceeded": "launch_error"}


def _configuration(path: Path, where: str, pairs: Any) -> dict:
    """A KTT configuration (a list of Name/Value pairs) as a dict."""
    if not isinstance(pairs, list) or not pairs:
        raise _fail(path, f"{where} has no 'Configuration' list")
    config = {}
    for pair in pairs:
        if not isinstance(pair, dict) or not isinstance(pair.get("Name"), str) or "Value" not in pair:
            raise _fail(path, f"{where}: a configuration pair without 'Name' and 'Value'")
        if pair["Name"] in config:
            raise _fail(path, f"{where}: parameter {pair['Name']!r} appears twice in its 'Configuration' (only one "
                              "value of a parameter can be kept)")
        config[pair["Name"]] = pair["Value"]
    return config


def entries_ktt(path: Path, data: dict) -> _Entries:
    """Configs and (status, timing, error) per result of a KTT JSON output file."""
    metadata = data["Metadata"]
    results = data["Results"]
    if not isinstance(results, list):
        raise _fail(path, "KTT output whose 'Results' is not a list")
    unit = metadata.get("TimeUnit")
    scale = _TIME_UNITS_US.get(str(unit).strip().lower()) if unit is not None else None
    if scale is None:
        raise _fail(path, f"KTT output with time unit {unit!r}; KTT writes Nanoseconds, Microseconds, "
                          "Milliseconds or Seconds")
    configs, outcomes, kernels, labels, stamps = [], [], set(), [], []
    parsed = []  # (config, its key, profiled) per result, read once
    for i, result in enumerate(results):
        if not isinstance(result, dict):
            raise _fail(path, f"result {i} is not an object")
        config = _configuration(path, f"result {i}", result.get("Configuration"))
        parsed.append((config, _config_key(config), _profiled(result)))
    plain_runs = {key for _, key, profiled in parsed if not profiled}
    last_profiled = {key: i for i, (_, key, profiled) in enumerate(parsed) if profiled}
    skipped = 0
    for i, (result, (config, key, profiled)) in enumerate(zip(results, parsed)):
        where = f"result {i}"
        if profiled and (key in plain_runs or last_profiled[key] != i):
            skipped += 1
            continue
        configs.append(config)
        labels.append(where)
        stamps.append(result.get(_STAMP_FIELD))
        status = _KTT_STATUS.get(str(result.get("Status")))
        if status is None:
            raise _fail(path, f"{where}: unknown status {result.get('Status')!r} (KTT writes "
                              f"{', '.join(_KTT_STATUS)})")
        name = name_field(path, f"{where}'s KernelName", result.get("KernelName"))
        if name:
            kernels.add(name)
        if status == "ok":
            outcomes.append(("ok", _timing(path, where, None, result.get("TotalDuration"), scale), None))
        else:
            outcomes.append((status, None, f"KTT status {result['Status']}"))
    if len(kernels) > 1:
        raise _fail(path, f"KTT output of several kernels ({', '.join(sorted(kernels))}); "
                          "tune and write each kernel to a file of its own")
    file_stamp = (metadata[_STAMP_FIELD], f"its Metadata's {_STAMP_FIELD}") if _STAMP_FIELD in metadata else None
    return _Entries(configs, outcomes, next(iter(kernels), ""), str(metadata.get("Device") or ""), None, skipped,
                    "ktt", labels=tuple(labels), stamps=tuple(stamps), file_stamp=file_stamp)


def _profiled(result: Any) -> bool:
    """Whether a KTT result is a run under the profiler (a computation of it carries ProfilingData)."""
    computations = result.get("ComputationResults") if isinstance(result, dict) else None
    return isinstance(computations, list) and any(isinstance(c, dict) and c.get("ProfilingData")
                                                  for c in computations)


def _config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=str)

