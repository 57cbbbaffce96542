"""Where kernels come from: the built-ins, the `zmlx_pipeline.kernels` entry point group, or `module:attr`."""

from __future__ import annotations

import importlib
import types
import unicodedata
from importlib.metadata import entry_points

from zmlx_pipeline.core.errors import SHOWN_CHARS, UnknownKernel, shown
from zmlx_pipeline.kernels.builtin import BUILTIN
from zmlx_pipeline.kernels.spec import KernelSpec

ENTRY_POINT_GROUP = "zmlx_pipeline.kernels"

__all__ = ["ENTRY_POINT_GROUP", "UnknownKernel", "builtin_kernels", "get_kernel", "registered_names", "resolve"]


def _from_path(path: str) -> KernelSpec:
    """The KernelSpec at `module:attr` (attr defaults to SPEC): the spec itself, or a function of that module that
    makes it when called with no arguments; anything else (a builtin such as sys:exit, a class, a command) is
    refused, never called."""
    module_name, _, attr = path.partition(":")
    if not module_name.strip() or module_name.startswith("."):
        raise UnknownKernel(f"kernel path {shown(path)} names no importable module: write it as package.module:ATTR")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever importing the user's module raised
        detail = str(exc).splitlines()[0] if str(exc).strip() else ""
        if len(detail) > 4 * SHOWN_CHARS:  # ("No module named ...": the name again)
            detail = detail[:4 * SHOWN_CHARS] + "..."
        raise UnknownKernel(f"cannot import {shown(module_name)} for kernel {shown(path)}: "
                            f"{type(exc).__name__}: {detail}".rstrip(": ")) from None
    try:
        obj = getattr(module, attr or "SPEC")
    except AttributeError:
        raise UnknownKernel(f"module {shown(module_name)} has no attribute {shown(attr or 'SPEC')}") from None
    factory = isinstance(obj, types.FunctionType) and getattr(obj, "__module__", None) == module.__name__
    if factory:
        try:
            obj = obj()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a factory that fails is a kernel that cannot load
            raise UnknownKernel(f"{shown(path)} raised {type(exc).__name__} when called to make its KernelSpec") from None
    if not isinstance(obj, KernelSpec):
        if factory:
            raise UnknownKernel(f"{shown(path)} is a function that returned {type(obj).__name__}, not a KernelSpec: "
                                "make it return the KernelSpec, or name the spec itself")
        raise UnknownKernel(f"{shown(path)} is {type(obj).__name__}, not a KernelSpec (or a function of "
                            f"{shown(module_name)} that returns one)")
    twin = _builtin_twin(obj)
    if twin is not None:
        raise UnknownKernel(f"{shown(path)} is a kernel named {shown(obj.name)}, the name of the built-in kernel "
                            f"{twin!r} (names that differ only in case, white space or Unicode compatibility form are "
                            "one name): give it a name of its own")
    return obj


def _fold(name: str) -> str:
    """A kernel name folded as the store compares names (data.records.fold_name): case, white space and NFKC."""
    return "".join(unicodedata.normalize("NFKC", name).casefold().split())


def _builtin_twin(spec: KernelSpec) -> str | None:
    """The built-in kernel whose name `spec` takes (or one differing only as _fold folds) when `spec` is not that
    kernel itself; None otherwise. A user kernel named as a built-in would pass for it in every table."""
    name = spec.name if isinstance(spec.name, str) else ""
    twin = next((b for b in BUILTIN if _fold(b) == _fold(name)), None)
    if twin is None:
        return None
    own = importlib.import_module(f"zmlx_pipeline.kernels.builtin.{twin}").SPEC
    return None if spec is own or spec == own else twin


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def builtin_kernels() -> list[KernelSpec]:
    """The built-in kernels, in listing order."""
    return [_from_path(f"zmlx_pipeline.kernels.builtin.{name}:SPEC") for name in BUILTIN]


def registered_names() -> list[str]:
    """Every kernel name known without a path: built-ins, then entry points."""
    return list(BUILTIN) + [n for n in _entry_points() if n not in BUILTIN]


def get_kernel(name: str) -> KernelSpec:
    """A kernel by built-in name, entry-point name, or `package.module:ATTR` path."""
    if ":" in name:
        return _from_path(name)
    if name in BUILTIN:
        return _from_path(f"zmlx_pipeline.kernels.builtin.{name}:SPEC")
    eps = _entry_points()
    if name in eps:
        spec = _from_path(eps[name])
        return spec
    known = ", ".join(registered_names())
    raise UnknownKernel(f"unknown kernel {shown(name)}; known kernels: {known} (or give a module:attr path)")


def resolve(names: list[str] | tuple[str, ...] | None) -> list[KernelSpec]:
    """Kernels for a CLI selection: all registered ones when `names` is empty."""
    if not names:
        return [get_kernel(n) for n in registered_names()]
    specs = [get_kernel(n) for n in names]
    seen: dict[str, KernelSpec] = {}
    for s in specs:
        seen.setdefault(s.name, s)
    return list(seen.values())
