"""Importing the runtime loads none of the heavy libraries (it ships inside other projects)."""

import json
import subprocess
import sys

HEAVY = ("duckdb", "polars", "sklearn", "pyarrow", "numpy", "mlx")


def test_importing_the_runtime_loads_no_heavy_library(subprocess_env):
    code = (
        "import sys, json\n"
        "import zmlx_pipeline.runtime as rt\n"
        "for name in rt.__all__:\n"
        "    getattr(rt, name)  # every part, each imported on first use\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env, check=True)
    assert json.loads(out.stdout) == []


def test_a_lookup_from_the_default_bundle_loads_no_heavy_library(subprocess_env):
    code = (
        "import sys, json\n"
        "from zmlx_pipeline.runtime import predicted_config\n"
        "p = predicted_config('rmsnorm', {'rows': 4096, 'cols': 4096}, 'float16', device='nvidia-h200')\n"
        f"print(json.dumps([p.evidence, sorted(m for m in {HEAVY!r} if m in sys.modules)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env, check=True)
    evidence, loaded = json.loads(out.stdout)
    assert evidence in ("measured", "predicted")
    assert loaded == []


def test_every_export_is_the_named_object_whatever_was_imported_first(subprocess_env):
    # a submodule named like an export (runtime/autotune.py beside the `autotune` decorator) replaced the
    # package attribute once anything imported the submodule first: `from ... import autotune` gave a module
    code = (
        "import importlib, json, pkgutil\n"
        "import zmlx_pipeline.runtime as rt\n"
        "for m in pkgutil.iter_modules(rt.__path__):\n"
        "    importlib.import_module('zmlx_pipeline.runtime.' + m.name)\n"
        "print(json.dumps(sorted(n for n in rt.__all__ if type(getattr(rt, n)).__name__ == 'module')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env, check=True)
    assert json.loads(out.stdout) == []
