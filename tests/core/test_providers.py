"""core/providers.py: the runtime reaches kernel specs through the provider kernels/ registers, never by importing it."""

from __future__ import annotations

import pytest

from zmlx_pipeline.core import providers
from zmlx_pipeline.core.errors import UnknownKernel


@pytest.fixture
def restore_provider():
    saved = list(providers._PROVIDER)
    yield
    providers._PROVIDER[:] = saved


def test_the_builtin_provider_answers_kernels_by_name(restore_provider):
    providers._PROVIDER.clear()  # as in a process that imported only the runtime
    provider = providers.kernel_provider()
    assert type(provider).__module__ == "zmlx_pipeline.kernels.provider"
    assert provider.get_kernel("rmsnorm").name == "rmsnorm"
    with pytest.raises(UnknownKernel):
        provider.get_kernel("no_such_kernel")


def test_a_registered_provider_is_what_the_tuner_resolves_names_with(restore_provider):
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.runtime import tuner

    asked = []

    class Renaming:
        def get_kernel(self, name):
            asked.append(name)
            return get_kernel("rmsnorm")

        def measurer(self, warmup, iters, rotate_bytes=0, timer="chain"):
            raise AssertionError("nothing is timed in this test")

        def rotate_bytes_for(self, row):
            return 0

    providers.register_provider(Renaming())
    assert tuner._spec("my_norm").name == "rmsnorm" and asked == ["my_norm"]


def test_an_unknown_name_is_the_tuners_unknown_kernel_error(restore_provider):
    from zmlx_pipeline.runtime.errors import UnknownKernelError
    from zmlx_pipeline.runtime.tuner import _spec

    with pytest.raises(UnknownKernelError, match="no_such_kernel"):
        _spec("no_such_kernel")
