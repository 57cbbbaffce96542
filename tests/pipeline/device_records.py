"""A device record for the tests of `devices add` and of what a registered device does: a chip no catalog lists."""

from __future__ import annotations

import copy
import json
from pathlib import Path

SHEET = {"title": "Acme X1 product brief", "url": "https://example.com/acme-x1.pdf"}
#: a chip no catalog lists, as a record of a catalog row's fields, every figure cited
ACME = {
    "id": "acme-x1", "name": "Acme X1 Accelerator", "aliases": ["Acme X1"], "vendor": "nvidia", "family": "ada",
    "variant": "acme-x1", "backend": "cuda", "architecture": "sm_89", "gpu_cores": 20, "core_unit": "sms",
    "memory_bandwidth_gbps": 192.0, "max_threads_per_threadgroup": 1024, "simd_width": 32,
    "threadgroup_memory_bytes": 49152, "l2_bytes": 25165824, "clock_mhz": 2100, "fp32_tflops": 10.75, "memory_gb": 8,
    "default_threadgroup": 256,
    "sources": {"gpu_cores": SHEET, "memory_bandwidth_gbps": SHEET, "l2_bytes": SHEET, "clock_mhz": SHEET,
                "memory_gb": SHEET, "fp32_tflops": "derived-gpu-fp32", "architecture": "cuda-guide-cc",
                "max_threads_per_threadgroup": "cuda-guide-cc", "simd_width": "cuda-guide-cc",
                "threadgroup_memory_bytes": "cuda-guide-cc", "default_threadgroup": "convention-default-threadgroup"},
}


def record(path: Path, **changes) -> Path:
    """ACME with `changes` (a None drops the field) written as JSON to `path`."""
    doc = copy.deepcopy(ACME)
    for key, value in changes.items():
        doc.pop(key) if value is None else doc.__setitem__(key, value)
    path.write_text(json.dumps(doc))
    return path
