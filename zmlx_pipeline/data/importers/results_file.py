"""The results file Kernel Tuner's `store_results` writes (kernel_tuner/integration.py, version_number "1.0").

One file holds the best configs (within `top` percent of the best, 3% by default) of one kernel for
any number of devices and problem sizes: `{"version_number", "kernel_name", "tunable_parameters",
"objective", "data": [{"device_name", "problem_size", "tunable_parameters": {...}, <objective>: value}]}`.
The device name has every run of characters other than letters and digits replaced by "_"
("NVIDIA_A100_PCIE_40GB"), the problem size its dims joined by "x". Each (device, problem size) is a
section of its own, one imported run each. Only a time objective gives kernel times (milliseconds, as
Kernel Tuner measures): a file stored for GFLOP/s holds no time and is refused.

Kernel Tuner versions before the version number wrote the same results as `{device: {problem size:
[records]}}`, each record the tuned parameters and the objective (`time` unless asked otherwise), the
device name with its spaces replaced by "-". Such a file is read when every record holds a `time` and
all records name the same fields; the parameters are the other fields.
"""

from __future__ import annotations

from pathlib import Path

from zmlx_pipeline.data.importers.kernel_tuner import _Entries, _fail, _timing, blank_name, name_field

_VERSIONS = ("1.0",)
_TIME_OBJECTIVE = "time"
_MS_TO_US = 1e3


def sections(path: Path, data: dict) -> list[_Entries]:
    """One _Entries per device and problem size of a store_results file, in the order they first appear."""
    version = str(data.get("version_number"))
    if version not in _VERSIONS:
        raise _fail(path, f"a Kernel Tuner results file of version_number {version!r}; versions read: "
                          f"{', '.join(_VERSIONS)}")
    objective = data.get("objective")
    if objective != _TIME_OBJECTIVE:
        raise _fail(path, f"a Kernel Tuner results file stored for {objective!r}, which holds no kernel times; "
                          "import the cache file of the same run (tune_kernel's cache=) instead")
    names = data.get("tunable_parameters")
    records = data.get("data")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise _fail(path, "a Kernel Tuner results file whose 'tunable_parameters' is not a list of names")
    if not isinstance(records, list):
        raise _fail(path, "a Kernel Tuner results file whose 'data' is not a list")
    kernel = name_field(path, "its kernel_name", data.get("kernel_name"))
    grouped: dict[tuple[str, str], tuple[list, list, list, list]] = {}
    for i, record in enumerate(records):
        where = f"record {i}"
        if not isinstance(record, dict) or not isinstance(record.get("tunable_parameters"), dict):
            raise _fail(path, f"{where} has no 'tunable_parameters' object")
        config = record["tunable_parameters"]
        missing = [n for n in names if n not in config]
        if missing:
            raise _fail(path, f"{where} lacks parameters {', '.join(missing)}")
        device, size = record.get("device_name"), record.get("problem_size")
        if not isinstance(device, str) or not device or not isinstance(size, str):
            raise _fail(path, f"{where} has no 'device_name' and 'problem_size'")
        configs, outcomes, labels, stamps = grouped.setdefault((device, size), ([], [], [], []))
        labels.append(where)
        stamps.append(record.get("timestamp"))  # store_results writes none: the rows are dated by their import
        configs.append({n: config[n] for n in names})
        outcomes.append(("ok", _timing(path, where, None, record.get(objective), _MS_TO_US), None))
    if not grouped:
        return []
    blank = blank_name("its kernel_name", data.get("kernel_name"))
    return [_Entries(configs, outcomes, kernel, device, size, 0, "results_file",
                     section={"device_name": device, "problem_size": size}, labels=tuple(labels), blank_name=blank,
                     stamps=tuple(stamps))
            for (device, size), (configs, outcomes, labels, stamps) in grouped.items()]


def is_legacy(data: dict) -> bool:
    """Whether a document is laid out as store_results wrote it before the version number: devices, then problem
    sizes, then lists of records."""
    return bool(data) and all(
        isinstance(sizes, dict) and sizes and all(
            isinstance(records, list) and all(isinstance(r, dict) for r in records) for records in sizes.values())
        for sizes in data.values())


def legacy_sections(path: Path, data: dict) -> list[_Entries]:
    """One _Entries per device and problem size of a results file of a Kernel Tuner before the version number."""
    fields = None
    out = []
    for device, sizes in data.items():
        for size, records in sizes.items():
            configs, outcomes, labels = [], [], []
            for i, record in enumerate(records):
                where = f"record {i} of {device} at {size}"
                if _TIME_OBJECTIVE not in record:
                    raise _fail(path, f"a results file of an older Kernel Tuner whose {where} holds no 'time' (it "
                                      "was stored for another objective); import the cache file of the run instead")
                names = sorted(record)
                if fields is None:
                    fields = names
                if names != fields:
                    raise _fail(path, f"a results file of an older Kernel Tuner whose {where} names fields "
                                      f"{', '.join(names)}, not {', '.join(fields)}")
                configs.append({k: v for k, v in record.items() if k != _TIME_OBJECTIVE})
                labels.append(where)
                outcomes.append(("ok", _timing(path, where, None, record[_TIME_OBJECTIVE], _MS_TO_US), None))
            if configs:
                out.append(_Entries(configs, outcomes, "", device, size, 0, "results_file (no version_number)",
                                    section={"device_name": device, "problem_size": size}, labels=tuple(labels)))
    return out
