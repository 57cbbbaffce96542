"""A `latest` pointer holding bytes that are no UTF-8 text is refused as an unsafe name (read as U+FFFD it names no
version), plain or reached through a symbolic link, and the publish directory is left as it was."""

import os
import shutil
from pathlib import Path

import pytest

from bundle_fixtures import latest_dir, tree_digest
from zmlx_pipeline.runtime import BundleError
from zmlx_pipeline.runtime.bundle import read_dir


@pytest.mark.parametrize("linked", [False, True])
def test_a_pointer_of_bytes_that_are_no_text_is_an_unsafe_name(toy_bundle, tmp_path, linked):
    version = latest_dir(toy_bundle[1])
    root = tmp_path / "pub"
    root.mkdir()
    shutil.copytree(version, root / version.name)
    (root / ("current" if linked else "latest")).write_bytes(b"\xff\xfe")
    if linked:
        os.symlink("current", root / "latest")
    before = tree_digest(root)
    with pytest.raises(BundleError) as info:
        read_dir(root)
    assert str(info.value) == f"{root / 'latest'}: the latest pointer holds an unsafe name '\ufffd\ufffd'"
    assert tree_digest(root) == before
