"""Config constraints, evaluated without eval() (a whitelist of arithmetic), and the device limits they read.

One grammar for both sides: kernels/spec.py checks a kernel's configs with it, and a bundle carries
each kernel's constraints as text (`"TG % ROWS == 0"`), so the runtime can drop a bucket's
candidates that are illegal for the exact shape asked. Bundle text is data, never code: it is
parsed with `ast` and only numbers, names, arithmetic, comparisons, boolean logic and min/max/abs
are accepted; anything else makes the constraint unusable (and it is ignored).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from zmlx_pipeline.core.dtypes import DTYPE_BYTES
from zmlx_pipeline.core.errors import ZmlxPipelineError

Env = Mapping[str, Any]
Check = Callable[[Env], Any]


def cuda_arch(architecture: Any) -> int:
    """NVIDIA compute capability of a catalog architecture ("sm_90" or "sm_90a" -> 90); 0 for any other."""
    text = str(architecture or "")
    digits = text[3:].rstrip("abf") if text.startswith("sm_") else ""
    return int(digits) if digits.isdigit() else 0


#: Apple GPUs (every M1-M4 chip): 32 KB of threadgroup memory, SIMD groups of 32 threads, at most 1024
#: threads per threadgroup; also the defaults for a device whose row is silent
APPLE_LIMITS = {"max_threads": 1024, "simd_width": 32, "tg_mem_bytes": 32768}


def limit_values(row: Mapping[str, Any] | None) -> dict[str, int]:
    """The device limits constraints use (max_threads, simd_width, tg_mem_bytes, cuda_arch) from a catalog,
    store or bundle-profile row; Apple's limits where the row is missing or silent.

    `max_threads` is the device's limit. A compiled Metal pipeline may allow fewer threads per threadgroup
    (its maxTotalThreadsPerThreadgroup, lower for kernels using many registers: 832 and 896 are seen on
    M1 Max and M2 Ultra), which no constraint can know before compiling: such a launch is refused at run
    time, recorded by collect as `launch_error` with the limit in its text (pipeline_thread_limit reads it
    back), and skipped by the runtime once refused."""
    row = row or {}
    return {
        "max_threads": int(row.get("max_threads_per_threadgroup") or APPLE_LIMITS["max_threads"]),
        "simd_width": int(row.get("simd_width") or APPLE_LIMITS["simd_width"]),
        "tg_mem_bytes": int(row.get("threadgroup_memory_bytes") or APPLE_LIMITS["tg_mem_bytes"]),
        "cuda_arch": cuda_arch(row.get("architecture")),
    }


@dataclass(frozen=True)
class Limits:
    """The device limits constraints are checked against (the same model of legality on every backend)."""

    max_threads: int = 1024
    simd_width: int = 32
    tg_mem_bytes: int = 32768
    cuda_arch: int = 0  # NVIDIA compute capability as 90 for sm_90; 0 off CUDA (arch-specific instructions)

    @classmethod
    def from_device_row(cls, row: Mapping[str, Any] | None) -> "Limits":
        """Limits of a catalog/store device row; conservative Apple-like defaults for unknown devices."""
        return cls(**limit_values(row))

    def env(self, dtype: str) -> dict[str, int]:
        """The limit names a constraint may use, for one dtype."""
        return {**vars(self), "dtype_bytes": DTYPE_BYTES[dtype]}  # every field is a limit name


#: MLX's Metal backend refuses a custom kernel whose threadgroup exceeds its compiled pipeline's
#: maxTotalThreadsPerThreadgroup with std::invalid_argument (a Python ValueError), evaluating it:
#: "Thread group size (1024) is greater than  the maximum allowed threads per threadgroup (896)."
#: (mlx/backend/metal/custom_kernel.cpp; two spaces before "the")
_PIPELINE_LIMIT = re.compile(
    r"thread\s*group size \((\d+)\) is greater than\s+the maximum allowed threads per threadgroup \((\d+)\)", re.I)


def pipeline_thread_limit(text: str) -> tuple[int, int] | None:
    """(threads asked, the pipeline's limit) when `text` is MLX's refusal of a threadgroup over a pipeline's
    thread limit; else None."""
    match = _PIPELINE_LIMIT.search(str(text))
    return (int(match.group(1)), int(match.group(2))) if match else None


def refusal_text(exc: BaseException, limit: int = 400) -> str:
    """One line for a refused launch; one refused for a pipeline's thread limit says the limit first."""
    text = re.sub(r"\s+", " ", f"{type(exc).__name__}: {exc}").strip()
    found = pipeline_thread_limit(str(exc))
    if found:
        text = (f"threadgroup of {found[0]} threads over this pipeline's limit of {found[1]} "
                f"(maxTotalThreadsPerThreadgroup): {text}")
    return text[:limit]


class UnsafeConstraint(ZmlxPipelineError, ValueError):
    "A constraint uses something other than arithmetic, comparisons, boolean logic and min/max/abs"


#: the functions an expression may call
FUNCTIONS = ("min", "max", "abs")


def expression_names(text: str) -> set[str]:
    """The names an expression reads, less the functions it may call (SyntaxError if it is not one)."""
    return set(compile(text, "<expression>", "eval").co_names) - set(FUNCTIONS)


#: how the nodes that are not plain operators evaluate, for numbers (constraints, the runtime); a
#: caller may pass its own, so that the same whitelisted text builds, say, polars column expressions
PYTHON_NODES: Mapping[str, Callable[..., Any]] = {
    "not": operator.not_,
    "and": lambda parts, env: all(p(env) for p in parts),
    "or": lambda parts, env: any(p(env) for p in parts),
    "compare": lambda ops, values: all(op(a, b) for op, a, b in zip(ops, values, values[1:])),
    "if": lambda test, body, orelse, env: body(env) if test(env) else orelse(env),
    "min": min,
    "max": max,
    "abs": abs,
}


def _compile(node, nodes: Mapping[str, Callable[..., Any]] = PYTHON_NODES) -> Check:  # noqa: C901 - one branch per node type
    import ast

    if isinstance(node, ast.Expression):
        return _compile(node.body, nodes)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)):
        value = node.value
        return lambda env: value
    if isinstance(node, ast.Name):
        name = node.id
        return lambda env: env[name]
    if isinstance(node, ast.BinOp):
        ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
               ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Div: operator.truediv}
        op = ops.get(type(node.op))
        if op is None:
            raise UnsafeConstraint(f"operator {type(node.op).__name__} is not allowed")
        left, right = _compile(node.left, nodes), _compile(node.right, nodes)
        return lambda env: op(left(env), right(env))
    if isinstance(node, ast.UnaryOp):
        ops = {ast.Not: nodes["not"], ast.USub: operator.neg, ast.UAdd: operator.pos}
        op = ops.get(type(node.op))
        if op is None:
            raise UnsafeConstraint(f"operator {type(node.op).__name__} is not allowed")
        operand = _compile(node.operand, nodes)
        return lambda env: op(operand(env))
    if isinstance(node, ast.BoolOp):
        parts = [_compile(v, nodes) for v in node.values]
        combine = nodes["and"] if isinstance(node.op, ast.And) else nodes["or"]
        return lambda env: combine(parts, env)
    if isinstance(node, ast.Compare):
        cmp = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
               ast.Gt: operator.gt, ast.GtE: operator.ge}
        ops = []
        for op in node.ops:
            if type(op) not in cmp:
                raise UnsafeConstraint(f"comparison {type(op).__name__} is not allowed")
            ops.append(cmp[type(op)])
        terms = [_compile(node.left, nodes)] + [_compile(c, nodes) for c in node.comparators]
        compare = nodes["compare"]
        return lambda env: compare(ops, [t(env) for t in terms])
    if isinstance(node, ast.IfExp):
        test, body, orelse = (_compile(n, nodes) for n in (node.test, node.body, node.orelse))
        choose = nodes["if"]
        return lambda env: choose(test, body, orelse, env)
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
            raise UnsafeConstraint("only min(), max() and abs() may be called")
        fn = nodes[node.func.id]
        args = [_compile(a, nodes) for a in node.args]
        return lambda env: fn(*(a(env) for a in args))
    raise UnsafeConstraint(f"{type(node).__name__} is not allowed in a constraint")


def compile_constraint(text: str, nodes: Mapping[str, Callable[..., Any]] = PYTHON_NODES) -> Check:
    """A function env -> truthy for one constraint; UnsafeConstraint if the text is not plain arithmetic.
    `nodes`: how the non-operator nodes evaluate (PYTHON_NODES: on numbers)."""
    import ast

    if len(text) > 500:
        raise UnsafeConstraint("constraint text too long")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise UnsafeConstraint(f"not an expression: {exc.msg}") from None
    return _compile(tree, nodes)


class ConstraintSet:
    """A kernel's constraints, compiled once; `legal(config, shape, limits)` says whether a config may run."""

    __slots__ = ("checks", "skipped")

    def __init__(self, texts: Sequence[str]) -> None:
        self.checks: list[Check] = []
        self.skipped: list[str] = []
        for text in texts:
            try:
                self.checks.append(compile_constraint(text))
            except UnsafeConstraint:
                self.skipped.append(text)

    def legal(self, config: Mapping[str, Any], shape: Mapping[str, int], limits: Mapping[str, int]) -> bool:
        env = {**limits, **shape, **config}
        for check in self.checks:
            try:
                if not check(env):
                    return False
            except ZeroDivisionError:
                return False
            except (KeyError, TypeError, ValueError, OverflowError):
                continue  # a name the bundle did not give: this constraint cannot be judged here
        return True
