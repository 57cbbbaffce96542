"""Importers: measurements made by other tools, read into the store as runs of their own."""

from zmlx_pipeline.data.importers.kernel_tuner import (
    ImportFileError,
    ParsedFile,
    UnmatchedDevice,
    import_files,
    parse_file,
)

__all__ = ["ImportFileError", "ParsedFile", "UnmatchedDevice", "import_files", "parse_file"]
