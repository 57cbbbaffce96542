"""Importers: measurements made by other tools, read into the store as runs of their own."""

from zmlx_pipeline.data.importers.kernel_tuner import (
    DeviceMap,
    ImportFileError,
    ParsedFile,
    UnmatchedDevice,
    import_files,
    load_device_map,
    parse_file,
    parse_problem_size,
)

__all__ = ["DeviceMap", "ImportFileError", "ParsedFile", "UnmatchedDevice", "import_files", "load_device_map",
           "parse_file", "parse_problem_size"]
