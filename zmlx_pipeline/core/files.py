"""Atomic file writes: a temp file in the target's directory, fsynced, then renamed over the target,
so a reader (or a process killed mid-write) sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import tempfile
import unicodedata
from pathlib import Path
from typing import Any


def write_text_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Write `text` to `path` atomically; `mode` sets the file's permissions (mkstemp makes it private)."""
    write_bytes_atomic(path, text.encode("utf-8"), mode)


def write_bytes_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write `data` to `path` atomically (a temp file beside it, renamed over it: a link of that name is replaced,
    never written through); `mode` sets the file's permissions (mkstemp makes it private)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if mode is not None:
            os.chmod(tmp, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any, mode: int | None = None) -> None:
    """`data` as indented, sorted-key JSON (one trailing newline), written atomically (`mode`: as write_text_atomic)."""
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n", mode=mode)


def current_umask() -> int:
    """This process's umask: read from /proc where it tells it (nothing changes, so threads are safe), else by
    setting it and at once putting it back (the only other way to read it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def expand_home(text: str) -> str:
    """A path's leading `~` or `~user` expanded as a shell does; ValueError saying whose home is unknown (such a
    path is never taken literally: a writer would make a folder named `~user`, DuckDB would read $HOME + "user")."""
    if not text.startswith("~"):
        return text
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        user = text[1:].split(os.sep, 1)[0]
        raise ValueError(f"no user {user!r} on this machine" if user else "no home directory ($HOME is not set)")
    return expanded


def shown_path(path: str | os.PathLike) -> str:
    """A path as one printable line: its bytes, those that are not UTF-8 text written as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


#: what printable() writes for the control characters that have a short escape
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: characters that reorder how the text around them is shown (bidirectional embeddings, overrides, isolates)
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def printable(text: str) -> str:
    """`text` as one line a terminal shows as it is: every control character (a newline, a carriage return, ESC
    and the rest of C0 and C1, DEL), a line or paragraph separator and a bidirectional control written as an escape
    (\\n, \\r, \\t, \\x1b, \\u2028), and a byte that is not UTF-8 (a surrogate escape) as \\xNN; nothing else
    changes, nothing is left out. Applying it twice gives what once gives (a backslash is kept as it is)."""
    if text.isprintable():  # the common case: every character shows as itself (a space is the only one it allows)
        return text
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, held as a surrogate escape
            out.append(f"\\x{code - 0xDC00:02x}")
        elif unicodedata.category(ch) in ("Cc", "Zl", "Zp", "Cs") or ch in _BIDI_CONTROLS:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


#: what a path is when it is not a regular file, by st_mode test
_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_regular_file(path: str | os.PathLike) -> str | None:
    """What `path` is when it is no regular file, said without opening it (a FIFO would block its reader, a device
    such as /dev/zero never end): "a FIFO (named pipe)", "a directory", "a symlink to /dev/zero, a character
    device", "missing" (nothing there, or a link to nothing); None for a regular file (or a link to one)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    what = next((w for test, w in _NOT_REGULAR if test(mode)), "not a regular file")
    if os.path.islink(path):
        return f"a symlink to {os.path.realpath(path)}, {what}"
    return what


def shell_command(*words: Any) -> str:
    """A command as a user would type it into a POSIX shell: each word quoted where it needs it (a kernel named
    `my norm` is `'my norm'`) and escaped as `printable` does, so the hint in a message runs as shown."""
    return " ".join(shlex.quote(printable(str(w))) for w in words)


#: how a Git LFS pointer file starts: a repository cloned without git-lfs holds these in place of its data files
GIT_LFS_POINTER = "version https://git-lfs.github.com/spec/"


#: a URL's scheme and its `://` as typed; one letter and a colon is a drive (C:/), never a scheme
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+)://")
#: the same URL as a pathlib.Path holds it: Path folds `s3://bucket` into `s3:/bucket`
_URL_IN_PATH = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/")


def url_scheme(text: str, in_path: bool = False) -> str | None:
    """The scheme of the URL `text` starts with (`s3` for `s3://bucket/x`), or None; `in_path`: also the form a
    pathlib.Path folds one into (`s3:/bucket/x`), for a path that went through Path before it is checked."""
    url = (_URL_IN_PATH if in_path else _URL).match(text)
    return None if url is None else url.group(1)


def url_problem(text: str, what: str = "path") -> str | None:
    """Why a path as typed is a URL (s3://, https://, hf://) and no local path, or None. Checked on the text as given:
    as a Path, `s3://b/x` is the local `s3:/b/x`, which a command would create under the current directory."""
    scheme = url_scheme(text)
    if scheme is None:
        return None
    return (f"{what} {text!r} is a URL ({scheme}:), not a local path: download or mount it and give its local "
            "path")


def utf8_problem(path: str | os.PathLike, what: str = "path") -> str | None:
    """Why a path cannot be handed on as UTF-8 text (to DuckDB, which takes paths as UTF-8, or into the JSON of a
    manifest or a run), or None: a name whose bytes are not UTF-8 in this locale (Python holds them as surrogate
    escapes, as under LC_ALL=C PYTHONUTF8=0) would fail there, after the work that came before it."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        return (f"{what} {shown_path(path)} cannot be encoded as UTF-8 in this locale: run with PYTHONUTF8=1 (or a "
                "UTF-8 locale such as LC_ALL=C.UTF-8), or use a path of plain ASCII characters")
    return None
