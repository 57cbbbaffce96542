"""A publish directory whose `latest` is a symbolic link (made by a user or a deployment tool, not by publish): the
link is followed to a bundle directory, its manifest.json or a pointer file; one that leads nowhere is refused in
one line naming the link, never reported as no pointer at all."""

import os
import shutil
import sys
from pathlib import Path

import pytest

from bundle_fixtures import latest_dir
from zmlx_pipeline.runtime import BundleError, BundleWarning, active_bundle, load_bundle
from zmlx_pipeline.runtime.bundle import read_dir


@pytest.fixture
def publish_copy(toy_bundle, tmp_path) -> tuple[Path, Path]:
    """(a publish directory with no `latest` yet, the name of its one bundle version) copied from the toy bundle."""
    version = latest_dir(toy_bundle[1])
    root = tmp_path / "pub"
    root.mkdir()
    shutil.copytree(version, root / version.name)
    return root, root / version.name


def _linked(root: Path, target: str | Path) -> Path:
    os.symlink(target, root / "latest")
    return root


@pytest.mark.parametrize("how", ["relative", "absolute", "to its manifest", "to a pointer file",
                                 "to a bundle elsewhere"])
def test_a_latest_that_is_a_symlink_is_followed(publish_copy, tmp_path, how):
    root, version = publish_copy
    expected = version
    if how == "relative":
        _linked(root, version.name)
    elif how == "absolute":
        _linked(root, version)
    elif how == "to its manifest":
        _linked(root, Path(version.name) / "manifest.json")
    elif how == "to a pointer file":
        (root / ".latest-real").write_text(version.name + "\n")
        _linked(root, ".latest-real")
    else:
        expected = Path(shutil.move(version, tmp_path / "releases" / version.name))
        _linked(root, expected)
    bundle = load_bundle(root, strict=True)
    assert bundle is active_bundle() and bundle.root.resolve() == expected.resolve()
    assert read_dir(root).bundle_id == bundle.bundle_id


@pytest.mark.parametrize("how, message", [
    ("dangling", r"latest is a symbolic link to 'gone', which does not exist: point it at a bundle version"),
    ("a loop", r"latest is a symbolic link to 'latest', which cannot be followed \("),
    ("a directory with no bundle", r"latest links to the directory .*empty, which holds no manifest.json"),
    ("a pointer naming no bundle", r"latest points at 'nothing-here', which holds no manifest.json"),
])
def test_a_latest_symlink_that_leads_to_no_bundle_is_refused_in_one_line(publish_copy, how, message):
    root, _ = publish_copy
    good = load_bundle(publish_copy[1], strict=True)
    if how == "dangling":
        _linked(root, "gone")
    elif how == "a loop":
        _linked(root, "latest")
    elif how == "a directory with no bundle":
        (root / "empty").mkdir()
        _linked(root, "empty")
    else:
        (root / "pointer").write_text("nothing-here\n")
        _linked(root, "pointer")
    with pytest.raises(BundleError, match=message) as info:
        load_bundle(root, strict=True)
    assert "\n" not in str(info.value) and "no latest pointer" not in str(info.value)
    with pytest.warns(BundleWarning, match=f"bundle refused: .*{message}") as caught:
        kept = load_bundle(root)
    assert len(caught) == 1 and kept is good and active_bundle() is good


def test_a_bundle_path_that_is_a_dangling_symlink_says_so(tmp_path):
    os.symlink(tmp_path / "gone", tmp_path / "bundle")
    with pytest.raises(BundleError, match=r"bundle is a symbolic link to '.*gone', which does not exist"):
        read_dir(tmp_path / "bundle")


def test_the_cli_follows_a_symlinked_latest_and_refuses_a_dangling_one_in_one_line(publish_copy, tmp_path):
    from click.testing import CliRunner

    from zmlx_pipeline.pipeline.cli import cli

    root, version = publish_copy
    _linked(root, version.name)
    args = ["lookup", "toy_scale", "--shape", "rows=64,cols=4096", "--dtype", "float16", "--device", "nvidia-h200",
            "--json", "--bundle", str(root)]
    answered = CliRunner().invoke(cli, args)
    assert answered.exit_code == 0, answered.output
    (root / "latest").unlink()
    _linked(root, "gone")
    refused = CliRunner().invoke(cli, args)
    assert refused.exit_code == 1 and refused.stdout == "" and "Traceback" not in refused.output
    (line,) = refused.stderr.splitlines()
    assert line.startswith("Error: ") and "latest is a symbolic link to 'gone', which does not exist" in line


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root reads any file")
def test_a_latest_symlink_to_a_place_this_process_cannot_read_is_refused_in_one_line(publish_copy, tmp_path):
    root, version = publish_copy
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "pointer").write_text(version.name + "\n")
    _linked(root, locked / "pointer")
    (locked / "pointer").chmod(0)
    try:
        with pytest.raises(BundleError, match=r"latest: cannot read .*pointer, the file it links to") as info:
            load_bundle(root, strict=True)
    finally:
        (locked / "pointer").chmod(0o600)
    assert "\n" not in str(info.value)


def test_a_pointer_file_a_latest_symlink_reaches_is_held_to_a_pointers_length(publish_copy):
    """The file a link reaches is read as a `latest` pointer file is: past MAX_POINTER_BYTES it is refused, never
    cut short to the name it begins with."""
    from zmlx_pipeline.runtime.bundle import MAX_POINTER_BYTES

    root, version = publish_copy
    (root / "pointer").write_text(version.name + " " * MAX_POINTER_BYTES + "\n")
    _linked(root, "pointer")
    with pytest.raises(BundleError) as info:
        load_bundle(root, strict=True)
    assert str(info.value) == (f"{root / 'latest'} links to {root / 'pointer'}, which is over {MAX_POINTER_BYTES} "
                               "bytes, longer than a latest pointer (one version directory's name) is: publish "
                               "again, or point it at a bundle version")
    (root / "pointer").write_text(version.name + "\n")
    assert load_bundle(root, strict=True).root == version
