"""What a bundle's JSON files must hold (bundle_fields.json, field by field), checked once as each file is read.

A bundle whose hashes match may still hold what the runtime cannot use (a config that is a number, an
index past the kernel's configs, a time that is a string): the index files are checked when the bundle
is loaded, a device's table when it is first parsed, and the first problem found is returned as one
line for the caller's BundleError. Every dim, bucket and count is bounded (a dim fits an array), every config
sets exactly its kernel's parameters, every constraint is arithmetic the runtime evaluates, and a kernel named
as a built-in one agrees with the built-in kernel (its dims, parameters and constraints), so no answer is a
config the kernel cannot run. A config value is what the importer stores (a whole number, a fraction, text,
a boolean, null: Kernel Tuner tunes "fast" and 0.5), but a built-in kernel's and every threadgroup size are
whole numbers. A device registered in the store has names detection can find it by: no catalog chip's, none
another registered device has (registered_problem). Standard library only (and the package's catalog, as detection).

Each kind is checked a column at a time (every entry's `best` at once, with C-level set, min and max), so a
device table of thousands of entries costs about what parsing it does, not several times that; only a column
that fails is walked item by item, to name the first bad value.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from itertools import chain, repeat
from operator import is_not
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from zmlx_pipeline.core.chips import binned_variants
from zmlx_pipeline.runtime.device import is_registered

FIELDS_FILE = Path(__file__).with_name("bundle_fields.json")
INF = float("inf")
#: the largest array dimension MLX takes (its shapes are 32-bit signed integers): every dim a bundle names
MAX_DIM = 2**31 - 1
#: the largest bucket key: a dim's log2, rounded (runtime/lookup.py bucket_of)
MAX_EXPONENT = MAX_DIM.bit_length()
#: the most candidates a kernel's prune_k may ask for (the largest built-in config space is a few thousand)
MAX_PRUNE_K = 4096
#: the largest magnitude of a built-in kernel's config value, and of any kernel's threadgroup size (a launch takes
#: them as 32-bit integers)
MAX_PARAM = 2**31 - 1
#: the integers an imported kernel's config value may be: int64's, as the importer stores them (data/records.py)
INT64 = (-2**63, 2**63 - 1)
#: the most characters of a config value that is text (Kernel Tuner tunes strings such as "fast" and "safe")
MAX_PARAM_TEXT = 256
#: a whole chip's device id, as the catalog and collect write one (data/records.py DEVICE_ID_PATTERN without its
#: core limit), and the most characters it may hold (records.py MAX_NAME_LENGTH)
CHIP_ID = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
MAX_ID_CHARS = 100
#: the content schema that gave every kernel its `measured_range` (publish/build.py); lookups mark a shape outside it
MEASURED_RANGE_SCHEMA = 2

#: (values of one kind, the kernel's number of configs) -> whether every value is usable
Column = Callable[[list, int], bool]
_given = functools.partial(is_not, None)


def _types(col: list) -> set:
    return set(map(type, col))


def _whole(col: list, least: int, below: float = INF) -> bool:
    return not col or _types(col) <= {int} and min(col) >= least and max(col) < below


def _of(col: list, kind: type) -> list:
    return [v for v in col if type(v) is kind]


def _config_values(col: list, n: int = 0) -> bool:
    """Every value is one a config may hold, as the importer stores it (any kernel's; a built-in kernel's are
    checked whole after): an int64 integer, a finite number, a boolean, null, or printable text of at most
    MAX_PARAM_TEXT characters (what lookups hash, compare and print; a list or object is none of these)."""
    kinds = _types(col)
    if kinds == {int}:
        return min(col) >= INT64[0] and max(col) <= INT64[1]
    if not kinds <= {int, float, bool, str, type(None)}:
        return False
    ints, floats, texts = _of(col, int), _of(col, float), _of(col, str)
    return (not ints or min(ints) >= INT64[0] and max(ints) <= INT64[1]) \
        and all(map(math.isfinite, floats)) \
        and (not texts or max(map(len, texts)) <= MAX_PARAM_TEXT and all(map(str.isprintable, texts)))


#: atomic kind -> (column check, what a value must be)
ATOMS: dict[str, tuple[Column, str]] = {
    "name": (lambda col, n: _types(col) <= {str}, "a string"),
    "bool": (lambda col, n: _types(col) <= {bool}, "true or false"),
    "device": (lambda col, n: _types(col) <= {str}
               and all(len(v) <= MAX_ID_CHARS and CHIP_ID.fullmatch(v) for v in col),
               f"a whole chip's device id (lower-case letters and digits in words joined by single hyphens, at most "
               f"{MAX_ID_CHARS} characters)"),
    "count": (lambda col, n: _whole(col, 1, MAX_DIM + 1), f"a whole number from 1 to {MAX_DIM}"),
    "k": (lambda col, n: _whole(col, 1, MAX_PRUNE_K + 1), f"a whole number from 1 to {MAX_PRUNE_K}"),
    "param": (_config_values, f"a whole number from -2**63 to 2**63-1, a finite number, a boolean, null or printable "
                              f"text of at most {MAX_PARAM_TEXT} characters"),
    "size": (lambda col, n: _whole(col, 0), "a whole number >= 0"),
    # the parser refuses NaN, so min and max order every number; a whole number past the largest float is no time
    "number": (lambda col, n: not col or _types(col) <= {int, float} and min(col) >= 0
               and max(col) <= sys.float_info.max,
               "a finite number >= 0"),
    "index": (lambda col, n: _whole(col, 0, n), "an index into the kernel's configs"),
    "object": (lambda col, n: _types(col) <= {dict}, "an object"),
    "range": (lambda col, n: _types(col) <= {list} and set(map(len, col)) <= {2}
              and _whole(list(chain.from_iterable(col)), 1, MAX_DIM + 1) and all(lo <= hi for lo, hi in col),
              f"a [low, high] pair of whole numbers from 1 to {MAX_DIM}"),
}


@functools.lru_cache(maxsize=1)
def specs() -> dict[str, Any]:
    """bundle_fields.json: the objects' fields and kinds, and the allowed values of the `choices` kinds."""
    return json.loads(FIELDS_FILE.read_text(encoding="utf-8"))


def _show(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.50}"


def _whole_keys(col: list) -> bool:
    keys = list(chain.from_iterable(col))
    return all(map(_whole_text, keys))


def _whole_text(text: str, most: int = MAX_DIM) -> bool:
    """`text` is a whole number from 0 to `most`, in ASCII digits (its length checked before it is read)."""
    return text.isascii() and text.isdigit() and len(text) <= len(str(most)) and int(text) <= most


@functools.lru_cache(maxsize=None)
def column(kind: str) -> Column:
    """The check of a column of values of one kind (bundle_fields.json's syntax)."""
    if kind.startswith("@"):
        return _object_column(kind[1:])
    if kind.startswith("["):
        item = column(kind[1:-1])
        return lambda col, n: _types(col) <= {list} and item(list(chain.from_iterable(col)), n)
    if kind.startswith("{"):
        keyed = kind.startswith("{#")
        item = column(kind[2:-1] if keyed else kind[1:-1])
        return lambda col, n: (_types(col) <= {dict} and (not keyed or _whole_keys(col))
                               and item(list(chain.from_iterable(map(dict.values, col))), n))
    choices = specs()["choices"].get(kind)
    if choices is not None:
        allowed = frozenset(choices)
        return lambda col, n: _types(col) <= {str} and set(col) <= allowed
    return ATOMS[kind][0]


def _object_column(name: str) -> Column:
    spec = specs()[name]
    required, present = tuple(spec.get("required", ())), tuple(spec.get("present", ()))
    fields = [(field, column(kind)) for field, kind in spec["fields"].items()]

    def check(col: list, n: int) -> bool:
        if not _types(col) <= {dict}:
            return False
        for field in required:
            if None in map(dict.get, col, repeat(field)):
                return False
        for field in present:
            if not all(map(dict.__contains__, col, repeat(field))):
                return False
        for field, field_check in fields:
            values = list(filter(_given, map(dict.get, col, repeat(field))))
            if values and not field_check(values, n):
                return False
        return True

    return check


def explain(kind: str, value: Any, n: int) -> tuple[str, str]:
    """(where inside `value`, what is wrong) for a value whose kind's check failed."""
    if kind.startswith("@"):
        if type(value) is not dict:
            return "", f"must be an object, not {_show(value)}"
        spec = specs()[kind[1:]]
        for field in (*spec.get("required", ()), *spec.get("present", ())):
            if field not in value or field in spec.get("required", ()) and value[field] is None:
                return "", f"lacks {field!r}"
        for field, field_kind in spec["fields"].items():
            v = value.get(field)
            if v is not None and not column(field_kind)([v], n):
                where, what = explain(field_kind, v, n)
                return f".{field}{where}", what
    elif kind.startswith(("[", "{")):
        mapping, keyed = kind.startswith("{"), kind.startswith("{#")
        item = kind[2:-1] if keyed else kind[1:-1]
        if type(value) is not (dict if mapping else list):
            return "", f"must be {'an object' if mapping else 'a list'}, not {_show(value)}"
        for key, v in (value.items() if mapping else enumerate(value)):
            if keyed and not _whole_keys([[key]]):
                return f"[{key:.20}]", f"is not named by a whole number from 0 to {MAX_DIM}"
            if not column(item)([v], n):
                where, what = explain(item, v, n)
                return f"[{key}]{where}", what
    else:
        choices = specs()["choices"].get(kind)
        return "", (f"must be one of {', '.join(choices)}" if choices else f"must be {ATOMS[kind][1]}") + \
            f", not {_show(value)}"
    return "", "cannot be used"


def _first(kind: str, named: Mapping[str, Any], n: int, where: str) -> str | None:
    """The first problem among `named` values of one kind, as `where[name].field what`; None if they are usable."""
    if column(kind)(list(named.values()), n):
        return None
    for name, value in named.items():
        if not column(kind)([value], n):
            inside, what = explain(kind, value, n)
            return f"{where}[{name}]{inside} {what}"
    return None


def index_problem(kernels: Mapping[str, Any], profiles: Mapping[str, Any],
                  builtin: Mapping[str, Any] | None = None, schema: int | None = None) -> str | None:
    """The first field of kernels.json or profiles.json the runtime cannot use, as `file: where what`; None if none.
    `builtin`: kernels.json entries of the built-in kernels, which a kernel of the same name must agree with.
    `schema`: the bundle's content schema; from MEASURED_RANGE_SCHEMA on every kernel has a measured_range of each of
    its dims (without one no shape would ever be marked outside the measured range)."""
    for name, meta in kernels.items():
        configs = meta.get("configs") if type(meta) is dict else None
        problem = _first("@kernel", {name: meta}, len(configs) if type(configs) is list else 0, "kernels.json: kernels")
        if problem:
            return problem
        dims, ranged = set(meta["dims"]), set(meta.get("measured_range") or ())
        if not dims or not ranged <= dims \
                or any(set(shape) != dims for shape in (meta.get("buckets") or {}).values()):
            return (f"kernels.json: kernels[{name}]: its measured_range and bucket shapes must use its dims "
                    f"({', '.join(sorted(dims))})")
        if schema is not None and schema >= MEASURED_RANGE_SCHEMA and ranged != dims:
            return (f"kernels.json: kernels[{name}] lacks the measured_range of {', '.join(sorted(dims - ranged))}, "
                    f"which every kernel of a schema-{schema} bundle has for each of its dims")
        own = (builtin or {}).get(name)
        problem = _kernel_problem(meta, own, own is not None or meta.get("spec") == "registered") \
            or _builtin_problem(meta, own)
        if problem:
            return f"kernels.json: kernels[{name}]{problem}"[:300]
    return _first("@profile", profiles, 0, "profiles.json: devices") or registered_problem(profiles)


@functools.lru_cache(maxsize=1)
def _catalog_labels() -> dict[str, str]:
    """Every catalog chip's name and alias as detection compares names (normalize_name) -> the chip's id."""
    from zmlx_pipeline.data.catalog import load_catalog, normalize_name

    labels: dict[str, str] = {}
    for spec in load_catalog():
        for label in (spec.name, *spec.aliases):
            labels.setdefault(normalize_name(label), spec.id)
    return labels


def registered_problem(profiles: Mapping[str, Any]) -> str | None:
    """The first name or alias of a registered device (device.is_registered) that detection cannot tell it by, as
    `profiles.json: devices[id].field what`; None if none. Names are compared as detection compares a GPU's reported
    name (normalize_name): one a catalog chip has is that chip's (the catalog is matched first), and one two
    registered devices share finds neither, unless they are binned variants of one chip (the same name, other core
    counts), which detection tells apart by core count, as `devices add` lets them be. Run after the kinds are checked
    (every name text, aliases a list of text); skipped without the catalog, as detection is."""
    try:
        from zmlx_pipeline.data.catalog import normalize_name

        catalog = _catalog_labels()
    except ImportError:
        return None
    owners: dict[str, dict[str, Mapping[str, Any]]] = {}
    for device_id, profile in profiles.items():
        if not is_registered(profile):
            continue
        named = [(".name", profile.get("name")), *((f".aliases[{i}]", a) for i, a in enumerate(profile["aliases"]))]
        for where, label in named:
            key = normalize_name(label) if isinstance(label, str) else ""
            if not key:
                continue
            chip = catalog.get(key)
            if chip is not None:
                return (f"profiles.json: devices[{device_id}]{where} {label!r:.60} is a name of catalog chip {chip}: a "
                        "registered device has names of its own (a GPU reporting it is found as that chip)")[:300]
            held = owners.setdefault(key, {})
            other = next((d for d, p in held.items() if d != device_id and not _binned(profile, p)), None)
            if other is not None:
                return (f"profiles.json: devices[{device_id}]{where} {label!r:.60} is also a name or alias of "
                        f"registered device {other}: a GPU reporting it would be found as neither")[:300]
            held[device_id] = profile
    return None


def _binned(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Two registered binned variants of one chip (binned_variants), both with a core count to be told apart by."""
    cores = one.get("gpu_cores"), other.get("gpu_cores")
    return None not in cores and binned_variants(one.get("name"), cores[0], other.get("name"), cores[1])


def _params(meta: Mapping[str, Any]) -> list[str]:
    """A kernel's parameters: as kernels.json lists them, else (an older bundle) its first config's."""
    params = meta.get("params")
    if params is None and meta["configs"]:
        params = sorted(meta["configs"][0])
    return list(params or ())


def _kernel_problem(meta: Mapping[str, Any], builtin: Mapping[str, Any] | None = None,
                    whole: bool = False) -> str | None:
    """Why a kernel's configs and constraints cannot be used together (`.field what`); None if they can: every
    config sets exactly its parameters with values the runtime uses (_values_problem; `whole`: a built-in kernel,
    whose values are all whole numbers), and every constraint is whitelisted arithmetic over its numeric parameters,
    dims and the device limits (a constraint that cannot be evaluated would be skipped, letting any config pass).
    The built-in kernel's own constraints are taken as they are: one the whitelist lacks an operator for is left to
    the kernel's spec, as in the shipped bundle."""
    from zmlx_pipeline.core.constraints import UnsafeConstraint, compile_constraint, expression_names, limit_values

    params = _params(meta)
    if len(set(params)) != len(params) or set(params) & set(meta["dims"]):
        return f".params {params!r:.80} must name each parameter once, none a dim"
    wanted = set(params)
    for i, config in enumerate(meta["configs"]):
        if set(config) != wanted:
            return f".configs[{i}] sets {', '.join(sorted(config)) or 'nothing'}, not the parameters " \
                   f"{', '.join(params)}"
    tg = meta.get("threadgroup_param")
    if tg is not None and tg not in wanted:
        return f".threadgroup_param {tg!r:.40} is not one of its parameters ({', '.join(params)})"
    problem = _values_problem(meta["configs"], tg, whole)
    if problem:
        return problem
    names = wanted | set(meta["dims"]) | set(limit_values(None)) | {"dtype_bytes"}
    own = set((builtin or {}).get("constraints") or ())
    texts = [(i, text) for i, text in enumerate(meta.get("constraints") or ()) if text not in own]
    # a parameter holding text or null cannot be computed with: a constraint reading it would be skipped
    unusable = {p for p in wanted if texts and not _types([c[p] for c in meta["configs"]]) <= {int, float, bool}}
    for i, text in texts:
        try:
            compile_constraint(text)
            read = expression_names(text)
        except (UnsafeConstraint, SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            return f".constraints[{i}] {text!r:.60} cannot be evaluated ({exc})"
        unknown = read - names
        if unknown:
            return f".constraints[{i}] {text!r:.60} reads {', '.join(sorted(unknown))}: neither a parameter, a dim " \
                   "nor a device limit"
        if read & unusable:
            return f".constraints[{i}] {text!r:.60} reads {', '.join(sorted(read & unusable))}, whose values are " \
                   "not all numbers: it cannot be evaluated for every config"
    return None


def _values_problem(configs: Sequence[Mapping[str, Any]], tg: str | None, whole: bool) -> str | None:
    """Why a kernel's config values cannot be used as the runtime uses them (`.configs[i][param] what`); None if they
    can. A built-in kernel's values (`whole`) and any kernel's threadgroup sizes are whole numbers a launch takes
    (lookups take a threadgroup's log2, the tuner its bit length); an imported kernel's other values may be any
    `param` (text, a fraction, a boolean: what the importer stores). Checked a column at a time, walked on failure."""
    if whole:
        values = list(chain.from_iterable(map(dict.values, configs)))
    elif tg is not None:
        values = [c[tg] for c in configs]
    else:
        return None
    if _whole(values, -MAX_PARAM, MAX_PARAM + 1):
        return None
    what = "a built-in kernel's parameter" if whole else "the threadgroup size"
    for i, config in enumerate(configs):
        for param, value in config.items():
            if (whole or param == tg) and not (type(value) is int and -MAX_PARAM <= value <= MAX_PARAM):
                return f".configs[{i}][{param}] must be a whole number from -{MAX_PARAM} to {MAX_PARAM} ({what}), " \
                       f"not {_show(value)}"
    return None


def _builtin_problem(meta: Mapping[str, Any], builtin: Mapping[str, Any] | None) -> str | None:
    """Why a kernel named as a built-in one does not describe it (`: what`); None if it does or none is built in.
    Its dims, parameters and threadgroup parameter are the built-in's, and it holds every built-in constraint (it
    may hold more: they only drop configs), so no config illegal for the built-in kernel is ever answered."""
    if builtin is None or builtin is meta:
        return None
    if list(meta["dims"]) != list(builtin.get("dims") or ()):
        return f": dims {', '.join(meta['dims'])} are not the built-in kernel's ({', '.join(builtin.get('dims') or ())})"
    params, own = _params(builtin), _params(meta)
    if set(own) != set(params):
        return f": parameters {', '.join(own)} are not the built-in kernel's ({', '.join(params)})"
    if meta.get("threadgroup_param") not in (None, builtin.get("threadgroup_param")):
        return f": threadgroup_param {meta.get('threadgroup_param')!r:.40} is not the built-in kernel's " \
               f"({builtin.get('threadgroup_param')!r})"
    missing = [c for c in builtin.get("constraints") or () if c not in set(meta.get("constraints") or ())]
    if missing:
        return f": lacks {len(missing)} constraint(s) of the built-in kernel, such as {missing[0]!r:.60}"
    return None


def table_problem(data: Any, kernels: Mapping[str, Any], positional: Sequence[str] | None = None) -> str | None:
    """The first thing a device table holds that the runtime cannot use (a key that is not the kernel's dims, an
    entry out of bundle_fields.json's `entry`); None if none. `positional`: an older schema's entry fields, in order."""
    by_kernel = data.get("kernels") if type(data) is dict else None
    if type(by_kernel) is not dict:
        return f"holds no 'kernels' object ({_show(data)})"
    for kernel, by_dtype in by_kernel.items():
        meta = kernels.get(kernel)
        if meta is None:
            return f"kernels.{kernel} is not a kernel of kernels.json"
        if type(by_dtype) is not dict:
            return f"kernels.{kernel} must be an object of dtypes, not {_show(by_dtype)}"
        n, dims = len(meta["configs"]), len(meta["dims"])
        for dtype, table in by_dtype.items():
            where = f"kernels.{kernel}.{dtype}"
            if type(table) is not dict:
                return f"{where} must be an object, not {_show(table)}"
            for part in ("measured", "buckets", "between"):
                entries = table.get(part)
                if entries is None:
                    continue
                if type(entries) is not dict:
                    return f"{where}.{part} must be an object, not {_show(entries)}"
                problem = _keys_problem(entries, dims, *((1, MAX_DIM) if part == "measured" else (0, MAX_EXPONENT)))
                if problem:
                    return f"{where}.{part} {problem}"
                if positional is not None:
                    entries = {k: dict(zip(positional, v)) if type(v) is list else v for k, v in entries.items()}
                problem = _first("@entry", entries, n, f"{where}.{part}")
                if problem:
                    return problem
    return None


def _keys_problem(entries: Mapping[str, Any], dims: int, least: int, most: int) -> str | None:
    """Why a table's keys are not `dims` comma-separated whole numbers from `least` to `most` (None when they are):
    a measured shape's dims, or a bucket's log2 of each (a larger one would name a shape no array can have)."""
    split = [key.split(",") for key in entries]
    values = list(chain.from_iterable(split))
    if set(map(len, split)) <= {dims} and all(map(str.isdigit, values)) and all(map(str.isascii, values)) \
            and max(map(len, values), default=0) <= len(str(most)) \
            and least <= min(map(int, values), default=least) and max(map(int, values), default=most) <= most:
        return None
    bad = next(key for key, parts in zip(entries, split)
               if len(parts) != dims or not all(_whole_text(p, most) and int(p) >= least for p in parts))
    return f"key {bad!r:.40} is not {dims} comma-separated whole numbers from {least} to {most}"
