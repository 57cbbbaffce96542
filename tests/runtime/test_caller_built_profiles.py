"""A DeviceTuningProfile built or replaced by the caller (dataclasses.replace, as ZMLX code does) with a field the
runtime cannot use is refused in one line with the runtime's own errors, when it is made and when it is used."""

import dataclasses

import pytest

from zmlx_pipeline.runtime import (
    BadArgument,
    BadArgumentType,
    DeviceTuningProfile,
    get_device_profile,
    get_threadgroup_candidates_for_shape,
)


@pytest.mark.parametrize("field, value, error, says", [
    ("threadgroup_candidates", None, BadArgumentType, "threadgroup_candidates must be threadgroup sizes"),
    ("threadgroup_candidates", 256, BadArgumentType, "threadgroup_candidates must be threadgroup sizes"),
    ("threadgroup_candidates", "256", BadArgumentType, "threadgroup_candidates must be threadgroup sizes"),
    ("threadgroup_candidates", (128, "x"), BadArgumentType, "a threadgroup candidate must be a whole number"),
    ("threadgroup_candidates", (128, 0), BadArgument, "a threadgroup candidate must be >= 1"),
    ("default_threadgroup", None, BadArgumentType, "default_threadgroup must be a whole number"),
    ("simd_width", 0, BadArgument, "simd_width must be >= 1"),
    ("max_threads_per_threadgroup", 1024.5, BadArgumentType, "max_threads_per_threadgroup must be a whole number"),
    ("learned", 5, BadArgumentType, "learned must be a mapping"),
])
def test_a_replaced_field_the_runtime_cannot_use_is_refused_in_one_line(field, value, error, says):
    profile = get_device_profile("nvidia-h200")
    with pytest.raises(error) as info:
        dataclasses.replace(profile, **{field: value})
    assert str(info.value).startswith(says) and "\n" not in str(info.value)


@pytest.mark.parametrize("learned", [{"general": 5}, {"general": {"by_dim": {"x": [128]}}},
                                     {"general": {"by_dim": {"12": [None]}}}, {"classes": [1, 2]}])
def test_learned_tables_the_runtime_cannot_read_are_refused_when_used(learned):
    profile = dataclasses.replace(get_device_profile("nvidia-h200"), learned=learned)
    with pytest.raises(BadArgumentType) as info:
        get_threadgroup_candidates_for_shape(profile, 4096, "general")
    assert "learned" in str(info.value) and "\n" not in str(info.value)


def test_a_profile_built_as_zmlx_builds_one_still_works():
    mine = DeviceTuningProfile(family="M9", variant="", gpu_cores=12, memory_bandwidth_gbps=200, default_threadgroup=256)
    assert get_threadgroup_candidates_for_shape(mine, 1024) == (128, 256)
    tuned = dataclasses.replace(get_device_profile("M3", "Max"), threadgroup_candidates=[256, 512])
    assert tuned.threadgroup_candidates == (256, 512)
