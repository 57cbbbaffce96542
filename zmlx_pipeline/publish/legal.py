"""A kernel's legal configs for many (device limits, dtype, shape) at once, as KernelSpec.legal_configs gives them.

Publishing asks for the legal configs of every device, dtype and shape bucket: for matmul (6,912 configs,
19 constraints) evaluating every constraint on every config took most of publish's time. A constraint reads
a few parameters and a few shape dims or limits, so here each one is evaluated once per distinct value of
the parameters it reads (matmul's `TG <= max_threads` reads one parameter of 6 values) and once per distinct
value of the shape dims and limits it reads (cached across calls), and the configs legal under all of them
are read off a boolean table. The expressions are compiled and evaluated exactly as KernelSpec.violations
does (a ZeroDivisionError is a violation), so the lists are the same, in the same order
(tests/publish/test_legal.py compares them on every built-in kernel).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

#: what a constraint may call (as KernelSpec.violations allows)
_GLOBALS = {"__builtins__": {}, "min": min, "max": max, "abs": abs}


class _Constraint:
    """One constraint over the config space: its code, the parameters it reads, each config's index among
    the distinct values of those parameters, and its verdicts per value of the other names it reads."""

    __slots__ = ("code", "params", "others", "values", "index", "verdicts")

    def __init__(self, text: str, kernel: str, configs: list[dict], params: list[str]) -> None:
        self.code = compile(text, f"<constraint of {kernel}>", "eval")
        names = set(self.code.co_names)
        self.params = [p for p in params if p in names]
        self.others = sorted(names - set(self.params) - set(_GLOBALS))
        keys = [tuple(c[p] for p in self.params) for c in configs]
        self.values = list(dict.fromkeys(keys))
        where = {v: i for i, v in enumerate(self.values)}
        self.index = np.fromiter((where[k] for k in keys), dtype=np.int64, count=len(keys))
        self.verdicts: dict[tuple, np.ndarray] = {}

    def passing(self, env: Mapping[str, Any]) -> np.ndarray:
        """Per config, whether it passes this constraint in `env` (shape dims and limits)."""
        key = tuple(env[n] for n in self.others if n in env)
        verdict = self.verdicts.get(key)
        if verdict is None:
            local = {n: env[n] for n in self.others if n in env}
            out = np.empty(len(self.values), dtype=bool)
            for i, value in enumerate(self.values):
                local.update(zip(self.params, value))
                try:
                    out[i] = bool(eval(self.code, _GLOBALS, local))  # noqa: S307 - the kernel author's own expressions
                except ZeroDivisionError:
                    out[i] = False
            verdict = self.verdicts[key] = out[self.index]
        return verdict


class LegalConfigs:
    """KernelSpec.legal_configs of one kernel, each constraint evaluated once per distinct input it reads; `extra`:
    constraints the runtime adds to the spec's (runtime/lookup.py thread_rule)."""

    def __init__(self, spec, extra: Sequence[str] = ()) -> None:
        self.configs = spec.configs()
        params = list(spec.params)
        self._constraints = [_Constraint(text, spec.name, self.configs, params)
                             for text in [*spec.constraints, *extra]]

    def __call__(self, shape: Mapping[str, int], dtype: str, limits) -> list[dict[str, int]]:
        """The configs that pass every constraint on this shape, dtype and device, in config-space order."""
        env = {**shape, **limits.env(dtype)}
        legal = np.ones(len(self.configs), dtype=bool)
        for constraint in self._constraints:
            legal &= constraint.passing(env)
            if not legal.any():
                return []
        return [self.configs[i] for i in np.flatnonzero(legal)]
