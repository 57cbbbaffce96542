"""topk_gating, moe_combine and matmul: references, config spaces, grids, costs, and their bodies compiled (nvcc) and run (a CPU emulation), all without a GPU."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from zmlx_pipeline.kernels import prelude  # noqa: E402
from zmlx_pipeline.kernels.spec import DTYPE_BYTES, Limits  # noqa: E402



def _load_cuda_compile():
    path = Path(__file__).with_name("cuda_compile.py")
    module_spec = importlib.util.spec_from_file_location("zp_cuda_compile_moe", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


cuda_compile = _load_cuda_compile()

NAMES = ("topk_gating", "moe_combine", "matmul")
DTYPES = ("float32", "float16", "bfloat16")
LIMITS = (Limits(), Limits(1024, 32, 49152))

SMALL = {
    "topk_gating": {"tokens": 7, "experts": 64, "k": 4},
    "moe_combine": {"tokens": 5, "k": 4, "hidden": 96},
    "matmul": {"M": 9, "N": 48, "K": 40},
}


def spec_of(name):
    return importlib.import_module(f"zmlx_pipeline.kernels.builtin.{name}").SPEC


def cpu_inputs(spec, shape, dtype="float32", seed=0):
    with mx.stream(mx.cpu):
        inputs = spec.make_inputs(shape, getattr(mx, dtype), mx.random.key(seed))
        mx.eval(inputs)
    return inputs


def cpu_eval(fn, inputs, shape):
    with mx.stream(mx.cpu):
        outs = [o if o.dtype != mx.bfloat16 else o.astype(mx.float32) for o in fn(inputs, shape)]
        mx.eval(outs)
    return [np.array(o) for o in outs]


# -- references ---------------------------------------------------------------------------------

def numpy_topk(x, k):
    idx = np.argsort(-x, axis=-1, kind="stable")[:, :k]
    v = np.take_along_axis(x, idx, -1)
    e = np.exp(v - v[:, :1])
    return e / e.sum(-1, keepdims=True), idx


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_reference_matches_numpy_and_mlx_op(dtype):
    spec = spec_of("topk_gating")
    for shape in (SMALL["topk_gating"], {"tokens": 3, "experts": 8, "k": 8}, {"tokens": 4, "experts": 256, "k": 1}):
        inputs = cpu_inputs(spec, shape, dtype)
        w, idx = cpu_eval(spec.reference, inputs, shape)
        assert w.dtype == np.float32 and idx.dtype == np.int32
        assert w.shape == idx.shape == (shape["tokens"], shape["k"])
        nw, nidx = numpy_topk(np.array(inputs[0].astype(mx.float32)), shape["k"])
        np.testing.assert_array_equal(idx, nidx)
        np.testing.assert_allclose(w, nw, rtol=1e-6, atol=1e-7)
        # MLX's own op selects the same experts (argpartition leaves them unordered)
        ow, oidx = cpu_eval(spec.mlx_op, inputs, shape)
        order = np.argsort(-ow, axis=-1, kind="stable")
        np.testing.assert_array_equal(np.take_along_axis(oidx, order, -1), idx)
        np.testing.assert_allclose(np.take_along_axis(ow, order, -1), w, rtol=1e-5, atol=1e-6)


def test_topk_inputs_are_exact_in_every_dtype_and_free_of_ties():
    spec = spec_of("topk_gating")
    for experts in (8, 16, 32, 64, 128, 256):
        shape = {"tokens": 64, "experts": experts, "k": 8}
        x32 = np.array(cpu_inputs(spec, shape, "float32", seed=experts)[0])
        for dtype in ("float16", "bfloat16"):
            x = np.array(cpu_inputs(spec, shape, dtype, seed=experts)[0].astype(mx.float32))
            np.testing.assert_array_equal(x, x32)
        assert all(len(set(row)) == experts for row in x32.tolist())
    kk = cpu_inputs(spec, SMALL["topk_gating"])[1]
    assert kk.dtype == mx.int32 and kk.shape == (SMALL["topk_gating"]["k"],)


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_combine_reference_matches_numpy_and_mlx_op(dtype):
    spec = spec_of("moe_combine")
    shape = SMALL["moe_combine"]
    inputs = cpu_inputs(spec, shape, dtype)
    (y,) = cpu_eval(spec.reference, inputs, shape)
    eo, w = (np.array(a.astype(mx.float32)).astype(np.float64) for a in inputs)
    np.testing.assert_allclose(y, np.einsum("tjh,tj->th", eo, w), rtol=1e-5, atol=1e-6)
    (o,) = cpu_eval(spec.mlx_op, inputs, shape)
    rtol, atol = spec.tolerance_for(dtype)
    np.testing.assert_allclose(o.astype(np.float32), y, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_reference_matches_numpy_and_mlx_op(dtype):
    spec = spec_of("matmul")
    shape = SMALL["matmul"]
    inputs = cpu_inputs(spec, shape, dtype)
    (c,) = cpu_eval(spec.reference, inputs, shape)
    a, b = (np.array(t.astype(mx.float32)).astype(np.float64) for t in inputs)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-6)
    (o,) = cpu_eval(spec.mlx_op, inputs, shape)
    rtol, atol = spec.tolerance_for(dtype)
    np.testing.assert_allclose(o.astype(np.float32), c, rtol=rtol, atol=atol)


def test_matmul_reference_is_float32_exact_through_a_tf32_split():
    from zmlx_pipeline.kernels.builtin.matmul import _tf32_split

    x = mx.random.normal((64, 64), key=mx.random.key(3))
    hi, lo = _tf32_split(x)
    bits = np.array(hi).view(np.uint32)
    assert not (bits & 0x1FFF).any()  # hi keeps 10 mantissa bits: exact in TF32
    np.testing.assert_array_equal(np.array(hi + lo), np.array(x))
    # the float32 reference on a long K stays at float32 accuracy
    spec = spec_of("matmul")
    shape = {"M": 4, "N": 16, "K": 4096}
    inputs = cpu_inputs(spec, shape)
    (c,) = cpu_eval(spec.reference, inputs, shape)
    a, b = (np.array(t).astype(np.float64) for t in inputs)
    assert np.max(np.abs(c - a @ b)) < 1e-5


# -- config spaces and shape grids --------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_presets_have_sensible_sizes(name):
    grid = spec_of(name).shape_grid
    assert set(grid.presets) == {"smoke", "full", "thin"}
    assert 3 <= len(grid.shapes("smoke")) <= 6
    assert 12 <= len(grid.shapes("full")) <= 40
    # the thinner grid of the SM-limited variants is a subset, so their cases compare with the full devices'
    assert 4 <= len(grid.shapes("thin")) < len(grid.shapes("full"))
    assert all(s in grid.shapes("full") for s in grid.shapes("thin"))


@pytest.mark.parametrize("limits", LIMITS, ids=("apple", "cuda48k"))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_every_shape_has_legal_configs(name, dtype, limits):
    spec = spec_of(name)
    for preset in spec.shape_grid.presets:
        for shape in spec.shape_grid.shapes(preset):
            assert spec.legal_configs(shape, dtype, limits), (preset, shape)


def test_matmul_space_stays_a_few_hundred_per_shape():
    spec = spec_of("matmul")
    counts = [len(spec.legal_configs(s, "float16", Limits())) for s in spec.shape_grid.shapes("full")]
    assert max(counts) <= 500


def test_matmul_constraints_remove_illegal_tiles():
    spec = spec_of("matmul")
    shape = {"M": 1024, "N": 4096, "K": 4096}
    cuda = Limits(1024, 32, 49152)
    # 2 x (128 x 40 + 32 x 136) halves = 37,888 bytes of slabs: fits CUDA, not Apple's 32 KiB
    big = {"TG": 128, "BM": 128, "BN": 128, "BK": 32, "WM": 2, "WN": 2, "STAGES": 2, "WG": 0}
    deep = "WG == 1 or STAGES == 4 or BK == 64 or tg_mem_bytes < 49152"
    # on CUDA a 32-deep slab goes only in a 4-deep ring (a 2-deep one measured slowest)
    assert spec.violations(big, shape, "float16", cuda) == [deep]
    ring = ("WG == 1 or STAGES * (BM * (BK + 16 // dtype_bytes) + BK * (BN + 8)) * dtype_bytes"
            " <= (101376 if tg_mem_bytes >= 49152 else tg_mem_bytes)")
    assert spec.violations(big, shape, "float16", Limits(1024, 32, 32768)) == [ring]
    # CUDA's ring is dynamic shared memory: past the 48 KiB of static memory, up to 99 KiB
    assert spec.violations({**big, "STAGES": 4}, shape, "float16", cuda) == []  # 75,776 bytes
    wide = {**big, "TG": 256, "WM": 4}  # 8 tiles a warp, as float32 allows
    assert spec.violations(wide, shape, "float32", cuda) == [deep]  # 71,680 bytes: fits, but 2-deep
    assert ring in spec.violations({**wide, "STAGES": 4}, shape, "float32", cuda)  # 143,360 bytes
    assert ring in spec.violations({**big, "BK": 64, "BN": 256}, shape, "float16", Limits(1024, 32, 232448))
    # the launch asks for exactly the ring on CUDA, nothing on Metal (static arrays there)
    assert spec.shared_memory_bytes({**big, "STAGES": 4}, "float16", "cuda") == 75776
    assert spec.shared_memory_bytes(big, "float32", "cuda") == 71680
    assert spec.shared_memory_bytes(big, "float16", "metal") == 0
    # a 64-deep slab only in a 2-deep ring
    assert "WG == 1 or BK == 32 or STAGES == 2" in spec.violations({**big, "BK": 64, "STAGES": 4}, shape, "float16", cuda)
    # TG is the warp layout's
    assert "TG == 32 * WM * WN" in spec.violations({**big, "TG": 256}, shape, "float16", cuda)
    legal = spec.legal_configs(shape, "float16", cuda)
    assert legal and all(c["TG"] == 32 * c["WM"] * c["WN"] for c in legal)
    # every warp owns 2..16 tiles of 16 x 16 (2..8 in float32)
    tiles = lambda c: (c["BM"] // (16 * c["WM"])) * (c["BN"] // (16 * c["WN"]))  # noqa: E731
    assert {tiles(c) for c in legal} <= set(range(2, 17)) and max(tiles(c) for c in legal) == 16
    assert all(c["WM"] * c["WN"] >= 2 and (c["BK"] == 32 or c["STAGES"] == 2) for c in legal)
    assert {(c["BK"], c["STAGES"]) for c in legal} == {(32, 4), (64, 2)}
    # where memory is short (Apple's 32 KiB) the 2-deep ring of 32-deep slabs stays
    small = spec.legal_configs(shape, "float16", Limits(1024, 32, 32768))
    assert (32, 2) in {(c["BK"], c["STAGES"]) for c in small}
    assert max(tiles(c) for c in spec.legal_configs(shape, "float32", cuda)) == 8
    # 16-lane SIMD groups cannot run the warp-level matrix ops
    assert "simd_width == 32" in spec.violations(big, shape, "float16", Limits(1024, 16, 49152))
    # decode rows get BM = 16 only, prefill rows the larger row blocks too
    assert {c["BM"] for c in spec.legal_configs({"M": 1, "N": 4096, "K": 4096}, "float16", cuda)} == {16}
    assert {c["BM"] for c in legal} == {16, 32, 64, 128}


def test_matmul_warpgroup_path_only_on_hopper_in_16_bit():
    spec = spec_of("matmul")
    shape = {"M": 1024, "N": 4096, "K": 4096}
    wg = {"TG": 256, "BM": 128, "BN": 256, "BK": 64, "WM": 2, "WN": 4, "STAGES": 4, "WG": 1}
    hopper, ampere, apple = (Limits(1024, 32, 49152, cuda_arch=90), Limits(1024, 32, 49152, cuda_arch=80),
                             Limits(1024, 32, 32768))
    arch = "WG == 0 or (cuda_arch == 90 and dtype_bytes == 2)"
    assert spec.violations(wg, shape, "float16", hopper) == []
    assert spec.violations(wg, shape, "bfloat16", hopper) == []
    assert spec.violations(wg, shape, "float32", hopper) == [arch]
    assert spec.violations(wg, shape, "float16", ampere) == [arch]
    assert arch in spec.violations(wg, shape, "float16", apple)
    # its ring: 4 x (128 + 256) rows of 128 bytes, plus 1 KiB to align it
    assert spec.shared_memory_bytes(wg, "float16", "cuda") == 4 * 384 * 128 + 1024
    # two warpgroups only where M fills them; rows of 8 elements for its 16-byte copies
    assert "WG == 0 or BM == 64 or M > 64" in spec.violations(wg, {**shape, "M": 16}, "float16", hopper)
    assert "WG == 0 or (N % 8 == 0 and K % 8 == 0)" in spec.violations(wg, {**shape, "N": 4100}, "float16", hopper)
    # the device's architecture reaches the limits from its catalog row
    assert Limits.from_device_row({"architecture": "sm_90"}).cuda_arch == 90
    assert Limits.from_device_row({"architecture": "apple9"}).cuda_arch == 0
    legal = spec.legal_configs(shape, "float16", hopper)
    assert {(c["BM"], c["BN"], c["STAGES"]) for c in legal if c["WG"]} == {
        (bm, bn, st) for bm in (64, 128) for bn in (128, 256) for st in (3, 4)}
    assert not any(c["WG"] for c in spec.legal_configs(shape, "float16", ampere))


def test_topk_constraints():
    spec = spec_of("topk_gating")
    shape = {"tokens": 64, "experts": 128, "k": 8}
    cfg = {"TG": 1024, "TOKENS": 8, "EPT": 1, "KMAX": 8}  # 64 KB of candidate lists
    assert spec.violations(cfg, shape, "float16", Limits(1024, 32, 49152)) == ["TG * KMAX * 8 <= tg_mem_bytes"]
    assert "k <= KMAX" in spec.violations({**cfg, "TG": 256, "KMAX": 4}, shape, "float16", Limits())
    assert "EPT * dtype_bytes <= 16" in spec.violations({"TG": 64, "TOKENS": 1, "EPT": 8, "KMAX": 8}, shape, "float32", Limits())
    legal = spec.legal_configs(shape, "float16", Limits())
    assert legal and all(c["KMAX"] == 8 for c in legal)
    assert {c["KMAX"] for c in spec.legal_configs({**shape, "k": 1}, "float16", Limits())} == {2, 4, 8}


def test_moe_combine_constraints():
    spec = spec_of("moe_combine")
    shape = {"tokens": 1, "k": 4, "hidden": 2880}
    assert "ROWS <= tokens" in spec.violations({"TG": 256, "VEC": 4, "ROWS": 2}, shape, "float16", Limits())
    assert "VEC * dtype_bytes <= 16" in spec.violations({"TG": 256, "VEC": 8, "ROWS": 1}, shape, "float32", Limits())
    assert "(TG // ROWS) * VEC <= hidden" in spec.violations({"TG": 1024, "VEC": 8, "ROWS": 1}, shape, "float16", Limits())


@pytest.mark.parametrize("name", NAMES)
def test_launches_are_whole_threadgroups_that_cover_the_output(name):
    spec = spec_of(name)
    for shape in spec.shape_grid.shapes("full"):
        for cfg in spec.legal_configs(shape, "float16", Limits(1024, 32, 49152)):
            launch = spec.launch(cfg, shape)
            tg = launch.threadgroup[0]
            assert launch.threadgroup == (cfg["TG"], 1, 1)
            assert launch.grid[0] % tg == 0
            assert launch.grid[1] <= 65535 and launch.grid[2] == 1  # CUDA's limit on grid y
            blocks = launch.grid[0] // tg
            if name == "topk_gating":
                assert blocks * cfg["TOKENS"] >= shape["tokens"]
                assert launch.output_dtypes == ("float32", "int32")
            elif name == "moe_combine":
                s = cfg["TG"] // cfg["ROWS"]
                assert blocks * cfg["ROWS"] >= shape["tokens"]
                assert launch.grid[1] * s * cfg["VEC"] >= shape["hidden"]
            else:
                # x: row blocks, y: column blocks (neighbouring threadgroups share B's columns)
                assert blocks * cfg["BM"] >= shape["M"] and launch.grid[1] * cfg["BN"] >= shape["N"]


def test_bytes_and_flops_by_hand():
    topk, combine, matmul = (spec_of(n) for n in NAMES)
    s = {"tokens": 1024, "experts": 128, "k": 8}
    assert topk.bytes_moved(s, 2) == 1024 * 128 * 2 + 1024 * 8 * (4 + 4)
    assert topk.flops(s) == 1024 * (128 + 4 * 8)
    s = {"tokens": 16, "k": 8, "hidden": 7168}
    assert combine.bytes_moved(s, 2) == (16 * 8 * 7168 + 16 * 8 + 16 * 7168) * 2
    assert combine.flops(s) == 2 * 16 * 8 * 7168
    s = {"M": 16, "N": 14336, "K": 4096}
    assert matmul.bytes_moved(s, 4) == (16 * 4096 + 4096 * 14336 + 16 * 14336) * 4
    assert matmul.flops(s) == 2 * 16 * 14336 * 4096


@pytest.mark.parametrize("name", NAMES)
def test_sources_stay_in_their_backend(name):
    spec = spec_of(name)
    for backend in prelude.BACKENDS:
        assert prelude.foreign_tokens(spec.header(backend) + spec.source(backend), backend) == []
    assert spec.describe()["class"]
    assert set(spec.params) <= set(spec.describe()["parameters"])


# -- CUDA translation unit and nvcc -------------------------------------------------------------

def test_translation_unit_types_int_inputs_when_asked():
    spec = spec_of("topk_gating")
    cfg = spec.legal_configs(SMALL["topk_gating"], "float16", Limits())[0]
    default = cuda_compile.translation_unit(spec, cfg, "float16")
    assert "const __half* kk," in default  # backward compatible: every input typed T
    dtypes = cuda_compile.input_dtypes_of(spec, "float16")
    assert dtypes == {"kk": "int32"}
    tu = cuda_compile.translation_unit(spec, cfg, "float16", dtypes)
    assert "const __half* logits," in tu and "const int32_t* kk," in tu
    assert "float* weights" in tu and "int32_t* indices" in tu
    with pytest.raises(ValueError):
        cuda_compile.translation_unit(spec, cfg, "float16", {"nope": "int32"})


NVCC_CASES = {
    "topk_gating": ("bfloat16", {"TG": 128, "TOKENS": 2, "EPT": 4, "KMAX": 8}),
    "moe_combine": ("float16", {"TG": 256, "VEC": 8, "ROWS": 2}),
    "matmul": ("float32", {"TG": 128, "BM": 64, "BN": 64, "BK": 16, "WM": 2, "WN": 2, "STAGES": 3, "WG": 0}),
}


@pytest.mark.skipif(cuda_compile.nvcc() is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_source_compiles(name, tmp_path):
    spec = spec_of(name)
    dtype, cfg = NVCC_CASES[name]
    result = cuda_compile.compile_cuda(spec, cfg, dtype, tmp_path, cuda_compile.input_dtypes_of(spec, dtype))
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.skipif(cuda_compile.nvcc() is None, reason="nvcc not installed")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("bm,bn", [(64, 256), (128, 128)])
def test_matmul_warpgroup_path_compiles_for_sm90a(dtype, bm, bn, tmp_path):
    """The wgmma path's PTX (sm_90a only); its numbers are checked on a Hopper GPU (test_gpu_kernels.py)."""
    spec = spec_of("matmul")
    cfg = {"TG": bm * 2, "BM": bm, "BN": bn, "BK": 64, "WM": bm // 64, "WN": 4, "STAGES": 4, "WG": 1}
    hopper = Limits(max_threads=1024, simd_width=32, tg_mem_bytes=49152, cuda_arch=90)
    assert not spec.violations(cfg, {"M": 2048, "N": 4096, "K": 4096}, dtype, hopper)
    result = cuda_compile.compile_cuda(spec, cfg, dtype, tmp_path, arch="sm_90a")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wgmma" not in cuda_compile.translation_unit(spec, cfg, dtype).split("namespace mlx::core::cu")[1]


# -- the bodies run on the CPU: one std::thread per GPU thread, std::barrier for KBARRIER --------

EMU_PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>
typedef unsigned int uint;
static std::barrier<>* k_bar;
#define KSHARED static
#define KBARRIER() k_bar->arrive_and_wait()
#define KINLINE inline
#define KDEV_PTR(T) T*
#define KCDEV_PTR(T) const T*
#define KTG_PTR(T) T*
#define KTH_PTR(T) T*
#define KRSQRT(x) (1.0f / std::sqrt(x))
#define KSQRT(x) std::sqrt(x)
#define KEXP(x) std::exp(x)
#define KLOG(x) std::log(x)
#define KTANH(x) std::tanh(x)
#define KFMAX(a, b) std::fmax(a, b)
#define KFMIN(a, b) std::fmin(a, b)
#define KFABS(x) std::fabs(x)
#define KLOWEST (-3.402823466e+38f)
template <int V, typename T> inline void k_load(const T* p, float* v) { for (int i = 0; i < V; ++i) v[i] = static_cast<float>(p[i]); }
template <int V, typename T> inline void k_store(T* p, const float* v) { for (int i = 0; i < V; ++i) p[i] = static_cast<T>(v[i]); }
struct Shape { int v[8]; int operator[](int i) const { return v[i]; } };
"""

#: the "mma" vocabulary on the CPU: every lane holds its warp's whole 16x16 tiles, so the body's
#: tiling, slab ring, edges and epilogue are checked; the element -> (row, column) map is CUDA's,
#: so every element of C must be written exactly once through it (the PTX fragment layouts
#: themselves only run on a GPU: tests/kernels/test_gpu_kernels.py)
EMU_MMA = r"""
#include <cstring>
#define KUNROLL
#define KALIGN16 __attribute__((aligned(16)))
static thread_local uint k_emu_lane;
struct k_mma_acc { float v[16][16]; };
template <typename T> struct k_mma_a { float v[16][16]; };
template <typename T> struct k_mma_b { float v[16][16]; };
inline void k_mma_zero(k_mma_acc* a) { std::memset(a->v, 0, sizeof(a->v)); }
template <typename T, typename F> inline void k_emu_fill(F* f, const T* p, int ld) {
  for (int r = 0; r < 16; ++r) for (int c = 0; c < 16; ++c) f->v[r][c] = static_cast<float>(p[r * ld + c]);
}
template <typename T> inline void k_mma_load_a(k_mma_a<T>* f, const T* p, int ld, uint) { k_emu_fill(f, p, ld); }
template <typename T> inline void k_mma_load_b(k_mma_b<T>* f, const T* p, int ld, uint) { k_emu_fill(f, p, ld); }
template <typename T> inline void k_mma(k_mma_acc* acc, const k_mma_a<T>* a, const k_mma_b<T>* b) {
  for (int i = 0; i < 16; ++i) for (int k = 0; k < 16; ++k) for (int j = 0; j < 16; ++j) acc->v[i][j] += a->v[i][k] * b->v[k][j];
}
inline int k_mma_row(int e, uint lane) { return (int)(lane >> 2) + ((e >> 1) & 1) * 8; }
inline int k_mma_col(int e, uint lane) { return (e >> 2) * 8 + (int)(lane & 3u) * 2 + (e & 1); }
inline float k_mma_get(const k_mma_acc* acc, int e) { return acc->v[k_mma_row(e, k_emu_lane)][k_mma_col(e, k_emu_lane)]; }
template <int V, typename T> inline void k_copy_async(T* dst, const T* src, int n) {
  for (int i = 0; i < V; ++i) dst[i] = i < n ? src[i] : static_cast<T>(0.0f);
}
template <typename T> inline void k_copy_async16(T* dst, const T* src) {
  for (int i = 0; i < 16 / (int)sizeof(T); ++i) dst[i] = src[i];
}
// threadgroup arrays as statics (shared by the block's threads), like KSHARED
#define KSHARED_DYN(T, name, count, offset) static T name[count]
inline void k_async_commit() {}
template <int N> inline void k_async_wait() {}
"""

#: "wgmma" is legal on sm_90 for 16-bit types only, never in these float32 runs: a no-op stand-in
EMU_WGMMA = r"""
template <typename T, int BM, int BN, int ST, int ON>
inline void k_wg_matmul(const T*, const T*, T*, int, int, int, int, int, int) {}
"""

#: the CPU stand-in of each prelude extension
EMU_EXTENSIONS = {"mma": EMU_MMA, "wgmma": EMU_WGMMA}

_EMU_TYPES = {"float32": "float", "int32": "int"}


def emulate(spec, config, shape, workdir: Path, seed=0, sanitize="address"):
    """Run `spec.body` for one config on float32 inputs: blocks one after another, KSHARED as statics.

    A thread that skips a barrier hangs the run (a timeout), and with `sanitize` ASan reports
    any read or write outside an input, output or threadgroup array.
    """
    inputs = [np.array(a) for a in cpu_inputs(spec, shape, "float32", seed)]
    launch = spec.launch(config, shape)
    out_dtypes = [d or "float32" for d in (launch.output_dtypes or (None,) * len(spec.outputs))]
    params, args, setup = [], [], []
    for i, (name, a) in enumerate(zip(spec.inputs, inputs)):
        ct = _EMU_TYPES[str(a.dtype)]
        params += [f"const {ct}* {name}", f"Shape {name}_shape"]
        args += [f"in{i}.data()", f"s{i}"]
        setup.append(f"std::vector<{ct}> in{i}({a.size}); if (fread(in{i}.data(), sizeof({ct}), {a.size}, f) != {a.size}) return 2;")
        setup.append(f"Shape s{i}{{}};" + "".join(f" s{i}.v[{j}] = {d};" for j, d in enumerate(a.shape)))
    sizes = []
    for i, (name, shp, d) in enumerate(zip(spec.outputs, launch.output_shapes, out_dtypes)):
        ct, n = _EMU_TYPES[d], math.prod(shp)
        params.append(f"{ct}* {name}")
        args.append(f"out{i}.data()")
        setup.append(f"std::vector<{ct}> out{i}({n}, ({ct})(-31337));")
        sizes.append((ct, n))
    tg = launch.threadgroup[0]
    consts = "".join(f"  constexpr int {k} = {int(v)};\n" for k, v in config.items())
    writes = "".join(f"  fwrite(out{i}.data(), sizeof({ct}), {n}, o);\n" for i, (ct, n) in enumerate(sizes))
    code = EMU_PRELUDE + "".join(EMU_EXTENSIONS[e] for e in spec.extensions) + spec.helpers + f"""
void k_body(uint k_tid, uint k_block_x, uint k_block_y, {", ".join(params)}) {{
  using T = float;
{consts}  const uint k_lane = k_tid & 31u; const uint k_warp = k_tid >> 5; (void)k_lane; (void)k_warp;
{"  k_emu_lane = k_lane;" if "mma" in spec.extensions else ""}
{spec.body}
}}
int main(int argc, char** argv) {{
  FILE* f = fopen(argv[1], "rb");
  {chr(10).join(setup)}
  fclose(f);
  for (uint by = 0; by < {launch.grid[1]}; ++by) for (uint bx = 0; bx < {launch.grid[0] // tg}; ++bx) {{
    std::barrier<> bar({tg}); k_bar = &bar;
    std::vector<std::thread> threads;
    for (uint t = 0; t < {tg}; ++t) threads.emplace_back([&, t] {{ k_body(t, bx, by, {", ".join(args)}); }});
    for (auto& th : threads) th.join();
  }}
  FILE* o = fopen(argv[2], "wb");
{writes}  fclose(o);
  return 0;
}}
"""
    tag = hashlib.sha256((code + str(sanitize)).encode()).hexdigest()[:12]
    src, exe = workdir / f"emu_{tag}.cpp", workdir / f"emu_{tag}"
    src.write_text(code)
    flags = ["-O1", "-g", f"-fsanitize={sanitize}"] if sanitize else ["-O2"]
    built = subprocess.run(["g++", "-std=c++20", "-pthread", *flags, str(src), "-o", str(exe)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (workdir / "in.bin").write_bytes(b"".join(np.ascontiguousarray(a).tobytes() for a in inputs))
    ran = subprocess.run([str(exe), str(workdir / "in.bin"), str(workdir / "out.bin")],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    raw, outs, off = (workdir / "out.bin").read_bytes(), [], 0
    for shp, d in zip(launch.output_shapes, out_dtypes):
        arr = np.frombuffer(raw, dtype=np.dtype(d), count=math.prod(shp), offset=off).reshape(shp)
        off += arr.nbytes
        outs.append(arr)
    refs = cpu_eval(spec.reference, [mx.array(a) for a in inputs], shape)
    return outs, refs


def _have_barrier_cxx() -> bool:
    if shutil.which("g++") is None:
        return False
    probe = subprocess.run(["g++", "-std=c++20", "-fsyntax-only", "-x", "c++", "-"],
                           input="#include <barrier>\nstd::barrier<> b(1);\n", capture_output=True, text=True)
    return probe.returncode == 0


EMU_CASES = [
    # odd sizes everywhere, so every edge guard is exercised; several tokens/rows per group
    ("topk_gating", {"tokens": 5, "experts": 64, "k": 4}, {"TG": 64, "TOKENS": 2, "EPT": 2, "KMAX": 4}),
    ("topk_gating", {"tokens": 3, "experts": 256, "k": 8}, {"TG": 256, "TOKENS": 1, "EPT": 1, "KMAX": 8}),
    ("topk_gating", {"tokens": 9, "experts": 8, "k": 2}, {"TG": 32, "TOKENS": 4, "EPT": 1, "KMAX": 2}),
    ("moe_combine", {"tokens": 5, "k": 3, "hidden": 72}, {"TG": 32, "VEC": 4, "ROWS": 2}),
    # odd M, N and K (zero-filled edges, rows not 16-byte aligned), 4-deep slab rings (the second with
    # fewer slabs than stages)
    ("matmul", {"M": 33, "N": 70, "K": 41}, {"TG": 64, "BM": 32, "BN": 32, "BK": 32, "WM": 2, "WN": 1, "STAGES": 4, "WG": 0}),
    ("matmul", {"M": 1, "N": 100, "K": 37}, {"TG": 64, "BM": 16, "BN": 64, "BK": 32, "WM": 1, "WN": 2, "STAGES": 4, "WG": 0}),
    # odd N: the epilogue stores element by element (an even N stores row neighbours in pairs); one
    # partial 64-deep slab
    ("matmul", {"M": 19, "N": 45, "K": 24}, {"TG": 64, "BM": 32, "BN": 32, "BK": 64, "WM": 2, "WN": 1, "STAGES": 2, "WG": 0}),
    # aligned rows: interior threadgroups copy whole slabs (k_copy_async16), edge ones check; several
    # K slabs, a last partial slab (K = 104), warps in a 2 x 2 layout
    ("matmul", {"M": 40, "N": 96, "K": 104}, {"TG": 128, "BM": 32, "BN": 64, "BK": 32, "WM": 2, "WN": 2, "STAGES": 4, "WG": 0}),
    ("matmul", {"M": 64, "N": 128, "K": 192}, {"TG": 128, "BM": 32, "BN": 64, "BK": 64, "WM": 2, "WN": 2, "STAGES": 2, "WG": 0}),
]


@pytest.mark.skipif(not _have_barrier_cxx(), reason="no g++ with C++20 <barrier>")
@pytest.mark.parametrize("name,shape,config", EMU_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(EMU_CASES)])
def test_body_matches_reference_in_cpu_emulation(name, shape, config, tmp_path):
    spec = spec_of(name)
    # legal on a CUDA device, whose fragment layout the emulation follows
    assert not spec.violations(config, shape, "float32", Limits(1024, 32, 49152))
    outs, refs = emulate(spec, config, shape, tmp_path)
    for out_name, o, r in zip(spec.outputs, outs, refs):
        if o.dtype.kind == "i":
            np.testing.assert_array_equal(o, r, err_msg=out_name)
        else:
            np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-5, err_msg=out_name)


@pytest.mark.parametrize("device, legal", [("nvidia-t4", False), ("nvidia-v100-sxm2-32gb", False),
                                           ("nvidia-gtx-1080-ti", False), ("nvidia-a100-sxm4-80gb", True),
                                           ("nvidia-rtx-4090", True), ("nvidia-h100-sxm", True),
                                           ("apple-m3-max-40c", True)])
def test_matmul_runs_on_cuda_from_ampere_on(device, legal):
    """Its CUDA body's cp.async copies and m16n8k16 MMAs exist from sm_80 on: an older NVIDIA GPU has no legal
    config (and the shipped bundle's lookup says so), Metal and every newer GPU keep theirs."""
    from zmlx_pipeline.data.catalog import get_device
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.runtime import predicted_config

    spec, shape = get_kernel("matmul"), {"M": 512, "N": 4096, "K": 4096}
    limits = Limits.from_device_row(get_device(device).as_row())
    assert bool(spec.legal_configs(shape, "bfloat16", limits)) is legal
    p = predicted_config("matmul", shape, "bfloat16", device=device)
    assert (p.config is not None) is legal
    if not legal:
        assert p.evidence == "none" and "cuda_arch == 0 or cuda_arch >= 80" in p.note
