"""A kernel's declared derived features (KernelSpec.features) as polars columns: the constraints'
whitelisted arithmetic evaluated on whole columns, so no row is looped over in Python."""

from __future__ import annotations

import functools
import operator
from typing import Any, Mapping, Sequence

import polars as pl

from zmlx_pipeline.core.constraints import compile_constraint, expression_names
from zmlx_pipeline.kernels.spec import Feature

#: column prefixes of the declared features: read by every model, or kept out of the per-device
#: models (Feature.per_device False; models/estimators.py: transfer_features)
PER_DEVICE_PREFIX = "cfg_x_"
SHARED_ONLY_PREFIX = "cfg_xs_"


def _expr(value: Any) -> pl.Expr:
    return value if isinstance(value, pl.Expr) else pl.lit(value)


#: core/constraints.py's non-operator nodes, on polars expressions (both branches of an `if`
#: and both sides of `and` are computed for every row, then chosen per row)
POLARS_NODES = {
    "not": lambda x: ~_expr(x),
    "and": lambda parts, env: functools.reduce(operator.and_, (_expr(p(env)) for p in parts)),
    "or": lambda parts, env: functools.reduce(operator.or_, (_expr(p(env)) for p in parts)),
    "compare": lambda ops, values: functools.reduce(
        operator.and_, (_expr(op(_expr(a), b)) for op, a, b in zip(ops, values, values[1:]))),
    "if": lambda test, body, orelse, env: pl.when(_expr(test(env))).then(_expr(body(env))).otherwise(
        _expr(orelse(env))),
    "min": lambda *args: pl.min_horizontal(*map(_expr, args)),
    "max": lambda *args: pl.max_horizontal(*map(_expr, args)),
    "abs": lambda x: _expr(x).abs(),
}


def derived_columns(features: Mapping[str, Feature], params: Sequence[str],
                    dims: Sequence[str]) -> list[pl.Expr]:
    """One Float64 column per declared feature (KernelSpec.derived_features), `cfg_x_<name>`, or
    `cfg_xs_<name>` when kept out of the per-device models, over a frame whose config params are `c_<param>` and shape dims `s_<dim>` columns (models/features.py's layout).
    Arithmetic is IEEE (x / 0 is infinite, so min(1, x / 0) is 1); a row whose final value is not
    finite gets null. A feature naming a param or dim the frame lacks (data of an older config
    space) is left out."""
    known = set(params) | set(dims)
    env = {**{p: pl.col("c_" + p).cast(pl.Float64) for p in params},
           **{d: pl.col("s_" + d).cast(pl.Float64) for d in dims}}
    out = []
    for name, feature in features.items():
        build = compile_constraint(feature.expr, POLARS_NODES)  # refuses anything but the whitelist
        if expression_names(feature.expr) - known:
            continue
        value = _expr(build(env)).cast(pl.Float64)
        prefix = PER_DEVICE_PREFIX if feature.per_device else SHARED_ONLY_PREFIX
        out.append(pl.when(value.is_finite()).then(value).otherwise(None).alias(prefix + name))
    return out
