"""Fixtures of the runtime tests: small real bundles (see bundle_fixtures.py), a clean runtime per test, real zmlx."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from bundle_fixtures import fresh_runtime, real_bundle, toy_bundle  # noqa: E402,F401


@pytest.fixture
def zmlx():
    """The real `zmlx` package (test extra): its autotune, device and device_profile modules, imported for one
    test and unloaded after it. Off an Apple Mac its package object raises RuntimeError, not AttributeError,
    for a name it lacks, which breaks any later code that scans sys.modules (pickle's and skops's whichmodule)."""
    import importlib
    import types

    modules = types.SimpleNamespace(**{name: importlib.import_module(f"zmlx.{name}")
                                       for name in ("autotune", "device", "device_profile")})
    yield modules
    for name in [n for n in sys.modules if n == "zmlx" or n.startswith("zmlx.")]:
        del sys.modules[name]
