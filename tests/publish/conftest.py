"""Fixtures of the publish tests: the runtime tests' small bundles and a clean runtime per test."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))

from bundle_fixtures import fresh_runtime, real_bundle, toy_bundle  # noqa: E402,F401
