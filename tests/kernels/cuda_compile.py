"""Builds the translation unit MLX's CUDA backend would JIT for a kernel config, and compiles it with nvcc.

Mirrors the wrapper `mx.fast.cuda_kernel` writes around `source` (signature, constexpr
template values, namespace), so a syntax or type error shows up here, without a GPU.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

STUB = Path(__file__).with_name("cuda_stub")
CUDA_TYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "int32": "int32_t", "uint32": "uint32_t"}


def nvcc() -> str | None:
    return shutil.which("nvcc")


def translation_unit(spec, config, dtype, input_dtypes=None):
    """The source MLX would JIT; `input_dtypes` maps an input name to its dtype when it is not T
    (MLX types each input by its array's dtype, e.g. int32 indices as `const int32_t*`)."""
    src = spec.source("cuda")
    input_dtypes = dict(input_dtypes or {})
    unknown = set(input_dtypes) - set(spec.inputs)
    if unknown:
        raise ValueError(f"input_dtypes names unknown input(s) {', '.join(sorted(unknown))}")
    params = []
    for name in spec.inputs:
        params.append(f"    const {CUDA_TYPES[input_dtypes.get(name, dtype)]}* {name}")
        if f"{name}_shape" in src:
            params.append(f"    const __grid_constant__ Shape {name}_shape")
        if f"{name}_strides" in src:
            params.append(f"    const __grid_constant__ Strides {name}_strides")
        if f"{name}_ndim" in src:
            params.append(f"    const __grid_constant__ int {name}_ndim")
    shape = {d: 64 for d in spec.shape_grid.dims}
    launch = spec.launch(config, shape)
    out_dtypes = launch.output_dtypes or (None,) * len(spec.outputs)
    for name, od in zip(spec.outputs, out_dtypes):
        params.append(f"    {CUDA_TYPES[od or dtype]}* {name}")
    consts = [f"  using T = {CUDA_TYPES[dtype]};"] + [f"  constexpr int {k} = {int(v)};" for k, v in config.items()]
    return (
        '#include "mlx/backend/cuda/device/utils.cuh"\n#include <cooperative_groups.h>\n'
        + spec.header("cuda")
        + "\nnamespace mlx::core::cu {\nnamespace cg = cooperative_groups;\n"
        + f"__global__ void k_{spec.name}(\n" + ",\n".join(params) + ") {\n"
        + "\n".join(consts) + "\n" + src + "\n}\n}\n"
    )


def input_dtypes_of(spec, dtype) -> dict[str, str]:
    """The dtype of each input that `spec.make_inputs` does not give in `dtype` (made on a tiny shape, on the CPU)."""
    import mlx.core as mx

    shape = {d: 8 for d in spec.shape_grid.dims}
    with mx.stream(mx.cpu):
        arrays = spec.make_inputs(shape, getattr(mx, dtype), mx.random.key(0))
    names = {getattr(mx, n): n for n in CUDA_TYPES if hasattr(mx, n)}
    return {name: names[a.dtype] for name, a in zip(spec.inputs, arrays) if a.dtype != getattr(mx, dtype)}


def compile_cuda(spec, config, dtype, workdir: Path, input_dtypes=None, arch: str = "sm_90") -> subprocess.CompletedProcess:
    """nvcc on the translation unit; `arch` sm_90a for Hopper-only instructions (wgmma), as MLX's NVRTC targets on an H100."""
    cu = workdir / f"{spec.name}_{dtype}.cu"
    cu.write_text(translation_unit(spec, config, dtype, input_dtypes))
    return subprocess.run(
        [nvcc(), "-std=c++17", f"-gencode=arch=compute_{arch[3:]},code={arch}", "-I", str(STUB), "-c", str(cu), "-o", str(cu.with_suffix(".o"))],
        capture_output=True, text=True, timeout=300,
    )
