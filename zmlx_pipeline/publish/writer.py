"""Writing a bundle atomically: a temp directory inside DIR, fsynced, renamed to its version, then `latest` swapped.

    DIR/
      20260101T120000Z-1a2b3c4d/   one directory per published version (never changed afterwards)
        manifest.json               schema, created, pipeline version, model id, data fingerprint, sha256 of every file
        kernels.json profiles.json tables.json autotune_v3.json devices/<hash>.json
      latest                        the name of the newest version (a small file, replaced with os.replace)

A reader following `latest` sees either the previous complete version or the new complete one.

`publish` writes plain JSON (schema 4: table entries with named fields; ZMLX's autotune_v3.json usable
as it is). `rewrite_bundle` turns a bundle into its compact form (schema 5: every file but the manifest
gzip-compressed as NAME.gz, 6.2x smaller for the default bundle) or back; the package's default bundle
ships compact. An older bundle keeps its content and so its schema's pair (2 plain, 3 compact).
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import shutil
import stat
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from zmlx_pipeline import __version__
from zmlx_pipeline.core.commits import commit_point
from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.core.files import current_umask, fsync_dir, write_text_atomic
from zmlx_pipeline.runtime.bundle import (
    BUNDLE_SCHEMA,
    BUNDLE_SCHEMA_VERSION,
    COMPACT_OF,
    COMPRESSED_SUFFIX,
    LATEST,
    MANIFEST,
    MAX_POINTER_BYTES,
    holds_bundle,
)

#: manifest fields make_manifest writes itself; the rest are the publisher's and survive a rewrite
OWN_FIELDS = ("schema", "schema_version", "bundle_id", "content_sha256", "files")


class PublishError(ZmlxPipelineError, OSError):
    "The bundle could not be written"


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def encode(obj: Any) -> bytes:
    """Canonical bundle JSON: sorted keys, compact, UTF-8, newline at the end."""
    return (json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n").encode()


def compress(blob: bytes) -> bytes:
    """gzip at level 9 with no timestamp in the header, so the same content always gives the same bytes and hash."""
    return gzip.compress(blob, compresslevel=9, mtime=0)


def stored_blobs(blobs: Mapping[str, bytes], compact: bool) -> dict[str, bytes]:
    """The files as a bundle stores them: as they are, or each gzip-compressed under NAME.gz."""
    if not compact:
        return dict(blobs)
    return {name + COMPRESSED_SUFFIX: compress(blob) for name, blob in blobs.items()}


def make_manifest(blobs: Mapping[str, bytes], fields: Mapping[str, Any], created: datetime,
                  schema_version: int = BUNDLE_SCHEMA_VERSION, unpacked: Mapping[str, int] | None = None) -> dict:
    """The manifest of stored `blobs`; `unpacked` gives a compressed file's size once inflated (`unpacked_bytes`,
    the most a reader inflates it to, so a damaged or hostile file cannot make it inflate more)."""
    files = {name: {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)} for name, blob in sorted(blobs.items())}
    for name, size in (unpacked or {}).items():
        files[name]["unpacked_bytes"] = size
    content = hashlib.sha256("".join(f"{n}:{e['sha256']}" for n, e in files.items()).encode()).hexdigest()
    return {
        "schema": BUNDLE_SCHEMA,
        "schema_version": schema_version,
        "bundle_id": f"{created.strftime('%Y%m%dT%H%M%SZ')}-{content[:8]}",
        "created": created.isoformat().replace("+00:00", "Z"),
        "pipeline_version": __version__,
        "content_sha256": content,
        **fields,
        "files": files,
    }


def write_files(directory: Path, blobs: Mapping[str, bytes], manifest: dict) -> None:
    """Write every file and the manifest (last) into `directory`, each fsynced."""
    for name, blob in blobs.items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob)
        _fsync_file(target)
    for sub in {(directory / n).parent for n in blobs}:
        fsync_dir(sub)
    (directory / MANIFEST).write_bytes(encode(manifest))
    _fsync_file(directory / MANIFEST)
    fsync_dir(directory)


def _check_links(root: Path) -> None:
    """Refuse a publish path through a symlink that leads nowhere (a loop, or a link to nothing): creating the
    directory would fail with a bare "File exists"."""
    for p in (root, *root.parents):
        if not p.is_symlink():
            continue
        try:
            p.stat()
        except OSError as exc:
            what = ("a symlink loop" if exc.errno == errno.ELOOP
                    else f"a symlink to {os.readlink(p)}, which does not exist")
            raise PublishError(f"cannot publish to {root}: {p} is {what}; fix or remove the link, or choose another "
                               "--to") from None


def _is_version(root: Path, name: str) -> bool:
    """Whether `name` in `root` is a bundle version: a real directory (not a symlink, whatever it leads to) holding
    a bundle's manifest. A folder merely named like one, or a link of that name, is not."""
    try:
        if not stat.S_ISDIR(os.lstat(root / name).st_mode):
            return False
        if not stat.S_ISREG(os.lstat(root / name / MANIFEST).st_mode):
            return False
        manifest = json.loads((root / name / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return False
    # what make_manifest always writes (a publisher's fields may name another schema)
    return isinstance(manifest, dict) and all(key in manifest for key in ("bundle_id", "files", "content_sha256"))


def _foreign_entry(root: Path) -> str | None:
    """The first name (sorted) in an existing publish directory that is neither `latest`, nor a version directory
    (a real directory, not a link, holding a bundle's manifest), nor a dot-file (a write in progress, an editor's or
    a VCS's file); None when there is none: the directory is empty or an earlier publish's."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PublishError(f"cannot publish to {root}: cannot list it ({exc.strerror or exc}); choose another "
                           "--to") from None
    for entry in entries:
        if entry.name.startswith(".") or entry.name == LATEST:  # `latest` is checked before this
            continue
        if not _is_version(root, entry.name):
            return entry.name
    return None


#: the most a `latest` pointer may hold, as the runtime reads one (swap_latest writes a version's name and a newline)
_MAX_LATEST_BYTES = MAX_POINTER_BYTES


class _LatestProblem(NamedTuple):
    """Why an existing `latest` is not an earlier publish's pointer: `why`, in a refusal's words after "its latest";
    `link`: it is a symbolic link (removing it keeps what it names)."""

    why: str
    link: bool = False


def _latest_problem(root: Path) -> _LatestProblem | None:
    """Why an existing `latest` in `root` is not an earlier publish's pointer (None: it is, or there is none): it
    must be a regular file holding the name of a version directory there, as swap_latest writes it, or a symbolic
    link the runtime follows to a bundle (which the new pointer file replaces)."""
    latest = root / LATEST
    try:
        st = os.lstat(latest)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _LatestProblem(f"cannot be read ({exc.strerror or exc})")
    if stat.S_ISLNK(st.st_mode):
        return _link_problem(latest)
    if not stat.S_ISREG(st.st_mode):
        return _LatestProblem("is not a file (the pointer to the newest bundle)")
    if st.st_size > _MAX_LATEST_BYTES:
        return _LatestProblem("is not a publish's pointer to the newest bundle (it is too long to name a bundle "
                              "version)")
    try:
        with open(latest, "rb") as fh:
            text = fh.read(_MAX_LATEST_BYTES + 1).decode("utf-8")
    except UnicodeDecodeError:
        text = None
    except OSError as exc:
        return _LatestProblem(f"cannot be read ({exc.strerror or exc})")
    name = (text or "").strip()
    if (text is None or not name or "/" in name or "\\" in name or name.startswith(".")
            or not _is_version(root, name)):
        return _LatestProblem("does not name a bundle version in the directory, so it is not an earlier publish's "
                              "pointer")
    return None


#: where a `latest` link that names no bundle leads (LatestLinkError.leads), in a refusal's words
_LEADS = {"nowhere": "which does not exist", "unfollowable": "which cannot be followed"}


def _link_problem(latest: Path) -> _LatestProblem | None:
    """Why a `latest` that is a symbolic link cannot be replaced by a publish's pointer file (None: it leads to a
    bundle, as the runtime follows it, so the new pointer loses nothing): it leads nowhere or to no bundle, as
    linked_latest finds it."""
    from zmlx_pipeline.runtime.bundle import LatestLinkError, linked_latest

    try:
        linked_latest(latest)
        return None
    except LatestLinkError as exc:
        link, leads = exc.link, exc.leads
    if link is None:
        return _LatestProblem("is a symbolic link that changed while it was read", link=True)
    return _LatestProblem(f"is a symbolic link to {link!r}, {_LEADS.get(leads, 'which leads to no bundle')}",
                          link=True)


def _latest_link(directory: str | os.PathLike) -> str | None:
    """What a publish directory's `latest` links to when it is a symbolic link (publish replaces it with the pointer
    file, leaving what it leads to as it was); None when it is no link."""
    try:
        return os.readlink(Path(directory) / LATEST)
    except OSError:
        return None


def check_publish_dir(directory: str | os.PathLike, contents: bool = True) -> None:
    """Refuse a publish directory that cannot be written (a file or a broken link on its path, no permission) or
    that is a published bundle or lies inside one (its new versions would never be read), before any work.

    `contents` (a directory to publish versions into): it must also be missing, empty, or an earlier publish's
    (`latest` and version directories only, dot-files aside); one holding other files (data/ with its shards, the
    store's directory, models/, a link to /etc) is refused, so a bundle and `latest` never land among them.
    `contents=False` checks only where a bundle replaces a directory of its own (versioned=False)."""
    if not str(directory).strip():
        raise PublishError("cannot publish to '': name the directory to publish into with --to")
    root = Path(directory)
    _check_links(root)
    if holds_bundle(root):  # a reader of root takes its manifest, never `latest`
        raise PublishError(f"cannot publish to {root}: it is a published bundle (it holds {MANIFEST}), not a "
                           f"directory to publish into; pass its parent ({root.parent}), the directory whose "
                           f"{LATEST} names the newest bundle, or a new directory")
    if (root / MANIFEST).exists():
        raise PublishError(f"cannot publish to {root}: it holds a {MANIFEST} that is no bundle's, which a reader of "
                           f"the directory would take for its bundle's and never follow {LATEST}; choose another --to")
    inside = next((p for p in root.parents if holds_bundle(p)), None)
    if inside is not None:
        raise PublishError(f"cannot publish to {root}: it is inside the published bundle {inside}; pass the "
                           f"directory that holds that bundle ({inside.parent}) or a new directory")
    blocker = next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise PublishError(f"cannot publish to {root}: {blocker} is a file, not a directory; choose another --to")
    if contents:
        problem = _latest_problem(root)
    else:  # the bundle replaces root whole: its `latest` is removed with it, never written through
        latest = root / LATEST
        problem = (_LatestProblem("is not a file (the pointer to the newest bundle)")
                   if latest.exists() and not latest.is_file() else None)
    if problem is not None and problem.link:
        raise PublishError(f"cannot publish to {root}: its {LATEST} {problem.why}; remove the link (publish then writes "
                           f"{LATEST} as the pointer file to the new bundle; what the link names is kept) or choose "
                           "another --to")
    if problem is not None:
        raise PublishError(f"cannot publish to {root}: its {LATEST} {problem.why}; remove it or choose another --to")
    foreign = _foreign_entry(root) if contents else None
    if foreign is not None:
        raise PublishError(f"cannot publish to {root}: it holds other files (e.g. {foreign}); publish into a new or "
                           "empty directory, or an earlier publish's (its latest and bundle versions only)")
    existing = next(p for p in (root, *root.parents) if p.exists())
    try:
        existing.joinpath(".zmlx-write-probe").mkdir()
        existing.joinpath(".zmlx-write-probe").rmdir()
    except FileExistsError:
        pass
    except OSError as exc:
        raise PublishError(f"cannot publish to {root}: {existing} is not writable ({exc.strerror or exc}); "
                           "choose another --to") from None


def swap_latest(to_dir: Path, name: str) -> str | None:
    """Point `latest` at a version: the pointer file replaced atomically, readable by the bundle's readers. This is
    the publish's commit point: once done, the bundle is published (a stop then no longer hides it). A `latest` that
    is a symbolic link is replaced by the pointer file (renamed over the link, never written through it); returns
    what the link named, else None."""
    link = _latest_link(to_dir)
    with commit_point():
        write_text_atomic(to_dir / LATEST, name + "\n", mode=0o666 & ~current_umask())
    fsync_dir(to_dir)
    return link


def write_bundle(to_dir: str | os.PathLike, files: Mapping[str, Any], fields: Mapping[str, Any],
                 created: datetime | None = None, versioned: bool = True, compact: bool = False,
                 verify: bool = False, replaced: list[str] | None = None) -> tuple[dict, Path]:
    """Publish JSON files as a new version under `to_dir` (atomic, then `latest`); returns (manifest, path).

    `versioned=False` replaces `to_dir` itself with the bundle (for the package's default bundle);
    `compact=True` stores every file gzip-compressed (schema 5); `verify`: see verify_written; `replaced` gets what
    a `latest` that was a symbolic link named, when the pointer file replaced it.
    """
    blobs = {name: encode(obj) for name, obj in files.items()}
    return write_blobs(to_dir, blobs, fields, created=created, versioned=versioned, compact=compact, verify=verify,
                       replaced=replaced)


def verify_written(directory: Path, to_dir: Path, own_builtins: bool = False) -> None:
    """Read a bundle just written, before it is committed, as the runtime reads it (hashes, index files, every device
    table): PublishError in one line naming what it would refuse, so `latest` never moves to a bundle no lookup can
    use. `own_builtins`: it is to be the package's default bundle, whose registered kernels are the built-in ones."""
    from zmlx_pipeline.runtime.bundle import BundleError, check_tables, read_dir, registered_kernels

    try:
        # the default bundle is read against its own built-in kernels, as the runtime reads it once shipped
        builtin = registered_kernels(directory) if own_builtins else None
        check_tables(read_dir(directory, source="the new bundle", builtin=builtin))
    except (BundleError, OSError) as exc:
        raise PublishError(f"cannot publish to {to_dir}: {exc}; the runtime would refuse it, so nothing was "
                           "published (what was there is unchanged)") from None


def rewrite_bundle(src: str | os.PathLike, dest: str | os.PathLike, compact: bool = True) -> tuple[dict, Path]:
    """A bundle (directory or publish root) written again, verified first, as a compact or a plain-JSON bundle
    that replaces `dest` (which may be `src` itself); the content, creation time and publisher's fields are kept.
    Returns (manifest, path)."""
    from zmlx_pipeline.runtime.bundle import read_dir

    bundle = read_dir(src)
    content = bundle.content_schema
    if content not in COMPACT_OF:
        # the content keeps its schema: schema 1 has no compact form, and calling it newer would make lookups trust it
        raise PublishError(f"cannot rewrite {src}: bundle schema {bundle.schema_version} predates schema "
                           f"{min(COMPACT_OF)}; publish it again")
    blobs = {name: bundle.data(name) for name in bundle.logical_names()}
    fields = {k: v for k, v in bundle.manifest.items() if k not in OWN_FIELDS}
    created = datetime.fromisoformat(str(bundle.manifest["created"]).replace("Z", "+00:00"))
    return write_blobs(dest, blobs, fields, created=created, versioned=False, compact=compact, content_schema=content)


def _remove_empty(made: list[Path]) -> None:
    """Remove the directories a refused publish created (deepest first), each only while it is still empty."""
    for directory in made:
        try:
            directory.rmdir()
        except OSError:
            return


def _keep_replaced_link(replaced: list[str] | None, link: str | None) -> None:
    """Keep what a replaced `latest` link named, for the caller that asked (write_bundle's `replaced`)."""
    if replaced is not None and link is not None:
        replaced.append(link)


def write_blobs(to_dir: str | os.PathLike, blobs: Mapping[str, bytes], fields: Mapping[str, Any],
                created: datetime | None = None, versioned: bool = True, compact: bool = False,
                content_schema: int = BUNDLE_SCHEMA_VERSION, verify: bool = False,
                replaced: list[str] | None = None) -> tuple[dict, Path]:
    """write_bundle for files already encoded: `blobs` maps each file's name to its JSON bytes, in the layout of
    plain schema `content_schema` (an older bundle rewritten keeps its own). `verify`: the files written are read
    back with the runtime's checks (verify_written) before anything is replaced or `latest` moves. `replaced`: see
    write_bundle."""
    created = created or datetime.now(timezone.utc).replace(microsecond=0)
    unpacked = {name + COMPRESSED_SUFFIX: len(blob) for name, blob in blobs.items()} if compact else None
    blobs = stored_blobs(blobs, compact)
    manifest = make_manifest(blobs, fields, created, COMPACT_OF[content_schema] if compact else content_schema,
                             unpacked)
    root = Path(to_dir)
    parent = root if versioned else root.parent
    made = [d for d in (parent, *parent.parents) if not os.path.lexists(d)]  # removed again if the bundle is refused
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".publish-", dir=parent))
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it private; a bundle is for others to read
    except OSError as exc:
        raise PublishError(f"cannot write a bundle under {parent}: {exc.strerror or exc}") from None
    try:
        write_files(tmp, blobs, manifest)
        if verify:
            verify_written(tmp, root, own_builtins=not versioned)
        if not versioned:
            old = None
            if root.exists():
                old = parent / f".old-{root.name}-{os.getpid()}"
                os.replace(root, old)
            os.replace(tmp, root)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            fsync_dir(parent)
            return manifest, root
        # checked again at the commit: a file put into the directory since the check before the build (which
        # took minutes) must not get a `latest` beside it either
        check_publish_dir(root)
        name = manifest["bundle_id"]
        final = root / name
        if final.exists():
            if (final / MANIFEST).is_file() and json.loads((final / MANIFEST).read_text())["files"] == manifest["files"]:
                shutil.rmtree(tmp, ignore_errors=True)
                _keep_replaced_link(replaced, swap_latest(root, name))
                manifest = json.loads((final / MANIFEST).read_text())
                return manifest, final
            n = 2
            while (root / f"{name}.{n}").exists():
                n += 1
            final = root / f"{name}.{n}"
        os.rename(tmp, final)
        try:
            fsync_dir(root)
            _keep_replaced_link(replaced, swap_latest(root, final.name))
        except OSError:  # `latest` still names the previous version: the new one would be an orphan
            shutil.rmtree(final, ignore_errors=True)
            raise
        return manifest, final
    except PublishError:  # already one line naming root (the directory changed since the check, a refused bundle)
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(made)
        raise
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PublishError(f"cannot publish to {root}: {exc.strerror or exc}") from None
    except BaseException:  # a stop (Ctrl-C, SIGTERM) while writing: no half-written temp directory stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
