"""Fixtures of the runtime tests: small real bundles (see bundle_fixtures.py) and a clean runtime per test."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bundle_fixtures import fresh_runtime, real_bundle, toy_bundle  # noqa: E402,F401
