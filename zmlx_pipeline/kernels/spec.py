"""What a tunable kernel is: one body, a config space with constraints, a shape grid, inputs and a reference.

Built-in kernels and kernels from other packages are both `KernelSpec` objects; every stage of
the pipeline reads only this description, so a kernel registered from outside is treated
exactly like a built-in one.
"""

from __future__ import annotations

import itertools
import keyword
import numbers
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from zmlx_pipeline.core.keys import canonical_json, digest
from zmlx_pipeline.kernels import prelude
from zmlx_pipeline.core.constraints import (  # noqa: F401 - Limits is part of this module's API
    FUNCTIONS,
    Limits,
    UnsafeConstraint,
    compile_constraint,
    expression_names,
)
from zmlx_pipeline.core.dtypes import DTYPE_BYTES
from zmlx_pipeline.core.errors import ZmlxPipelineError, shown

#: names a constraint may use besides the config parameters and shape dimensions
LIMIT_NAMES = ("max_threads", "simd_width", "tg_mem_bytes", "dtype_bytes", "cuda_arch")

#: (rtol, atol) per dtype for the check against the reference, on float32 values
DEFAULT_TOLERANCE = {"float32": (1e-4, 1e-5), "float16": (1e-2, 1e-3), "bfloat16": (5e-2, 1e-2)}


class KernelSpecError(ZmlxPipelineError, ValueError):
    """A kernel description is inconsistent (bad constraint, unknown name, empty space)."""


@dataclass(frozen=True)
class Launch:
    """How one config of a kernel is dispatched on one shape: grid in threads, as MLX counts it."""

    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str | None, ...] | None = None  # None: every output has the input dtype


#: the values an integer template argument of a kernel can hold (C++ int)
TEMPLATE_INT = (-(2**31), 2**31 - 1)


class CheckedLaunch:
    """A kernel's `launch` function, checked on every call: what it returns must be a Launch, so a user kernel
    whose launch returns something else fails in one line naming it (KernelSpecError), not later in whatever
    reads `.grid` or `.threadgroup`. Equal to (and hashed as) the function it wraps."""

    def __init__(self, fn: Callable[[Mapping[str, int], Mapping[str, int]], Launch], kernel: str) -> None:
        self.__wrapped__ = fn
        self.kernel = kernel

    def __call__(self, config: Mapping[str, int], shape: Mapping[str, int]) -> Launch:
        out = self.__wrapped__(config, shape)
        if not isinstance(out, Launch):
            raise KernelSpecError(f"kernel {shown(self.kernel)}: launch() returned {type(out).__name__}, not Launch: "
                                  "return Launch(grid=..., threadgroup=..., output_shapes=...)")
        for what in ("grid", "threadgroup"):
            dims = getattr(out, what)
            if (not isinstance(dims, (tuple, list)) or len(dims) != 3
                    or any(isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1 for d in dims)):
                raise KernelSpecError(f"kernel {shown(self.kernel)}: launch() of config {dict(config)} gives {what} "
                                      f"{dims!r:.60}, not three whole numbers >= 1")
        return out

    def __eq__(self, other: object) -> bool:
        return self.__wrapped__ == (other.__wrapped__ if isinstance(other, CheckedLaunch) else other)

    def __hash__(self) -> int:
        return hash(self.__wrapped__)

    def __repr__(self) -> str:
        return f"CheckedLaunch({self.__wrapped__!r})"


@dataclass(frozen=True)
class TileAxes:
    """How a config tiles a shape, declared by the kernel author: the launch geometry the models'
    `geo_*` features are computed from (models/features.py), without reading the launch code.

    - grid: shape dim -> the params whose product is one threadgroup's extent along that dim
      (one threadgroup per tile: ceil(dim / extent) of them along it);
    - threads: the params whose product is the threads of one threadgroup;
    - steps: shape dim -> the params whose product is the step a threadgroup loops over that dim
      in (a reduction: K of a matmul), empty when none;
    - seen: whether the models of a device measured in training read the geometry too (True), or only
      the models of a new device, whose core count is what the geometry carries over (False).
    """

    grid: Mapping[str, tuple[str, ...]]
    threads: tuple[str, ...]
    steps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    seen: bool = True

    def names(self) -> tuple[set[str], set[str]]:
        """(shape dims, params) the declaration refers to."""
        dims = set(self.grid) | set(self.steps)
        params = {p for ps in (*self.grid.values(), *self.steps.values()) for p in ps} | set(self.threads)
        return dims, params


@dataclass(frozen=True)
class Feature:
    """A derived feature of a kernel (KernelSpec.features): an expression of config params and shape
    dims. `per_device` False keeps it out of the per-device config models that a new device borrows
    from its neighbours (models/transfer.py), for a feature that helps rank a seen
    device's configs across shapes but, there, hurts the ranking on a device left out."""

    expr: str
    per_device: bool = True


class ShapeGrid:
    """Named presets of shapes: each either a product of dimension lists or an explicit list."""

    def __init__(self, dims: Sequence[str], presets: Mapping[str, Any]):
        self.dims = tuple(dims)
        self._presets = {name: self._expand(name, p) for name, p in presets.items()}
        if not self._presets:
            raise KernelSpecError("a shape grid needs at least one preset")

    def _expand(self, name: str, preset: Any) -> tuple[dict[str, int], ...]:
        if isinstance(preset, Mapping) and "shapes" in preset:
            shapes = [dict(s) for s in preset["shapes"]]
        elif isinstance(preset, Mapping):
            missing = [d for d in self.dims if d not in preset]
            if missing:
                raise KernelSpecError(f"preset {name!r} lacks dimension(s) {', '.join(missing)}")
            lists = [list(preset[d]) for d in self.dims]
            shapes = [dict(zip(self.dims, combo)) for combo in itertools.product(*lists)]
        else:
            shapes = [dict(s) for s in preset]
        for s in shapes:
            if set(s) != set(self.dims):
                raise KernelSpecError(f"preset {name!r} shape {s} does not have dims {self.dims}")
            if any(int(v) != v or v < 1 for v in s.values()):
                raise KernelSpecError(f"preset {name!r} shape {s} has a non-positive or non-integer size")
        return tuple({d: int(s[d]) for d in self.dims} for s in shapes)

    @classmethod
    def from_toml(cls, path: str | Path, section: str) -> "ShapeGrid":
        """Read `[section]` (with `dims` and `[section.presets.NAME]` tables) from a TOML file."""
        with open(path, "rb") as fh:
            table = tomllib.load(fh)[section]
        return cls(table["dims"], table["presets"])

    @property
    def presets(self) -> tuple[str, ...]:
        return tuple(self._presets)

    def shapes(self, preset: str) -> tuple[dict[str, int], ...]:
        """The shapes of one preset; KernelSpecError names the presets there are."""
        try:
            return self._presets[preset]
        except KeyError:
            raise KernelSpecError(
                f"no shape preset {preset!r}; this kernel has {', '.join(self._presets)}"
            ) from None

    def as_dict(self) -> dict[str, list[dict[str, int]]]:
        return {name: list(shapes) for name, shapes in self._presets.items()}


@dataclass(frozen=True)
class KernelSpec:
    """A tunable kernel, written once in the shared Metal/CUDA subset (see `prelude`)."""

    name: str
    description: str
    kernel_class: str  # groups kernels for the device profile's learned default threadgroup
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    body: str
    params: Mapping[str, Sequence[int]]  # the config space: each parameter's candidate values
    constraints: Sequence[str]  # Python expressions over params, shape dims and LIMIT_NAMES
    shape_grid: ShapeGrid
    launch: Callable[[Mapping[str, int], Mapping[str, int]], Launch]
    make_inputs: Callable[..., list]  # (shape, dtype: mx.Dtype, key) -> list[mx.array]
    reference: Callable[..., list]  # (inputs, shape) -> list[mx.array], from plain mx ops
    bytes_moved: Callable[[Mapping[str, int], int], float]  # (shape, dtype_bytes) -> bytes
    flops: Callable[[Mapping[str, int]], float] = lambda shape: 0.0
    helpers: str = ""  # shared helper functions, written in the same vocabulary as the body
    threadgroup_param: str = "TG"  # the parameter that is the threadgroup size
    tolerance: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    mlx_op: Callable[..., Any] | None = None  # MLX's own op for the same function, for comparisons
    tiles: TileAxes | None = None  # how a config tiles the shape (launch-geometry features); None: not tiled
    # derived features the models read beside the raw parameters: name -> an expression of config
    # params and shape dims in the constraints' arithmetic (core/constraints.py), such as the
    # share of a row a config holds in registers, or a Feature. They do not change the kernel's code
    # or version.
    features: Mapping[str, str | Feature] = field(default_factory=dict)
    extensions: tuple[str, ...] = ()  # optional prelude vocabularies the body uses (prelude.EXTENSIONS)
    # bytes of dynamic threadgroup memory a config's launch requests on CUDA, for the body's
    # KSHARED_DYN arrays: (config, dtype_bytes) -> bytes; None: none (Metal arrays are static)
    shared_memory: Callable[[Mapping[str, int], int], int] | None = None
    _compiled: dict = field(default_factory=dict, repr=False, compare=False, hash=False)
    _joined: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.params:
            raise KernelSpecError(f"kernel {self.name!r} has an empty config space")
        self._check_params()
        if self.threadgroup_param not in self.params:
            raise KernelSpecError(f"kernel {self.name!r}: threadgroup parameter {self.threadgroup_param!r} is not a parameter")
        for name in self.params:
            if name in self.shape_grid.dims or name in LIMIT_NAMES:
                raise KernelSpecError(f"kernel {self.name!r}: parameter {name!r} clashes with a shape dim or limit")
        allowed = set(self.params) | set(self.shape_grid.dims) | set(LIMIT_NAMES)
        for text in self.constraints:
            try:
                code = compile(text, f"<constraint of {self.name}>", "eval")
            except SyntaxError as exc:
                raise KernelSpecError(f"kernel {self.name!r}: constraint {text!r} is not an expression: {exc.msg}") from None
            unknown = set(code.co_names) - allowed - set(FUNCTIONS)
            if unknown:
                raise KernelSpecError(f"kernel {self.name!r}: constraint {text!r} uses unknown name(s) {', '.join(sorted(unknown))}")
            self._compiled[text] = code
        self._check_features()
        if self.tiles is not None:
            dims, params = self.tiles.names()
            unknown = sorted(dims - set(self.shape_grid.dims)) + sorted(params - set(self.params))
            if unknown or not self.tiles.grid or not self.tiles.threads:
                raise KernelSpecError(f"kernel {self.name!r}: tiles need grid dims and thread params of this kernel"
                                      + (f"; unknown name(s) {', '.join(unknown)}" if unknown else ""))
            if not isinstance(self.tiles.seen, bool):  # "no" would read as True: seen devices' models get it too
                raise KernelSpecError(f"kernel {self.name!r}: tiles' seen must be True or False, not "
                                      f"{self.tiles.seen!r}")
        unknown_ext = [e for e in self.extensions if e not in prelude.EXTENSIONS]
        if unknown_ext:
            raise KernelSpecError(f"kernel {self.name!r}: unknown prelude extension(s) {', '.join(unknown_ext)}; "
                                  f"there are {', '.join(prelude.EXTENSIONS)}")
        leaks = prelude.foreign_tokens(self.body + self.helpers, None)
        if leaks:
            raise KernelSpecError(f"kernel {self.name!r}: body uses backend-specific token(s) {', '.join(leaks)}; use the prelude vocabulary")
        launch = self.launch.__wrapped__ if isinstance(self.launch, CheckedLaunch) else self.launch
        if callable(launch):  # (re)wrapped for this name: replace() may rename the kernel
            object.__setattr__(self, "launch", CheckedLaunch(launch, self.name))

    def _check_params(self) -> None:
        """Each parameter an identifier with a list of whole numbers: MLX passes them as integer template arguments,
        and the constraints are compiled as a function of them, so a string or bool value is refused here, by name,
        not met as a TypeError when configs are enumerated."""
        changed: dict[str, tuple[int, ...]] = {}
        for name, values in self.params.items():
            if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
                raise KernelSpecError(f"kernel {self.name!r}: parameter name {shown(name)} is not an identifier")
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise KernelSpecError(f"kernel {self.name!r}: parameter {name!r} is {type(values).__name__}, not a "
                                      "list or tuple of whole numbers")
            if not values:
                raise KernelSpecError(f"kernel {self.name!r}: parameter {name!r} has no values")
            for value in values:
                if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                    raise KernelSpecError(f"kernel {self.name!r}: parameter {name!r} value {shown(value)} is "
                                          f"{type(value).__name__}, not int: parameters are integer template "
                                          "arguments of the kernel")
                if not TEMPLATE_INT[0] <= int(value) <= TEMPLATE_INT[1]:
                    raise KernelSpecError(f"kernel {self.name!r}: parameter {name!r} value {int(value)} does not fit "
                                          "a template argument (a 32-bit int)")
            whole = tuple(int(v) for v in values)  # numpy integers become ints: the launch and the runtime take ints
            if len(set(whole)) != len(whole):
                raise KernelSpecError(f"kernel {self.name!r}: parameter {name!r} lists a value twice "
                                      f"({', '.join(str(v) for v in whole)})")
            if any(type(v) is not int for v in values):
                changed[name] = whole
        if changed:
            object.__setattr__(self, "params", {**self.params, **changed})

    def _check_features(self) -> None:
        allowed = set(self.params) | set(self.shape_grid.dims)
        for name, feature in self.features.items():
            text = feature.expr if isinstance(feature, Feature) else feature
            if not name.isidentifier() or name in allowed:
                raise KernelSpecError(f"kernel {self.name!r}: feature name {name!r} must be an identifier "
                                      "that is not a parameter or shape dim")
            try:
                compile_constraint(text)
                unknown = expression_names(text) - allowed
            except (UnsafeConstraint, SyntaxError) as exc:
                raise KernelSpecError(f"kernel {self.name!r}: feature {name!r} = {text!r}: {exc}") from None
            if unknown:
                raise KernelSpecError(f"kernel {self.name!r}: feature {name!r} = {text!r} uses unknown name(s) "
                                      f"{', '.join(sorted(unknown))}: only parameters and shape dims")
            if isinstance(feature, Feature) and not isinstance(feature.per_device, bool):  # "no" would read as True
                raise KernelSpecError(f"kernel {self.name!r}: feature {name!r}: per_device must be True or False, "
                                      f"not {feature.per_device!r}")

    def derived_features(self) -> dict[str, Feature]:
        """The declared features, each as a Feature (a plain expression is read by every model)."""
        return {name: f if isinstance(f, Feature) else Feature(f) for name, f in self.features.items()}

    def replace(self, **changes: Any) -> "KernelSpec":
        """A copy with some fields changed, re-validated (constraints and body are checked again)."""
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__ if f not in ("_compiled", "_joined")}
        return KernelSpec(**{**fields, **changes})

    # -- sources -------------------------------------------------------------------------------
    def source(self, backend: str) -> str:
        """The `source` argument for mx.fast.<backend>_kernel: index prelude + body."""
        return prelude.index_prelude(backend) + self.body

    def header(self, backend: str) -> str:
        """The `header` argument: the backend's vocabulary + this kernel's helpers."""
        return prelude.header(backend, self.extensions) + self.helpers

    @property
    def version(self) -> str:
        """A hash of everything that decides the generated code, so changed code never mixes with old timings."""
        text = canonical_json({
            "name": self.name,
            "body": self.body,
            "helpers": self.helpers,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "prelude": prelude.PRELUDE_VERSION,
            "sources": {b: self.header(b) + self.source(b) for b in prelude.BACKENDS},
        })
        return digest(text, 12)

    # -- config space -------------------------------------------------------------------------
    def configs(self) -> list[dict[str, int]]:
        """Every point of the config space, constraints not applied."""
        names = list(self.params)
        return [dict(zip(names, combo)) for combo in itertools.product(*(self.params[n] for n in names))]

    def violations(self, config: Mapping[str, int], shape: Mapping[str, int], dtype: str, limits: Limits) -> list[str]:
        """The constraints `config` breaks on this shape, dtype and device (empty: legal)."""
        env: dict[str, Any] = {**shape, **config, **limits.env(dtype)}
        broken = []
        for text, code in self._compiled.items():
            try:
                ok = eval(code, {"__builtins__": {}, "min": min, "max": max, "abs": abs}, env)  # noqa: S307 - author's own expressions
            except ZeroDivisionError:
                ok = False
            if not ok:
                broken.append(text)
        return broken

    def legal_configs(self, shape: Mapping[str, int], dtype: str, limits: Limits) -> list[dict[str, int]]:
        """The configs that pass every constraint, in config-space order (those `violations` finds none in).

        The constraints are one compiled `lambda <params>: (c1) and (c2) ...` whose globals are the shape
        and limits, called once per point of the config space: the autotuner enumerates a case's configs
        on every first call, and this is a fraction of one eval per constraint and config. The first legal
        config's launch is worked out too, so a launch that returns no Launch is refused (KernelSpecError)
        before a tune or collect times anything."""
        names = list(self.params)
        scope: dict[str, Any] = {**shape, **limits.env(dtype), "__builtins__": {}, "min": min, "max": max, "abs": abs}
        check = eval(self._conjunction(), scope)  # noqa: S307 - the author's own expressions, checked at construction
        legal = []
        for combo in itertools.product(*(self.params[n] for n in names)):
            try:
                ok = check(*combo)
            except ZeroDivisionError:  # as in violations: a constraint that divides by zero is broken
                ok = False
            if ok:
                legal.append(dict(zip(names, combo)))
        if legal and isinstance(self.launch, CheckedLaunch):
            try:  # a launch that returns no Launch is refused at the first config, before anything is timed
                self.launch(legal[0], shape)
            except KernelSpecError:
                raise
            except Exception:  # noqa: BLE001 - a launch that raises is that config's launch error, when measured
                pass
        return legal

    def _conjunction(self):
        """`lambda <params>: (c1) and (c2) and ...` compiled once (True without constraints), cached."""
        if "__all__" not in self._joined:
            body = " and ".join(f"({t})" for t in self._compiled) or "True"
            self._joined["__all__"] = compile(f"lambda {', '.join(self.params)}: {body}",
                                              f"<constraints of {self.name}>", "eval")
        return self._joined["__all__"]

    def shared_memory_bytes(self, config: Mapping[str, int], dtype: str, backend: str) -> int:
        """Dynamic threadgroup memory to request for this config's launch (0 on Metal or without KSHARED_DYN)."""
        if backend != "cuda" or self.shared_memory is None:
            return 0
        return int(self.shared_memory(config, DTYPE_BYTES[dtype]))

    def tolerance_for(self, dtype: str) -> tuple[float, float]:
        return tuple(self.tolerance.get(dtype, DEFAULT_TOLERANCE[dtype]))  # type: ignore[return-value]

    def describe(self) -> dict[str, Any]:
        """What `zmlx-pipeline kernels --json` prints for this kernel."""
        return {
            "name": self.name,
            "description": self.description,
            "class": self.kernel_class,
            "version": self.version,
            "backends": list(prelude.BACKENDS),
            "extensions": list(self.extensions),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "parameters": {k: list(v) for k, v in self.params.items()},
            "threadgroup_parameter": self.threadgroup_param,
            "constraints": list(self.constraints),
            "features": {name: {"expr": f.expr, "per_device": f.per_device}
                         for name, f in self.derived_features().items()},
            "configs": len(self.configs()),
            "shape_dims": list(self.shape_grid.dims),
            "shape_grid": self.shape_grid.as_dict(),
        }


def spread(configs: Sequence[Any], n: int | None) -> list:
    """At most n items evenly spread over `configs`, first and last included (a deterministic sample)."""
    configs = list(configs)
    if n is None or len(configs) <= n:
        return configs
    if n == 1:
        return configs[:1]
    step = (len(configs) - 1) / (n - 1)
    return [configs[round(i * step)] for i in range(n)]


def load_grid(section: str) -> ShapeGrid:
    """A built-in kernel's shape grid, from the package's shapes.toml."""
    return ShapeGrid.from_toml(Path(__file__).with_name("shapes.toml"), section)
