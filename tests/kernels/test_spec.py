"""KernelSpec: config space, constraints as expressions, shape grids."""

from __future__ import annotations

import pytest

from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.spec import Feature, KernelSpecError, Limits, ShapeGrid


def test_constraints_remove_illegal_configs():
    spec = get_kernel("rmsnorm")
    shape = {"rows": 4096, "cols": 4096}
    legal16 = spec.legal_configs(shape, "float16", Limits())
    legal32 = spec.legal_configs(shape, "float32", Limits())
    assert {"TG": 256, "VEC": 8, "ROWS": 1} in legal16
    assert {"TG": 256, "VEC": 8, "ROWS": 1} not in legal32  # 32-byte vector access
    assert spec.violations({"TG": 256, "VEC": 8, "ROWS": 1}, shape, "float32", Limits()) == ["VEC * dtype_bytes <= 16"]


def test_device_limits_shape_the_legal_space():
    spec = get_kernel("rmsnorm")
    shape = {"rows": 4096, "cols": 4096}
    small = spec.legal_configs(shape, "float32", Limits(max_threads=256))
    assert small and max(c["TG"] for c in small) == 256
    assert max(c["TG"] for c in spec.legal_configs(shape, "float32", Limits())) == 1024


def test_constraint_with_an_unknown_name_is_refused():
    spec = get_kernel("rmsnorm")
    with pytest.raises(KernelSpecError, match="unknown name"):
        spec.replace(constraints=("TG <= max_thread",))


def test_shape_grid_product_and_explicit_forms():
    grid = ShapeGrid(["m", "n"], {"a": {"m": [1, 2], "n": [3]}, "b": {"shapes": [{"m": 5, "n": 6}]}})
    assert grid.shapes("a") == ({"m": 1, "n": 3}, {"m": 2, "n": 3})
    assert grid.shapes("b") == ({"m": 5, "n": 6},)
    with pytest.raises(KernelSpecError, match="no shape preset 'c'; this kernel has a, b"):
        grid.shapes("c")


def test_shape_grid_rejects_bad_sizes():
    with pytest.raises(KernelSpecError, match="non-positive"):
        ShapeGrid(["m"], {"a": {"m": [0]}})


def test_describe_lists_what_kernels_json_needs():
    d = get_kernel("rmsnorm").describe()
    assert d["backends"] == ["metal", "cuda"]
    assert set(d["parameters"]) == {"TG", "VEC", "ROWS"}
    assert "TG <= max_threads" in d["constraints"]
    assert d["shape_grid"]["smoke"] and d["configs"] == 6 * 4 * 3


def test_every_limit_a_constraint_sees_is_a_declared_limit_name():
    from zmlx_pipeline.kernels.spec import LIMIT_NAMES

    env = Limits(cuda_arch=90).env("float16")
    assert sorted(env) == sorted(LIMIT_NAMES)
    assert env["cuda_arch"] == 90 and env["dtype_bytes"] == 2


def test_declared_features_are_checked_when_the_kernel_is_built():
    spec = get_kernel("softmax")
    assert spec.features and spec.describe()["features"] == {
        name: {"expr": text, "per_device": True} for name, text in spec.features.items()}
    assert get_kernel("layernorm").describe()["features"]["trips"]["per_device"] is False
    with pytest.raises(KernelSpecError, match="unknown name"):
        spec.replace(features={"share": Feature("TG / width", per_device=False)})
    with pytest.raises(KernelSpecError, match="unknown name"):
        spec.replace(features={"share": "TG / width"})
    with pytest.raises(KernelSpecError, match="must be an identifier"):
        spec.replace(features={"TG": "TG * 2"})
    with pytest.raises(KernelSpecError, match="feature 'p'"):
        spec.replace(features={"p": "TG ** 2"})
    for flag in ("no", "False", 0, None):  # a truthy "no" would put the feature in the per-device models
        with pytest.raises(KernelSpecError, match="per_device must be True or False"):
            spec.replace(features={"share": Feature("TG * 2", per_device=flag)})
    # a feature describes the config, not the code: the kernel's version does not move
    assert spec.replace(features={}).version == spec.version


def test_legal_configs_are_exactly_the_configs_without_violations():
    """legal_configs evaluates the constraints as one conjunction; it must agree with violations() everywhere,
    including tiny shapes, every dtype and device limits (CUDA, Apple, none)."""
    from zmlx_pipeline.kernels.registry import builtin_kernels

    limits = [Limits(), Limits(cuda_arch=90), Limits(max_threads=256), Limits.from_device_row(None)]
    for spec in builtin_kernels():
        shapes = [dict(s) for p in spec.shape_grid.presets for s in spec.shape_grid.shapes(p)[:3]]
        shapes.append({d: 1 for d in spec.shape_grid.dims})
        for shape in shapes:
            for dtype in ("float16", "float32"):
                for lim in limits:
                    want = [c for c in spec.configs() if not spec.violations(c, shape, dtype, lim)]
                    assert spec.legal_configs(shape, dtype, lim) == want, (spec.name, shape, dtype, lim)
