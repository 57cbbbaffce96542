"""Compiled-kernel cache for CUDA: each (kernel source, config, dtype, arch) compiled once per machine.

mx.fast.cuda_kernel compiles with NVRTC in every process that launches a config (1-2.5 s each).
Here we build the same program MLX would (its generated signature and template constants around
the kernel's header and source), compile it with NVRTC ourselves to a cubin for this GPU (PTX where
only CuPy reaches NVRTC), keep it in the disk cache (kernels/ptx_cache.py) and launch it through mx.fast.precompiled_cuda_kernel. Differences from
MLX's program, none of which change what the body computes: the kernel is `extern "C"` (so its
name is known without NVRTC's name lowering), and the `<input>_shape` arrays a body reads arrive as
int scalars after the outputs (precompiled kernels take scalars, not MLX's Shape structs) and are
rebuilt as a local `const int <input>_shape[ndim]`. MLX's own device header is not included: our
prelude brings cuda_fp16.h and cuda_bf16.h, and the bodies use nothing else of it. A body that
reads `_strides` or `_ndim` is left to cuda_kernel.

$ZMLX_PIPELINE_PRECOMPILED=0 turns this path off (every launch goes through cuda_kernel).
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any, Iterable, Sequence

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.kernels.ptx_cache import PtxCache, build_all

DISABLE_ENV = "ZMLX_PIPELINE_PRECOMPILED"

#: the C type of each MLX dtype in a generated signature (MLX's dtype_to_cuda_type for the float types)
CUDA_TYPES = {
    "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double",
    "int8": "signed char", "uint8": "unsigned char", "int16": "short", "uint16": "unsigned short",
    "int32": "int", "uint32": "unsigned int", "int64": "long long", "uint64": "unsigned long long", "bool": "bool",
}


#: compute capabilities compiled for their arch-specific target (sm_90a, sm_100a, sm_121a), as MLX does
ARCH_SPECIFIC = {(9, 0), (10, 0), (12, 1)}


class PrecompiledUnsupported(ZmlxPipelineError, RuntimeError):
    """This program cannot take the precompiled path (cuda_kernel launches it instead)"""


def dtype_name(dtype: Any) -> str:
    """'float16' for mx.float16 (or for the string itself)."""
    return str(dtype).rsplit(".", 1)[-1]


def input_signature(inputs: Sequence[Any]) -> tuple[tuple[str, int], ...]:
    """(dtype name, ndim) of each input: with the template, all a generated signature depends on."""
    return tuple((dtype_name(a.dtype), int(a.ndim)) for a in inputs)


def template_suffix(template: Sequence[tuple[str, Any]]) -> str:
    """MLX's template-arguments part of a kernel name: _<int> per int, _<dtype> per type."""
    out = ""
    for _, v in template:
        if isinstance(v, bool):
            out += "_t" if v else "_f"
        elif isinstance(v, int):
            out += f"_{v}"
        else:
            out += f"_{dtype_name(v)}"
    return out


def shape_inputs(source: str, input_names: Sequence[str]) -> list[bool]:
    """Which inputs' `<name>_shape` the source reads (as MLX decides which shapes to pass)."""
    return [f"{n}_shape" in source for n in input_names]


def program(name: str, header: str, source: str, input_names: Sequence[str], output_names: Sequence[str],
            signature: Sequence[tuple[str, int]], output_dtypes: Sequence[str],
            template: Sequence[tuple[str, Any]]) -> str:
    """The full CUDA program for one launch signature; the kernel is `extern "C" __global__ void <name>`."""
    for n in input_names:
        if f"{n}_strides" in source or f"{n}_ndim" in source:
            raise PrecompiledUnsupported(f"the source reads {n}_strides or {n}_ndim")
    uses = shape_inputs(source, input_names)
    params, scalars, rebuild = [], [], []
    for n, (dt, ndim), used in zip(input_names, signature, uses):
        params.append(f"    const {CUDA_TYPES[dt]}* {n}")
        if used and ndim > 0:
            dims = [f"{n}_shape_{d}" for d in range(ndim)]
            scalars += [f"    const int {d}" for d in dims]
            rebuild.append(f"  const int {n}_shape[{ndim}] = {{{', '.join(dims)}}};\n")
    params += [f"    {CUDA_TYPES[dt]}* {n}" for n, dt in zip(output_names, output_dtypes)]
    consts = []
    for k, v in template:
        if isinstance(v, bool):
            consts.append(f"  constexpr bool {k} = {'true' if v else 'false'};\n")
        elif isinstance(v, int):
            consts.append(f"  constexpr int {k} = {v};\n")
        else:
            consts.append(f"  using {k} = {CUDA_TYPES[dtype_name(v)]};\n")
    return (
        "// zmlx-pipeline precompiled program (mx.fast.cuda_kernel's, shapes as scalars)\n"
        + header
        + "\nnamespace mlx::core::cu {\n\n"
        + f'extern "C" __global__ void {name}(\n'
        + ",\n".join(params + scalars) + ") {\n"
        + "".join(rebuild) + "".join(consts) + "\n"
        + source
        + "\n}\n\n} // namespace mlx::core::cu\n"
    )


def shape_scalars(uses: Sequence[bool], inputs: Sequence[Any]) -> list[int]:
    """The int scalars a program from program() takes: the shape of each input whose shape the source
    reads (`uses`, from shape_inputs), in input order."""
    out: list[int] = []
    for used, a in zip(uses, inputs):
        if used and a.ndim > 0:
            out += [int(d) for d in a.shape]
    return out


def mlx_version() -> str:
    try:
        import mlx.core as mx

        return mx.__version__
    except ImportError:
        return "none"


class Compiler:
    """NVRTC through the disk cache for this process's GPU: program() one, programs() several in parallel threads."""

    def __init__(self, cache: PtxCache | None = None, arch: tuple[int, int] | None = None,
                 compile_fn=None, nvrtc_version: str | None = None, includes: list[str] | None = None,
                 cubin: bool | None = None):
        from zmlx_pipeline.kernels import nvrtc

        self.cache = cache or PtxCache()
        arch = arch or nvrtc.compute_capability()
        if arch is None:
            raise PrecompiledUnsupported("no CUDA device found through the driver")
        # A cubin (sm_ target) loads without the driver compiling PTX first (about 30 ms a program, in every
        # process whose driver cache lacks it); PTX (compute_) where only CuPy reaches NVRTC. Hopper and
        # Blackwell's arch-specific features (wgmma) need the "a" target, as MLX compiles them: code for
        # compute_90 holding wgmma is refused at load (CUDA_ERROR_INVALID_PTX), compute_90a loads
        cubin = nvrtc.cubin_available() if cubin is None else cubin
        self.arch = f"{'sm' if cubin else 'compute'}_{arch[0]}{arch[1]}{'a' if tuple(arch) in ARCH_SPECIFIC else ''}"
        self._compile = compile_fn or nvrtc.compile_program
        includes = nvrtc.include_paths() if includes is None else includes
        self.options = [f"--gpu-architecture={self.arch}"] + [f"--include-path={p}" for p in includes]
        self.nvrtc_version = nvrtc_version or nvrtc.version()
        self.mlx_version = mlx_version()
        self._memo: dict[str, bytes] = {}

    def fields(self, source: str, name: str) -> dict[str, Any]:
        """Everything that changes the binary: the cache entry's key fields."""
        return {"name": name, "source_sha256": hashlib.sha256(source.encode()).hexdigest(), "arch": self.arch,
                "nvrtc": self.nvrtc_version, "mlx": self.mlx_version, "options": list(self.options)}

    def _job(self, source: str, name: str):
        return self.fields(source, name), lambda: self._compile(source, name, list(self.options))

    def program(self, source: str, name: str) -> bytes:
        """The program (cubin or PTX) for one (source, name): memoised, from the disk cache, else compiled."""
        if name not in self._memo:
            self._memo[name] = self.cache.get_or_build(*self._job(source, name))
        return self._memo[name]

    def programs(self, programs: Iterable[tuple[str, str]], workers: int | None = None) -> list[bytes | BaseException]:
        """The program (cubin or PTX), or the exception, for each (source, name), compiled in parallel threads."""
        programs = list(programs)
        todo = list({n: (s, n) for s, n in programs if n not in self._memo}.values())
        errors: dict[str, BaseException] = {}
        for (_, n), got in zip(todo, build_all(self.cache, (self._job(s, n) for s, n in todo), workers)):
            if isinstance(got, BaseException):
                errors[n] = got
            else:
                self._memo[n] = got
        return [self._memo[n] if n in self._memo else errors[n] for _, n in programs]


_PROCESS_COMPILER: Compiler | None = None
_UNAVAILABLE: str | None = None


def process_compiler() -> Compiler | None:
    """This process's Compiler when the precompiled path can run here, else None (cuda_kernel then)."""
    global _PROCESS_COMPILER, _UNAVAILABLE
    if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if _PROCESS_COMPILER is None and _UNAVAILABLE is None:
        try:
            import mlx.core as mx

            if getattr(mx.fast, "precompiled_cuda_kernel", None) is None:
                raise PrecompiledUnsupported("this MLX has no mx.fast.precompiled_cuda_kernel")
            _PROCESS_COMPILER = Compiler()
        except Exception as exc:  # noqa: BLE001 - any missing piece means cuda_kernel compiles instead
            _UNAVAILABLE = str(exc)
    return _PROCESS_COMPILER


def unavailable_reason() -> str | None:
    """Why process_compiler() gave None (after it was asked), for benchmarks and logs."""
    return _UNAVAILABLE


def sanitize(name: str) -> str:
    return re.sub(r"\W", "_", name)


def launch_name(base: str, template: Sequence[tuple[str, Any]], signature: Sequence[tuple[str, int]],
                output_dtypes: Sequence[str]) -> str:
    """custom_kernel_<base><template suffix>_pc<hash of the signature>: MLX's name for the config (what the
    gpu timer matches), made unique per launch signature and distinct from cuda_kernel's own module."""
    sig = hashlib.sha256(repr((tuple(signature), tuple(output_dtypes))).encode()).hexdigest()[:8]
    return sanitize(f"custom_kernel_{base}{template_suffix(template)}_pc{sig}")
