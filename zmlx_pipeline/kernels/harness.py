"""Launch, validate, time: one config of one kernel on one shape and dtype, with every failure a status."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from zmlx_pipeline.core.constraints import pipeline_thread_limit, refusal_text
from zmlx_pipeline.core.dtypes import DTYPE_BYTES
from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.kernels.spec import KernelSpec
from zmlx_pipeline.kernels.timing import Timing, time_gpu, time_launches

#: fills float outputs before a checked launch, so an element the kernel never wrote cannot pass
POISON_FLOAT = float("nan")
#: the fill when some output is an integer (NaN has no integer value)
POISON_INT = -31337.0

_COMPILE_MARKERS = ("compil", "nvrtc", "unable to build metal library", "error: ", "ptxas", "jit")

_settled = False  # whether this process has timed the decoy kernel yet (settle)
_DECOYS: dict = {}  # backend -> the decoy's Launcher, compiled once per process


class NoGpuBackend(ZmlxPipelineError, RuntimeError):
    """MLX has no Metal or CUDA backend here, and custom kernels need one"""


class GpuUnhealthy(ZmlxPipelineError, RuntimeError):
    """The GPU no longer runs even a trivial op (a failed launch left the context broken)"""


class TimerFailed(GpuUnhealthy):
    """The gpu timer read nothing from CUPTI: every later config would fail alike, so stop"""


@dataclass(frozen=True)
class Outcome:
    """What measuring one config gave: a status, and a timing when the status is ok."""

    status: str
    timing: Timing | None = None
    error: str | None = None


#: MLX's CUDA allocator serves allocations of at most this many bytes from a small pool of managed
#: (unified) memory (mlx/backend/cuda/allocator.cpp: small_block_size, MLX 0.32)
SMALL_POOL_BYTES = 8


def in_small_pool(array) -> bool:
    """Whether MLX CUDA would allocate this array (evaluated or not) from its managed small pool."""
    return 0 < array.nbytes <= SMALL_POOL_BYTES


def device_resident(arrays: list) -> list:
    """The arrays, each of at most SMALL_POOL_BYTES bytes swapped for an equal view into a larger buffer,
    so that no kernel input sits in MLX CUDA's managed small pool: a kernel reading from there pays page
    migrations (moe_combine's router weights at one token and k * dtype bytes <= 8 read 1.6-18 us for a
    2.9 us kernel, config for config at random). Values, shapes and dtypes are unchanged."""
    import mlx.core as mx

    out = []
    for a in arrays:
        if in_small_pool(a):
            pad = mx.zeros((2 * SMALL_POOL_BYTES // a.itemsize,), dtype=a.dtype)
            a = mx.concatenate([a.reshape(-1), pad])[: a.size].reshape(a.shape)
        out.append(a)
    return out


def make_inputs(spec: KernelSpec, shape, dtype: str, key) -> list:
    """spec.make_inputs, every input kept out of MLX CUDA's managed small pool (device_resident)."""
    return device_resident(list(spec.make_inputs(shape, mx_dtype(dtype), key)))


def rotate_bytes_for(device_row: Mapping[str, Any] | None) -> int:
    """Bytes of distinct inputs a timing rotates through on this device: twice its L2 (0 when
    unknown), so a kernel is timed reading memory, not a warm cache. Collect, repeats and the
    runtime tuner all time this way, so their timings rank configs alike."""
    return 2 * int((device_row or {}).get("l2_bytes") or 0)


def mx_dtype(name: str):
    import mlx.core as mx

    return getattr(mx, name)


def classify_error(exc: BaseException) -> str:
    """compile_error for a source the JIT rejected, launch_error for anything else that raised (a
    threadgroup over the compiled pipeline's thread limit among them: it compiled, the launch was refused)."""
    text = str(exc).lower()
    if pipeline_thread_limit(text):
        return "launch_error"
    return "compile_error" if any(m in text for m in _COMPILE_MARKERS) else "launch_error"


def short_error(exc: BaseException, limit: int = 400) -> str:
    """The first meaningful line(s) of an exception, bounded, for the error column; a launch refused for the
    pipeline's thread limit starts with that limit (constraints.refusal_text)."""
    return refusal_text(exc, limit)


class Launcher:
    """A kernel compiled for one backend; calling it launches one config (compiled once per config and dtype)."""

    def __init__(self, spec: KernelSpec, backend: str, precompiled: bool | None = None):
        """`precompiled`: on CUDA, launch through the compiled-kernel cache (kernels/compiled.py): None
        where it can run here, False never (every config compiled by mx.fast.cuda_kernel)."""
        import mlx.core as mx

        factories = {"cuda": getattr(mx.fast, "cuda_kernel", None), "metal": getattr(mx.fast, "metal_kernel", None)}
        if factories.get(backend) is None:
            raise NoGpuBackend(f"no {backend} kernel support in this MLX build")
        self.spec = spec
        self.backend = backend
        self.name = "zp_" + re.sub(r"\W", "_", spec.name) + "_" + spec.version.split(":")[-1]
        # MLX names the compiled CUDA kernel custom_kernel_<name>_<template args>
        self.kernel_name_part = f"custom_kernel_{self.name}_"
        self._factory = factories[backend]
        self._kernels: dict[int, Any] = {}
        self.kernel = self.kernel_for(0)
        self.compiler = None
        if backend == "cuda" and precompiled is not False:
            from zmlx_pipeline.kernels import compiled

            self.compiler = compiled.process_compiler()
        self._programs: dict[tuple, tuple[str, bytes] | None] = {}  # (template, signature, outputs) -> (name, ptx)

    def kernel_for(self, shared_memory: int):
        """The MLX kernel object launching with this much dynamic shared memory (CUDA fixes it per
        object; each config's compiled kernel has its own name, so one size per config)."""
        if shared_memory not in self._kernels:
            extra = {"shared_memory": shared_memory} if shared_memory else {}
            self._kernels[shared_memory] = self._factory(
                name=self.name,
                input_names=list(self.spec.inputs),
                output_names=list(self.spec.outputs),
                source=self.spec.source(self.backend),
                header=self.spec.header(self.backend),
                ensure_row_contiguous=True,
                **extra,
            )
        return self._kernels[shared_memory]

    def __call__(self, inputs, config: Mapping[str, int], shape: Mapping[str, int], dtype: str, init_value=None):
        return self.bind(config, shape, dtype, init_value)(inputs)

    def bind(self, config: Mapping[str, int], shape: Mapping[str, int], dtype: str, init_value=None):
        """A function of the inputs that launches this config: the launch geometry is worked out once,
        so a timed chain of many launches spends its Python time in MLX, not here."""
        launch = self.spec.launch(config, shape)
        n_out = len(self.spec.outputs)
        names = launch.output_dtypes or (None,) * n_out
        kwargs: dict[str, Any] = {
            "template": [("T", mx_dtype(dtype))] + [(k, int(v)) for k, v in config.items()],
            "grid": tuple(launch.grid),
            "threadgroup": tuple(launch.threadgroup),
            "output_shapes": [tuple(s) for s in launch.output_shapes],
            "output_dtypes": [mx_dtype(d or dtype) for d in names],
        }
        if init_value is not None:
            kwargs["init_value"] = init_value
        shared_memory = self.spec.shared_memory_bytes(config, dtype, self.backend)
        kernel = self.kernel_for(shared_memory)

        def plain(inputs):
            return kernel(inputs=list(inputs), **kwargs)

        if self.compiler is None:
            return plain
        return self._bind_precompiled(kwargs, shared_memory, plain)

    def _out_dtypes(self, kwargs) -> tuple[str, ...]:
        from zmlx_pipeline.kernels.compiled import dtype_name

        return tuple(dtype_name(d) for d in kwargs["output_dtypes"])

    def _program(self, template, signature, out_dtypes) -> tuple[str, str]:
        """(kernel name, full program text) of one launch signature (compiled.program)."""
        from zmlx_pipeline.kernels import compiled

        name = compiled.launch_name(self.name, template, signature, out_dtypes)
        return name, compiled.program(name, self.spec.header(self.backend), self.spec.source(self.backend),
                                      self.spec.inputs, self.spec.outputs, signature, out_dtypes, template)

    def _resolve(self, template, signature, out_dtypes) -> tuple[str, bytes] | None:
        """(name, PTX) from the cache (compiling on a miss), or None: cuda_kernel launches this one."""
        from zmlx_pipeline.kernels.compiled import PrecompiledUnsupported
        from zmlx_pipeline.kernels.nvrtc import NvrtcCompileError, NvrtcUnavailable

        key = (tuple(template), tuple(signature), tuple(out_dtypes))
        if key not in self._programs:
            try:
                name, text = self._program(template, signature, out_dtypes)
                self._programs[key] = (name, self.compiler.program(text, name))
            except (PrecompiledUnsupported, NvrtcCompileError, NvrtcUnavailable, KeyError, OSError):
                # cuda_kernel compiles it instead and reports its own error, if any
                self._programs[key] = None
        return self._programs[key]

    def precompile(self, items, workers: int | None = None) -> int:
        """Compile ahead, in parallel threads, every (config, shape, dtype, inputs) in `items`, so their
        first launches load cached PTX; returns how many programs are ready (0 without the compiled path)."""
        if self.compiler is None:
            return 0
        from zmlx_pipeline.kernels.compiled import PrecompiledUnsupported, input_signature

        jobs: dict[tuple, tuple[str, str]] = {}
        for config, shape, dtype, inputs in items:
            kwargs = self._launch_kwargs(config, shape, dtype)
            key = (tuple(kwargs["template"]), input_signature(inputs), self._out_dtypes(kwargs))
            if key in self._programs or key in jobs:
                continue
            try:
                jobs[key] = self._program(*key)
            except (PrecompiledUnsupported, KeyError):
                self._programs[key] = None
        got = self.compiler.programs([(text, name) for name, text in jobs.values()], workers)
        for key, (name, _), ptx in zip(jobs, jobs.values(), got):
            self._programs[key] = None if isinstance(ptx, BaseException) else (name, ptx)
        return sum(v is not None for v in self._programs.values())

    def _launch_kwargs(self, config, shape, dtype) -> dict[str, Any]:
        launch = self.spec.launch(config, shape)
        names = launch.output_dtypes or (None,) * len(self.spec.outputs)
        return {"template": [("T", mx_dtype(dtype))] + [(k, int(v)) for k, v in config.items()],
                "output_dtypes": [mx_dtype(d or dtype) for d in names]}

    def _bind_precompiled(self, kwargs, shared_memory: int, plain):
        """A launch function through mx.fast.precompiled_cuda_kernel, falling back to `plain` (cuda_kernel)
        for a signature the compiled path cannot build."""
        import mlx.core as mx

        from zmlx_pipeline.kernels.compiled import input_signature, shape_inputs, shape_scalars

        fast = mx.fast.precompiled_cuda_kernel
        template, out_dtypes = kwargs["template"], self._out_dtypes(kwargs)
        uses = shape_inputs(self.spec.source(self.backend), self.spec.inputs)
        extra = {k: kwargs[k] for k in ("init_value",) if k in kwargs}
        resolved: dict[tuple, tuple[str, bytes] | None] = {}

        def launch(inputs):
            signature = input_signature(inputs)
            if signature not in resolved:
                resolved[signature] = self._resolve(template, signature, out_dtypes)
            entry = resolved[signature]
            if entry is None:
                return plain(inputs)
            name, ptx = entry
            return fast(name=name, compiled_source=ptx, inputs=list(inputs), output_shapes=kwargs["output_shapes"],
                        output_dtypes=kwargs["output_dtypes"], scalars=shape_scalars(uses, inputs),
                        grid=kwargs["grid"], threadgroup=kwargs["threadgroup"], shared_memory=shared_memory,
                        ensure_row_contiguous=True, **extra)

        return launch


def compare(spec: KernelSpec, outs, refs, dtype: str) -> str | None:
    """None when every output matches its reference at the dtype's tolerance, else why not."""
    import mlx.core as mx

    rtol, atol = spec.tolerance_for(dtype)
    if len(outs) != len(refs):
        return f"kernel gave {len(outs)} outputs, reference {len(refs)}"
    for name, o, r in zip(spec.outputs, outs, refs):
        if tuple(o.shape) != tuple(r.shape):
            return f"{name}: shape {tuple(o.shape)} != reference {tuple(r.shape)}"
        if mx.issubdtype(r.dtype, mx.integer) or mx.issubdtype(o.dtype, mx.integer):
            bad = int(mx.sum(o.astype(mx.int64) != r.astype(mx.int64)).item())
            if bad:
                return f"{name}: {bad} of {r.size} integer elements differ from the reference"
            continue
        of, rf = o.astype(mx.float32), r.astype(mx.float32)
        unwritten = int(mx.sum(mx.isnan(of) & ~mx.isnan(rf)).item())
        if unwritten:
            return f"{name}: {unwritten} of {r.size} elements unwritten or NaN"
        close = mx.isclose(of, rf, rtol=rtol, atol=atol)
        bad = int(mx.sum(~close).item())
        if bad:
            err = float(mx.max(mx.abs(of - rf)).item())
            return f"{name}: {bad} of {r.size} elements off the reference (max abs error {err:.3g}, rtol {rtol:g}, atol {atol:g})"
    return None


def poison_for(spec: KernelSpec, config, shape) -> float:
    launch = spec.launch(config, shape)
    if launch.output_dtypes and any(d and d.startswith(("int", "uint")) for d in launch.output_dtypes):
        return POISON_INT
    return POISON_FLOAT


@dataclass
class Prepared:
    """Inputs shared by every config of one (kernel, shape, dtype): random check inputs with their
    reference outputs, and the input sets timing rotates through. Building them once per shape
    instead of once per config keeps a collect's time on the kernels, not on random numbers."""

    check_inputs: list
    refs: list
    sets: list


def prepare(spec: KernelSpec, shape, dtype: str, seed: int, rotate_bytes: int) -> Prepared:
    """Draw check inputs (seeded per shape and dtype, never zeros), their reference, and timing sets."""
    import mlx.core as mx

    inputs = make_inputs(spec, shape, dtype, mx.random.key(seed))
    refs = spec.reference(inputs, shape)
    mx.eval(inputs, refs)
    return Prepared(inputs, refs, input_sets(spec, shape, dtype, seed, rotate_bytes))


def check(launcher: Launcher, config, shape, dtype: str, seed: int, prepared: Prepared | None = None) -> str | None:
    """Run one config on random inputs into poisoned outputs; None when it matches the reference."""
    import mlx.core as mx

    spec = launcher.spec
    if prepared is None:
        inputs = make_inputs(spec, shape, dtype, mx.random.key(seed))
        refs = spec.reference(inputs, shape)
    else:
        inputs, refs = prepared.check_inputs, prepared.refs
    outs = launcher(inputs, config, shape, dtype, init_value=poison_for(spec, config, shape))
    mx.eval(outs, refs)
    return compare(spec, outs, refs, dtype)


def gpu_healthy() -> bool:
    """Whether a trivial op still evaluates (after a failed launch a CUDA context can stay broken)."""
    import mlx.core as mx

    try:
        mx.eval(mx.arange(8) + 1)
        mx.synchronize()
        return True
    except Exception:  # noqa: BLE001 - any failure means the device is unusable
        return False


def input_set_count(spec: KernelSpec, shape, dtype: str, rotate_bytes: int, max_sets: int = 4) -> int:
    """How many input sets timing rotates through: enough to move rotate_bytes, at most max_sets."""
    size = max(1.0, float(spec.bytes_moved(shape, DTYPE_BYTES[dtype])))
    return int(max(1, min(max_sets, math.ceil(rotate_bytes / size))))


def input_sets(spec: KernelSpec, shape, dtype: str, seed: int, rotate_bytes: int, max_sets: int = 4) -> list:
    """Enough distinct input sets that rotating through them does not just time the cache."""
    import mlx.core as mx

    n = input_set_count(spec, shape, dtype, rotate_bytes, max_sets)
    sets = [make_inputs(spec, shape, dtype, mx.random.key(seed + 7919 * (i + 1))) for i in range(n)]
    mx.eval(sets)
    return sets


def settle(backend: str, timer: str) -> None:
    """Once per process, before its first timing: time the decoy kernel (kernels/decoy.py) with the same
    timer and drop the result. The first custom kernel a process times reads fast until another has been
    timed (on the H100, 1.22 us for a 1.57 us launch), so without this a collect worker's first config
    was often recorded as its case's best. A decoy that fails is ignored: the kernel under test reports
    its own failures."""
    global _settled
    if _settled:
        return
    _settled = True
    from zmlx_pipeline.kernels import decoy

    try:
        measure(decoy_launcher(backend), decoy.CONFIG, decoy.SHAPE, decoy.DTYPE, timer=timer)
    except Exception:  # noqa: BLE001 - the real measurement reports a broken GPU or timer itself
        pass


def decoy_launcher(backend: str) -> Launcher:
    """The decoy kernel's Launcher for this process (one, so compiling it ahead, compile_decoy, is kept)."""
    if backend not in _DECOYS:
        from zmlx_pipeline.kernels import decoy

        _DECOYS[backend] = Launcher(decoy.SPEC, backend)
    return _DECOYS[backend]


def compile_decoy(backend: str) -> None:
    """Compile the decoy by launching it once, untimed: a collect worker does this with its own configs,
    before workers take turns on the GPU, so settle() does not compile in its turn. Failures are ignored."""
    from zmlx_pipeline.kernels import decoy

    try:
        check(decoy_launcher(backend), decoy.CONFIG, decoy.SHAPE, decoy.DTYPE, seed=0)
    except Exception:  # noqa: BLE001 - settle() and the real measurements report problems
        pass


def measure(
    launcher: Launcher,
    config: Mapping[str, int],
    shape: Mapping[str, int],
    dtype: str,
    *,
    seed: int = 0,
    rotate_bytes: int = 0,
    warmup: int = 3,
    samples: int = 10,
    target_sample_s: float = 1e-3,
    timeout_s: float = 2.0,
    inputs: list | None = None,
    prepared: Prepared | None = None,
    warmup_s: float = 0.0,
    max_chain: int = 1024,
    timer: str = "chain",
    gpu_launches: int = 30,
) -> Outcome:
    """Check a config against the reference, then time it; a failure becomes a status, never an exception.

    `timer` is "chain" (host-timed chains, any backend) or "gpu" (CUPTI kernel durations, CUDA;
    `gpu_launches` launches): see kernels/timing.py. Raises GpuUnhealthy when a failure left the
    GPU unable to run anything (TimerFailed when the gpu timer read nothing), so the caller stops
    instead of recording every later config as failed.
    """
    from zmlx_pipeline.kernels.cupti import CuptiUnavailable

    if timer not in ("gpu", "chain"):
        raise ValueError(f"unknown timer {timer!r}: measure takes 'gpu' or 'chain' (resolve 'auto' first)")

    settle(launcher.backend, timer)
    try:
        wrong = check(launcher, config, shape, dtype, seed, prepared)
    except Exception as exc:  # noqa: BLE001 - the JIT and the launch raise plain RuntimeErrors
        if not gpu_healthy():
            raise GpuUnhealthy(short_error(exc)) from exc
        return Outcome(classify_error(exc), error=short_error(exc))
    if wrong:
        return Outcome("wrong_result", error=wrong[:400])
    sets = inputs or (prepared.sets if prepared else None) or input_sets(launcher.spec, shape, dtype, seed, rotate_bytes)
    try:
        bound = launcher.bind(config, shape, dtype)

        def launch(i: int):
            return bound(sets[i % len(sets)])

        if timer == "gpu":
            timing = time_gpu(
                launch, launcher.kernel_name_part,
                warmup=warmup, launches=gpu_launches, timeout_s=timeout_s, warmup_s=warmup_s, period=len(sets),
            )
        else:
            timing = time_launches(
                launch,
                warmup=warmup, samples=samples, target_sample_s=target_sample_s, timeout_s=timeout_s,
                warmup_s=warmup_s, period=len(sets), max_chain=max_chain,
            )
    except CuptiUnavailable as exc:
        raise TimerFailed(f"the gpu timer failed: {exc}") from exc
    except TimeoutError as exc:
        return Outcome("timeout", error=str(exc))
    except Exception as exc:  # noqa: BLE001
        if not gpu_healthy():
            raise GpuUnhealthy(short_error(exc)) from exc
        return Outcome(classify_error(exc), error=short_error(exc))
    return Outcome("ok", timing=timing)
