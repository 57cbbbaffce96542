"""core/constraints.py: the one constraint grammar (no eval) and the device limits kernels and the runtime share."""

from __future__ import annotations

import pytest

from zmlx_pipeline.core.constraints import ConstraintSet, Limits, UnsafeConstraint, compile_constraint, limit_values
from zmlx_pipeline.core.errors import ZmlxPipelineError


def test_arithmetic_comparisons_and_min_max_evaluate():
    check = compile_constraint("TG % ROWS == 0 and min(TG, cols) <= max_threads")
    assert check({"TG": 256, "ROWS": 4, "cols": 4096, "max_threads": 1024})
    assert not check({"TG": 256, "ROWS": 3, "cols": 4096, "max_threads": 1024})


@pytest.mark.parametrize("text", ["__import__('os').system('x')", "TG.bit_length()", "[TG for TG in x]", "lambda: 1"])
def test_anything_but_arithmetic_is_refused(text):
    with pytest.raises(UnsafeConstraint) as caught:
        compile_constraint(text)
    assert isinstance(caught.value, ZmlxPipelineError) and isinstance(caught.value, ValueError)


def test_a_set_skips_unsafe_text_and_cannot_judge_a_missing_name():
    rules = ConstraintSet(["TG <= max_threads", "open('x')", "VEC * TG <= cols"])
    assert rules.skipped == ["open('x')"]
    assert rules.legal({"TG": 512}, {"cols": 4096}, {"max_threads": 1024})  # VEC unknown: not judged
    assert not rules.legal({"TG": 2048, "VEC": 1}, {"cols": 4096}, {"max_threads": 1024})


def test_limits_of_a_device_row_and_apples_for_a_silent_one():
    row = {"max_threads_per_threadgroup": 1024, "simd_width": 32, "threadgroup_memory_bytes": 49152,
           "architecture": "sm_90a"}
    assert Limits.from_device_row(row) == Limits(1024, 32, 49152, 90)
    assert Limits.from_device_row(None) == Limits(**limit_values({})) == Limits(1024, 32, 32768, 0)
    assert Limits().env("bfloat16")["dtype_bytes"] == 2
