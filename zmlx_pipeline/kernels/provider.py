"""What the runtime's autotuner uses from kernels/ (through core/providers.py): a spec by name, and the
collect harness as a measurer that checks and times one config."""

from __future__ import annotations

from typing import Any, Mapping

from zmlx_pipeline.core.providers import Measure


class BuiltinProvider:
    """Kernels from the registry, measured with the harness; MLX is imported only when a measurer is made."""

    def get_kernel(self, name: str) -> Any:
        from zmlx_pipeline.kernels.registry import get_kernel

        return get_kernel(name)

    def rotate_bytes_for(self, row: Mapping[str, Any] | None) -> int:
        from zmlx_pipeline.kernels.harness import rotate_bytes_for

        return rotate_bytes_for(row)

    def measurer(self, warmup: int, iters: int, rotate_bytes: int = 0, timer: str = "chain") -> Measure:
        return harness_measurer(warmup, iters, rotate_bytes, timer)


def harness_measurer(warmup: int, iters: int, rotate_bytes: int = 0, timer: str = "chain") -> Measure:
    """A measurer on this process's GPU: (spec, config, shape, dtype) -> (status, median us, error text),
    with `precompile(spec, configs, shape, dtype)` to compile every candidate at once before timing."""
    from zmlx_pipeline.data.detect import detect_backend
    from zmlx_pipeline.kernels import harness
    from zmlx_pipeline.kernels.timing import resolve_timer

    backend = detect_backend()
    if backend not in ("metal", "cuda"):
        raise harness.NoGpuBackend(f"no Metal or CUDA backend here (MLX runs on the {backend})")
    timer = resolve_timer(timer, backend)
    launchers: dict = {}
    prepared: dict = {}

    def launcher_for(spec):
        launcher = launchers.get(spec.name)
        if launcher is None or launcher.spec is not spec:
            launcher = launchers[spec.name] = harness.Launcher(spec, backend)
        return launcher

    def prepared_for(spec, shape, dtype):
        key = (spec.name, tuple(sorted(shape.items())), dtype)
        if key not in prepared:
            prepared.clear()
            prepared[key] = harness.prepare(spec, dict(shape), dtype, 0, rotate_bytes)
        return prepared[key]

    def precompile(spec, configs, shape, dtype) -> int:
        """Compile every candidate at once (threads, through the compiled-kernel cache) before any is timed."""
        inputs = prepared_for(spec, shape, dtype).check_inputs
        return launcher_for(spec).precompile([(dict(c), dict(shape), dtype, inputs) for c in configs])

    def measure(spec, config, shape, dtype) -> tuple[str, float | None]:
        launcher = launcher_for(spec)
        extra = {"prepared": prepared_for(spec, shape, dtype)}
        outcome = harness.measure(launcher, dict(config), dict(shape), dtype, warmup=warmup, samples=iters,
                                  timer=timer, **extra)
        return outcome.status, (outcome.timing.median_us if outcome.timing else None), outcome.error

    measure.precompile = precompile  # type: ignore[attr-defined]
    return measure
