"""models/derived.py: a kernel's declared features as polars columns, by the constraints' grammar."""

from __future__ import annotations

import polars as pl
import pytest

from zmlx_pipeline.kernels.registry import builtin_kernels, get_kernel
from zmlx_pipeline.kernels.spec import Feature, Limits
from zmlx_pipeline.models.derived import derived_columns
from zmlx_pipeline.core.constraints import UnsafeConstraint, compile_constraint

FRAME = pl.DataFrame({"c_TG": [128, 256, 512, 1024], "c_ROWS": [1, 2, 1, 4], "s_cols": [4096, 4096, 0, 8192]})


def columns(features: dict) -> dict:
    out = FRAME.with_columns(derived_columns({n: Feature(t) for n, t in features.items()}, ["TG", "ROWS"], ["cols"]))
    return {c: out[c].to_list() for c in out.columns if c.startswith("cfg_x_")}


def test_each_feature_is_the_expression_per_row_as_python_would_compute_it():
    features = {"per_row": "TG // ROWS", "cover": "min(1, (TG // ROWS) * 8 / cols)",
                "wide": "1 if TG >= 512 and ROWS == 1 else 0", "lo": "max(abs(ROWS - 2), TG % 3)",
                "band": "128 < TG <= 512"}
    got = columns(features)
    for i, row in enumerate(FRAME.iter_rows(named=True)):
        env = {"TG": row["c_TG"], "ROWS": row["c_ROWS"], "cols": row["s_cols"]}
        for name, text in features.items():
            if name == "cover" and env["cols"] == 0:
                continue
            assert got["cfg_x_" + name][i] == pytest.approx(float(compile_constraint(text)(env))), (name, env)


def test_a_value_that_is_not_finite_is_null():
    assert columns({"share": "TG / cols"})["cfg_x_share"] == [pytest.approx(128 / 4096), pytest.approx(256 / 4096),
                                                              None, pytest.approx(1024 / 8192)]


def test_a_feature_naming_a_param_the_data_lacks_is_left_out():
    assert list(columns({"reg": "CACHE * TG", "threads": "TG"})) == ["cfg_x_threads"]


def test_the_grammar_is_the_constraints_whitelist():
    with pytest.raises(UnsafeConstraint):
        derived_columns({"bad": Feature("__import__('os').getpid()")}, ["TG"], [])
    with pytest.raises(UnsafeConstraint):
        derived_columns({"bad": Feature("TG ** 2")}, ["TG"], [])


@pytest.mark.parametrize("name", [s.name for s in builtin_kernels() if s.features])
def test_every_builtin_feature_is_finite_on_its_legal_configs_and_matches_python(name):
    spec = get_kernel(name)
    rows = []
    for shape in spec.shape_grid.shapes("full")[::3]:
        for config in spec.legal_configs(shape, "float16", Limits(cuda_arch=90))[::5]:
            rows.append({**{"c_" + k: v for k, v in config.items()}, **{"s_" + k: v for k, v in shape.items()}})
    assert rows
    frame = pl.DataFrame(rows)
    features = spec.derived_features()
    out = frame.with_columns(derived_columns(features, list(spec.params), list(spec.shape_grid.dims)))
    for prefix, per_device in (("cfg_x_", True), ("cfg_xs_", False)):
        chosen = {n: f.expr for n, f in features.items() if f.per_device is per_device}
        for n, text in chosen.items():
            column = out[prefix + n]
            assert column.null_count() == 0, (name, n)
            check = compile_constraint(text)
            for row, value in zip(rows[:50], column.to_list()):
                env = {k[2:]: v for k, v in row.items()}
                assert value == pytest.approx(float(check(env))), (name, n, env)
