"""A throwaway kernel a process times once before anything it means to keep (harness.settle).

On the H100 the first custom kernel a process times reads fast until another custom kernel has been
timed: a 1.57 us swiglu launch read 1.22 us, whichever config came first, over 11 timings and after
idling, re-preparing its inputs or a large MLX op, and read 1.57 us once another config had been timed
(`python benchmarks/order_probe.py --scenario ...`, notes/collection.md). So a collect worker's first
config was often recorded as its case's best. Timing this kernel first takes that reading instead.
Not registered: it is never collected or learned from.
"""

from __future__ import annotations

from zmlx_pipeline.kernels.spec import KernelSpec, Launch, ShapeGrid

BODY = r"""
  const size_t i = (size_t)k_block_x * TG + (size_t)k_tid;
  if (i < (size_t)x_shape[0]) {
    float v[1];
    k_load<1>(x + i, v);
    v[0] = v[0] * 0.5f + 1.0f;
    k_store<1>(y + i, v);
  }
"""

CONFIG = {"TG": 64}
SHAPE = {"n": 4096}
DTYPE = "float32"


def _launch(config, shape):
    groups = -(-shape["n"] // config["TG"])
    return Launch(grid=(groups * config["TG"], 1, 1), threadgroup=(config["TG"], 1, 1), output_shapes=((shape["n"],),))


def _inputs(shape, dtype, key):
    import mlx.core as mx

    return [mx.random.normal((shape["n"],), key=key).astype(dtype)]


def _reference(inputs, shape):
    return [inputs[0] * 0.5 + 1.0]


SPEC = KernelSpec(
    name="zmlx_decoy",
    description="throwaway kernel timed once per process before any real timing (harness.settle)",
    kernel_class="elementwise",
    inputs=("x",),
    outputs=("y",),
    body=BODY,
    params={"TG": (64,)},
    constraints=("TG <= max_threads",),
    shape_grid=ShapeGrid(("n",), {"smoke": {"n": [SHAPE["n"]]}}),
    launch=_launch,
    make_inputs=_inputs,
    reference=_reference,
    bytes_moved=lambda s, b: 2.0 * s["n"] * b,
)
