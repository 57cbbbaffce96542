"""config_id and remember_refusal given a config that is not a mapping (None, a list, a string): the runtime's
BadArgumentType in one line, never Python's TypeError, and no refusal kept or written to the cache file."""

from __future__ import annotations

import pytest

from zmlx_pipeline.runtime import BadArgumentType, RuntimeAPIError
from zmlx_pipeline.runtime.tuner import config_id, forget_refusals, refused_configs, remember_refusal


@pytest.mark.parametrize("config, says", [
    (None, "NoneType (None)"), ([1, 2], "list ([1, 2])"), ("TG=256", "str ('TG=256')"), (256, "int (256)"),
])
def test_a_config_that_is_not_a_mapping_is_refused(config, says, tmp_path):
    message = f"a config must be a mapping of parameter names to values, not {says}"
    with pytest.raises(BadArgumentType) as exc:
        config_id(config)
    assert isinstance(exc.value, RuntimeAPIError) and str(exc.value) == message
    cache = tmp_path / "autotune.json"
    forget_refusals()
    with pytest.raises(BadArgumentType) as exc:
        remember_refusal("rmsnorm", "nvidia-h200", config, "launch failed", cache_path=str(cache))
    assert str(exc.value) == message
    forget_refusals()
    assert not cache.exists() and refused_configs("rmsnorm", "nvidia-h200", str(cache)) == set()


def test_a_mapping_still_has_its_identity():
    assert config_id({"VEC": 4, "TG": (256,)}) == '{"TG":[256],"VEC":4}'
