"""The one base class of every error this package raises on purpose.

A caller catches `ZmlxPipelineError` for anything the library refuses; the CLI turns it into a
one-line message in one place (pipeline/cli_common.py). Each subclass also derives from the
builtin a caller would expect (ValueError, LookupError, ...).
"""

from __future__ import annotations

#: most characters of a name (a kernel, a path) an error message repeats: a message stays one readable line
SHOWN_CHARS = 60


def unwritable(value: object) -> str:
    """A value Python will not write out (an int of over 4300 digits, or a list holding one: str and repr raise
    ValueError) as a message names it: by its size."""
    if isinstance(value, int):
        return f"{'a negative' if value < 0 else 'an'} integer of about {int(abs(value).bit_length() * 0.30103)} digits"
    return f"a {type(value).__name__} holding an integer too long to write out"


def shown(name: object, keep: int = SHOWN_CHARS) -> str:
    """A name as an error message repeats it: quoted whole, or, when longer than `keep` characters, its start
    quoted, "..." and its length (a name of 100,000 characters is one line, not a page)."""
    try:
        text = str(name)
    except ValueError:  # an int of over 4300 digits, which Python will not write out
        return unwritable(name)
    return repr(text) if len(text) <= keep else f"{text[:keep]!r}... ({len(text)} characters)"


#: most characters of a typed number an error message repeats whole (an int64 has 19 digits and a sign)
SHOWN_DIGITS = 24


def shown_number(text: str) -> str:
    """A typed number as an error message repeats it: whole up to SHOWN_DIGITS characters, else its first 20, "..."
    and its length (a value of 5,000 digits is one short line)."""
    return text if len(text) <= SHOWN_DIGITS else f"{text[:20]}... ({len(text)} digits)"


class ZmlxPipelineError(Exception):
    "Base of every error zmlx_pipeline raises on purpose: bad input, missing data, an unusable device or file"


class UnknownKernel(ZmlxPipelineError, LookupError):
    "No registered kernel, entry point or module:attr path names this kernel"
