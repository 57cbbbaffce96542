"""The benchmark scripts under benchmarks/ as modules, for the tests of their functions (they are scripts,
not a package: loaded by path)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def script_path(name: str) -> Path:
    """benchmarks/<name>.py."""
    return BENCHMARKS / f"{name}.py"


def load(name: str) -> ModuleType:
    """benchmarks/<name>.py, executed as a fresh module named `name`."""
    spec = importlib.util.spec_from_file_location(name, script_path(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
