"""Fixtures of the pipeline tests: `fresh_runtime` (no bundle loaded, no device detected, before and after a test),
not autouse here, for the modules that ask for it with pytestmark = pytest.mark.usefixtures("fresh_runtime")."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))

from bundle_fixtures import fresh_runtime_on_request  # noqa: E402,F401
