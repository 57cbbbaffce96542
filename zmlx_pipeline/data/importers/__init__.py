"""Importers: measurements made by other tools (Kernel Tuner, KTT), read into the store as runs of their own."""

from zmlx_pipeline.data.importers.kernel_tuner import (
    DeviceMap,
    ImportFileError,
    ParsedFile,
    UnmatchedDevice,
    import_files,
    load_device_map,
    parse_file,
    parse_problem_size,
    parse_sections,
)

__all__ = ["DeviceMap", "ImportFileError", "ParsedFile", "UnmatchedDevice", "import_files", "load_device_map",
           "parse_file", "parse_problem_size", "parse_sections"]
