"""One kernel name, one config space: an imported file whose kernel is stored with another parameter set or other
shape dims goes under a name of its own.

Published files reuse kernel names for other config spaces (Kernel Tuner's test caches all say
`convolution_kernel`, with two, three, six or eight parameters; every T4 file in one folder takes the folder's name).
Stored under one name, such files would mix configs that lack each other's parameters, and every lookup and
model of that kernel would read them as one space. Refusing them would keep published files out, so a file
whose kernel name (from the file, a search-space description or its folder) is stored, or given by an earlier
file of the same import, with another parameter set or other dims is stored as `<kernel>_2`, `<kernel>_3`, ...:
the first of those stored (or given) with the file's own parameters and dims, so a re-import and a second
file of that space land where the first did, else the first free one (no rows, no built-in kernel's, none a file
of the import gives, no twin of any of them). A file of unknown size (no dims) fits any dims. A kernel named
with `--kernel` is never renamed: a file whose parameters or dims differ from the stored ones is refused. A
built-in kernel's name keeps its own rule (kernel_tuner._check_rows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Sequence

from zmlx_pipeline.data.importers.builtin_kernels import BUILTIN_KERNELS
from zmlx_pipeline.data.importers.kernel_tuner import ParsedFile, _fail, kernel_version
from zmlx_pipeline.data.records import name_problem, twin_problem
from zmlx_pipeline.data.store import Store

#: the most names a message lists of a parameter set
_SHOWN_NAMES = 8


@dataclass(frozen=True)
class _Space:
    """A parameter set and shape dims a kernel name holds, and who holds it: "stored" or an earlier file's name."""

    params: frozenset[str]
    dims: frozenset[str]
    origin: str


STORED = "stored"


def _fits(spaces: Sequence[_Space], params: frozenset[str], dims: frozenset[str]) -> bool:
    """Whether a file of `params` and `dims` belongs to a name holding `spaces` (none: a free name fits anything)."""
    if not spaces:
        return True
    known = {s.dims for s in spaces if s.params == params}
    if not known:
        return False
    known.discard(frozenset())
    return not dims or not known or dims in known


def _names(names: frozenset[str]) -> str:
    """Names as a message lists them: sorted, in parentheses, the first few and how many when there are more."""
    shown = sorted(names)
    text = ", ".join(shown[:_SHOWN_NAMES])
    return f"({text}, ... {len(shown)} in all)" if len(shown) > _SHOWN_NAMES else f"({text or 'none'})"


def _difference(kernel: str, spaces: Sequence[_Space], params: frozenset[str],
                dims: frozenset[str]) -> tuple[str, str]:
    """What `kernel` holds that a file does not, and the file's own: shape dims when it holds the file's parameters,
    else parameters ("convolution_kernel has other parameters stored (block_size_x, block_size_y)", "this file's
    (...)")."""
    other = next((s for s in spaces if s.params == params and s.dims and s.dims != dims), None)
    if other is not None:
        what, theirs, mine = "shape dims", other.dims, dims
    else:
        other = spaces[0]
        what, theirs, mine = "parameters", other.params, params
    held = "stored" if other.origin == STORED else f"given by {other.origin}"
    return f"{kernel} has other {what} {held} {_names(theirs)}", f"this file's {_names(mine)}"


class KernelSpaces:
    """The parameter sets and dims of kernel names, as stored and as given by the files placed so far."""

    def __init__(self, store: Store, given: Sequence[str] = ()) -> None:
        self._store = store
        #: the kernel names the files of the import give: a derived name is none of them, nor a twin of one
        self._given = frozenset(given)
        self._known: dict[str, list[_Space]] = {}
        self._read: set[str] = set()
        self._stored_names: list[str] | None = None

    def _load(self, kernel: str) -> None:
        """Read what the store holds of `kernel` and of every name it begins (its derived names among them)."""
        if any(kernel.startswith(prefix) for prefix in self._read):
            return
        self._read.add(kernel)
        for name, params, dims in self._store.kernel_spaces(kernel):
            space = _Space(frozenset(params), frozenset(dims), STORED)
            if space not in self._known.setdefault(name, []):
                self._known[name].append(space)

    def _add(self, name: str, params: frozenset[str], dims: frozenset[str], origin: str) -> None:
        """Mark `name` as holding this space (given by `origin`), so later files of it are placed beside it."""
        spaces = self._known.setdefault(name, [])
        if not any(s.params == params and s.dims == dims for s in spaces):
            spaces.append(_Space(params, dims, origin))

    def _derived(self, kernel: str, params: frozenset[str], dims: frozenset[str]) -> tuple[str | None, str]:
        """The name a file of `kernel` with a space of its own goes under: the first `<kernel>_N` (N >= 2) holding
        that space, else the first free one (no rows, no built-in kernel's, none a file gives, no twin of another
        name's); (None, why) when that name could not name a kernel (longer than a name may be)."""
        pattern = re.compile(re.escape(kernel) + r"_([1-9][0-9]*)")
        taken = sorted((int(m.group(1)), name) for name, spaces in self._known.items()
                       if spaces and (m := pattern.fullmatch(name)) is not None)
        for number, name in taken:
            if number >= 2 and _fits(self._known[name], params, dims):
                return name, ""
        if self._stored_names is None:
            self._stored_names = self._store.kernel_names()
        others = [*self._stored_names, *BUILTIN_KERNELS, *self._known, *sorted(self._given)]
        number = 2
        while True:
            name = f"{kernel}_{number}"
            problem = name_problem("the kernel name it would go under,", name)
            if problem is not None:
                return None, problem
            if not self._known.get(name) and name not in BUILTIN_KERNELS and name not in self._stored_names \
                    and name not in self._given and twin_problem("kernel", name, others) is None:
                return name, ""
            number += 1

    def place(self, item: ParsedFile, named: bool) -> ParsedFile:
        """`item` under the kernel name its config space goes under: its own, or a derived one when its own holds
        another space (`named`, a name given with --kernel: refused instead, one line, naming both spaces)."""
        kernel = item.kernel
        if kernel in BUILTIN_KERNELS or not item.measurements:
            return item
        params, dims = frozenset(item.measurements[0].config), frozenset(item.shape)
        self._load(kernel)
        spaces = self._known.get(kernel, [])
        if _fits(spaces, params, dims):
            self._add(kernel, params, dims, item.path.name)
            return item
        theirs, mine = _difference(kernel, spaces, params, dims)
        if named:
            raise _fail(item.path, f"--kernel {theirs} than {mine}: one kernel holds one config space; pass another "
                                   "--kernel NAME, or leave --kernel out to store the file under a name of its own")
        name, problem = self._derived(kernel, params, dims)
        if name is None:
            raise _fail(item.path, f"{theirs}, and {problem}; pass --kernel NAME")
        self._add(name, params, dims, item.path.name)
        version = kernel_version(name, item.measurements[0].config)
        return replace(item, kernel=name, kernel_version=version,
                       measurements=[replace(m, kernel=name, kernel_version=version) for m in item.measurements],
                       source={**item.source, "kernel_renamed_from": kernel}, renamed_from=kernel,
                       note=f"{theirs}; {mine} stored as {name}; name it with --kernel NAME")


def keep_spaces_apart(store: Store, parsed: list[ParsedFile], named: bool) -> list[ParsedFile]:
    """The files, in their order, each under the kernel name of its config space (see the module's docstring);
    `named`: the kernel was given with --kernel, so a file of another space is refused, never renamed."""
    spaces = KernelSpaces(store, [item.kernel for item in parsed])
    return [spaces.place(item, named) for item in parsed]
