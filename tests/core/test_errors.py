"""One base error: every exception class the package defines (warnings aside) derives from ZmlxPipelineError."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import zmlx_pipeline
from zmlx_pipeline.core.errors import UnknownKernel, ZmlxPipelineError

#: modules that import a package no extra of ours installs everywhere (Ray), skipped when it is missing
OPTIONAL = {"zmlx_pipeline.pipeline.ray_collect": "ray"}


def _error_classes() -> list[type]:
    found = []
    for info in pkgutil.walk_packages(zmlx_pipeline.__path__, "zmlx_pipeline."):
        if info.name.endswith("__main__") or info.name.endswith(".worker"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ModuleNotFoundError as exc:
            if OPTIONAL.get(info.name) == exc.name:
                continue
            raise
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (cls.__module__ == module.__name__ and issubclass(cls, Exception)
                    and not issubclass(cls, Warning)):
                found.append(cls)
    return found


def test_every_error_class_of_the_package_derives_from_the_base():
    classes = _error_classes()
    names = {c.__name__ for c in classes}
    assert {"StoreError", "ModelError", "RuntimeAPIError", "KernelSpecError", "ImportFileError", "PublishError",
            "CollectError", "MeasureError", "UnknownDevice", "AutotuneError"} <= names
    assert [f"{c.__module__}.{c.__name__}" for c in classes if not issubclass(c, ZmlxPipelineError)] == []


def test_the_runtime_errors_are_library_errors_and_still_the_builtins_callers_catch():
    from zmlx_pipeline.runtime.errors import BadArgument, UnknownKernelError
    from zmlx_pipeline.runtime.tuner import UnknownTunedKernel

    assert issubclass(BadArgument, ValueError) and issubclass(BadArgument, ZmlxPipelineError)
    assert issubclass(UnknownTunedKernel, UnknownKernelError) and issubclass(UnknownTunedKernel, LookupError)


def test_an_unknown_kernel_is_one_class_for_the_registry_and_a_lookup_error():
    from zmlx_pipeline.kernels.registry import UnknownKernel as registry_unknown
    from zmlx_pipeline.kernels.registry import get_kernel

    assert registry_unknown is UnknownKernel
    with pytest.raises(UnknownKernel, match="rmsnrom"):
        get_kernel("rmsnrom")


def test_a_long_name_is_shown_by_its_start_and_length():
    from zmlx_pipeline.core.errors import shown

    assert shown("rmsnorm") == "'rmsnorm'" and shown("k" * 60) == repr("k" * 60)
    assert shown("k" * 100_000) == f"{'k' * 60!r}... (100000 characters)"


def test_an_int_python_will_not_write_out_is_shown_by_its_size():
    """str() of an int over 4300 digits raises ValueError: a message names its size instead of failing."""
    from zmlx_pipeline.core.errors import shown
    from zmlx_pipeline.runtime.errors import value_text

    assert shown(10 ** 5000) == "an integer of about 5000 digits"
    assert shown(-10 ** 5000) == "a negative integer of about 5000 digits"
    assert value_text([1, 10 ** 5000]) == "a list holding an integer too long to write out"
    assert value_text(4096.5) == "4096.5" and value_text("x" * 100) == repr("x" * 100)[:60]
