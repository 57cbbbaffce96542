"""Bundle files on disk: readable by others as ordinary files are, path problems refused before any work."""

from __future__ import annotations

import os
import stat
import time
import warnings
from pathlib import Path

import pytest

from zmlx_pipeline.data.store import Store
from zmlx_pipeline.publish import PublishError, publish
from zmlx_pipeline.publish.writer import check_publish_dir, write_bundle
from zmlx_pipeline.runtime import bundle as bundle_mod


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask():
    """Set the process umask for one test and put the old one back."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda mask: os.umask(mask)
    os.umask(old)


@pytest.mark.parametrize("mask,file_mode,dir_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775), (0o077, 0o600, 0o700)])
def test_bundle_files_and_latest_pointer_follow_the_umask(umask, tmp_path, mask, file_mode, dir_mode):
    umask(mask)
    manifest, path = write_bundle(tmp_path / "pub", {"kernels.json": {"a": 1}}, {"schema": "x"})
    assert _mode(tmp_path / "pub" / "latest") == file_mode  # was 0600 whatever the umask
    assert _mode(path) == dir_mode
    assert _mode(path / "kernels.json") == file_mode and _mode(path / "manifest.json") == file_mode


def test_a_publish_path_under_a_regular_file_is_refused_at_once(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(PublishError, match=r"f is a file, not a directory; choose another --to"):
        check_publish_dir(tmp_path / "f" / "bundles")
    with Store(tmp_path / "empty.duckdb") as store:  # the path check comes before anything is read or built
        started = time.perf_counter()
        with pytest.raises(PublishError, match="is a file, not a directory"):
            publish(store, tmp_path / "f" / "bundles")
        assert time.perf_counter() - started < 5


def test_an_unwritable_publish_directory_is_refused_before_building(tmp_path, monkeypatch):
    target = tmp_path / "ro"
    target.mkdir()
    real_mkdir = Path.mkdir

    def refuse(self, *args, **kwargs):
        if self.parent == target:
            raise PermissionError(13, "Permission denied")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(PublishError, match=r"ro is not writable \(Permission denied\); choose another --to"):
        check_publish_dir(target / "sub")


def test_a_bundle_the_process_cannot_read_is_refused_with_one_warning(toy_bundle, tmp_path, monkeypatch, fresh_runtime):
    _, publish_dir = toy_bundle
    before = bundle_mod.load_bundle(publish_dir)
    real_read = Path.read_bytes

    def unreadable(self):
        if self.name == "manifest.json":
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = bundle_mod.load_bundle(publish_dir)
    assert len(caught) == 1 and "Permission denied" in str(caught[0].message)
    assert kept is not None and kept.bundle_id == before.bundle_id  # the one in use keeps answering
    with pytest.raises(bundle_mod.BundleError, match="Permission denied"):
        bundle_mod.load_bundle(publish_dir, strict=True)


def test_an_unreadable_latest_pointer_is_a_bundle_error_not_a_traceback(tmp_path, monkeypatch):
    write_bundle(tmp_path / "pub", {"kernels.json": {"a": 1}}, {"schema": "x"})
    real_read = bundle_mod.read_regular

    def unreadable(path, limit):
        if Path(path).name == "latest":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path, limit)

    monkeypatch.setattr(bundle_mod, "read_regular", unreadable)
    with pytest.raises(bundle_mod.BundleError, match=r"latest: cannot read the latest pointer \(Permission denied\)$"):
        bundle_mod.read_dir(tmp_path / "pub")


def test_a_compact_write_stores_gzip_files_under_their_names_dot_gz_reproducibly(tmp_path):
    import gzip
    import json

    files = {"kernels.json": {"kernels": {}}, "profiles.json": {"devices": {}},
             "tables.json": {"devices": {"nvidia-h200": "devices/a.json"}}, "devices/a.json": {"kernels": {}}}
    first, path = write_bundle(tmp_path / "one", files, {}, versioned=False, compact=True)
    second, _ = write_bundle(tmp_path / "two", files, {}, versioned=False, compact=True)
    plain, _ = write_bundle(tmp_path / "plain", files, {}, versioned=False)
    assert first["schema_version"] == 5 and plain["schema_version"] == 4
    assert sorted(first["files"]) == sorted(n + ".gz" for n in files)
    assert json.loads(gzip.decompress((path / "devices/a.json.gz").read_bytes())) == {"kernels": {}}
    assert first["files"] == second["files"] != plain["files"]  # no timestamp in the gzip header
    loaded = bundle_mod.read_dir(path)
    assert loaded.tables == {"nvidia-h200": "devices/a.json"} and loaded.json("devices/a.json") == {"kernels": {}}


def test_a_latest_pointer_that_cannot_be_replaced_leaves_no_orphan_version(tmp_path, monkeypatch):
    from zmlx_pipeline.publish import writer

    first, path = write_bundle(tmp_path / "pub", {"kernels.json": {"a": 1}}, {"schema": "x"})
    before = sorted(p.name for p in (tmp_path / "pub").iterdir())

    def immutable(to_dir, name):  # what chattr +i on `latest` does to os.replace
        raise PermissionError(1, "Operation not permitted", str(to_dir / "latest"))

    monkeypatch.setattr(writer, "swap_latest", immutable)
    with pytest.raises(PublishError, match=r"^cannot publish to .*pub: Operation not permitted$"):
        write_bundle(tmp_path / "pub", {"kernels.json": {"a": 2}}, {"schema": "x"})
    assert sorted(p.name for p in (tmp_path / "pub").iterdir()) == before  # no new version, no temp directory
    assert (tmp_path / "pub" / "latest").read_text().strip() == path.name


def test_a_bundle_or_a_directory_inside_one_is_refused_as_a_publish_directory(tmp_path):
    manifest, version = write_bundle(tmp_path / "pub", {"kernels.json": {"a": 1}}, {})
    with pytest.raises(PublishError, match=f"cannot publish to {version}: it is a published bundle \\(it holds "
                                           f"manifest.json\\), not a directory to publish into; pass its parent "
                                           f"\\({tmp_path / 'pub'}\\)"):
        check_publish_dir(version)
    with pytest.raises(PublishError, match=f"it is inside the published bundle {version}; pass the directory that "
                                           f"holds that bundle \\({tmp_path / 'pub'}\\)"):
        check_publish_dir(version / "sub" / "deeper")
    check_publish_dir(tmp_path / "pub")  # the publish directory itself takes new versions
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "manifest.json").write_text('{"name": "a web app"}')  # another tool's manifest, above
    check_publish_dir(tmp_path / "site" / "bundles")
    with pytest.raises(PublishError, match="it holds a manifest.json that is no bundle's, which a reader of the "
                                           "directory would take for its bundle's"):
        check_publish_dir(tmp_path / "site")  # there, the new bundles' latest would never be read


def test_a_publish_path_through_a_broken_link_says_which_link(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    with pytest.raises(PublishError, match=f"{tmp_path / 'a'} is a symlink loop; fix or remove the link"):
        check_publish_dir(tmp_path / "a" / "bundles")
    with pytest.raises(PublishError, match=f"{tmp_path / 'gone'} is a symlink to {tmp_path / 'nowhere'}, which does "
                                           "not exist"):
        check_publish_dir(tmp_path / "gone")


@pytest.mark.parametrize("kind", ["data", "store", "models", "link to a full folder"])
def test_a_folder_of_other_files_is_refused_as_a_publish_directory(tmp_path, kind):
    """A bundle and `latest` never land among other files: data/ with its shards, the store's folder, models/, a
    link to a folder such as /etc; refused before any work, nothing written there."""
    folder = tmp_path / "folder"
    folder.mkdir()
    first = {"data": "a.parquet", "store": "models", "models": "rmsnorm-1.zmodel", "link to a full folder": "hosts"}[kind]
    files = {"data": ["a.parquet", "b.parquet"], "store": ["store.duckdb"], "models": ["rmsnorm-1.zmodel"],
             "link to a full folder": ["hosts", "passwd"]}[kind]
    for name in files:
        (folder / name).write_text("x")
    if kind == "store":
        (folder / "models").mkdir()
    target = folder
    if kind == "link to a full folder":
        target = tmp_path / "link"
        target.symlink_to(folder)
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(PublishError) as refused:
        check_publish_dir(target)
    assert str(refused.value) == (f"cannot publish to {target}: it holds other files (e.g. {first}); publish into a "
                                  "new or empty directory, or an earlier publish's (its latest and bundle versions "
                                  "only)")
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_missing_empty_or_earlier_publish_directory_takes_a_bundle(tmp_path):
    """What publish --to and run --bundle-dir take: a missing directory, an empty one (dot-files aside), and one an
    earlier publish wrote (its `latest` and versions, a second run's), also with a leftover temp directory; and a
    versioned=False bundle (the package's default) replaces its own folder among its parent's files."""
    check_publish_dir(tmp_path / "new" / "bundles")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".gitkeep").write_text("")
    check_publish_dir(tmp_path / "empty")
    write_bundle(tmp_path / "pub", {"kernels.json": {"a": 1}}, {"schema": "x"})
    write_bundle(tmp_path / "pub", {"kernels.json": {"a": 2}}, {"schema": "x"})
    (tmp_path / "pub" / ".publish-abc123").mkdir()
    check_publish_dir(tmp_path / "pub")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "module.py").write_text("")
    check_publish_dir(tmp_path / "pkg", contents=False)
    write_bundle(tmp_path / "pkg" / "default_bundle", {"kernels.json": {"a": 1}}, {"schema": "x"}, versioned=False)
    assert (tmp_path / "pkg" / "module.py").exists()


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("kind", ["notes", "link", "names nothing", "names a plain folder"])
def test_a_latest_that_is_no_earlier_publish_pointer_is_refused_and_kept(tmp_path, kind):
    """A user's file named `latest` (their notes, a link to no bundle, a name of no bundle version there) is never
    replaced: only the pointer swap_latest writes, naming a version directory that exists, is an earlier publish's
    (or a link the runtime follows to a bundle: tests/pipeline/test_cli_publish_linked_latest.py)."""
    pub = tmp_path / "pub"
    pub.mkdir()
    latest = pub / "latest"
    if kind == "notes":
        latest.write_text("my notes\n")
    elif kind == "link":
        (tmp_path / "elsewhere.txt").write_text("precious\n")
        latest.symlink_to(tmp_path / "elsewhere.txt")
    elif kind == "names nothing":
        latest.write_text("20260101T000000Z-deadbeef\n")
    else:
        (pub / "20260101T000000Z-deadbeef").mkdir()
        latest.write_text("20260101T000000Z-deadbeef\n")
    why = {"notes": "does not name a bundle version in the directory, so it is not an earlier publish's pointer",
           "link": f"is a symbolic link to {str(tmp_path / 'elsewhere.txt')!r}, which leads to no bundle",
           "names nothing": "does not name a bundle version in the directory, so it is not an earlier publish's "
                            "pointer",
           "names a plain folder": "does not name a bundle version in the directory, so it is not an earlier "
                                   "publish's pointer"}[kind]
    before = _tree(tmp_path)
    with pytest.raises(PublishError) as refused:
        check_publish_dir(pub)
    todo = ("remove the link (publish then writes latest as the pointer file to the new bundle; what the link names "
            "is kept)" if kind == "link" else "remove it")
    assert str(refused.value) == f"cannot publish to {pub}: its latest {why}; {todo} or choose another --to"
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("kind", ["plain folder", "link to a folder", "link to a bundle"])
def test_a_version_named_entry_that_is_no_bundle_version_is_refused(tmp_path, kind):
    """An entry named like a version counts as one only as a real directory (not a link) holding a bundle's
    manifest: a plain folder of that name, or a link of that name to an outside folder, is another file."""
    pub = tmp_path / "pub"
    pub.mkdir()
    name = "20260101T000000Z-deadbeef"
    if kind == "plain folder":
        (pub / name).mkdir()
        (pub / name / "mydata.txt").write_text("mine\n")
    elif kind == "link to a folder":
        (tmp_path / "outside").mkdir()
        (tmp_path / "outside" / "mydata.txt").write_text("mine\n")
        (pub / name).symlink_to(tmp_path / "outside")
    else:
        _, version = write_bundle(tmp_path / "other", {"kernels.json": {"a": 1}}, {})
        (pub / name).symlink_to(version)
    before = _tree(tmp_path)
    with pytest.raises(PublishError) as refused:
        check_publish_dir(pub)
    assert str(refused.value) == (f"cannot publish to {pub}: it holds other files (e.g. {name}); publish into a new "
                                  "or empty directory, or an earlier publish's (its latest and bundle versions only)")
    assert _tree(tmp_path) == before


def test_a_file_put_into_the_publish_directory_during_the_build_stops_the_commit(tmp_path):
    """The directory is checked before the build and again at the commit: a user's file added in between gets no
    bundle and no `latest` beside it, and the earlier publish stays as it was."""
    root = tmp_path / "pub"
    _, first = write_bundle(root, {"kernels.json": {"a": 1}}, {"schema": "x"})
    check_publish_dir(root)  # what publish runs before its build
    (root / "notes.txt").write_text("mine")  # then, during the build
    before = sorted(p.name for p in root.iterdir()), (root / "latest").read_text()
    with pytest.raises(PublishError, match="holds other files .*notes.txt"):
        write_bundle(root, {"kernels.json": {"a": 2}}, {"schema": "x"})
    assert (sorted(p.name for p in root.iterdir()), (root / "latest").read_text()) == before
    assert (root / "latest").read_text().strip() == first.name
