"""A covering sample of a kernel's configs: every value of every parameter in at least one case, on
the small shapes of cases.toml, with the fewest cases a greedy choice finds."""

from __future__ import annotations

import tomllib
from pathlib import Path

from zmlx_pipeline.kernels.spec import KernelSpec, Limits

CASES = Path(__file__).with_name("cases.toml")

#: the limits of an Apple GPU, where the Metal source runs (32 KiB of threadgroup memory, 32 lanes)
APPLE = Limits()


def table(name: str) -> dict:
    with open(CASES, "rb") as fh:
        return tomllib.load(fh)[name]


def _cost(config, shape) -> int:
    """Work of a case: elements touched, and a launch of many lanes costs more to schedule."""
    elements = 1
    for v in shape.values():
        elements *= v
    return elements + 64 * max(config.values())


_LEGAL: dict = {}


def _legal(spec: KernelSpec, name: str, dtype: str) -> tuple:
    key = (name, spec.version, dtype)
    if key not in _LEGAL:
        shapes = table(name)["shapes"]
        _LEGAL[key] = tuple((c, s) for s in shapes for c in spec.legal_configs(s, dtype, APPLE))
    return _LEGAL[key]


def covering_sample(spec: KernelSpec, name: str, dtype: str) -> list[tuple[dict, dict]]:
    """(config, shape) pairs covering every (parameter, value) that is legal on an Apple GPU for this
    dtype on some shape of the kernel's table, plus the table's extra cases."""
    legal = _legal(spec, name, dtype)
    todo = {(k, v) for c, _ in legal for k, v in c.items()}
    picked: list[tuple[dict, dict]] = []
    while todo:
        best = max(legal, key=lambda cs: (len(todo & set(cs[0].items())), -_cost(*cs)))
        picked.append(best)
        todo -= set(best[0].items())
    for extra in table(name).get("extra", []):
        if not spec.violations(extra["config"], extra["shape"], dtype, APPLE):
            picked.append((dict(extra["config"]), dict(extra["shape"])))
    return picked


def values_reached(spec: KernelSpec, name: str) -> dict[str, set[int]]:
    """The values of each parameter legal on an Apple GPU in some dtype on some shape of the table."""
    reached: dict[str, set[int]] = {k: set() for k in spec.params}
    for dtype in ("float32", "float16", "bfloat16"):
        for c, _ in _legal(spec, name, dtype):
            for k, v in c.items():
                reached[k].add(v)
    return reached
