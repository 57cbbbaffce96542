"""The data type each config of a tuning file computes in, from the parameter that picks it.

Published tuning files tune the precision like any other parameter (CLBlast's `PRECISION`: 32 or 64,
`use_fp16`, a `TYPE` of "float" or "half"). Such a parameter is the dtype of the case, not a launch
parameter: one file with two precisions becomes the cases of two dtypes. Which names and values
mean which dtype is data (`dtype_params.json`), not code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from zmlx_pipeline.core.dtypes import DTYPE_BYTES

_TABLE = json.loads(Path(__file__).with_name("dtype_params.json").read_text(encoding="utf-8"))
PARAMETERS: dict[str, str] = _TABLE["parameters"]
VALUES: dict[str, dict[str, str | None]] = _TABLE["values"]


class DtypeSplit(NamedTuple):
    """The configs without the dtype parameter, the dtype of each, and the parameter (None: the file has none)."""

    parameter: str | None
    dtypes: list[str]
    configs: list[dict]


def _spelled(value: Any) -> str:
    """A parameter value as the table spells it: 32.0 -> "32", True -> "true", " Float " -> "float"."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip().lower()


def split_dtype(configs: list[dict], default: str) -> DtypeSplit:
    """Take the data-type parameter out of every config; ValueError (one line) for a value that names a data type
    the store does not hold, or none while the parameter's other values do.

    Configs without such a parameter, or whose parameter of such a name holds no data-type value at all,
    keep every parameter and get `default`.
    """
    names = list(dict.fromkeys(k for c in configs for k in c if str(k).lower() in PARAMETERS))
    unchanged = DtypeSplit(None, [default] * len(configs), configs)
    if not names:
        return unchanged
    typed = [n for n in names if any(_spelled(c.get(n)) in VALUES[PARAMETERS[n.lower()]] for c in configs)]
    if not typed:
        return unchanged
    if len(typed) > 1:
        raise ValueError(f"several parameters pick the data type ({', '.join(typed)}); "
                         "a file whose configs each name one data type can be imported")
    name = typed[0]
    table = VALUES[PARAMETERS[name.lower()]]
    held = ", ".join(DTYPE_BYTES)
    dtypes = []
    for config in configs:
        value = config.get(name)
        key = _spelled(value)
        if key not in table:
            known = ", ".join(sorted(k for k in table if table[k]))
            raise ValueError(f"{name}={value!r} names no data type, while its other values do "
                             f"({name} values we read: {known})")
        if table[key] is None or table[key] not in DTYPE_BYTES:
            raise ValueError(f"{name}={value!r} is a precision the store does not hold (it holds {held}); "
                             f"import a copy of the file without those entries")
        dtypes.append(table[key])
    return DtypeSplit(name, dtypes, [{k: v for k, v in c.items() if k != name} for c in configs])
