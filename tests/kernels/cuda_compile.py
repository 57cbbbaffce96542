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


def translation_unit(spec, config, dtype):
    src = spec.source("cuda")
    params = []
    for name in spec.inputs:
        params.append(f"    const {CUDA_TYPES[dtype]}* {name}")
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


def compile_cuda(spec, config, dtype, workdir: Path) -> subprocess.CompletedProcess:
    cu = workdir / f"{spec.name}_{dtype}.cu"
    cu.write_text(translation_unit(spec, config, dtype))
    return subprocess.run(
        [nvcc(), "-std=c++17", "-arch=sm_90", "-I", str(STUB), "-c", str(cu), "-o", str(cu.with_suffix(".o"))],
        capture_output=True, text=True, timeout=300,
    )
