"""Canonical identities for configs, shapes and sources: a hash of sorted-key JSON, never of parameter order."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Mapping

from zmlx_pipeline.core.errors import ZmlxPipelineError

HASH_PREFIX = "sha256:"


class RepeatedJSONKey(ZmlxPipelineError):
    "A JSON object names a key twice (json would keep the last value, silently); args[0] is the first such key"


def unique_keys(pairs: list, dict: type = dict, len: Callable = len) -> dict:
    """json's object_pairs_hook: the object's pairs as a dict, RepeatedJSONKey naming the first key named twice.
    Bundle files and shards' JSON columns are read through it (neither writer repeats a key)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set = set()
        raise RepeatedJSONKey(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return obj


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace, so equal mappings give equal text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def digest(text: str, length: int = 16) -> str:
    """A prefixed sha256 of `text`, cut to `length` hex digits (the prefix names the hash)."""
    return HASH_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:length]


def mapping_key(mapping: Mapping[str, Any]) -> str:
    """Identity of a config or shape: independent of the order its parameters are listed in."""
    return digest(canonical_json(dict(mapping)))
