"""The row-wise built-in kernels (add_rmsnorm, layernorm, softmax, swiglu), checked without a GPU.

References against MLX's own ops on the CPU backend, config spaces and their constraints, launch
mappings, the bytes model, the generated sources, an nvcc compile of the exact translation unit
MLX's CUDA backend would JIT, and a CPU run of each body (TG real threads per threadgroup, a real
barrier) against the reference.
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from zmlx_pipeline.kernels import prelude
from zmlx_pipeline.kernels.harness import compare
from zmlx_pipeline.kernels.spec import DTYPE_BYTES, Limits

KERNELS = ("add_rmsnorm", "layernorm", "softmax", "swiglu")
DTYPES = ("float16", "bfloat16", "float32")
LIMITS = (Limits(), Limits(1024, 32, 49152))


def spec_of(name):
    return importlib.import_module(f"zmlx_pipeline.kernels.builtin.{name}").SPEC


def _cuda_compile():
    path = Path(__file__).with_name("cuda_compile.py")
    module_spec = importlib.util.spec_from_file_location("zp_cuda_compile", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


# -- references ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KERNELS)
def test_reference_agrees_with_mlx_op_in_float32(name):
    import mlx.core as mx

    spec = spec_of(name)
    shape = {"rows": 5, "cols": 264}
    with mx.stream(mx.cpu):
        inputs = spec.make_inputs(shape, mx.float32, mx.random.key(3))
        refs = spec.reference(inputs, shape)
        ops = spec.mlx_op(inputs, shape)
        mx.eval(refs, ops)
        assert [tuple(r.shape) for r in refs] == [(5, 264)] * len(spec.outputs)
        assert compare(spec, ops, refs, "float32") is None


def test_add_rmsnorm_reference_normalises_the_rounded_sum():
    import mlx.core as mx

    spec = spec_of("add_rmsnorm")
    shape = {"rows": 3, "cols": 128}
    with mx.stream(mx.cpu):
        x, r, w = spec.make_inputs(shape, mx.float16, mx.random.key(5))
        h, y = spec.reference([x, r, w], shape)
        assert h.dtype == mx.float16
        assert mx.array_equal(h, x + r).item()
        hf = h.astype(mx.float32)
        want = hf * mx.rsqrt(mx.mean(hf * hf, axis=-1, keepdims=True) + 1e-5) * w.astype(mx.float32)
        assert mx.allclose(y, want, rtol=1e-6, atol=1e-6).item()


def test_layernorm_reference_handles_a_large_mean():
    import mlx.core as mx

    spec = spec_of("layernorm")
    shape = {"rows": 2, "cols": 256}
    with mx.stream(mx.cpu):
        x, w, b = spec.make_inputs(shape, mx.float32, mx.random.key(9))
        (y,) = spec.reference([x + 100.0, w, b], shape)
        (y0,) = spec.reference([x, w, b], shape)
        assert mx.allclose(y, y0, rtol=1e-3, atol=1e-3).item()


# -- config spaces ---------------------------------------------------------------------------


@pytest.mark.parametrize("limits", LIMITS, ids=("default", "49k"))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", KERNELS)
def test_every_shape_of_every_preset_has_legal_configs(name, dtype, limits):
    spec = spec_of(name)
    for preset in ("smoke", "full"):
        for shape in spec.shape_grid.shapes(preset):
            assert spec.legal_configs(shape, dtype, limits), (preset, shape)


@pytest.mark.parametrize("name", KERNELS)
def test_grids_are_sized_as_agreed(name):
    spec = spec_of(name)
    assert spec.shape_grid.dims == ("rows", "cols")
    assert 4 <= len(spec.shape_grid.shapes("smoke")) <= 6
    full = spec.shape_grid.shapes("full")
    # at most 48: a full grid must collect in a few calls per GPU (softmax's 42 shapes took two H200 calls)
    assert 12 <= len(full) <= 48
    # token counts: powers of two up to 32768
    assert all(s["rows"] & (s["rows"] - 1) == 0 and s["rows"] <= 32768 for s in full)
    thin = spec.shape_grid.shapes("thin")
    assert 4 <= len(thin) < len(full) and all(s in full for s in thin)
    if name == "swiglu":
        assert all(s["cols"] % 8 == 0 for s in full)
    else:
        assert all(512 <= s["cols"] <= 32768 for s in full)


@pytest.mark.parametrize("name", KERNELS)
def test_vec8_is_illegal_in_float32_only(name):
    spec = spec_of(name)
    shape = {"rows": 64, "cols": 4096}
    extra = {"EPT": 1} if name == "swiglu" else {"ROWS": 1}
    config = {"TG": 256, "VEC": 8, **extra}
    assert "VEC * dtype_bytes <= 16" in spec.violations(config, shape, "float32", Limits())
    assert spec.violations(config, shape, "float16", Limits()) == []
    assert len(spec.legal_configs(shape, "float32", Limits())) < len(spec.legal_configs(shape, "float16", Limits()))


def test_row_constraints_remove_threadgroups_wider_than_the_work():
    spec = spec_of("softmax")
    assert spec.violations({"TG": 256, "VEC": 1, "ROWS": 8}, {"rows": 4, "cols": 1024}, "float16", Limits()) == ["ROWS <= rows"]
    # 64 threads per row at 8 elements each need at least 512 columns
    assert "(TG // ROWS) * VEC <= cols" in spec.violations({"TG": 64, "VEC": 8, "ROWS": 1}, {"rows": 4, "cols": 256}, "float16", Limits())
    small = Limits(max_threads=256)
    assert all(c["TG"] <= 256 for c in spec.legal_configs({"rows": 64, "cols": 4096}, "float16", small))


def test_swiglu_register_budget_and_tile_constraints():
    spec = spec_of("swiglu")
    big = {"rows": 4096, "cols": 14336}
    assert "TG * VEC * EPT <= 16384" in spec.violations({"TG": 1024, "VEC": 4, "EPT": 8}, big, "float16", Limits())
    assert spec.violations({"TG": 512, "VEC": 4, "EPT": 8}, big, "float16", Limits()) == []
    assert "VEC * EPT <= 32" in spec.violations({"TG": 32, "VEC": 8, "EPT": 8}, big, "float16", Limits())
    assert "TG * VEC * EPT <= rows * cols" in spec.violations({"TG": 1024, "VEC": 2, "EPT": 1}, {"rows": 1, "cols": 1408}, "float16", Limits())


# -- launches --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KERNELS)
def test_launches_are_whole_threadgroups_covering_the_problem(name):
    spec = spec_of(name)
    for shape in (*spec.shape_grid.shapes("smoke"), {"rows": 7, "cols": 1032}):
        for dtype in ("float16", "float32"):
            for config in spec.legal_configs(shape, dtype, Limits()):
                launch = spec.launch(config, shape)
                tg = config["TG"]
                assert launch.threadgroup == (tg, 1, 1)
                assert launch.grid[0] % tg == 0 and launch.grid[1:] == (1, 1)
                assert launch.output_shapes == ((shape["rows"], shape["cols"]),) * len(spec.outputs)
                groups = launch.grid[0] // tg
                if name == "swiglu":
                    per_group = tg * config["VEC"] * config["EPT"]
                    n = shape["rows"] * shape["cols"]
                    assert groups * per_group >= n > (groups - 1) * per_group
                    assert launch.grid[0] < 2**31
                else:
                    assert groups * config["ROWS"] >= shape["rows"] > (groups - 1) * config["ROWS"]


# -- cost model ------------------------------------------------------------------------------


def test_bytes_moved_matches_a_hand_count():
    s = {"rows": 8, "cols": 1024}
    n = 8 * 1024
    # x, r read; h, y written; w read once
    assert spec_of("add_rmsnorm").bytes_moved(s, 2) == 2 * (4 * n + 1024) == 67584
    # x read, y written; w and b read once
    assert spec_of("layernorm").bytes_moved(s, 4) == 4 * (2 * n + 2 * 1024) == 73728
    # x read once (the second pass re-reads the same bytes), y written
    assert spec_of("softmax").bytes_moved(s, 2) == 2 * 2 * n == 32768
    # g, u read; y written
    assert spec_of("swiglu").bytes_moved(s, 2) == 3 * 2 * n == 49152
    for name in KERNELS:
        assert spec_of(name).flops(s) > 0


# -- sources ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KERNELS)
def test_sources_are_one_body_in_each_backends_vocabulary(name):
    spec = spec_of(name)
    assert prelude.foreign_tokens(spec.body + spec.helpers, None) == []
    for backend in prelude.BACKENDS:
        text = spec.header(backend) + spec.source(backend)
        assert prelude.foreign_tokens(text, backend) == []
        assert spec.body in spec.source(backend)
    first_input = spec.inputs[0]
    assert f"{first_input}_shape" in spec.body  # MLX passes the shape of the input it names
    if name != "swiglu":
        body = spec.body
        # every thread reaches the single barrier; only then may inactive threads leave
        assert body.count("KBARRIER()") == 1
        assert body.index("KBARRIER()") < body.index("return;")
        assert "KSHARED float" in body and "TG / 32" in body


def test_kernel_versions_differ():
    assert len({spec_of(n).version for n in KERNELS} | {spec_of("rmsnorm").version}) == len(KERNELS) + 1


# -- nvcc ------------------------------------------------------------------------------------

COMPILE_CASES = (
    ("add_rmsnorm", {"TG": 256, "VEC": 8, "ROWS": 2}, "float16"),
    ("layernorm", {"TG": 128, "VEC": 8, "ROWS": 1}, "bfloat16"),
    ("softmax", {"TG": 1024, "VEC": 4, "ROWS": 1, "CACHE": 2}, "float32"),
    ("softmax", {"TG": 512, "VEC": 8, "ROWS": 2, "CACHE": 1}, "float16"),
    ("softmax", {"TG": 256, "VEC": 8, "ROWS": 1, "CACHE": 0}, "bfloat16"),
    ("swiglu", {"TG": 256, "VEC": 8, "EPT": 2}, "bfloat16"),
)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("name,config,dtype", COMPILE_CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in COMPILE_CASES])
def test_cuda_translation_unit_compiles(name, config, dtype, tmp_path):
    spec = spec_of(name)
    assert spec.violations(config, {"rows": 4096, "cols": 14336}, dtype, Limits()) == []
    result = _cuda_compile().compile_cuda(spec, config, dtype, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert " error" not in result.stderr


# -- CPU run of the body ---------------------------------------------------------------------

# The prelude vocabulary on the host: a threadgroup is TG std::threads sharing a std::barrier,
# KSHARED arrays are statics (one threadgroup runs at a time), and a SIMD reduction goes through
# a per-threadgroup scratch array between two barriers (every body calls them uniformly).
_HOST_PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
typedef unsigned int uint;
struct bf16 {
  uint16_t b;
  bf16() = default;
  bf16(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { b = 0x7fc0; return; }
    u += 0x7fffu + ((u >> 16) & 1u); b = (uint16_t)(u >> 16);
  }
  explicit operator float() const { uint32_t u = (uint32_t)b << 16; float f; std::memcpy(&f, &u, 4); return f; }
};
static std::barrier<>* g_bar;
static float g_simd[1024];
static thread_local uint t_tid;
#define KSHARED static
#define KBARRIER() g_bar->arrive_and_wait()
#define KINLINE inline
#define KDEV_PTR(T) T*
#define KCDEV_PTR(T) const T*
#define KTG_PTR(T) T*
#define KTH_PTR(T) T*
#define KRSQRT(x) (1.0f / std::sqrt((float)(x)))
#define KSQRT(x) std::sqrt((float)(x))
#define KEXP(x) std::exp((float)(x))
#define KLOG(x) std::log((float)(x))
#define KTANH(x) std::tanh((float)(x))
#define KFMAX(a, b) std::fmax((float)(a), (float)(b))
#define KFMIN(a, b) std::fmin((float)(a), (float)(b))
#define KFABS(x) std::fabs((float)(x))
#define KLOWEST (-3.402823466e+38f)
static float k_simd_reduce(float v, bool is_max) {
  g_simd[t_tid] = v;
  g_bar->arrive_and_wait();
  const uint b0 = t_tid & ~31u;
  float r = g_simd[b0];
  for (uint i = 1; i < 32; ++i) r = is_max ? std::fmax(r, g_simd[b0 + i]) : r + g_simd[b0 + i];
  g_bar->arrive_and_wait();
  return r;
}
#define KSIMD_SUM(v) k_simd_reduce((v), false)
#define KSIMD_MAX(v) k_simd_reduce((v), true)
template <int V, typename T> inline void k_load(const T* p, float* vals) { for (int i = 0; i < V; ++i) vals[i] = static_cast<float>(p[i]); }
template <int V, typename T> inline void k_store(T* p, const float* vals) { for (int i = 0; i < V; ++i) p[i] = static_cast<T>(vals[i]); }
"""

HOST_TYPES = {"float16": "_Float16", "bfloat16": "bf16", "float32": "float"}


def host_program(spec, dtype, configs) -> str:
    """One program running any of `configs` on float32 files: argv = config groups rows cols (size file)... outs..."""
    names = list(spec.params)
    params = [f"const T* {n}, const int* {n}_shape" for n in spec.inputs] + [f"T* {n}" for n in spec.outputs]
    args = [f"in[{i}].data(), shp" for i in range(len(spec.inputs))] + [f"out[{i}].data()" for i in range(len(spec.outputs))]
    cases = "\n".join(
        f"    case {i}: run<{', '.join(str(c[k]) for k in names)}>({c[spec.threadgroup_param]}, groups, in, out, shp); break;"
        for i, c in enumerate(configs)
    )
    return _HOST_PRELUDE + spec.helpers + f"""
template <typename T, {', '.join('int ' + k for k in names)}>
void kern({', '.join(params)}, uint tid, uint block) {{
  t_tid = tid;
  const uint k_tid = tid; const uint k_block_x = block; const uint k_block_y = 0;
  const uint k_lane = tid & 31u; const uint k_warp = tid >> 5;
  (void)k_block_y; (void)k_lane; (void)k_warp;
{spec.body}
}}
using T = {HOST_TYPES[dtype]};
template <{', '.join('int ' + k for k in names)}>
void run(int tg, int groups, std::vector<std::vector<T>>& in, std::vector<std::vector<T>>& out, const int* shp) {{
  for (int g = 0; g < groups; ++g) {{
    std::barrier<> bar(tg);
    g_bar = &bar;
    std::vector<std::thread> threads;
    for (int t = 0; t < tg; ++t)
      threads.emplace_back([&, t] {{ kern<T, {', '.join(names)}>({', '.join(args)}, (uint)t, (uint)g); }});
    for (auto& th : threads) th.join();
  }}
}}
int main(int argc, char** argv) {{
  const int cfg = atoi(argv[1]), groups = atoi(argv[2]);
  const int shp[2] = {{atoi(argv[3]), atoi(argv[4])}};
  const size_t n = (size_t)shp[0] * shp[1];
  int a = 5;
  std::vector<std::vector<T>> in, out;
  for (int i = 0; i < {len(spec.inputs)}; ++i) {{
    std::vector<float> f((size_t)atol(argv[a++]));
    FILE* fh = fopen(argv[a++], "rb"); if (fread(f.data(), 4, f.size(), fh) != f.size()) return 3; fclose(fh);
    in.emplace_back(f.begin(), f.end());
  }}
  for (int i = 0; i < {len(spec.outputs)}; ++i) out.emplace_back(n, static_cast<T>(NAN));
  switch (cfg) {{
{cases}
    default: return 2;
  }}
  for (int i = 0; i < {len(spec.outputs)}; ++i) {{
    std::vector<float> f(n);
    for (size_t j = 0; j < n; ++j) f[j] = static_cast<float>(out[i][j]);
    FILE* fh = fopen(argv[a++], "wb"); fwrite(f.data(), 4, n, fh); fclose(fh);
  }}
  return 0;
}}
"""


HOST_CASES = (
    # rows not a multiple of ROWS, a partial last threadgroup for swiglu, several SIMD groups per row
    ("add_rmsnorm", "float16", {"rows": 5, "cols": 520}),
    ("layernorm", "bfloat16", {"rows": 9, "cols": 192}),
    ("softmax", "float32", {"rows": 3, "cols": 1032}),
    ("swiglu", "float16", {"rows": 7, "cols": 1408}),
)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (C++20)")
@pytest.mark.parametrize("name,dtype,shape", HOST_CASES, ids=[c[0] for c in HOST_CASES])
def test_body_run_on_host_threads_matches_the_reference(name, dtype, shape, tmp_path):
    import mlx.core as mx
    import numpy as np

    spec = spec_of(name)
    legal = spec.legal_configs(shape, dtype, Limits())
    # the widest and narrowest threadgroups, the most rows per threadgroup, the widest vectors
    picks = {0, len(legal) - 1}
    for key in [k for k in ("ROWS", "VEC", "EPT") if k in spec.params]:
        picks.add(max(range(len(legal)), key=lambda i: (legal[i][key], -legal[i]["TG"])))
    configs = [legal[i] for i in sorted(picks)]
    cpp = tmp_path / "k.cpp"
    cpp.write_text(host_program(spec, dtype, configs))
    built = subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-w", str(cpp), "-o", str(tmp_path / "k")],
                           capture_output=True, text=True, timeout=300)
    if built.returncode and "barrier" in built.stderr and "No such file" in built.stderr:
        pytest.skip("g++ has no <barrier>")
    assert built.returncode == 0, built.stderr[-4000:]
    with mx.stream(mx.cpu):
        inputs = spec.make_inputs(shape, getattr(mx, dtype), mx.random.key(11))
        refs = spec.reference(inputs, shape)
        files = []
        for i, a in enumerate(inputs):
            path = tmp_path / f"in{i}.bin"
            np.array(a.astype(mx.float32)).astype(np.float32).tofile(path)
            files += [str(a.size), str(path)]
        for i, config in enumerate(configs):
            launch = spec.launch(config, shape)
            outs = [str(tmp_path / f"out{j}.bin") for j in range(len(spec.outputs))]
            run = subprocess.run([str(tmp_path / "k"), str(i), str(launch.grid[0] // launch.threadgroup[0]),
                                  str(shape["rows"]), str(shape["cols"]), *files, *outs],
                                 capture_output=True, text=True, timeout=120)
            assert run.returncode == 0, (config, run.stderr)
            got = [mx.array(np.fromfile(p, dtype=np.float32).reshape(s)) for p, s in zip(outs, launch.output_shapes)]
            assert compare(spec, got, refs, dtype) is None, config
