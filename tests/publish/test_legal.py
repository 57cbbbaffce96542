"""publish.legal.LegalConfigs gives exactly KernelSpec.legal_configs, on every built-in kernel."""

from __future__ import annotations

import pytest

from zmlx_pipeline.data.catalog import load_catalog
from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.spec import KernelSpec, Limits, ShapeGrid
from zmlx_pipeline.publish.legal import LegalConfigs
from zmlx_pipeline.core.constraints import limit_values

KERNELS = ("rmsnorm", "add_rmsnorm", "layernorm", "softmax", "swiglu", "topk_gating", "moe_combine", "matmul")


def _limits() -> list[Limits]:
    """The distinct device limits of the catalog (Apple, NVIDIA of several architectures, AMD)."""
    return [Limits(**dict(t)) for t in sorted({tuple(sorted(limit_values(d.as_row()).items())) for d in load_catalog()})]


@pytest.mark.parametrize("kernel", KERNELS)
def test_legal_configs_are_the_specs_own_in_its_order(kernel):
    spec = get_kernel(kernel)
    legal = LegalConfigs(spec)
    shapes = [s for p in spec.shape_grid.presets for s in spec.shape_grid.shapes(p)]
    shapes = shapes[:: max(1, len(shapes) // 6)] + [{d: 1 for d in spec.shape_grid.dims}]
    limits = _limits()
    assert len(limits) >= 4
    some = 0
    for lim in limits[:: max(1, len(limits) // 4)]:
        for dtype in ("float16", "float32"):
            for shape in shapes:
                want = spec.legal_configs(shape, dtype, lim)
                assert legal(shape, dtype, lim) == want, (kernel, shape, dtype, lim)
                assert legal(shape, dtype, lim) == want  # from the cached verdicts
                some += bool(want)
    assert some > 0


def test_a_division_by_zero_is_a_violation_as_in_the_spec():
    spec = KernelSpec(name="div", description="", kernel_class="elementwise", inputs=("x",), outputs=("y",), body="",
                      params={"TG": (0, 32, 64), "VEC": (1, 2)}, constraints=("cols // TG >= 1", "TG <= max_threads"),
                      shape_grid=ShapeGrid(["cols"], {"smoke": {"cols": [64]}}), launch=None, make_inputs=None,
                      reference=None, bytes_moved=None)
    for cols in (16, 64, 128):
        got = LegalConfigs(spec)({"cols": cols}, "float32", Limits(max_threads=32))
        assert got == spec.legal_configs({"cols": cols}, "float32", Limits(max_threads=32))
    assert LegalConfigs(spec)({"cols": 64}, "float32", Limits()) == [{"TG": 32, "VEC": 1}, {"TG": 32, "VEC": 2},
                                                                      {"TG": 64, "VEC": 1}, {"TG": 64, "VEC": 2}]
