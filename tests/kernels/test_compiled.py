"""The precompiled program: MLX's generated kernel around our source, shapes as scalars; compiled once, in parallel."""

import threading
import time

import pytest

from zmlx_pipeline.kernels import compiled
from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.ptx_cache import PtxCache


class FakeArray:
    def __init__(self, shape, dtype):
        self.shape, self.ndim, self.dtype = tuple(shape), len(shape), f"mlx.core.{dtype}"


def test_the_program_declares_inputs_outputs_then_shape_scalars():
    spec = get_kernel("rmsnorm")
    template = [("T", "mlx.core.float16"), ("TG", 256), ("VEC", 4), ("ROWS", 1)]
    sig = compiled.input_signature([FakeArray((8, 4096), "float16"), FakeArray((4096,), "float16")])
    name = compiled.launch_name("zp_rmsnorm_abc", template, sig, ("float16",))
    assert name.startswith("custom_kernel_zp_rmsnorm_abc_float16_256_4_1_pc")
    text = compiled.program(name, spec.header("cuda"), spec.source("cuda"), spec.inputs, spec.outputs, sig,
                            ["float16"], template)
    head = text[text.index(f'extern "C" __global__ void {name}('):]
    order = [head.index(p) for p in ("const __half* x", "const __half* w", "__half* y", "const int x_shape_0",
                                     "const int x_shape_1")]
    assert order == sorted(order)
    assert "w_shape_0" not in text  # the body never reads w_shape
    assert "const int x_shape[2] = {x_shape_0, x_shape_1};" in text
    assert "constexpr int TG = 256;" in text and "using T = __half;" in text
    assert text.index("using T = __half;") < text.index(spec.source("cuda").strip()[:40])
    uses = compiled.shape_inputs(spec.source("cuda"), spec.inputs)
    assert compiled.shape_scalars(uses, [FakeArray((8, 4096), "float16"), FakeArray((4096,), "float16")]) == [8, 4096]


def test_a_source_reading_strides_is_left_to_cuda_kernel():
    with pytest.raises(compiled.PrecompiledUnsupported):
        compiled.program("k", "", "y[0] = x_strides[0];", ["x"], ["y"], [("float32", 1)], ["float32"], [])


def test_each_launch_signature_gets_its_own_name():
    t = [("T", "float32"), ("TG", 128)]
    a = compiled.launch_name("zp_k", t, (("float32", 2),), ("float32",))
    assert a != compiled.launch_name("zp_k", t, (("float32", 3),), ("float32",))
    assert a != compiled.launch_name("zp_k", [("T", "float32"), ("TG", 256)], (("float32", 2),), ("float32",))


class SlowCompiler:
    """NVRTC's test double: records each compile and how many ran at once."""

    def __init__(self, delay=0.05, fail=()):
        self.calls, self.active, self.peak, self.delay, self.fail = [], 0, 0, delay, fail
        self.lock = threading.Lock()

    def __call__(self, source, name, options):
        with self.lock:
            self.calls.append(name)
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(self.delay)
        with self.lock:
            self.active -= 1
        if name in self.fail:
            raise RuntimeError("Failed to compile kernel: bad")
        return f"// ptx of {name} for {options[0]}\n".encode()


def _compiler(tmp_path, fake, arch=(9, 0), cubin=False):
    return compiled.Compiler(PtxCache(tmp_path), arch=arch, compile_fn=fake, nvrtc_version="13.0", includes=[],
                             cubin=cubin)


def test_programs_compile_in_parallel_once_per_program_and_the_cache_serves_the_next_process(tmp_path):
    fake = SlowCompiler()
    programs = [(f"src {i}", f"k{i}") for i in range(8)] + [("src 0", "k0")]
    got = _compiler(tmp_path, fake).programs(programs, workers=4)
    assert sorted(fake.calls) == sorted(f"k{i}" for i in range(8)) and fake.peak > 1
    assert got[0] == got[-1] == b"// ptx of k0 for --gpu-architecture=compute_90a\n"  # wgmma needs sm_90a
    again = SlowCompiler()
    assert _compiler(tmp_path, again).programs(programs) == got and again.calls == []
    other_arch = SlowCompiler()
    compiled.Compiler(PtxCache(tmp_path), arch=(8, 0), compile_fn=other_arch, nvrtc_version="13.0",
                      includes=[], cubin=False).program("src 0", "k0")
    assert other_arch.calls == ["k0"]


def test_a_failed_compile_is_returned_not_cached(tmp_path):
    fake = SlowCompiler(delay=0, fail=("k1",))
    got = _compiler(tmp_path, fake).programs([("a", "k0"), ("b", "k1")])
    assert isinstance(got[1], RuntimeError) and isinstance(got[0], bytes)
    retry = SlowCompiler(delay=0)
    assert isinstance(_compiler(tmp_path, retry).programs([("b", "k1")])[0], bytes) and retry.calls == ["k1"]


def test_the_path_is_off_when_disabled(monkeypatch):
    monkeypatch.setenv(compiled.DISABLE_ENV, "0")
    assert compiled.process_compiler() is None


def test_arch_specific_targets_where_mlx_uses_them(tmp_path):
    target = lambda cc: _compiler(tmp_path, SlowCompiler(), arch=cc).arch  # noqa: E731
    assert (target((9, 0)), target((8, 0)), target((8, 9)), target((10, 0))) == (
        "compute_90a", "compute_80", "compute_89", "compute_100a")
    cubin = lambda cc: _compiler(tmp_path, SlowCompiler(), arch=cc, cubin=True).arch  # noqa: E731
    assert (cubin((9, 0)), cubin((8, 0)), cubin((12, 1))) == ("sm_90a", "sm_80", "sm_121a")


def test_a_cubin_and_ptx_of_one_program_are_separate_entries(tmp_path):
    as_ptx, as_cubin = SlowCompiler(delay=0), SlowCompiler(delay=0)
    ptx = _compiler(tmp_path, as_ptx).program("src 0", "k0")
    cubin = _compiler(tmp_path, as_cubin, cubin=True).program("src 0", "k0")
    assert as_ptx.calls == as_cubin.calls == ["k0"]  # neither served the other's entry
    assert b"compute_90a" in ptx and b"sm_90a" in cubin


def test_without_nvrtc_or_cupy_the_compiler_says_so(monkeypatch):
    import sys

    from zmlx_pipeline.kernels import nvrtc

    monkeypatch.setattr(nvrtc, "_LIB", None)
    monkeypatch.setattr(nvrtc, "_candidates", lambda: ["/nonexistent/libnvrtc.so"])
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setitem(sys.modules, "cupy.cuda", None)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nvrtc", None)
    with pytest.raises(nvrtc.NvrtcUnavailable, match="CuPy"):
        nvrtc.version()
    with pytest.raises(nvrtc.NvrtcUnavailable, match="CuPy"):
        nvrtc.compile_program("", "k", ["--gpu-architecture=compute_90"])
    assert nvrtc.cubin_available() is False
    with pytest.raises(nvrtc.NvrtcUnavailable):  # CuPy is not asked for a cubin: the Compiler chose PTX there
        nvrtc.compile_program("", "k", ["--gpu-architecture=sm_90"])
