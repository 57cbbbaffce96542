"""Which devices may share a name: binned variants of one chip, told apart by their core counts.

The catalog's checks (data/catalog.py) and a bundle's registered devices (runtime/contents.py) hold names to the
same rule. Standard library only.
"""

from __future__ import annotations

from typing import Any


def binned_variants(name: Any, cores: Any, other_name: Any, other_cores: Any) -> bool:
    """Whether two devices are binned variants of one chip, which may share a name or alias: the same name, other
    core counts (detection tells them apart by cores)."""
    return name == other_name and cores != other_cores
