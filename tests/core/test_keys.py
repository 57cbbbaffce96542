"""core/keys.py: identities of configs and shapes never depend on the order parameters are listed in."""

from __future__ import annotations

from zmlx_pipeline.core.keys import canonical_json, digest, mapping_key


def test_a_mapping_key_ignores_order_and_tells_values_apart():
    assert mapping_key({"TG": 256, "VEC": 4}) == mapping_key({"VEC": 4, "TG": 256})
    assert mapping_key({"TG": 256, "VEC": 4}) != mapping_key({"TG": 256, "VEC": 2})


def test_canonical_json_and_the_digest_format():
    assert canonical_json({"b": 1, "a": [1, "é"]}) == '{"a":[1,"\\u00e9"],"b":1}'
    key = digest("x", length=12)
    assert key.startswith("sha256:") and len(key) == len("sha256:") + 12
