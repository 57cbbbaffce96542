"""Which device this process runs on: what MLX reports, matched to a catalog row (stdlib; MLX imported lazily)."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from zmlx_pipeline.data.catalog import (
    DeviceSpec,
    arch_generation,
    match_device,
    match_device_by_cores,
    match_gpu_arch,
)

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
_IOREG_CORES = re.compile(r'"gpu-core-count"\s*=\s*(\d+)')
_IOREG_MODEL = re.compile(r'"model"\s*=\s*"([^"]*)"')
_SYSCTL_BRAND = re.compile(r"^(?:machdep\.cpu\.brand_string:\s*)?(.+?)\s*$", re.MULTILINE)


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
    registered: bool = False  # `spec` is a device registered in the store (devices add), not a catalog row

    @property
    def row(self) -> dict[str, Any]:
        """The store's `devices` row: catalog specs when known, else only what the backend reported. A registered
        device's row leaves `reported` out, which holds its registration (an upsert changes only the given columns)."""
        reported = {"device_id": self.device_id, "reported_name": self.reported_name, "reported": dict(self.info)}
        if self.spec is not None and self.registered:
            return {**self.spec.as_row(), "device_id": self.device_id, "in_catalog": False, "flagged_unknown": False}
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


@dataclass(frozen=True)
class IoregGpu:
    """What `ioreg -rc AGXAccelerator -d 1` says about the Apple GPU."""

    gpu_cores: int | None
    model: str | None  # "Apple M4"


def parse_ioreg(text: str | None) -> IoregGpu:
    """The core count and chip name in ioreg's AGXAccelerator listing (None where absent)."""
    cores, model = _IOREG_CORES.search(text or ""), _IOREG_MODEL.search(text or "")
    return IoregGpu(gpu_cores=int(cores.group(1)) if cores else None,
                    model=(model.group(1).strip() or None) if model else None)


def parse_sysctl_brand(text: str | None) -> str | None:
    """The chip name in `sysctl -n machdep.cpu.brand_string` (or `sysctl machdep.cpu.brand_string`) output."""
    for line in (text or "").splitlines():
        if "brand_string" in line or ":" not in line:
            found = _SYSCTL_BRAND.match(line.strip())
            if found and found.group(1):
                return found.group(1)
    return None


def _command_output(args: list[str]) -> str | None:
    """Stdout of a macOS probe command, or None off macOS or when it cannot run."""
    if sys.platform != "darwin":
        return None
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def ioreg_text() -> str | None:
    """The AGXAccelerator entry of macOS's IORegistry (None off macOS)."""
    return _command_output(["ioreg", "-rc", "AGXAccelerator", "-d", "1"])


def apple_chip_name() -> str | None:
    """The chip name macOS reports (sysctl's brand string, else ioreg's model), for an MLX that names no device."""
    return parse_sysctl_brand(_command_output(["sysctl", "-n", "machdep.cpu.brand_string"])) or parse_ioreg(
        ioreg_text()).model


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
    return parse_ioreg(ioreg_text()).gpu_cores


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


def match_apple(name: str, gpu_arch: str, gpu_cores: int | None) -> DeviceSpec | None:
    """The catalog row of an Apple GPU from its name, architecture name and core count; None rather than a guess.

    The name decides when it names a catalog chip (binned variants by core count); a reported architecture
    of another generation than that row's is a contradiction and matches nothing. Without a name, or with
    one the catalog does not know, the architecture's generation and the core count decide (match_gpu_arch),
    so a future generation (applegpu_g18s) stays unknown whatever its core count.
    """
    generation = arch_generation(gpu_arch)
    if name and match_device(name) is not None:
        spec = match_device(name, gpu_cores)
        if spec is not None and generation is not None and arch_generation(spec.gpu_arch) != generation:
            return None
        return spec
    return match_gpu_arch(gpu_arch, gpu_cores) if generation is not None else None


def detect_device(
    info: dict[str, Any] | None = None, *, backend: str | None = None, gpu_cores: int | None = None,
    ioreg: str | None = None, chip_name: str | None = None,
) -> DetectedDevice:
    """The current device (or the one `info` describes), matched to the catalog; unknown names stay unknown.

    On Metal, `ioreg` (the text of `ioreg -rc AGXAccelerator -d 1`) gives the core count and, with
    `chip_name` (sysctl's brand string), the name when MLX reports none (MLX before device_name); both
    are read from this Mac when `ioreg` is not given.
    """
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
    if backend == "metal":
        report = parse_ioreg(ioreg) if ioreg is not None else None  # None: probe this Mac
        if gpu_cores is None:
            gpu_cores = report.gpu_cores if report is not None else apple_gpu_core_count()
        if not name:
            name = (chip_name or (report.model if report is not None else apple_chip_name()) or "").strip()
        spec = match_apple(name, architecture, gpu_cores)
    else:
        if gpu_cores is None and backend == "cuda":
            gpu_cores = cuda_sm_count()
        spec = match_device(name, gpu_cores)
        if spec is None and backend == "cuda":
            spec = match_device_by_cores(name, gpu_cores)
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
