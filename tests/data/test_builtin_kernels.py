"""data/importers/builtin_kernels.json is the registry's built-in kernels as data (data/ cannot import kernels/);
run this file as a script to rewrite it after a kernel's dims, parameters or constraints change."""

from __future__ import annotations

import json

from zmlx_pipeline.core.constraints import Limits
from zmlx_pipeline.data.importers.builtin_kernels import BUILTIN_KERNELS, TABLE
from zmlx_pipeline.kernels.registry import builtin_kernels

ABOUT = ("The built-in kernels' shape dims, parameters and constraints (KernelSpec.describe()), for data/ to "
         "check rows of their names against; written by tests/data/test_builtin_kernels.py, never by hand.")


def expected() -> dict:
    kernels = {}
    for spec in builtin_kernels():
        described = spec.describe()
        kernels[spec.name] = {"shape_dims": described["shape_dims"], "parameters": sorted(described["parameters"]),
                              "constraints": described["constraints"]}
    return {"about": ABOUT, "kernels": kernels}


def test_the_table_is_the_registrys_built_in_kernels():
    assert json.loads(TABLE.read_text(encoding="utf-8")) == expected(), (
        f"{TABLE} is out of date: run `python tests/data/test_builtin_kernels.py` to rewrite it")


def test_a_constraint_is_judged_as_the_kernel_spec_judges_it():
    spec = next(s for s in builtin_kernels() if s.name == "rmsnorm")
    kernel = BUILTIN_KERNELS["rmsnorm"]
    limits = Limits(max_threads=1024)
    shape = {"rows": 8, "cols": 4096}
    for config in ({"TG": 256, "ROWS": 1, "VEC": 4}, {"TG": 2048, "ROWS": 1, "VEC": 4}, {"TG": 256, "ROWS": 16, "VEC": 4},
                   {"TG": 256, "ROWS": 1, "VEC": 16}):
        broken = kernel.broken({**shape, **config, **limits.env("float16")})
        assert (broken is None) == (spec.violations(config, shape, "float16", limits) == [])
        assert broken is None or broken in spec.violations(config, shape, "float16", limits)
    # a name the row does not give leaves its constraints unjudged, as ConstraintSet does
    assert kernel.broken({**shape, "TG": 64, **limits.env("float16")}) is None
    assert kernel.broken({**shape, "TG": 999999, **limits.env("float16")}) == "TG <= max_threads"


if __name__ == "__main__":
    TABLE.write_text(json.dumps(expected(), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {TABLE}")
