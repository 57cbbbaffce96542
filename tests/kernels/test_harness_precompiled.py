"""The harness's launch through cached PTX, without a GPU: MLX's precompiled_cuda_kernel and cuda_kernel are
test doubles that record their arguments; the compiler is NVRTC's double."""

from __future__ import annotations

import mlx.core as mx
import pytest

from zmlx_pipeline.kernels import compiled, harness
from zmlx_pipeline.kernels.nvrtc import NvrtcCompileError
from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.ptx_cache import PtxCache

SHAPE = {"rows": 8, "cols": 256}
CONFIG = {"TG": 64, "VEC": 2, "ROWS": 1}


class Recorder:
    def __init__(self, label):
        self.label, self.calls = label, []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        return [self.label]


@pytest.fixture
def doubles(monkeypatch, tmp_path):
    fast = Recorder("precompiled")
    plain = Recorder("cuda_kernel")
    monkeypatch.setattr(mx.fast, "precompiled_cuda_kernel", fast)
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **kw: plain)
    compiles = []

    def nvrtc(source, name, options):
        compiles.append(name)
        if "BROKEN" in source:
            raise NvrtcCompileError("Failed to compile kernel: error: BROKEN")
        return b"// ptx " + name.encode()

    comp = compiled.Compiler(PtxCache(tmp_path), arch=(9, 0), compile_fn=nvrtc, nvrtc_version="13.0", includes=[])
    monkeypatch.setattr(compiled, "process_compiler", lambda: comp)
    return fast, plain, compiles


def _inputs():
    return [mx.ones((SHAPE["rows"], SHAPE["cols"]), dtype=mx.float16), mx.ones((SHAPE["cols"],), dtype=mx.float16)]


def test_a_launch_goes_through_cached_ptx_with_shapes_as_scalars(doubles):
    fast, plain, compiles = doubles
    launcher = harness.Launcher(get_kernel("rmsnorm"), "cuda")
    out = launcher(_inputs(), CONFIG, SHAPE, "float16", init_value=float("nan"))
    assert out == ["precompiled"] and plain.calls == []
    call = fast.calls[0]
    assert call["name"].startswith(launcher.kernel_name_part) and call["compiled_source"] == b"// ptx " + call["name"].encode()
    assert call["scalars"] == [8, 256]  # x_shape only: the body never reads w_shape
    assert call["ensure_row_contiguous"] is True and call["init_value"] != call["init_value"]  # NaN poison kept
    assert call["output_shapes"] == [(8, 256)] and call["output_dtypes"] == [mx.float16]
    launcher(_inputs(), CONFIG, SHAPE, "float16")
    assert len(compiles) == 1  # the second launch reuses the program


def test_precompile_builds_every_config_before_any_launch(doubles):
    fast, _, compiles = doubles
    launcher = harness.Launcher(get_kernel("rmsnorm"), "cuda")
    configs = [{"TG": tg, "VEC": 2, "ROWS": 1} for tg in (32, 64, 128)]
    assert launcher.precompile([(c, SHAPE, "float16", _inputs()) for c in configs]) == 3
    assert len(compiles) == 3 and fast.calls == []
    for c in configs:
        launcher(_inputs(), c, SHAPE, "float16")
    assert len(compiles) == 3 and len(fast.calls) == 3


def test_a_program_nvrtc_rejects_falls_back_to_cuda_kernel(doubles, monkeypatch):
    fast, plain, _ = doubles
    spec = get_kernel("rmsnorm")
    monkeypatch.setattr(type(spec), "header", lambda self, backend: "// BROKEN\n")
    launcher = harness.Launcher(spec, "cuda")
    assert launcher(_inputs(), CONFIG, SHAPE, "float16") == ["cuda_kernel"]
    assert fast.calls == [] and len(plain.calls) == 1


def test_precompiled_false_never_uses_the_cache(doubles):
    fast, plain, compiles = doubles
    launcher = harness.Launcher(get_kernel("rmsnorm"), "cuda", precompiled=False)
    assert launcher(_inputs(), CONFIG, SHAPE, "float16") == ["cuda_kernel"] and compiles == [] and fast.calls == []
