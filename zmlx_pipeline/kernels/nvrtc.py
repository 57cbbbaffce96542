"""NVRTC, the CUDA runtime compiler, called directly through ctypes (CuPy's binding as a fallback).

MLX's cuda_kernel compiles with NVRTC inside each launching process and keeps nothing; calling NVRTC
ourselves gives PTX we can cache on disk and compile in parallel threads (ctypes releases the GIL).
The library comes from $ZMLX_PIPELINE_NVRTC, the CUDA toolkit ($CUDA_HOME, $CUDA_PATH,
/usr/local/cuda) or the nvidia-cuda-nvrtc wheel that mlx-cuda installs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import threading
from pathlib import Path

from zmlx_pipeline.core.errors import ZmlxPipelineError


class NvrtcUnavailable(ZmlxPipelineError, RuntimeError):
    """No NVRTC library (nor CuPy) could be loaded here"""


class NvrtcCompileError(ZmlxPipelineError, RuntimeError):
    """NVRTC rejected the program; the message carries its log"""


_LIB = None
_LOCK = threading.Lock()


def _candidates() -> list[str]:
    found = [os.environ.get("ZMLX_PIPELINE_NVRTC", "")]
    for home in _cuda_homes():
        if home:
            found += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")), reverse=True)
            found += sorted(glob.glob(os.path.join(home, "targets", "*", "lib", "libnvrtc.so*")), reverse=True)
    for site in sys.path:
        found += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libnvrtc.so*")), reverse=True)
    found += ["libnvrtc.so.13", "libnvrtc.so.12", ctypes.util.find_library("nvrtc") or ""]
    return [c for c in found if c and "alt" not in os.path.basename(c) and "builtins" not in c]


def _cuda_homes() -> list[str]:
    """$CUDA_HOME, $CUDA_PATH, /usr/local/cuda, then versioned toolkits newest first (MLX's own order, extended)."""
    fixed = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    return [h for h in fixed if h] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)


def library():
    """The loaded libnvrtc (once per process); NvrtcUnavailable when none loads."""
    global _LIB
    with _LOCK:
        if _LIB is None:
            for name in _candidates():
                try:
                    lib = ctypes.CDLL(name)
                    lib.nvrtcVersion  # noqa: B018 - a library without it is not NVRTC
                except (OSError, AttributeError):
                    continue
                _declare(lib)
                _LIB = lib
                break
            else:
                raise NvrtcUnavailable("no libnvrtc found (set CUDA_HOME or $ZMLX_PIPELINE_NVRTC)")
        return _LIB


def _declare(lib) -> None:
    p, c, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(p), c, c, ctypes.c_int, ctypes.POINTER(c), ctypes.POINTER(c)]
    lib.nvrtcCompileProgram.argtypes = [p, ctypes.c_int, ctypes.POINTER(c)]
    lib.nvrtcGetProgramLogSize.argtypes = [p, ctypes.POINTER(sz)]
    lib.nvrtcGetProgramLog.argtypes = [p, c]
    lib.nvrtcGetPTXSize.argtypes = [p, ctypes.POINTER(sz)]
    lib.nvrtcGetPTX.argtypes = [p, c]
    lib.nvrtcGetCUBINSize.argtypes = [p, ctypes.POINTER(sz)]
    lib.nvrtcGetCUBIN.argtypes = [p, c]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(p)]
    lib.nvrtcGetErrorString.restype = c


def version() -> str:
    """NVRTC's version as 'major.minor' (part of every cache key: another compiler, another binary)."""
    try:
        lib = library()
    except NvrtcUnavailable:
        try:
            import cupy.cuda.nvrtc as cnvrtc  # noqa: PLC0415 - the fallback compiler
        except ImportError:
            raise NvrtcUnavailable("no libnvrtc found (set CUDA_HOME or $ZMLX_PIPELINE_NVRTC) and CuPy is not "
                                   "installed") from None
        major, minor = cnvrtc.getVersion()
        return f"{major}.{minor}"
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def cubin_available() -> bool:
    """Whether NVRTC is reached directly here, so programs can be compiled to cubins (compile_program, sm_ targets)."""
    try:
        library()
        return True
    except NvrtcUnavailable:
        return False


def compile_program(source: str, name: str, options: list[str]) -> bytes:
    """PTX for one program, or its cubin where the target is a real GPU (`--gpu-architecture=sm_..`: loading
    it skips the driver's PTX compile, about 30 ms a program); NvrtcCompileError with NVRTC's log when the
    source does not compile."""
    cubin = any(o.startswith("--gpu-architecture=sm_") for o in options)
    try:
        lib = library()
    except NvrtcUnavailable:
        if cubin:
            raise
        return _compile_with_cupy(source, name, options)
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None))
    try:
        opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        result = lib.nvrtcCompileProgram(prog, len(options), opts)
        if result != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value + 1)
            lib.nvrtcGetProgramLog(prog, log)
            raise NvrtcCompileError(f"Failed to compile kernel: {log.value.decode(errors='replace').strip()}")
        size = ctypes.c_size_t()
        if cubin:
            _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)))
            buf = ctypes.create_string_buffer(size.value)
            _check(lib, lib.nvrtcGetCUBIN(prog, buf))
            return buf.raw[:size.value]
        _check(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(size)))
        buf = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetPTX(prog, buf))
        return buf.raw.rstrip(b"\0")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _check(lib, result: int) -> None:
    if result != 0:
        raise NvrtcCompileError(f"nvrtc call failed: {lib.nvrtcGetErrorString(result).decode()}")


def _compile_with_cupy(source: str, name: str, options: list[str]) -> bytes:
    try:
        from cupy.cuda import compiler  # noqa: PLC0415
    except ImportError:
        raise NvrtcUnavailable("no libnvrtc found and CuPy is not installed") from None
    arch = next((o.split("_", 1)[1] for o in options if o.startswith("--gpu-architecture=")), None)
    rest = tuple(o for o in options if not o.startswith("--gpu-architecture="))
    try:
        out = compiler.compile_using_nvrtc(source, rest, arch, f"{name}.cu")
    except compiler.CompileException as exc:
        raise NvrtcCompileError(f"Failed to compile kernel: {exc}") from None
    ptx = out[0] if isinstance(out, tuple) else out
    return ptx.encode() if isinstance(ptx, str) else bytes(ptx)


def compute_capability(ordinal: int = 0) -> tuple[int, int] | None:
    """(major, minor) of the CUDA device this process sees first, through the driver; None on failure."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        if lib.cuInit(0) != 0:
            return None
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            return None
        major, minor = ctypes.c_int(), ctypes.c_int()
        if (lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev) != 0  # ..._COMPUTE_CAPABILITY_MAJOR
                or lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev) != 0):  # ..._MINOR
            return None
    except (OSError, AttributeError):
        return None
    return major.value, minor.value


def include_paths() -> list[str]:
    """Where NVRTC finds cuda_fp16.h, cuda_bf16.h and libcu++: the CUDA toolkit, the nvidia wheels, MLX's CCCL."""
    paths = []
    try:
        import mlx  # noqa: PLC0415

        for root in getattr(mlx, "__path__", []):
            paths.append(os.path.join(root, "include", "cccl"))
    except ImportError:
        pass
    paths.append(os.environ.get("MLX_CCCL_DIR", ""))
    for home in _cuda_homes():
        if home:
            paths.append(os.path.join(home, "include"))
    for site in sys.path:
        paths += sorted(str(Path(h).parent) for h in glob.glob(os.path.join(site, "nvidia", "*", "include", "cuda_fp16.h")))
    seen: list[str] = []
    for p in paths:
        if p and os.path.isdir(p) and p not in seen:
            seen.append(p)
    return seen
