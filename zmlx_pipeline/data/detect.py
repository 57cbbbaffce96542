"""Which device this process runs on: what MLX reports, matched to a catalog row (stdlib; MLX imported lazily)."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from zmlx_pipeline.data.catalog import DeviceSpec, match_device

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
_IOREG_CORES = re.compile(r'"gpu-core-count"\s*=\s*(\d+)')


def slug(text: str) -> str:
    """Lower-case ASCII letters and digits joined by single hyphens (for ids built from reported names)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unnamed"


@dataclass(frozen=True)
class DetectedDevice:
    """The device a run measured on: the backend's report and, when known, its catalog row."""

    device_id: str
    reported_name: str
    architecture: str
    backend: str
    gpu_cores: int | None
    spec: DeviceSpec | None
    known: bool
    core_limited: bool
    info: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def row(self) -> dict[str, Any]:
        """The store's `devices` row: catalog specs when known, else only what the backend reported."""
        reported = {"device_id": self.device_id, "reported_name": self.reported_name, "reported": dict(self.info)}
        if self.spec is not None:
            return {**self.spec.as_row(), "in_catalog": True, "flagged_unknown": False, **reported}
        return {
            **reported,
            "id": self.device_id,
            "name": self.reported_name,
            "backend": self.backend,
            "architecture": self.architecture,
            "gpu_cores": self.gpu_cores,
            "in_catalog": False,
            "flagged_unknown": True,
        }


def _mlx():
    import mlx.core as mx  # lazy: importing this module must not load MLX

    return mx


def detect_backend() -> str:
    """The MLX backend in use: metal or cuda when that GPU backend is available, else cpu."""
    mx = _mlx()
    for backend in ("metal", "cuda"):
        module = getattr(mx, backend, None)
        if module is not None and hasattr(module, "is_available") and module.is_available():
            return backend
    return "cpu"


def apple_gpu_core_count() -> int | None:
    """The GPU core count macOS's IORegistry reports (AGXAccelerator), or None off macOS or on failure."""
    if sys.platform != "darwin":
        return None
    try:
        out = subprocess.run(
            ["ioreg", "-rc", "AGXAccelerator", "-d", "1"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = _IOREG_CORES.search(out or "")
    return int(found.group(1)) if found else None


def cuda_sm_count() -> int | None:
    """SMs visible to this process on CUDA device 0 (fewer under an MPS thread limit), or None on failure."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        if lib.cuInit(0) != 0:
            return None
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), 0) != 0:
            return None
        count = ctypes.c_int()
        if lib.cuDeviceGetAttribute(ctypes.byref(count), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return count.value if count.value > 0 else None


def detect_device(
    info: dict[str, Any] | None = None, *, backend: str | None = None, gpu_cores: int | None = None
) -> DetectedDevice:
    """The current device (or the one `info` describes), matched to the catalog; unknown names stay unknown."""
    if info is None:
        info = dict(_mlx().device_info())
    if backend is None:
        backend = detect_backend()
    name = str(info.get("device_name") or "").strip()
    architecture = str(info.get("architecture") or "")
    if backend == "cpu":
        label = name or architecture or "cpu"
        return DetectedDevice(
            device_id="cpu-" + slug(label), reported_name=name, architecture=architecture, backend="cpu",
            gpu_cores=None, spec=None, known=False, core_limited=False, info=dict(info),
        )
    if gpu_cores is None:
        gpu_cores = apple_gpu_core_count() if backend == "metal" else cuda_sm_count() if backend == "cuda" else None
    spec = match_device(name, gpu_cores)
    core_limited = False
    if spec is not None and backend == "cuda" and gpu_cores is not None and gpu_cores < spec.gpu_cores:
        spec, core_limited = spec.with_core_limit(gpu_cores, reported_name=name), True
    if spec is None:
        return DetectedDevice(
            device_id="unknown-" + slug(name or architecture), reported_name=name, architecture=architecture,
            backend=backend, gpu_cores=gpu_cores, spec=None, known=False, core_limited=False, info=dict(info),
        )
    return DetectedDevice(
        device_id=spec.id, reported_name=name, architecture=architecture, backend=backend,
        gpu_cores=gpu_cores if gpu_cores is not None else spec.gpu_cores, spec=spec, known=True,
        core_limited=core_limited, info=dict(info),
    )
