"""Canonical identities for configs, shapes and sources: a hash of sorted-key JSON, never of parameter order."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

HASH_PREFIX = "sha256:"


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace, so equal mappings give equal text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def digest(text: str, length: int = 16) -> str:
    """A prefixed sha256 of `text`, cut to `length` hex digits (the prefix names the hash)."""
    return HASH_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:length]


def mapping_key(mapping: Mapping[str, Any]) -> str:
    """Identity of a config or shape: independent of the order its parameters are listed in."""
    return digest(canonical_json(dict(mapping)))
