"""Profile bundles: load one from a directory or an http(s) URL, verify every file's sha256, keep it active.

A bundle is a directory (or the same files behind a URL): `manifest.json` names every other file
with its sha256 and size. Nothing is used before every hash matches and the index files hold what
the runtime reads (contents.py; a device's table is checked when it is first parsed). In a compact bundle (schema 5, or
3 for schema 2's content; the form shipped in the package) every file but the manifest is stored
gzip-compressed as `NAME.gz`;
the hashes are of the stored bytes, and a file is decompressed and parsed only when first asked
for, so a lookup for one device never inflates another device's table. A bundle that fails (bad
hash, truncated file, unknown schema, unreachable server) is refused with one warning line and
the bundle already in use keeps serving; with no bundle loaded yet, the one shipped inside the
package (`default_bundle/`) is used. Remote bundles are cached under
`$XDG_CACHE_HOME/zmlx-pipeline/bundles` (default `~/.cache/zmlx-pipeline/bundles`), so a later
fetch that fails falls back to the last verified copy. Each file's fetch ends within FETCH_DEADLINE_S, the whole
bundle's within FETCH_BUNDLE_DEADLINE_S, and each reads no more than its manifest size (a compressed file inflates to at most its `unpacked_bytes` or MAX_FILE_BYTES);
redirects are followed only to http(s) URLs, at most MAX_REDIRECTS.

Standard library only; `urllib` is imported only when a URL is fetched.

Why one long module: loading, verifying, inflating per device and activating a bundle share the
manifest and its hashes; nothing of a bundle is used before all of them are checked here.
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path
from typing import Any, Callable

from zmlx_pipeline.core.errors import shown
from zmlx_pipeline.core.files import url_problem, write_text_atomic
from zmlx_pipeline.core.keys import RepeatedJSONKey, unique_keys
from zmlx_pipeline.runtime.errors import (
    BadArgument,
    BadArgumentType,
    RuntimeAPIError,
    caller_stacklevel,
    home_expanded,
    plain,
)

BUNDLE_SCHEMA = "zmlx-pipeline-bundle"
#: the schema of plain-JSON bundles (what `publish` writes); 2 added extrapolated evidence, its source device
#: and scaled times, the kernels' measured ranges and work terms (publish/build.py), and the chips' fp32 TFLOPs;
#: 4 gave every table entry named fields (lookup.ENTRY_FIELDS) instead of a list read by position
BUNDLE_SCHEMA_VERSION = 4
#: the schema of compact bundles: schema 4's content, every file but the manifest stored as `NAME.gz`
COMPACT_SCHEMA_VERSION = 5
#: plain schema -> its compact form (3 is schema 2's content compressed)
COMPACT_OF = {2: 3, BUNDLE_SCHEMA_VERSION: COMPACT_SCHEMA_VERSION}
#: the schemas whose table entries are lists read by position (lookup.POSITIONAL_FIELDS)
POSITIONAL_SCHEMAS = (1, 2, 3)
#: the newest schema this runtime reads
MAX_SCHEMA_VERSION = COMPACT_SCHEMA_VERSION
#: the suffix of a file stored gzip-compressed in a compact bundle
COMPRESSED_SUFFIX = ".gz"
#: the oldest schema this runtime still reads (lookup.py answers a schema-1 bundle with what it holds)
MIN_SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
LATEST = "latest"
#: files every bundle has besides the manifest (the per-device tables are listed in tables.json)
REQUIRED_FILES = ("kernels.json", "profiles.json", "tables.json")
DEFAULT_BUNDLE_DIR = Path(__file__).with_name("default_bundle")
#: the longest one read from a server may wait, and the longest one file's fetch may take from connecting to its
#: last byte (a server that stalls or trickles is cut off then)
FETCH_TIMEOUT_S = 20.0
FETCH_DEADLINE_S = 60.0
#: a bundle is a few hundred files: without a limit on their sum, a server slow on each could take hours
FETCH_BUNDLE_DEADLINE_S = 300.0
#: a `.fetch-*` temp directory older than this was left by a fetch that died (a full disk, a killed process): the
#: next fetch of that URL removes it (one being written by another process now is younger)
STALE_FETCH_S = 3600.0
#: redirects followed per fetch (only to http(s) URLs); past them the fetch fails asking for the final URL
MAX_REDIRECTS = 10
#: the most bytes read of a listed file whose size the manifest does not give (schema 1 may not), of a fetched
#: manifest and of a fetched `latest` pointer: past it the file is refused, never read to its end
MAX_FILE_BYTES = 1024**3
MAX_MANIFEST_BYTES = 64 * 1024**2
MAX_POINTER_BYTES = 4096
#: most characters of a manifest's bundle_id: publish writes 25, its UTC time, "-" and 8 hex of its content
#: (20260311T101500Z-1a2b3c4d); a longer one (a tampered manifest) would run on over every line that names it
MAX_BUNDLE_ID_CHARS = 64
#: the most bytes inflated at once from a compressed file (its pieces are counted against its unpacked limit)
UNPACK_CHUNK = 4 * 1024**2


class BundleError(RuntimeAPIError):
    "A bundle is missing, unreadable, fails verification, or has a schema this runtime does not know"


class LatestLinkError(BundleError):
    """A `latest` that is a symbolic link names no bundle (linked_latest). `link`: what it names (None: it could not
    be read, so it changed or went while read); `leads`: "nowhere" (what it names does not exist), "unfollowable" (a
    loop, no permission) or "no bundle" (it is followed to anything but a bundle)."""

    def __init__(self, message: str, link: str | None = None, leads: str | None = None):
        super().__init__(message)
        self.link = link
        self.leads = leads


class FetchError(BundleError):
    "A remote bundle could not be downloaded (the server is unreachable or answered with an error)"


class BundleWarning(UserWarning):
    "A bundle was refused (or a remote one could not be fetched) and another one stays in use"


class Bundle:
    """A verified bundle: its manifest, the parsed index files, and the verified bytes of its tables."""

    __slots__ = ("source", "root", "manifest", "kernels", "profiles", "tables", "strict", "stands_in", "_raw",
                 "_parsed")

    def __init__(self, source: str, root: Path, manifest: dict, files: dict[str, bytes]) -> None:
        self.source = source
        self.root = root
        self.manifest = manifest
        self._raw = files
        self._parsed: dict[str, Any] = {}
        self.kernels: dict[str, dict] = self._section("kernels.json", "kernels")
        self.profiles: dict[str, dict] = self._section("profiles.json", "devices")
        self.tables: dict[str, str] = self._section("tables.json", "devices")
        #: loaded with strict=True: a device table that fails its checks raises BundleError, not a warning
        self.strict = False
        #: why this bundle answers in place of the one asked for ($ZMLX_PIPELINE_BUNDLE refused); "" when asked for
        self.stands_in = ""

    def _section(self, name: str, key: str) -> dict:
        value = self.json(name)
        section = value.get(key) if isinstance(value, dict) else None
        if not isinstance(section, dict):
            raise BundleError(f"{plain(self.source)}: malformed index files: {plain(name)} holds no {key!r} object")
        return section

    @property
    def schema_version(self) -> int:
        return int(self.manifest.get("schema_version") or BUNDLE_SCHEMA_VERSION)

    @property
    def compact(self) -> bool:
        """Its files are stored gzip-compressed (schema 3 or 5)."""
        return is_compact(self.schema_version)

    @property
    def content_schema(self) -> int:
        """The plain schema of its content: a compact bundle's uncompressed form (3 holds 2's, 5 holds 4's)."""
        return next((plain for plain, packed in COMPACT_OF.items() if packed == self.schema_version),
                    self.schema_version)

    def stored_name(self, name: str) -> str | None:
        """The file that holds `name`: itself, or in a compact bundle `name.gz`; None if the bundle has neither."""
        return _stored_name(name, self._raw, self.schema_version)

    @property
    def bundle_id(self) -> str:
        return self.manifest.get("bundle_id", "?")

    def logical_names(self) -> list[str]:
        """Every file of the bundle by the name readers ask for (a compact bundle's `NAME.gz` as `NAME`)."""
        compact = self.compact
        return sorted(n[: -len(COMPRESSED_SUFFIX)] if compact and n.endswith(COMPRESSED_SUFFIX) else n
                      for n in self._raw)

    def data(self, name: str) -> bytes:
        """The verified content of a file, decompressed if the bundle stores it compressed."""
        stored = self.stored_name(name)
        if stored is None:
            raise BundleError(f"bundle {plain(self.source)}: no file {name!r} in its manifest")
        return _decompressed(self._raw[stored], stored, name, f"bundle {plain(self.source)}", self.manifest["files"][stored])

    def json(self, name: str) -> Any:
        """A file of the bundle, decompressed and parsed (once, on first use) from its verified bytes."""
        try:
            return self._parsed[name]
        except KeyError:
            pass
        value = self._parsed[name] = parse_json(self.data(name), name, f"bundle {plain(self.source)}")
        return value

    def __repr__(self) -> str:
        return f"Bundle({self.bundle_id!r} from {self.source!r})"


# ------------------------------------------------------------------------------------------
# verification


def _no_constant(name: str) -> Any:
    raise ValueError(f"{plain(name)} is not a JSON number")


def parse_json(raw: bytes, name: str, where: str) -> Any:
    """A bundle file's bytes parsed; BundleError (naming `where` and `name`) for anything that is no JSON the runtime
    reads: a syntax error, NaN or Infinity, a number of thousands of digits, nesting deep enough to exhaust the stack,
    an object naming a key twice (which of its values was meant cannot be told; a publisher never writes one)."""
    import json

    try:
        return json.loads(raw, parse_constant=_no_constant, object_pairs_hook=unique_keys)
    except RepeatedJSONKey as exc:
        raise BundleError(f"{plain(where)}: {plain(name)} names the key {str(exc.args[0])!r:.60} twice in one "
                          "object") from None
    except ValueError as exc:
        raise BundleError(f"{plain(where)}: {plain(name)} is not valid JSON ({plain(exc)})") from None
    except RecursionError:
        raise BundleError(f"{plain(where)}: {plain(name)} is nested too deeply to be a bundle file") from None


def _decompressed(raw: bytes, stored: str, name: str, where: str, entry: Any = None) -> bytes:
    """The content of `name` from the bytes it is stored as (`stored`: itself, or gzip-compressed `name.gz`).

    Inflated a piece at a time and refused once past its manifest `entry`'s `unpacked_bytes` (else MAX_FILE_BYTES),
    so a gzip bomb costs at most that limit, never its whole unpacked size."""
    if stored == name:
        return raw
    import zlib

    declared = entry.get("unpacked_bytes") if isinstance(entry, dict) else None
    limit = declared if type(declared) is int else MAX_FILE_BYTES
    inflater = zlib.decompressobj(wbits=31)  # 31: a gzip header and trailer around the deflate stream
    parts: list[bytes] = []
    size, pending = 0, raw
    try:
        while not inflater.eof:
            part = inflater.decompress(pending, min(UNPACK_CHUNK, limit - size + 1))
            pending = inflater.unconsumed_tail
            if not part and not pending:
                break  # the input ended before the stream did
            size += len(part)
            if size > limit:
                cap = "its manifest's unpacked_bytes" if type(declared) is int else "the most a bundle file may hold"
                raise BundleError(f"{plain(where)}: {plain(stored)} unpacks to more than {limit} bytes "
                                  f"({cap}): a gzip bomb "
                                  "or a damaged file")
            parts.append(part)
    except zlib.error as exc:
        raise BundleError(f"{plain(where)}: {plain(stored)} is not valid gzip ({plain(exc)})") from None
    if not inflater.eof:
        raise BundleError(f"{plain(where)}: {plain(stored)} is not valid gzip (incomplete or truncated stream)")
    return b"".join(parts)


def is_compact(schema_version: int) -> bool:
    """A bundle of this schema stores its files gzip-compressed."""
    return schema_version in COMPACT_OF.values()


def _stored_name(name: str, files: Any, schema_version: int) -> str | None:
    if name in files:
        return name
    if is_compact(schema_version) and name + COMPRESSED_SUFFIX in files:
        return name + COMPRESSED_SUFFIX
    return None


def sha256_hex(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _check_manifest(manifest: Any, source: str) -> dict[str, dict]:
    """The manifest's file table after schema checks; BundleError names what is wrong."""
    if not isinstance(manifest, dict) or manifest.get("schema") != BUNDLE_SCHEMA:
        schema = manifest.get("schema") if isinstance(manifest, dict) else None
        raise BundleError(f"{plain(source)}: not a zmlx-pipeline bundle manifest (schema {schema!r})")
    version = manifest.get("schema_version")
    if type(version) is not int:
        raise BundleError(f"{plain(source)}: manifest has no integer schema_version")
    if version > MAX_SCHEMA_VERSION:
        raise BundleError(f"{plain(source)}: bundle schema {version} is newer than this runtime reads "
                          f"({MAX_SCHEMA_VERSION}); upgrade zmlx-pipeline")
    if version < MIN_SCHEMA_VERSION:
        raise BundleError(f"{plain(source)}: bundle schema {version} is older than this runtime reads "
                          f"({MIN_SCHEMA_VERSION}-{MAX_SCHEMA_VERSION}); publish it again")
    bundle_id = manifest.get("bundle_id")
    if bundle_id is not None and not (isinstance(bundle_id, str) and 0 < len(bundle_id) <= MAX_BUNDLE_ID_CHARS
                                      and bundle_id.isprintable()):
        raise BundleError(f"{plain(source)}: manifest's bundle_id {shown(bundle_id)} is not a bundle id (at most "
                          f"{MAX_BUNDLE_ID_CHARS} printable characters; publish writes its time and 8 hex): publish "
                          "the bundle again")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise BundleError(f"{plain(source)}: manifest lists no files")
    for name, entry in files.items():
        if not _safe_name(name):
            raise BundleError(f"{plain(source)}: manifest names an unsafe path {name!r}")
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise BundleError(f"{plain(source)}: manifest entry for {name!r} has no sha256")
        for field, what in (("bytes", "size"), ("unpacked_bytes", "unpacked size")):
            size = entry.get(field)
            if size is not None and (type(size) is not int or not 0 <= size <= MAX_FILE_BYTES):
                raise BundleError(f"{plain(source)}: manifest entry for {name!r} gives its {what} as {size!r:.40}, "
                                  f"not a whole number of bytes from 0 to {MAX_FILE_BYTES}")
    missing = [f for f in REQUIRED_FILES if _stored_name(f, files, version) is None]
    if missing:
        raise BundleError(f"{plain(source)}: manifest lacks {', '.join(missing)}")
    return files


def _safe_name(name: Any) -> bool:
    """A relative path inside the bundle: no absolute path, no '..', no backslash, no NUL byte or lone surrogate (no
    file can be opened by such a name)."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "\0" in name:
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def _verify(name: str, data: bytes, entry: dict, source: str) -> None:
    size = entry.get("bytes")
    if isinstance(size, int) and len(data) != size:
        raise BundleError(f"{plain(source)}: {plain(name)} is {len(data)} bytes, the manifest says "
                          f"{size} (truncated or altered)")
    if sha256_hex(data) != entry["sha256"]:
        raise BundleError(f"{plain(source)}: sha256 of {plain(name)} does not match the manifest (altered or corrupt)")


def _build(source: str, root: Path, manifest_bytes: bytes, read: Callable[[str, int], bytes],
           builtin: dict[str, dict] | None = None) -> Bundle:
    """Parse and check the manifest, read and verify every file (`read(name, limit)` reads at most `limit` + 1
    bytes: the size the manifest gives it), and parse the index files (`builtin`: as _check_contents takes it)."""
    manifest = parse_json(manifest_bytes, MANIFEST, source)
    files = _check_manifest(manifest, source)
    data: dict[str, bytes] = {}
    for name, entry in files.items():
        size = entry.get("bytes")
        limit = size if isinstance(size, int) and size >= 0 else MAX_FILE_BYTES
        blob = read(name, limit)
        if len(blob) > limit:
            raise BundleError(f"{plain(source)}: {plain(name)} is larger than the {limit} bytes the manifest gives it "
                              "(altered or corrupt)")
        _verify(name, blob, entry, source)
        data[name] = blob
    bundle = Bundle(source, root, manifest, data)
    _check_contents(bundle, builtin)
    return bundle


def _check_contents(bundle: Bundle, builtin: dict[str, dict] | None = None) -> None:
    """Checks beyond the hashes: every table file a device points at is in the manifest, and the index files hold
    what the runtime reads (contents.py; a device's table is checked when it is first parsed). `builtin`: the
    built-in kernels a kernel of the same name must agree with (None: the shipped bundle's, builtin_kernels)."""
    from zmlx_pipeline.runtime.contents import index_problem

    for device, name in bundle.tables.items():
        if not isinstance(name, str) or bundle.stored_name(name) is None:
            raise BundleError(f"{plain(bundle.source)}: device {device!r} points at {name!r:.60}, "
                              "which the manifest does not list")
    problem = index_problem(bundle.kernels, bundle.profiles, builtin_kernels() if builtin is None else builtin,
                            bundle.content_schema)
    if problem:
        raise BundleError(f"{plain(bundle.source)}: malformed index files: {problem}")


def check_tables(bundle: Bundle) -> None:
    """Parse and check every device table now, as a lookup checks one when first asked for it; BundleError for the
    first the runtime cannot use. For a publisher, which must know the whole bundle is usable before `latest` moves."""
    from zmlx_pipeline.runtime.contents import table_problem
    from zmlx_pipeline.runtime.lookup import ENTRY_FIELDS

    positional = ENTRY_FIELDS if bundle.schema_version in POSITIONAL_SCHEMAS else None
    for device, name in sorted(bundle.tables.items()):
        problem = table_problem(bundle.json(name), bundle.kernels, positional)
        if problem:
            raise BundleError(f"{plain(bundle.source)}: malformed table {plain(name)} of {plain(device)}: {problem}")


_BUILTIN: dict[Path, dict[str, dict]] = {}


def builtin_kernels() -> dict[str, dict]:
    """The built-in kernels as the shipped bundle records them (name -> its kernels.json entry, those published from
    a registered spec): a kernel of the same name in any bundle must agree with its dims, parameters and constraints.
    Read once from the shipped manifest and kernels.json alone (its hash checked); empty if they fail."""
    root = DEFAULT_BUNDLE_DIR
    if root not in _BUILTIN:
        try:
            _BUILTIN[root] = registered_kernels(root)
        except (BundleError, OSError):
            _BUILTIN[root] = {}  # the default bundle's own load says what is wrong with it
    return _BUILTIN[root]


def registered_kernels(root: Path) -> dict[str, dict]:
    """The kernels.json entries a bundle directory published from registered specs (name -> entry), read from its
    manifest and kernels.json alone (the hash checked): what a bundle about to be shipped holds as built-in."""
    return {name: meta for name, meta in _shipped_kernels(root).items()
            if type(meta) is dict and meta.get("spec") == "registered"}


def _shipped_kernels(root: Path) -> dict:
    source = "default bundle"
    manifest = parse_json(read_regular(root / MANIFEST, MAX_MANIFEST_BYTES), MANIFEST, source)
    files = _check_manifest(manifest, source)
    stored = _stored_name("kernels.json", files, manifest["schema_version"])
    blob = read_regular(root / stored, files[stored].get("bytes") or MAX_FILE_BYTES)
    _verify(stored, blob, files[stored], source)
    kernels = parse_json(_decompressed(blob, stored, "kernels.json", source, files[stored]), "kernels.json", source)
    kernels = kernels.get("kernels") if type(kernels) is dict else None
    return kernels if type(kernels) is dict else {}


# ------------------------------------------------------------------------------------------
# local directories


def resolve_dir(path: Path) -> Path:
    """The bundle directory a path names: the bundle itself, or a publish root with a `latest` pointer (a symbolic
    link is followed: linked_latest)."""
    if path.is_file() and path.name == MANIFEST:
        return path.parent
    if (path / MANIFEST).is_file():
        return path
    pointer = path / LATEST
    if pointer.is_symlink():
        return linked_latest(pointer)
    if pointer.is_file():
        return _pointed_at(pointer, _pointer_text(pointer), path)
    raise BundleError(f"{plain(path)}: no manifest.json and no latest pointer (not a bundle or a publish directory)")


def _pointer_text(pointer: Path, target: Path | None = None) -> str:
    """The text of a `latest` pointer file (`target`: the file a `latest` that is a symbolic link reaches), read no
    further than a pointer may be long (a version's name is short, so a longer file is no pointer, refused in one
    line naming `pointer` without reading it whole); bytes that are no UTF-8 text are kept as surrogate escapes, which
    name no version and which messages show as \\xNN (plain)."""
    try:
        blob = read_regular(pointer if target is None else target, MAX_POINTER_BYTES)
    except OSError as exc:
        whose = "the latest pointer" if target is None else f"{plain(target)}, the file it links to"
        raise BundleError(f"{plain(pointer)}: cannot read {whose} ({exc.strerror or exc})") from None
    if len(blob) > MAX_POINTER_BYTES:
        linked = "" if target is None else f" links to {plain(target)}, which"
        raise BundleError(f"{plain(pointer)}{linked} is over {MAX_POINTER_BYTES} bytes, longer than a latest pointer "
                          "(one version directory's name) is: publish again, or point it at a bundle version")
    return blob.decode("utf-8", errors="surrogateescape")


def _version_name(text: str) -> str | None:
    """The version directory a `latest` pointer's text names, one safe name (_safe_name) with no '/'; None for any
    other text (bytes that are no text, kept as surrogate escapes, are no safe name). Every reader of a pointer holds
    to it."""
    name = text.strip()
    return name if _safe_name(name) and "/" not in name and "\ufffd" not in name else None


def _pointed_at(pointer: Path, text: str, folder: Path) -> Path:
    """The version directory in `folder` a pointer's text names; BundleError for an unsafe name or no bundle there."""
    name = _version_name(text)
    if name is None:
        raise BundleError(f"{plain(pointer)}: the latest pointer holds an unsafe name '{plain(text.strip())}'")
    target = folder / name
    if (target / MANIFEST).is_file():
        return target
    raise BundleError(f"{plain(pointer)} points at {name!r}, which holds no manifest.json")


def linked_latest(pointer: Path) -> Path:
    """The bundle a `latest` that is a symbolic link names, wherever the link leads: a bundle directory, its
    manifest.json, or a pointer file (its name read beside the file the link reaches). BundleError in one line for
    a link that leads nowhere (dangling, a loop) or to anything else; a LatestLinkError, saying which."""
    try:
        link = os.readlink(pointer)
    except OSError as exc:
        raise LatestLinkError(f"{plain(pointer)}: cannot read the symbolic link ({exc.strerror or exc})") from None
    try:
        target = Path(os.path.realpath(pointer, strict=True))
        mode = os.stat(target).st_mode
    except OSError as exc:
        missing = isinstance(exc, FileNotFoundError)
        why = "which does not exist" if missing else f"which cannot be followed ({exc.strerror or exc})"
        raise LatestLinkError(f"{plain(pointer)} is a symbolic link to {plain(link)!r}, {why}: point it at a bundle "
                              "version directory, or replace it with a pointer file naming one", link,
                              "nowhere" if missing else "unfollowable") from None
    if stat.S_ISDIR(mode):
        if (target / MANIFEST).is_file():
            return target
        raise LatestLinkError(f"{plain(pointer)} links to the directory {plain(target)}, which holds no manifest.json",
                              link, "no bundle")
    if stat.S_ISREG(mode):
        if target.name == MANIFEST:
            return target.parent
        try:
            return _pointed_at(pointer, _pointer_text(pointer, target), target.parent)
        except BundleError as exc:
            raise LatestLinkError(str(exc), link, "no bundle") from None
    raise LatestLinkError(f"{plain(pointer)} links to {plain(target)}, which is neither a bundle directory nor a file",
                          link, "no bundle")


def folder_problem(folder: Path) -> str | None:
    """Why other files cannot be written into `folder`, in a refusal's words: a file on its path ("x is a file, not a
    directory") or a published place (published_problem, "which holds what publish writes alone"); None where neither
    holds. Models, shards and reports check their folder with it before any work."""
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return f"{blocker} is a file, not a directory"
    return published_problem(folder)


def published_problem(path: str | os.PathLike) -> str | None:
    """Why other files cannot be written at `path` (a directory, or the folder of a file to write), in a refusal's
    words: a published place (published_place), "which holds what publish writes alone"; None where it is none."""
    published = published_place(path)
    return None if published is None else f"{published}, which holds what publish writes alone"


def published_place(path: str | os.PathLike) -> str | None:
    """Why other files must not be written at `path` (a directory, or the folder of a file to write): it is a published
    bundle or lies inside one (the bundle would no longer be what its manifest hashed), or it is a publish directory
    whose `latest` names a bundle there, or is a symbolic link the runtime follows to a bundle (every later publish
    would refuse the directory); None where neither holds."""
    root = Path(path)
    inside = next((p for p in (root, *root.parents) if holds_bundle(p)), None)
    if inside is not None:
        return f"{inside} is a published bundle" if inside == root else f"it is inside the published bundle {inside}"
    latest = root / LATEST
    if latest.is_symlink():
        try:
            linked_latest(latest)
        except (BundleError, OSError):
            return None
        return f"{root} is a publish directory (its {LATEST} links to the newest bundle)"
    try:
        name = _version_name(_pointer_text(latest)) if latest.is_file() else None
    except (OSError, BundleError):
        name = None
    if name is not None and holds_bundle(root / name):
        return f"{root} is a publish directory (its {LATEST} names the newest bundle there)"
    return None


def holds_bundle(directory: Path) -> bool:
    """Whether a directory holds a published bundle's manifest (another tool's manifest.json is not one)."""
    import json

    try:
        manifest = json.loads((directory / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("schema") == BUNDLE_SCHEMA


def read_dir(path: str | os.PathLike, source: str | None = None, builtin: dict[str, dict] | None = None) -> Bundle:
    """A verified bundle from a local directory (or publish root); raises BundleError. `builtin`: the built-in
    kernels its kernels must agree with (None: the shipped bundle's; {} for a bundle that is to be the shipped one)."""
    if isinstance(os.fspath(path), str) and url_problem(os.fspath(path)) is not None:
        raise BundleError(url_problem(os.fspath(path), "bundle location") + " (a bundle is read from a local directory "
                          "or an http(s) URL)")
    p = Path(home_expanded(os.fspath(path), "bundle location"))
    try:
        if not p.exists():
            if p.is_symlink():
                raise BundleError(f"{plain(p)} is a symbolic link to {plain(os.readlink(p))!r}, which does not exist "
                                  "or cannot be followed")
            raise BundleError(f"{plain(p)}: no such bundle directory")
        root = resolve_dir(p)
    except OSError as exc:  # a directory or pointer this process may not read
        raise BundleError(f"{plain(p)}: cannot read the bundle ({exc.strerror or exc})") from None

    def read(name: str, limit: int) -> bytes:
        try:
            return read_regular(root / name, limit)
        except OSError as exc:
            raise BundleError(f"{plain(source or root)}: cannot read {plain(name)} ({exc.strerror or exc})") from None

    try:
        manifest_bytes = (root / MANIFEST).read_bytes()  # resolve_dir found it a regular file
    except OSError as exc:
        raise BundleError(f"{plain(root)}: cannot read manifest.json ({exc.strerror or exc})") from None
    return _build(source or str(root), root, manifest_bytes, read, builtin)


def read_regular(path: Path, limit: int) -> bytes:
    """At most `limit` + 1 bytes of a regular file (one byte past the limit tells that it is larger).

    The file is opened without blocking and checked before a byte is read, so a FIFO or a device (a link to
    /dev/zero) is refused at once with an OSError saying what it is, never waited on or read without end."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket or other special file")
        raise OSError(f"it is {what}, not a regular file")
    with os.fdopen(fd, "rb") as fh:
        return fh.read(limit + 1)


# ------------------------------------------------------------------------------------------
# remote bundles


def cache_root() -> Path:
    """Where fetched bundles are kept: $ZMLX_PIPELINE_CACHE, else $XDG_CACHE_HOME or ~/.cache, /zmlx-pipeline/bundles."""
    explicit = os.environ.get("ZMLX_PIPELINE_CACHE")  # empty or blank (only spaces): unset
    if explicit and explicit.strip():
        return Path(home_expanded(explicit, "$ZMLX_PIPELINE_CACHE")) / "bundles"
    base = os.environ.get("XDG_CACHE_HOME")
    base = home_expanded(base, "$XDG_CACHE_HOME") if base and base.strip() else str(Path.home() / ".cache")
    return Path(base) / "zmlx-pipeline" / "bundles"


def _url_dir(url: str) -> Path:
    return cache_root() / sha256_hex(url.rstrip("/").encode())[:16]


def _fetch(url: str, limit: int = MAX_FILE_BYTES, until: float | None = None) -> bytes:
    """The body at `url`, at most `limit` + 1 bytes of it, within FETCH_DEADLINE_S (and before the monotonic time
    `until`, the whole bundle's deadline); FetchError in one line for a server that errs, stalls, trickles past the
    deadline or redirects where we do not follow (see _opener); BundleError for one that announces more than
    `limit` (the manifest's size of the file): it serves another file, which is invalid, not unreachable."""
    import http.client
    import socket
    import threading
    import time
    import urllib.error

    seconds = FETCH_DEADLINE_S
    if until is not None:
        seconds = min(seconds, until - time.monotonic())
        if seconds <= 0:
            raise FetchError(_bundle_too_slow(url))

    sockets: list = []
    expired = threading.Event()

    def cut_off() -> None:  # wakes a read blocked on a trickling server: it then sees the end of the stream
        expired.set()
        for sock in list(sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(seconds, cut_off)
    timer.daemon = True
    timer.start()
    got: list[bytes] = []
    try:
        with _opener(sockets).open(url, timeout=FETCH_TIMEOUT_S) as resp:
            announced = (resp.headers.get("Content-Length") or "").strip()
            if announced.isascii() and announced.isdigit() and int(announced) > limit:
                # the server answered: what it serves is not the bundle's file (a verification error, as a wrong
                # hash is), not an unreachable server, so a strict load never falls back to a cached copy for it
                raise BundleError(f"{plain(url)}: the server announces {int(announced)} bytes, more than the {limit} "
                                  "this file may have")
            size = 0
            while size <= limit:
                part = resp.read1(min(1024**2, limit + 1 - size))
                if not part:
                    break
                got.append(part)
                size += len(part)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            raise FetchError(f"{plain(url)}: HTTP {exc.code}, a redirect not followed "
                             f"({' '.join(str(exc.msg).split())}): "
                             f"redirects are followed only to http(s) URLs, at most {MAX_REDIRECTS}; give the "
                             "bundle's final URL") from None
        raise FetchError(f"{plain(url)}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:  # InvalidURL is the last
        if expired.is_set():
            raise FetchError(_too_slow(url, got, seconds < FETCH_DEADLINE_S)) from None
        reason = getattr(exc, "reason", exc)
        raise FetchError(f"{plain(url)}: cannot fetch ({plain(reason)})") from None
    finally:
        timer.cancel()
    if expired.is_set():
        raise FetchError(_too_slow(url, got, seconds < FETCH_DEADLINE_S))
    return b"".join(got)


def _too_slow(url: str, got: list[bytes], bundle_deadline: bool = False) -> str:
    if bundle_deadline:
        return _bundle_too_slow(url)
    return (f"{plain(url)}: no complete answer within {FETCH_DEADLINE_S:g} s ({sum(map(len, got))} bytes "
            f"received): the "
            "server stalls or sends too slowly")


def _bundle_too_slow(url: str) -> str:
    return (f"{plain(url)}: the bundle's files did not all arrive within {FETCH_BUNDLE_DEADLINE_S:g} s: "
            f"the server sends too "
            "slowly")


def _opener(sockets: list) -> Any:
    """A urllib opener that adds every socket it connects to `sockets` (for the deadline to cut off) and follows at
    most MAX_REDIRECTS redirects, each to an http(s) URL."""
    import http.client
    import urllib.error
    import urllib.request

    def watched(connection: type) -> type:
        class Watched(connection):  # type: ignore[misc, valid-type]
            def connect(self) -> None:
                super().connect()
                sockets.append(self.sock)

        return Watched

    plain = watched(http.client.HTTPConnection)

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(plain, req)

    handlers: list[type] = [Http]
    if hasattr(urllib.request, "HTTPSHandler"):  # Python built with ssl
        secure = watched(http.client.HTTPSConnection)

        class Https(urllib.request.HTTPSHandler):
            def https_open(self, req):
                return self.do_open(secure, req, context=self._context)

        handlers.append(Https)

    class Redirects(urllib.request.HTTPRedirectHandler):
        max_redirections = MAX_REDIRECTS
        inf_msg = f"a redirect loop, or more than {MAX_REDIRECTS} redirects; the last said: "

        def redirect_request(self, req, fp, code, msg, headers, newurl):
            if not is_url(newurl):
                raise urllib.error.HTTPError(newurl, code, f"to {newurl!r:.80}, not an http(s) URL", headers, fp)
            return super().redirect_request(req, fp, code, msg, headers, newurl)

        def http_error_302(self, req, fp, code, msg, headers):
            if "location" not in headers and "uri" not in headers:
                raise urllib.error.HTTPError(req.full_url, code, "it names no Location", headers, fp)
            return super().http_error_302(req, fp, code, msg, headers)

        http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302

    return urllib.request.build_opener(*handlers, Redirects)


def _remote_base(url: str, until: float) -> tuple[str, bytes]:
    """(base URL of the bundle, manifest bytes): the URL itself, or the version its `latest` names."""
    base = url.rstrip("/")
    if base.endswith("/" + MANIFEST):
        base = base[: -len(MANIFEST) - 1]
    try:
        return base, _fetch(base + "/" + MANIFEST, MAX_MANIFEST_BYTES, until)
    except BundleError as first:
        try:
            blob = _fetch(base + "/" + LATEST, MAX_POINTER_BYTES, until)
        except FetchError:  # no pointer there either: the manifest's error says what is missing
            raise first from None
        if len(blob) > MAX_POINTER_BYTES:  # served without a length: refused as a local pointer of that size is
            raise BundleError(f"{plain(base)}/{LATEST} is over {MAX_POINTER_BYTES} bytes, longer than a latest "
                              "pointer (one version directory's name) is: publish again, or point it at a bundle "
                              "version") from None
        text = blob.decode("utf-8", "surrogateescape")
        name = _version_name(text)
        if name is None:
            raise BundleError(f"{plain(base)}/{LATEST} holds an unsafe name '{plain(text.strip())}'") from None
        return base + "/" + name, _fetch(base + "/" + name + "/" + MANIFEST, MAX_MANIFEST_BYTES, until)


def fetch_url(url: str) -> Bundle:
    """Download a bundle, verify it, and keep it in the local cache (atomically); raises BundleError. The whole
    download ends within FETCH_BUNDLE_DEADLINE_S."""
    import time

    until = time.monotonic() + FETCH_BUNDLE_DEADLINE_S
    base, manifest_bytes = _remote_base(url, until)
    fetched: dict[str, bytes] = {}

    def read(name: str, limit: int) -> bytes:
        fetched[name] = _fetch(base + "/" + name, limit, until)
        return fetched[name]

    bundle = _build(url, _url_dir(url), manifest_bytes, read)
    bundle.root = _store_cached(url, bundle, manifest_bytes, fetched)
    return bundle


def _store_cached(url: str, bundle: Bundle, manifest_bytes: bytes, files: dict[str, bytes]) -> Path:
    """Write a verified remote bundle into the cache: a temp dir renamed into place, then `latest` swapped. A temp
    dir that could not be completed is removed, and those of earlier fetches that died are swept first."""
    import shutil
    import tempfile

    top = _url_dir(url)
    # no leading dot: an id of "." or ".." would name the cache's own folder or the one holding every URL's copies
    # (both removed below), and ".fetch-*" a temp dir the next fetch sweeps away
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in bundle.bundle_id).lstrip(".") or "bundle"
    final = top / name
    tmp: Path | None = None
    try:
        top.mkdir(parents=True, exist_ok=True)
        _sweep_stale_fetches(top)
        if not (final / MANIFEST).is_file() or (final / MANIFEST).read_bytes() != manifest_bytes:
            tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=top))
            for rel, blob in files.items():
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(blob)
            (tmp / MANIFEST).write_bytes(manifest_bytes)
            (tmp / "source_url").write_text(url + "\n", encoding="utf-8")
            if final.exists():
                shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            tmp = None
        write_text_atomic(top / LATEST, name + "\n")
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        warnings.warn(f"zmlx-pipeline: bundle {plain(url)} verified but not cached "
                      f"({plain(exc)})", BundleWarning, stacklevel=caller_stacklevel())
    return final


def _sweep_stale_fetches(top: Path) -> None:
    """Remove the `.fetch-*` temp dirs under `top` untouched for STALE_FETCH_S (left by fetches that died)."""
    import shutil
    import time

    cutoff = time.time() - STALE_FETCH_S
    for old in top.glob(".fetch-*"):
        try:
            if old.is_dir() and not old.is_symlink() and old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:  # gone meanwhile (another process swept it), or unreadable: nothing to do here
            pass


def cached_copy(url: str) -> Bundle:
    """The last verified copy of a remote bundle from the local cache (verified again); raises BundleError."""
    top = _url_dir(url)
    if not (top / LATEST).is_file():
        raise BundleError(f"no cached copy of {plain(url)}")
    return read_dir(top, source=f"{plain(url)} (cached copy)")


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


# ------------------------------------------------------------------------------------------
# the active bundle

_ACTIVE: Bundle | None = None
_DEFAULT_FAILED: list[str] = []
_LISTENERS: list[Callable[[Bundle | None], None]] = []


def on_change(listener: Callable[[Bundle | None], None]) -> None:
    """Call `listener` whenever the active bundle changes (lookup tables drop their caches)."""
    _LISTENERS.append(listener)


def _activate(bundle: Bundle | None) -> None:
    global _ACTIVE
    _ACTIVE = bundle
    for listener in _LISTENERS:
        listener(bundle)


def read_bundle(path_or_url: str | os.PathLike, cached_if_invalid: bool = True) -> Bundle:
    """A verified bundle, not activated: a directory, a publish root (its `latest`), or an http(s) URL.

    A URL that cannot be fetched falls back to its last verified cached copy with a warning; so
    does one that fails verification, unless `cached_if_invalid` is False. Raises BundleError
    when there is nothing verified to use.
    """
    text = _path_text(path_or_url)
    if not is_url(text):
        return read_dir(text)
    try:
        return fetch_url(text)
    except BundleError as exc:
        if not cached_if_invalid and not isinstance(exc, FetchError):
            raise
        try:
            cached = cached_copy(text)
        except BundleError:
            raise exc from None
        warnings.warn(f"zmlx-pipeline: {plain(exc)}; using the cached copy "
                      f"{plain(cached.bundle_id)}", BundleWarning, stacklevel=caller_stacklevel())
        return cached


def _path_text(path_or_url: Any) -> str:
    """A bundle location as text; BadArgumentType for anything but a str or path (None, a number), BadArgument
    for an empty one."""
    if isinstance(path_or_url, bytes) or not isinstance(path_or_url, (str, os.PathLike)):
        raise BadArgumentType(f"a bundle is a directory path or an http(s) URL, not {type(path_or_url).__name__} "
                              f"({path_or_url!r:.60})")
    text = os.fspath(path_or_url)
    if not text.strip():
        raise BadArgument("a bundle is a directory path or an http(s) URL, not an empty string")
    return bundle_location(text)


def fetchable_url(text: str) -> str:
    """An http(s) bundle location as given; BadArgument for one whose files' URLs it cannot lead to: a query or a
    fragment (`/manifest.json` and each file's name are appended to the location, so they would land after it),
    or a user name or password (never sent; the message shows neither)."""
    from urllib.parse import urlsplit

    try:
        url = urlsplit(text)
    except ValueError:  # a malformed host ([::1): the fetch says so in its one line
        return text
    if "@" in url.netloc:
        shown_url = url._replace(netloc="...@" + url.netloc.rpartition("@")[2]).geturl()
        raise BadArgument(f"bundle location {shown_url!r:.80} carries a user name or password, which are never sent: "
                          "give the URL without them")
    if url.query or url.fragment or "?" in text or "#" in text:
        raise BadArgument(f"bundle location {text!r:.80} has a query (?) or a fragment (#), which would come before "
                          "manifest.json and each file's name in their URLs: give the URL without it")
    return text


def bundle_location(text: str) -> str:
    """A bundle location as read: an http(s) URL as given, a directory path with a leading `~` expanded, a file://
    URL as the local path it names; BadArgument for a path no file can have (a NUL byte), a `~user` with no known
    home, a file URL of another host or another scheme."""
    if "\0" in text:
        raise BadArgument(f"bundle location {text!r:.80} holds a NUL byte: give a directory path or an http(s) URL")
    scheme, sep, _ = text.partition("://")
    if not sep or not scheme.isalpha() or is_url(text):
        return fetchable_url(text) if is_url(text) else home_expanded(text, "bundle location")
    if scheme.lower() != "file":
        raise BadArgument(f"bundle location {text!r:.80}: {scheme}:// is not read; give a directory path, a file:// "
                          "or an http(s) URL")
    from urllib.parse import urlsplit
    from urllib.request import url2pathname

    url = urlsplit(text)
    if url.netloc not in ("", "localhost"):
        raise BadArgument(f"bundle location {text!r:.80} names a file on host {url.netloc!r}; give a local path, a "
                          "file:/// URL or an http(s) URL")
    return url2pathname(url.path)


def load_bundle(path_or_url: str | os.PathLike, *, strict: bool = False) -> Bundle | None:
    """Verify a bundle and make it the one lookups use; returns the bundle now in use.

    On failure (bad hash, truncated file, wrong schema, unreachable URL with no cached copy) the
    bundle is refused with one warning line and the previous one stays in use (returned); a URL
    that fails falls back to its last verified cached copy, with a warning. `strict` raises
    BundleError instead (an unreachable URL still falls back to its cached copy), also for a device's
    table that fails its checks when a lookup first reads it. A location that is not a str or path
    raises BadArgumentType either way.
    """
    _path_text(path_or_url)
    if not isinstance(strict, bool):  # 'yes' or 0 would be read as a truth value, "no" as strict
        raise BadArgumentType(f"strict must be True or False, not {type(strict).__name__} ({strict!r:.40})")
    try:
        bundle = read_bundle(path_or_url, cached_if_invalid=not strict)
        bundle.strict = bool(strict)
    except BundleError as exc:
        if strict:
            raise
        current = active_bundle(load_default=True)
        keep = f"still using bundle {plain(current.bundle_id)}" if current is not None else "no bundle in use"
        warnings.warn(f"zmlx-pipeline: bundle refused: {plain(exc)}; {keep}", BundleWarning,
                      stacklevel=caller_stacklevel())
        return current
    _activate(bundle)
    return bundle


def default_bundle() -> Bundle:
    """The bundle shipped inside the package; raises BundleError if it is missing or fails verification."""
    return read_dir(DEFAULT_BUNDLE_DIR, source="default bundle")


def active_bundle(load_default: bool = True) -> Bundle | None:
    """The bundle lookups use: the last one loaded, else $ZMLX_PIPELINE_BUNDLE, else the shipped default."""
    if _ACTIVE is None and load_default:
        env = os.environ.get("ZMLX_PIPELINE_BUNDLE")
        chosen: Bundle | None = None
        refused = ""
        if env and env.strip():  # empty or blank (only spaces): unset
            try:
                chosen = read_bundle(env)
            except (BundleError, BadArgument) as exc:  # BadArgument: a location no bundle can be at (ftp://)
                warnings.warn(f"zmlx-pipeline: bundle refused: {plain(exc)} ($ZMLX_PIPELINE_BUNDLE); "
                              f"using the default bundle",
                              BundleWarning, stacklevel=caller_stacklevel())
                refused = f"answered from the default bundle: $ZMLX_PIPELINE_BUNDLE was refused ({plain(exc)})"
        if chosen is None:
            if _DEFAULT_FAILED:
                return None
            try:
                chosen = default_bundle()
                chosen.stands_in = refused
            except BundleError as exc:
                _DEFAULT_FAILED.append(str(exc))  # warn once, not on every new lookup
                warnings.warn(f"zmlx-pipeline: {plain(exc)}; lookups answer with catalog "
                              f"defaults", BundleWarning, stacklevel=caller_stacklevel())
                return None
        _activate(chosen)
    return _ACTIVE


def reset() -> None:
    """Forget the active bundle (the next lookup loads the default again); for tests and long-lived tools."""
    _DEFAULT_FAILED.clear()
    _activate(None)
