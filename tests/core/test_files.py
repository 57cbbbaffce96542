"""core/files.py: atomic writes leave the old file or the new one, never a half-written one or a temp file."""

from __future__ import annotations

import json
import os
import stat

import pytest

from zmlx_pipeline.core import files
from zmlx_pipeline.core.files import write_json_atomic, write_text_atomic


def test_json_is_written_sorted_and_replaces_the_old_file(tmp_path):
    path = tmp_path / "deep" / "cache.json"
    write_json_atomic(path, {"b": 1, "a": [1, 2]})
    write_json_atomic(path, {"c": 3, "a": 0})
    assert path.read_text() == '{\n "a": 0,\n "c": 3\n}\n'
    assert json.loads(path.read_text()) == {"a": 0, "c": 3}
    assert [p.name for p in path.parent.iterdir()] == ["cache.json"]


def test_a_failed_replace_keeps_the_old_file_and_removes_the_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "bundles" / "latest"
    path.parent.mkdir()
    path.write_text("v1\n")

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(path, "v2\n")
    assert path.read_text() == "v1\n"
    assert [p.name for p in path.parent.iterdir()] == ["latest"]


def test_the_mode_is_applied_to_the_new_file(tmp_path):
    path = tmp_path / "latest"
    write_text_atomic(path, "v1\n", mode=0o644)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    write_text_atomic(path, "v2\n")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # mkstemp's private default


def test_current_umask_reads_the_mask_and_leaves_it_as_it_was():
    import os

    from zmlx_pipeline.core.files import current_umask

    old = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        assert current_umask() == 0o027  # reading it changed nothing
    finally:
        os.umask(old)


def test_a_path_that_is_not_utf8_says_so_with_its_bytes_shown():
    import os

    from zmlx_pipeline.core.files import utf8_problem

    assert utf8_problem("/tmp/ünï/store.duckdb") is None
    problem = utf8_problem(os.fsdecode(b"/tmp/x\xff"), "store path")
    assert problem.startswith("store path /tmp/x\\xff cannot be encoded as UTF-8 in this locale: run with PYTHONUTF8=1")


@pytest.mark.parametrize("typed, scheme", [("s3://bucket/x.duckdb", "s3"), ("https://host/b", "https"),
                                           ("hf://org/repo", "hf"), ("git+ssh://h/r", "git+ssh")])
def test_a_url_is_told_as_typed_and_as_a_path_folds_it(typed, scheme):
    from pathlib import Path

    folded = str(Path(typed))  # Path keeps one slash: s3:/bucket/x.duckdb
    assert "://" not in folded
    assert files.url_scheme(typed) == scheme and files.url_scheme(typed, in_path=True) == scheme
    assert files.url_scheme(folded) is None  # as typed, the folded text is a local name (a folder "s3:")
    assert files.url_scheme(folded, in_path=True) == scheme
    assert files.url_problem(typed) == (f"path {typed!r} is a URL ({scheme}:), not a local path: download or mount "
                                        "it and give its local path")


@pytest.mark.parametrize("text", ["C:/store.duckdb", "c://x", "store.duckdb", "./s3:/x", "a:b/c", "1s:/x", "/s3:/x"])
def test_a_drive_letter_or_a_colon_inside_a_name_is_no_url(text):
    assert files.url_scheme(text) is None and files.url_scheme(text, in_path=True) is None
    assert files.url_problem(text) is None

