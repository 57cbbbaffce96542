"""The repository itself: every path README.md and ARCHITECTURE.md cite exists, the README's layout names
every top-level folder, and no text file speaks of work periods (a session, round or issue and its number)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

import zmlx_pipeline

REPO_ROOT = Path(zmlx_pipeline.__file__).resolve().parents[1]
CITING_DOCS = ("README.md", "ARCHITECTURE.md", "lab/README.md",
               *sorted(f"notes/{p.name}" for p in (Path(__file__).resolve().parents[1] / "notes").glob("*.md")))
# A cited path starts with a top-level folder or, in the architecture's module paths, a package folder.
TOP_LEVEL = ("notes", "benchmarks", "tools", "examples", "data", "lab", "tests", "zmlx_pipeline")
PACKAGE_LEVEL = ("kernels", "data", "models", "publish", "runtime", "pipeline")
PATH_RE = re.compile(r"(?<![\w/.~$-])((?:%s)/[\w./{},*<>-]*)" % "|".join(sorted(set(TOP_LEVEL + PACKAGE_LEVEL))))
DIARY_RE = re.compile(r"\b(session|issue|round|stop) ?#?[0-9]+|\bsessions? [0-9]|\bround [0-9]|issue [0-9]",
                      re.IGNORECASE)
BINARY_SUFFIXES = (".parquet", ".npy", ".zip", ".png", ".zmodel", ".gz", ".duckdb")


def expand_braces(text: str) -> list[str]:
    """`a-{x,y}.json` -> [`a-x.json`, `a-y.json`] (nested groups expand one at a time)."""
    match = re.search(r"\{([^{}]*)\}", text)
    if not match:
        return [text]
    out: list[str] = []
    for alt in match.group(1).split(","):
        out += expand_braces(text[: match.start()] + alt + text[match.end():])
    return out


def cited_paths(text: str) -> set[str]:
    """Relative paths a document cites, with trailing punctuation and placeholders (`<hash>`) cut off."""
    found = set()
    for raw in PATH_RE.findall(text):
        path = raw.split("<", 1)[0].rstrip(".,:;")
        if path.count("{") != path.count("}"):
            continue
        found.update(expand_braces(path))
    return found


def exists(path: str) -> bool:
    """A path relative to the repository root, or (for module paths such as `data/store.py`) to the package."""
    for base in (REPO_ROOT, REPO_ROOT / "zmlx_pipeline"):
        if "*" in path:
            if list(base.glob(path)):
                return True
        elif (base / path).exists():
            return True
    return False


def tracked_files() -> list[Path]:
    """The files git tracks, or every file outside hidden and build folders when there is no git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True)
        names = [n for n in out.stdout.decode().split("\0") if n]
        if names:
            return [REPO_ROOT / n for n in names]
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for root, dirs, names in os.walk(REPO_ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "build", "bundles")
                   and not d.endswith(".egg-info")]
        files += [Path(root) / n for n in names]
    return files


def text_of(path: Path) -> str | None:
    if path.suffix in BINARY_SUFFIXES or not path.is_file():
        return None
    data = path.read_bytes()
    if b"\0" in data[:4096]:
        return None
    return data.decode("utf-8", errors="replace")


def test_cited_paths_are_found_in_text():
    text = "see `notes/collection.md`, benchmarks/results/a-{x,y}.json. and data/store.py; also ~/.cache/data/x"
    assert cited_paths(text) == {"notes/collection.md", "benchmarks/results/a-x.json",
                                 "benchmarks/results/a-y.json", "data/store.py"}
    assert cited_paths("DIR/<time>-<hash>/ and devices/<hash>.json") == set()
    assert cited_paths("lab/results/regret_by_device-*.txt") == {"lab/results/regret_by_device-*.txt"}


@pytest.mark.parametrize("doc", CITING_DOCS)
def test_every_path_a_document_cites_exists(doc):
    text = (REPO_ROOT / doc).read_text(encoding="utf-8")
    paths = cited_paths(text)
    assert paths, f"{doc} cites no path: the pattern no longer matches its citations"
    missing = sorted(p for p in paths if not exists(p))
    assert not missing, f"{doc} cites paths that do not exist: {missing}"


def test_the_readme_layout_names_every_top_level_folder():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    folders = {p.relative_to(REPO_ROOT).parts[0] for p in tracked_files() if len(p.relative_to(REPO_ROOT).parts) > 1}
    shown = {f for f in folders if not f.startswith(".")}
    missing = sorted(f for f in shown if not re.search(rf"^\s*{re.escape(f)}/", layout, re.MULTILINE))
    assert not missing, f"README's layout does not name: {missing}"
    assert "ARCHITECTURE.md" in layout


def test_the_diary_pattern_catches_work_period_labels():
    # written as word + number so that this file does not carry the labels it looks for
    for word, number in (("session", " 27"), ("Session", " #3"), ("round", " 9"), ("issue", " 4"), ("stop", " 2"),
                         ("sessions", " 23-26"), ("issue", " #12")):
        assert DIARY_RE.search(word + number), word + number
    for fine in ("a second round of timing", "rounds_vs_mlx", "dual issue.", "start_new_session=True", "issues/12"):
        assert not DIARY_RE.search(fine), fine


def test_no_text_file_speaks_of_work_periods():
    hits = []
    for path in tracked_files():
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if DIARY_RE.search(line):
                hits.append(f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()[:120]}")
    assert not hits, "work-period labels:\n" + "\n".join(hits[:40])


LONG_MODULE_LINES = 500
LONG_MODULE_REASON = "Why one long module:"


def _long_modules_without_a_reason(package: Path) -> list[str]:
    """Modules over LONG_MODULE_LINES lines whose docstring does not say why they are one module."""
    import ast

    missing = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") <= LONG_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if LONG_MODULE_REASON not in doc:
            missing.append(str(path.relative_to(package.parent)))
    return missing


def test_a_long_module_says_why_it_is_one_module(tmp_path):
    package = Path(zmlx_pipeline.__file__).parent
    assert _long_modules_without_a_reason(package) == []
    # the check itself: a long module without the reason is caught, one with it is not
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text('"""A long module."""\n' + "x = 1\n" * (LONG_MODULE_LINES + 1))
    (tmp_path / "pkg" / "said.py").write_text(f'"""A long module.\n\n{LONG_MODULE_REASON} a reason.\n"""\n'
                                              + "x = 1\n" * (LONG_MODULE_LINES + 1))
    (tmp_path / "pkg" / "short.py").write_text('"""Short."""\nx = 1\n')
    assert _long_modules_without_a_reason(tmp_path / "pkg") == ["pkg/long.py"]
