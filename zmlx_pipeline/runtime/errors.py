"""The runtime's own errors: one base class, each also the builtin a caller would catch (ValueError, TypeError, ...).

A kernel wrapper can catch `RuntimeAPIError` for anything the runtime refuses, or the builtin it
already expects; every message is one line that names what was wrong and what is accepted.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterable

from zmlx_pipeline.core.errors import ZmlxPipelineError, unwritable
from zmlx_pipeline.core.files import printable


#: the folder of the runtime's modules: a warning names the first frame outside it
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))


class RuntimeAPIError(ZmlxPipelineError):
    "Base of every error zmlx_pipeline.runtime raises on purpose"


class BadArgument(RuntimeAPIError, ValueError):
    "An argument has the right type but a value the runtime cannot use (a shape dim of 0, k = 0, inf)"


class BadArgumentType(RuntimeAPIError, TypeError):
    "An argument has a type the runtime does not take (a shape of None, a dtype that is a list)"


class UnknownName(RuntimeAPIError, LookupError):
    "A kernel or dtype the active bundle (or the runtime) does not know"


class UnknownKernelError(UnknownName):
    "A kernel that is not in the active bundle"


class UnknownKernelType(UnknownName, BadArgument):
    """A kernel_type that is neither one of ZMLX's (general, reduction, simd) nor a learned kernel class: a
    LookupError and a ValueError, so a caller catching either gets it"""


class UnknownDtypeError(UnknownName):
    "A dtype the runtime has no tables for"


class UnknownDeviceError(UnknownName):
    """A device the caller named (argument or $ZMLX_PIPELINE_DEVICE) that is no catalog id, core limit of one or
    device of the bundle, or a name that does not tell one chip ("M3 Max": 30 or 40 cores)"""


def plain(value: Any) -> str:
    """A user-given path, URL or name as a message shows it: one line, every control character written as an escape
    (`r3/x\\nY`), never sent to a terminal (an ANSI escape), as the CLI's messages write it (core.files.printable)."""
    return printable(str(value))


def value_text(value: Any, width: int = 60) -> str:
    """A caller's value as a message shows it: its repr, cut to `width` characters (core.errors.unwritable for one
    Python will not write out, or an integer longer than `width`: cut, it would read as another number)."""
    try:
        text = repr(value)
    except ValueError:
        return unwritable(value)
    if isinstance(value, int) and not isinstance(value, bool) and len(text) > width:
        return unwritable(value)
    return text[:width]


def known(names: Iterable[Any]) -> str:
    """A short list for a message: `a, b, c` (the first 20, then how many more)."""
    items = sorted(str(n) for n in names)
    head = ", ".join(items[:20])
    return head + (f" and {len(items) - 20} more" if len(items) > 20 else "") if items else "none"


def expect_str(value: Any, what: str, optional: bool = False) -> None:
    """BadArgumentType unless `value` is a str (or None when `optional`)."""
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise BadArgumentType(f"{what} must be a string{' or None' if optional else ''}, "
                              f"not {type(value).__name__} ({value!r:.60})")


def home_expanded(text: str, what: str) -> str:
    """A path with a leading `~` or `~user` expanded, as every path the runtime reads or writes is; BadArgument when
    no home directory is known for that user (the path is never taken literally, as a folder named `~user`)."""
    from zmlx_pipeline.core.files import expand_home

    try:
        return expand_home(text)
    except ValueError as exc:
        raise BadArgument(f"{what} {text!r:.80}: no home directory is known ({exc}); give a path without ~") from None


def caller_stacklevel() -> int:
    """The `stacklevel` for a warning raised by the function calling this one that names the first frame outside the
    runtime: the line that called the public function, however deep in the runtime the warning was raised."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _RUNTIME_DIR:
        frame, level = frame.f_back, level + 1
    return level
