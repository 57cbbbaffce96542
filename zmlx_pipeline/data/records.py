"""The rows collect writes and every later stage reads: a measurement and its statuses."""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping

from zmlx_pipeline.core.dtypes import DTYPE_BYTES
from zmlx_pipeline.core.keys import canonical_json, mapping_key

STATUSES = ("ok", "wrong_result", "launch_error", "compile_error", "timeout")
DTYPES = tuple(DTYPE_BYTES)
#: the largest shape dimension a row may hold: the largest array dimension MLX takes (its shapes are 32-bit
#: signed integers), as the runtime's lookup bounds a shape (runtime/lookup.py MAX_DIM)
MAX_DIM = 2**31 - 1


@dataclass(frozen=True)
class Measurement:
    """One timed (or failed) launch config of one kernel, dtype and shape on one device."""

    run_id: str
    device_id: str
    kernel: str
    kernel_version: str
    dtype: str
    shape: dict[str, int]
    config: dict[str, Any]
    status: str
    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    samples: int = 0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    measured_at: datetime | None = None  # when it was timed (UTC), where that was before it is recorded (an import)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; expected one of {', '.join(STATUSES)}")

    @property
    def shape_key(self) -> str:
        return mapping_key(self.shape)

    @property
    def config_key(self) -> str:
        return mapping_key(self.config)

    @property
    def shape_json(self) -> str:
        return canonical_json(self.shape)

    @property
    def config_json(self) -> str:
        return canonical_json(self.config)


# What every stored row must hold, whichever way it comes in (collect, import, ingest): each check gives the
# reason a value is refused, or None. Import and ingest refuse a file naming its row and this reason.


#: a device id as collect (data/detect.py), import and the catalog write one: lower-case letters and digits in
#: words joined by single hyphens, and an optional core limit `@<cores>sm` (nvidia-h200@66sm)
DEVICE_ID_PATTERN = r"[a-z0-9]+(-[a-z0-9]+)*(@[1-9][0-9]*sm)?"
_DEVICE_ID = re.compile(DEVICE_ID_PATTERN)
#: the most characters a name (a kernel, device or run id, a dtype) may hold: names become file names (a trained
#: model's), and the longest the product writes (a catalog id with a core limit, a run id) is under 50
MAX_NAME_LENGTH = 100


def shortened(text: str, keep: int = 40) -> str:
    """A long text for a one-line message: its start, quoted, and how long it is."""
    return repr(text) if len(text) <= keep else f"{text[:keep]!r}... ({len(text)} characters)"


def name_problem(what: str, name: Any) -> str | None:
    """Why `name` (a kernel, device or run id) cannot name a row: not text, empty, longer than MAX_NAME_LENGTH,
    holding control characters, starting or ending with white space, or not in Unicode's composed form NFC ("cafe"
    and a combining accent): a name that would pass for another when printed."""
    if not isinstance(name, str):
        return f"{what} {name!r} is not text"
    if not name.strip():
        return f"{what} is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"{what} {shortened(name)} is longer than {MAX_NAME_LENGTH} characters, the most a name may hold"
    if not name.isprintable():
        return f"{what} {name!r} holds a control character"
    if name != name.strip():
        return f"{what} {name!r} starts or ends with white space"
    composed = unicodedata.normalize("NFC", name)
    if composed != name:
        return (f"{what} {ascii(name)} is not in Unicode's composed form (NFC), which writes it {ascii(composed)}: "
                "write it so, or it passes for that name")
    return None


def device_id_problem(device_id: Any) -> str | None:
    """Why `device_id` is not one the product writes (name_problem's reasons, or not of DEVICE_ID_PATTERN's form)."""
    problem = name_problem("device_id", device_id)
    if problem is None and not _DEVICE_ID.fullmatch(device_id):
        return (f"device_id {device_id!r} is not a device id (lower-case letters and digits joined by single "
                "hyphens, and an optional core limit like @66sm, as the catalog writes them)")
    return problem


def fold_name(name: str) -> str:
    """A name folded for comparison: two kernel names that differ only in case, white space or Unicode's compatibility
    forms (NFKC: fullwidth "ｒｍｓｎｏｒｍ" is rmsnorm) name one kernel."""
    return "".join(unicodedata.normalize("NFKC", name).casefold().split())


def twin_problem(what: str, name: str, others: Iterable[str]) -> str | None:
    """Why `name` cannot name a row beside `others` (stored, built-in or other new names, in the order to name them):
    it differs from one of them only as fold_name folds, so its rows would pass for that one's; None when none is."""
    folded = fold_name(name)
    twin = next((other for other in others if other != name and fold_name(other) == folded), None)
    if twin is None:
        return None
    return (f"{what} {name!r} differs from {what} {twin!r} only in case, white space or Unicode compatibility form "
            "(NFKC): name one kernel one way")


def dim_problem(name: Any, value: Any) -> str | None:
    """Why one shape dimension is unusable: a name that is not text, or a size that is not a whole number in
    1..MAX_DIM (a bool is not a size, nor is 4096.0 in a stored shape: its key would differ from 4096's)."""
    if not isinstance(name, str) or not name.strip():
        return f"dimension name {name!r} is not a name"
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name}={value!r} is not a positive integer"
    if value < 1:
        return f"{name}={value!r} is not a positive integer"
    if value > MAX_DIM:
        return f"{name}={value!r} is larger than an array dimension can be ({MAX_DIM})"
    return None


def shape_problem(shape: Any) -> str | None:
    """Why a shape is unusable: not a mapping of dimension names to sizes (an empty one is a case of unknown size)."""
    if not isinstance(shape, Mapping):
        return f"shape {shape!r} is not an object of dimension sizes"
    for name, value in shape.items():
        problem = dim_problem(name, value)
        if problem is not None:
            return f"shape {canonical_json(shape)}: {problem}"
    return None


#: the integers a config value may be: int64's, as every reader of a config column (DuckDB's JSON, Arrow, NumPy)
#: holds an integer; 2**63 would be read as a float, or not at all
INT64 = (-2**63, 2**63 - 1)


def _value_problem(value: Any) -> str | None:
    """Why a config value (or a number inside a list or object of one) cannot be stored as written: an integer
    outside int64, or a float that is not finite (NaN, inf: no JSON, and equal to no other)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return None
    if isinstance(value, int):
        return None if INT64[0] <= value <= INT64[1] else "is an integer outside int64 (-2**63 to 2**63-1)"
    if isinstance(value, float):
        return None if math.isfinite(value) else "is not a finite number"
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else ()
    return next((p for p in map(_value_problem, items) if p is not None), None)


def config_problem(config: Any) -> str | None:
    """Why a config is unusable: not a non-empty mapping of parameter names to values. Any JSON value may be one
    (an imported kernel's parameter may be negative, zero, a float, text, a list, an object or null, kept as
    written), but for an integer outside int64 or a number that is not finite; a built-in kernel's are positive
    integers (data/importers/builtin_kernels.py)."""
    if not isinstance(config, Mapping) or not config:
        return f"config {config!r} is not an object of parameter values"
    for name, value in config.items():
        if not isinstance(name, str) or not name.strip():
            return f"config {canonical_json(config)}: parameter name {name!r} is not a name"
        problem = _value_problem(value)
        if problem is not None:
            shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
            return f"config parameter {name}={shown} {problem}"
    return None
