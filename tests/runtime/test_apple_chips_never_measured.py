"""Every Apple chip of the catalog, as a Mac user of zmlx meets it through the default bundle: its own profile
(detected from MLX's name, architecture and core count too), the catalog's Metal limits, evidence never
`measured`, and every config a lookup returns legal on that chip for that shape and dtype."""

import pytest

from zmlx_pipeline.core.constraints import Limits
from zmlx_pipeline.data import detect
from zmlx_pipeline.data.catalog import load_catalog
from zmlx_pipeline.kernels.registry import builtin_kernels
from zmlx_pipeline.runtime import (
    candidates,
    get_current_device_profile,
    get_threadgroup_candidates_for_shape,
    predicted_config,
)

APPLE = [spec for spec in load_catalog() if spec.vendor == "apple"]
SHAPES = {
    "rmsnorm": {"rows": 4096, "cols": 4096}, "add_rmsnorm": {"rows": 3, "cols": 64},
    "layernorm": {"rows": 2, "cols": 160}, "softmax": {"rows": 1, "cols": 32000},
    "swiglu": {"rows": 1, "cols": 4096}, "topk_gating": {"tokens": 16, "experts": 256, "k": 8},
    "moe_combine": {"tokens": 1, "k": 8, "hidden": 64}, "matmul": {"M": 16, "N": 64, "K": 64},
}


@pytest.mark.parametrize("spec", APPLE, ids=[spec.id for spec in APPLE])
def test_an_apple_chip_answers_as_itself_never_measured_within_its_limits(spec, monkeypatch):
    real = detect.detect_device
    monkeypatch.setattr(detect, "detect_device", lambda *a, **k: real(
        {"device_name": spec.name, "architecture": spec.gpu_arch}, backend="metal",
        ioreg=f'"gpu-core-count" = {spec.gpu_cores}'))
    p = get_current_device_profile()
    assert (p.device_id, p.gpu_cores) == (spec.id, spec.gpu_cores)
    assert p.evidence != "measured" and p.evidence in ("extrapolated", "predicted", "default")
    assert (p.max_threads_per_threadgroup, p.simd_width) == (spec.max_threads_per_threadgroup, spec.simd_width)
    assert all(c.get("evidence") != "measured" for c in p.learned["classes"].values())
    for kernel_type in ("general", "reduction", "simd", "matmul"):
        for dim in (0, 96, 4096):
            got = get_threadgroup_candidates_for_shape(p, dim, kernel_type)
            assert got and all(c <= spec.max_threads_per_threadgroup and c % spec.simd_width == 0 for c in got)

    limits = Limits(max_threads=spec.max_threads_per_threadgroup, simd_width=spec.simd_width,
                    tg_mem_bytes=spec.threadgroup_memory_bytes)
    for kernel in builtin_kernels():
        shape = SHAPES[kernel.name]
        for dtype in ("float16", "bfloat16", "float32"):
            legal = kernel.legal_configs(shape, dtype, limits)
            pred = predicted_config(kernel.name, shape, dtype)  # this process's GPU: the chip detected above
            assert pred.device == spec.id and pred.evidence in ("extrapolated", "predicted", "default"), pred.note
            assert f"{spec.id} was never measured" in pred.note
            assert legal and pred.config in legal and all(c in legal for c in pred.candidates)
            assert all(c in legal for c in candidates(kernel.name, shape, dtype, device=spec.id))
