"""The built-in kernels' shape dims, parameters and constraints, as data: what an imported or ingested row of a
built-in kernel's name must fit.

kernels/ imports data/ (to detect the device), so data/ reads the built-ins from `builtin_kernels.json`, a copy
of what `KernelSpec.describe()` gives; tests/data/test_builtin_kernels.py checks the copy against the registry
and rewrites it when run as a script.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from zmlx_pipeline.core.constraints import FUNCTIONS

TABLE = Path(__file__).with_name("builtin_kernels.json")
#: what a constraint may call, as KernelSpec.violations allows
_GLOBALS = {"__builtins__": {}, "min": min, "max": max, "abs": abs}


@dataclass(frozen=True)
class BuiltinKernel:
    """One built-in kernel: its shape dims, parameter names and constraints (compiled on first use)."""

    name: str
    dims: tuple[str, ...]
    params: tuple[str, ...]
    constraints: tuple[str, ...]
    _compiled: dict = field(default_factory=dict, repr=False, compare=False)

    def mismatch(self, shape: Mapping[str, Any], config: Mapping[str, Any], every_param: bool) -> str | None:
        """Why a row's shape or config is not this kernel's: other dims, a parameter it does not have (or, with
        `every_param`, lacks one), or a parameter value that is not an integer; None when it fits."""
        if set(shape) != set(self.dims):
            return (f"kernel {self.name!r} is built in, with shape dims {', '.join(self.dims)}, "
                    f"not {', '.join(map(str, shape)) or 'none'}")
        names = set(config)
        if not names <= set(self.params) or (every_param and names != set(self.params)):
            return (f"kernel {self.name!r} is built in, with parameters {', '.join(self.params)}, "
                    f"not {', '.join(sorted(map(str, config)))}")
        for name, value in config.items():
            if isinstance(value, bool) or not isinstance(value, int):
                return f"kernel {self.name!r} is built in, whose parameters are integers, not {name}={value!r}"
        return None

    def broken(self, env: Mapping[str, Any]) -> str | None:
        """The first constraint a config breaks in `env` (its shape, config and device limits), else None.

        Each is evaluated as KernelSpec.violations evaluates it (the kernel author's own expressions, copied from
        the kernel's code; one dividing by zero is broken), except that one reading a name `env` lacks (a
        parameter a row does not give) is not judged, as ConstraintSet.legal does. All are tried at once first
        (the usual row passes them all); a row that does not is judged one constraint at a time.
        """
        if not self._compiled:
            self._compile()
        try:
            if self._compiled["all"](**env):
                return None
        except (TypeError, ValueError, OverflowError, ZeroDivisionError):
            pass  # a name the row lacks, or a constraint that fails on it
        for text, code, names, verdicts in self._compiled["each"]:
            try:
                key = tuple(env[n] for n in names)
            except KeyError:
                continue
            verdict = verdicts.get(key)
            if verdict is None:
                try:
                    verdict = bool(eval(code, _GLOBALS, dict(zip(names, key))))  # noqa: S307 - the author's own
                except ZeroDivisionError:
                    verdict = False
                except (TypeError, ValueError, OverflowError):
                    verdict = True  # a value of a type the constraint cannot judge: the value checks say why
                verdicts[key] = verdict
            if not verdict:
                return text
        return None

    def _compile(self) -> None:
        """Every constraint compiled on its own (with the names it reads and its verdicts so far), and their
        conjunction as one function of all their names."""
        checks = []
        for text in self.constraints:
            code = compile(text, f"<constraint of {self.name}>", "eval")
            checks.append((text, code, tuple(sorted(set(code.co_names) - set(FUNCTIONS))), {}))
        names = sorted({n for _, _, used, _ in checks for n in used})
        body = " and ".join(f"({text})" for text in self.constraints) or "True"
        conjunction = eval(compile(f"lambda {''.join(n + ', ' for n in names)}**_: {body}",  # noqa: S307
                                   f"<constraints of {self.name}>", "eval"), _GLOBALS)
        self._compiled.update(all=conjunction, each=checks)


def _load() -> dict[str, BuiltinKernel]:
    table = json.loads(TABLE.read_text(encoding="utf-8"))["kernels"]
    return {name: BuiltinKernel(name, tuple(k["shape_dims"]), tuple(k["parameters"]), tuple(k["constraints"]))
            for name, k in table.items()}


BUILTIN_KERNELS: dict[str, BuiltinKernel] = _load()
