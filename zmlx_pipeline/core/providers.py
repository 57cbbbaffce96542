"""How the runtime reaches kernel specs and the measuring harness without importing kernels/.

The autotuner needs a kernel spec for a name and a way to check and time one config; both live in
kernels/, which imports MLX and must stay free to change. The runtime asks `kernel_provider()`: the
provider registered with `register_provider` (an application's own, or a test's), else the built-in
one named by `DEFAULT_PROVIDER` (kernels/provider.py), made on first use.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping, Protocol

#: "module:class" of the built-in provider: the registry, and the collect harness as the measurer
DEFAULT_PROVIDER = "zmlx_pipeline.kernels.provider:BuiltinProvider"

#: (spec, config, shape, dtype) -> (status, median us) or (status, median us, error text)
Measure = Callable[[Any, Mapping[str, int], Mapping[str, int], str], tuple]


class KernelProvider(Protocol):
    """What the runtime asks of the kernels' side."""

    def get_kernel(self, name: str) -> Any:
        """The kernel spec of a registered name or module:attr path; core.errors.UnknownKernel if none."""

    def measurer(self, warmup: int, iters: int, rotate_bytes: int, timer: str) -> Measure:
        """A function that checks and times one config on this process's GPU (it may carry `precompile`)."""

    def rotate_bytes_for(self, row: Mapping[str, Any] | None) -> int:
        """Bytes of inputs to rotate through on a device (its catalog row), as collect times."""


_PROVIDER: list[KernelProvider] = []


def register_provider(provider: KernelProvider) -> None:
    """Make `provider` the one the runtime asks (the last registered wins)."""
    _PROVIDER[:] = [provider]


def kernel_provider() -> KernelProvider:
    """The registered provider, else the built-in one (imported and made on first use)."""
    if not _PROVIDER:
        module, _, name = DEFAULT_PROVIDER.partition(":")
        _PROVIDER.append(getattr(importlib.import_module(module), name)())
    return _PROVIDER[0]
