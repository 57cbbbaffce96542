"""Check one config of a kernel on the CPU: its Metal source built and run on inputs from the kernel's
own factory, outputs compared with the kernel's reference by the collector's own comparison.

The parent process draws inputs and references with mlx on the CPU; building and running happen in a
worker process (`run_library`), so a kernel that crashes fails its case instead of the test session.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from zmlx_pipeline.kernels import harness
from zmlx_pipeline.kernels.spec import KernelSpec

from metal_cpu import build, mlx_source

#: Apple GPUs' threadgroup memory (the catalog's tg_mem_bytes for every Apple device)
APPLE_TG_MEM_BYTES = 32768

_NP_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class Case:
    """Everything a worker needs to build and run one launch: plain data, picklable."""

    tu: str
    buffers: tuple[bytes, ...]  # in MLX's buffer order
    outputs: tuple[int, ...]  # indices into buffers of the outputs
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    tg_mem_bytes: int


@dataclass(frozen=True)
class Result:
    status: str  # ok, compile_error, launch_error or wrong_result
    detail: str = ""


def run_library(case: Case) -> tuple[str, str, list[bytes]]:
    """(status, error, output bytes): build the case's library and run its dispatch once."""
    try:
        lib_path = build.build(case.tu)
    except build.BuildError as exc:
        return "compile_error", str(exc), []
    lib = ctypes.CDLL(str(lib_path))
    bufs = [ctypes.create_string_buffer(b, max(len(b), 1)) for b in case.buffers]
    ptrs = (ctypes.c_void_p * max(len(bufs), 1))(*[ctypes.cast(b, ctypes.c_void_p) for b in bufs])
    err = ctypes.create_string_buffer(1024)
    rc = lib.zp_launch(ptrs, (ctypes.c_long * 3)(*case.grid), (ctypes.c_long * 3)(*case.threadgroup),
                       ctypes.c_long(case.tg_mem_bytes), err, ctypes.c_int(len(err)))
    if rc != 0:
        return "launch_error", err.value.decode(errors="replace"), []
    return "ok", "", [bufs[i].raw[: len(case.buffers[i])] for i in case.outputs]


def _bytes(array) -> bytes:
    import mlx.core as mx

    bits = _NP_BITS[array.itemsize]
    return np.ascontiguousarray(np.array(array.view(getattr(mx, bits.__name__)))).tobytes()


def _array(raw: bytes, dtype: str, shape):
    import mlx.core as mx

    itemsize = np.dtype(np.float32).itemsize if dtype in ("float32", "int32", "uint32") else 2
    bits = np.frombuffer(raw, dtype=_NP_BITS[itemsize]).reshape(shape)
    return mx.array(bits).view(getattr(mx, dtype))


def prepare(spec: KernelSpec, config: Mapping[str, int], shape: Mapping[str, int], dtype: str, seed: int = 0,
            transform: Callable[[str], str] | None = None):
    """(Case, reference outputs, output dtypes, Launch): the launch `metal_kernel` would make, on fresh inputs.

    `transform` edits the generated Metal source (header + signature + body) before it is built.
    """
    import mlx.core as mx

    inputs = harness.make_inputs(spec, shape, dtype, mx.random.key(seed))
    refs = spec.reference(inputs, shape)
    mx.eval(inputs, refs)
    launch = spec.launch(config, shape)
    out_dtypes = [d or dtype for d in (launch.output_dtypes or (None,) * len(spec.outputs))]
    in_meta = [(str(a.dtype).removeprefix("mlx.core."), tuple(a.shape)) for a in inputs]
    template = [("T", dtype)] + [(k, int(v)) for k, v in config.items()]
    name = "zp_" + spec.name
    text, params = mlx_source.metal_source(name, list(spec.inputs), in_meta, list(spec.outputs), out_dtypes,
                                           spec.source("metal"), spec.header("metal"), template)
    if transform is not None:
        text = transform(text)
    call = mlx_source.kernel_name(name, template) + mlx_source.write_template(template)
    poison = harness.poison_for(spec, config, shape)
    buffers, outputs = [], []
    for p in params:
        if p.kind == "input":
            buffers.append(_bytes(inputs[p.array]))
        elif p.kind == "shape":
            buffers.append(np.array(inputs[p.array].shape, dtype=np.int32).tobytes())
        elif p.kind == "strides":
            a = inputs[p.array]
            strides = [int(np.prod(a.shape[i + 1:])) for i in range(a.ndim)]
            buffers.append(np.array(strides, dtype=np.int64).tobytes())
        elif p.kind == "ndim":
            buffers.append(np.array(inputs[p.array].ndim, dtype=np.int32).tobytes())
        elif p.kind == "output":
            o = mx.full(launch.output_shapes[p.array], poison, dtype=getattr(mx, out_dtypes[p.array]))
            outputs.append(len(buffers))
            buffers.append(_bytes(o))
    case = Case(build.translation_unit(text, call, params), tuple(buffers), tuple(outputs),
                tuple(launch.grid), tuple(launch.threadgroup), APPLE_TG_MEM_BYTES)
    return case, refs, out_dtypes, launch


def judge(spec: KernelSpec, dtype: str, refs, out_dtypes, launch, ran: tuple[str, str, list[bytes]]) -> Result:
    """The case's result from what the worker returned: its status, or the comparison with the reference."""
    status, error, raw = ran
    if status != "ok":
        return Result(status, error)
    outs = [_array(r, d, s) for r, d, s in zip(raw, out_dtypes, launch.output_shapes)]
    why = harness.compare(spec, outs, refs, dtype)
    return Result("wrong_result", why) if why else Result("ok")
