"""Kernel inputs of 8 bytes or fewer are moved out of MLX CUDA's managed small pool, values unchanged."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from zmlx_pipeline.kernels import harness
from zmlx_pipeline.kernels.registry import get_kernel

MOE_DECODE = {"tokens": 1, "k": 2, "hidden": 4096}  # w is [1, 2]: 4 bytes in 16-bit, 8 in float32


def test_small_arrays_become_equal_views_and_big_ones_pass_through():
    big = mx.arange(16, dtype=mx.float16).reshape(2, 8)            # 32 bytes
    small = [mx.array([[0.25, 0.75]], dtype=mx.float16),            # 4 bytes
             mx.array([[0.25, 0.75]], dtype=mx.float32),            # 8 bytes: still the pool's
             mx.array([7], dtype=mx.int32),
             mx.array([1.5, 2.5, 3.5, 4.5], dtype=mx.bfloat16)]     # 8 bytes
    edge = mx.array([1.0, 2.0, 3.0, 4.0], dtype=mx.float32)         # 16 bytes: left alone
    empty = mx.zeros((0, 3), dtype=mx.float32)
    out = harness.device_resident([big, *small, edge, empty])
    assert out[0] is big and out[-2] is edge and out[-1] is empty
    for before, after in zip(small, out[1:-2]):
        assert after is not before
        assert after.shape == before.shape and after.dtype == before.dtype
        assert np.array_equal(np.array(after.astype(mx.float32)), np.array(before.astype(mx.float32)))


def test_make_inputs_draws_what_the_kernel_draws():
    spec = get_kernel("moe_combine")
    for dtype in ("float16", "float32"):
        ours = harness.make_inputs(spec, MOE_DECODE, dtype, mx.random.key(3))
        theirs = spec.make_inputs(MOE_DECODE, harness.mx_dtype(dtype), mx.random.key(3))
        assert [a.shape for a in ours] == [a.shape for a in theirs]
        for a, b in zip(ours, theirs):
            assert np.array_equal(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)))


@pytest.fixture
def spy(monkeypatch):
    calls = []
    real = harness.device_resident

    def wrapped(arrays):
        calls.append([a.nbytes for a in arrays])
        return real(arrays)

    monkeypatch.setattr(harness, "device_resident", wrapped)
    return calls


def test_every_input_the_harness_draws_goes_through_it(spy):
    spec = get_kernel("moe_combine")
    prepared = harness.prepare(spec, MOE_DECODE, "float16", seed=1, rotate_bytes=3 * 16 * 1024)
    assert len(spy) == 1 + len(prepared.sets) and len(prepared.sets) > 1   # check inputs, then each timing set
    assert all(sizes[1] == 4 for sizes in spy)                              # w, in the pool's range
    spy.clear()
    harness.input_sets(spec, MOE_DECODE, "float32", seed=1, rotate_bytes=0)
    assert spy == [[2 * 4096 * 4, 8]]
