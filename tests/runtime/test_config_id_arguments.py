"""config_id and remember_refusal given a config that is not a mapping (None, a list, a string), and
refused_configs and remember_refusal given a kernel, device key or error that is not text: the runtime's
BadArgumentType in one line, never Python's TypeError nor an empty answer, and no refusal kept or written to the
cache file."""

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


@pytest.mark.parametrize("kernel, dkey, says", [
    (5, "nvidia-h200", "kernel must be a string, not int (5)"),
    (None, "nvidia-h200", "kernel must be a string, not NoneType (None)"),
    ("rmsnorm", b"nvidia-h200", "dkey must be a string, not bytes (b'nvidia-h200')"),
])
def test_refused_configs_of_a_kernel_or_device_that_is_not_text_is_refused(kernel, dkey, says, tmp_path):
    forget_refusals()
    with pytest.raises(BadArgumentType) as exc:
        refused_configs(kernel, dkey, str(tmp_path / "autotune.json"))
    assert str(exc.value) == says
    with pytest.raises(BadArgumentType) as exc:
        remember_refusal(kernel, dkey, {"TG": 256}, "launch failed", cache_path=str(tmp_path / "autotune.json"))
    assert str(exc.value) == says
    with pytest.raises(BadArgumentType) as exc:
        refused_configs("rmsnorm", "nvidia-h200", 5)
    assert str(exc.value) == "cache_path must be a file path or None, not int (5)"
    assert not (tmp_path / "autotune.json").exists()


@pytest.mark.parametrize("error, says", [
    (None, "NoneType (None)"), (RuntimeError("launch failed"), "RuntimeError (RuntimeError('launch failed'))"),
    (b"launch failed", "bytes (b'launch failed')"),
])
def test_a_refusal_whose_error_is_not_text_is_refused_keeping_nothing(error, says, tmp_path):
    cache = tmp_path / "autotune.json"
    forget_refusals()
    with pytest.raises(BadArgumentType) as exc:
        remember_refusal("rmsnorm", "nvidia-h200", {"TG": 256}, error, cache_path=str(cache))
    assert isinstance(exc.value, RuntimeAPIError) and str(exc.value) == f"error must be a string, not {says}"
    assert not cache.exists() and refused_configs("rmsnorm", "nvidia-h200", str(cache)) == set()
    assert remember_refusal("rmsnorm", "nvidia-h200", {"TG": 256}, "launch failed", cache_path=str(cache)) == ""
    assert refused_configs("rmsnorm", "nvidia-h200", str(cache)) == {'{"TG":256}'}
