"""Where kernels come from: the built-ins, the `zmlx_pipeline.kernels` entry point group, or `module:attr`."""

from __future__ import annotations

import importlib
import types
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
    if isinstance(obj, types.FunctionType) and getattr(obj, "__module__", None) == module.__name__:
        try:
            obj = obj()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a factory that fails is a kernel that cannot load
            raise UnknownKernel(f"{shown(path)} raised {type(exc).__name__} when called to make its KernelSpec") from None
    if not isinstance(obj, KernelSpec):
        raise UnknownKernel(f"{shown(path)} is a {type(obj).__name__}, not a KernelSpec (or a function of {shown(module_name)} "
                            "that returns one)")
    return obj


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
