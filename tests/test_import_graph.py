"""The package's import structure, read from the source with `ast` (nothing is imported):

- runtime/ (the light install) imports neither kernels/, pipeline/, models/ nor publish/, and what it
  reaches imports only the standard library and MLX;
- kernels/ imports neither runtime/, pipeline/, models/ nor publish/;
- core/ imports only the standard library and itself;
- no two subpackages import each other, directly or round a longer loop, and no module-level import
  loop exists between modules.

Every import counts, also one inside a function: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import zmlx_pipeline

PACKAGE = Path(zmlx_pipeline.__file__).resolve().parent

#: subpackage -> the subpackages it must never import
FORBIDDEN = {
    "runtime": {"kernels", "pipeline", "models", "publish"},
    "kernels": {"runtime", "pipeline", "models", "publish"},
    "core": {"data", "kernels", "runtime", "pipeline", "models", "publish"},
}
#: packages outside the standard library a module reachable from runtime/ may import (MLX, to time or detect)
LIGHT_EXTRA = {"mlx"}


class Graph:
    """Modules of one package and what each imports: `every` (any import in the file) and `top` (module level)."""

    def __init__(self, root: Path) -> None:
        self.name = root.name
        self.files: dict[str, Path] = {}
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            self.files[".".join(parts)] = path
        self.every = {m: self._imports(m, top_only=False) for m in self.files}
        self.top = {m: self._imports(m, top_only=True) for m in self.files}

    def _imports(self, module: str, top_only: bool) -> set[str]:
        path = self.files[module]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str] = set()
        for node in (tree.body if top_only else ast.walk(tree)):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                found.add(target)
                found |= {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in self.files}
        return found

    def own(self, name: str) -> str | None:
        """The package module an imported name is (or lives in), else None (outside the package)."""
        while name and name not in self.files:
            name = name.rpartition(".")[0]
        return name or None

    def part(self, module: str) -> str:
        """The subpackage (or top-level module) a module belongs to."""
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else "<package>"

    def violations(self, forbidden: dict[str, set[str]]) -> list[str]:
        out = []
        for module, names in self.every.items():
            banned = forbidden.get(self.part(module), set())
            for name in sorted(names):
                target = self.own(name)
                if target is not None and self.part(target) in banned:
                    out.append(f"{module} imports {name}")
        return out

    def outside_imports(self, module: str) -> set[str]:
        """Top-level names of the packages outside this one that a module imports."""
        return {n.partition(".")[0] for n in self.every[module] if self.own(n) is None and n}

    def reachable(self, starts: list[str]) -> set[str]:
        seen: set[str] = set()
        todo = list(starts)
        while todo:
            module = todo.pop()
            if module in seen:
                continue
            seen.add(module)
            todo += [t for t in (self.own(n) for n in self.every[module]) if t is not None]
        return seen

    def part_cycles(self) -> list[list[str]]:
        edges: dict[str, set[str]] = {}
        for module, names in self.every.items():
            for name in names:
                target = self.own(name)
                if target is not None and self.part(target) != self.part(module):
                    edges.setdefault(self.part(module), set()).add(self.part(target))
        return _cycles(edges)

    def module_cycles(self) -> list[list[str]]:
        edges = {m: {t for t in (self.own(n) for n in names) if t is not None and t != m}
                 for m, names in self.top.items()}
        return _cycles(edges)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in list(edges):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph() -> Graph:
    return Graph(PACKAGE)


def test_no_subpackage_imports_one_it_must_not(graph):
    assert graph.violations(FORBIDDEN) == []


def test_core_imports_only_the_standard_library(graph):
    core = [m for m in graph.files if graph.part(m) == "core"]
    assert core, "zmlx_pipeline/core/ is missing"
    outside = {m: graph.outside_imports(m) - set(sys.stdlib_module_names) for m in core}
    assert {m: names for m, names in outside.items() if names} == {}


def test_what_the_runtime_reaches_imports_only_the_standard_library_and_mlx(graph):
    runtime = [m for m in graph.files if graph.part(m) == "runtime"]
    reached = graph.reachable(runtime)
    outside = {m: graph.outside_imports(m) - set(sys.stdlib_module_names) - LIGHT_EXTRA for m in reached}
    assert {m: names for m, names in outside.items() if names} == {}
    assert not {graph.part(m) for m in reached} & FORBIDDEN["runtime"]


def test_no_two_subpackages_import_each_other(graph):
    assert graph.part_cycles() == []


def test_no_module_level_import_loop(graph):
    assert graph.module_cycles() == []


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "zmlx_pipeline"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def test_the_checks_catch_a_forbidden_import_a_loop_and_a_heavy_package(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "core/__init__.py": "import duckdb\n",
        "kernels/__init__.py": "",
        "kernels/spec.py": "def f():\n    from zmlx_pipeline.runtime.lookup import x\n",
        "runtime/__init__.py": "",
        "runtime/lookup.py": "from ..kernels import spec\nx = 1\n",
        "pipeline/__init__.py": "",
        "pipeline/cli.py": "from zmlx_pipeline.pipeline import cli_models\n",
        "pipeline/cli_models.py": "from zmlx_pipeline.pipeline.cli import cli\n",
    })
    g = Graph(pkg)
    assert g.violations(FORBIDDEN) == ["zmlx_pipeline.kernels.spec imports zmlx_pipeline.runtime.lookup",
                                       "zmlx_pipeline.runtime.lookup imports zmlx_pipeline.kernels",
                                       "zmlx_pipeline.runtime.lookup imports zmlx_pipeline.kernels.spec"]
    assert g.part_cycles() == [["kernels", "runtime"]]
    assert g.module_cycles() == [["zmlx_pipeline.pipeline.cli", "zmlx_pipeline.pipeline.cli_models"]]
    assert g.outside_imports("zmlx_pipeline.core") == {"duckdb"}
