"""A `latest` pointer holding bytes that are no UTF-8 text is refused as an unsafe name (it names no version), its
bytes shown as \\xNN escapes (never as U+FFFD, which hides which bytes they were), plain or reached through a
symbolic link, and the publish directory is left as it was."""

import os
import shutil
from pathlib import Path

import pytest

from bundle_fixtures import latest_dir, tree_digest
from zmlx_pipeline.runtime import BundleError
from zmlx_pipeline.runtime.bundle import read_dir


@pytest.mark.parametrize("blob, shown", [(b"\xff\xfe", "\\xff\\xfe"), (b"v1\xe9\n", "v1\\xe9")])
@pytest.mark.parametrize("linked", [False, True])
def test_a_pointer_of_bytes_that_are_no_text_is_an_unsafe_name(toy_bundle, tmp_path, linked, blob, shown):
    version = latest_dir(toy_bundle[1])
    root = tmp_path / "pub"
    root.mkdir()
    shutil.copytree(version, root / version.name)
    (root / ("current" if linked else "latest")).write_bytes(blob)
    if linked:
        os.symlink("current", root / "latest")
    before = tree_digest(root)
    with pytest.raises(BundleError) as info:
        read_dir(root)
    assert str(info.value) == f"{root / 'latest'}: the latest pointer holds an unsafe name '{shown}'"
    assert tree_digest(root) == before
