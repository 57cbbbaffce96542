"""Compile every built-in kernel's precompiled program with NVRTC (no MLX needed) and load it in the driver.

    python benchmarks/ptx_compile_probe.py [--configs 2] [--dtypes float16,bfloat16,float32] [--arch 90]

Builds kernels/compiled.py's program for the first smoke shape of each built-in kernel, --configs
legal configs spread over its space, per dtype; compiles them all at once through the compiled-
kernel cache (NVRTC in parallel threads) into an empty cache directory, reads them back through a
new Compiler (the warm cache: nothing compiled), and loads each PTX with the CUDA driver
(cuModuleLoadData, then the kernel by name). Prints the NVRTC version, the target, the wall times
and every failure. The ranks of inputs are the built-in kernels' (1 for topk_gating's kk, 3 for
moe_combine's expert_out, else 2). notes/compiled-kernels.md has the figures from an H200.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RANKS = {"kk": 1, "expert_out": 3}


def programs(configs: int, dtypes: list[str], arch: int) -> list[tuple[str, str]]:
    from zmlx_pipeline.kernels import compiled
    from zmlx_pipeline.kernels.builtin import BUILTIN
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.kernels.spec import Limits, spread

    out = []
    for name in BUILTIN:
        spec = get_kernel(name)
        shape = spec.shape_grid.shapes("smoke")[0]
        for dtype in dtypes:
            for cfg in spread(spec.legal_configs(shape, dtype, Limits(1024, 32, 232448, cuda_arch=arch)), configs):
                launch = spec.launch(cfg, shape)
                outs = [d or dtype for d in (launch.output_dtypes or (None,) * len(spec.outputs))]
                template = [("T", dtype)] + [(k, int(v)) for k, v in cfg.items()]
                sig = tuple((dtype, RANKS.get(n, 2)) for n in spec.inputs)
                kname = compiled.launch_name("zp_" + name, template, sig, outs)
                out.append((compiled.program(kname, spec.header("cuda"), spec.source("cuda"), spec.inputs,
                                             spec.outputs, sig, outs, template), kname))
    return out


def load_failures(items: list[tuple[str, bytes]]) -> list[str]:
    """Names whose PTX the driver refused, or whose kernel it did not find."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuInit(0)
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    lib.cuDeviceGet(ctypes.byref(dev), 0)
    lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    lib.cuCtxSetCurrent(ctx)
    bad = []
    for name, ptx in items:
        module, fn = ctypes.c_void_p(), ctypes.c_void_p()
        err = lib.cuModuleLoadData(ctypes.byref(module), ptx)
        if err or lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()):
            bad.append(f"{name} (CUresult {err})")
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=2)
    parser.add_argument("--dtypes", default="float16,bfloat16,float32")
    parser.add_argument("--arch", type=int, default=90, help="cuda_arch for the legality constraints")
    args = parser.parse_args()
    from zmlx_pipeline.kernels import compiled, nvrtc
    from zmlx_pipeline.kernels.ptx_cache import PtxCache

    try:
        print(f"NVRTC {nvrtc.version()}, device {nvrtc.compute_capability()}")
    except nvrtc.NvrtcUnavailable as exc:
        print(f"ptx_compile_probe: {exc}", file=sys.stderr)
        return 2
    todo = programs(args.configs, args.dtypes.split(","), args.arch)
    root = tempfile.mkdtemp(prefix="zmlx-ptx-probe-")
    cold = compiled.Compiler(PtxCache(root))
    t0 = time.perf_counter()
    got = cold.programs(todo)
    cold_s = time.perf_counter() - t0
    failed = [f"{n}: {str(g)[:300]}" for (_, n), g in zip(todo, got) if isinstance(g, BaseException)]
    warm = compiled.Compiler(PtxCache(root))
    t0 = time.perf_counter()
    again = warm.programs(todo)
    warm_s = time.perf_counter() - t0
    print(f"target {cold.arch}: {len(todo)} programs compiled in {cold_s:.2f} s, {len(failed)} failed; warm "
          f"{warm_s:.3f} s ({warm.cache.built} compiled, same bytes: {again == got})")
    for f in failed[:5]:
        print("  compile failure:", f)
    bad = load_failures([(n, g) for (_, n), g in zip(todo, got) if isinstance(g, bytes)])
    print(f"driver load failures: {len(bad)}")
    for b in bad[:5]:
        print("  ", b)
    return 1 if failed or bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
