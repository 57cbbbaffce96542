"""The one base class of every error this package raises on purpose.

A caller catches `ZmlxPipelineError` for anything the library refuses; the CLI turns it into a
one-line message in one place (pipeline/cli_common.py). Each subclass also derives from the
builtin a caller would expect (ValueError, LookupError, ...).
"""

from __future__ import annotations


class ZmlxPipelineError(Exception):
    "Base of every error zmlx_pipeline raises on purpose: bad input, missing data, an unusable device or file"


class UnknownKernel(ZmlxPipelineError, LookupError):
    "No registered kernel, entry point or module:attr path names this kernel"
