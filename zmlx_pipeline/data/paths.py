"""What a path given to ingest or import stands for: a file, or the files of a kind below a directory.

Both commands read a directory the same way, so a shard or a tuning file in a subfolder is never left out unsaid,
an editor's or a notebook's hidden copies (`.ipynb_checkpoints`, `.shard.parquet.tmp-...`) are never read, and a
FIFO or a device among the files is named, never skipped or read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable

from zmlx_pipeline.core.errors import ZmlxPipelineError

# What a path names when it is not a regular file: each refused by name (a FIFO would block its reader forever,
# a device such as /dev/zero would never end, /dev/null would swallow a store).
_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class UnreadableFolder(ZmlxPipelineError, OSError):
    "A folder below a directory given to ingest or import could not be listed; its files would be left out unsaid"

    def __init__(self, folder: str, reason: str) -> None:
        super().__init__(f"{folder} cannot be read ({reason})")
        self.folder = folder


def _unreadable(err: OSError) -> None:
    """os.walk's onerror: a folder it cannot list is refused, not skipped."""
    raise UnreadableFolder(str(err.filename), err.strerror or type(err).__name__) from None


def not_regular(mode: int) -> str | None:
    """What a file of this st_mode is when it is not a regular file ("a FIFO (named pipe)"), else None."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _NOT_REGULAR if test(mode)), "not a regular file")


def files_below(directory: Path, suffixes: Iterable[str]) -> tuple[list[Path], tuple[Path, str] | None]:
    """The files below `directory`, in every subfolder, whose names end with one of `suffixes` (any case), sorted;
    hidden files and folders (a name starting with ".") are left out. Also the first such name that is not a
    regular file, and what it is (None when there is none), for the caller to refuse. UnreadableFolder when a
    folder cannot be listed (no permission): its files would otherwise be left out unsaid."""
    suffixes = tuple(s.lower() for s in suffixes)
    found: list[Path] = []
    odd: list[tuple[Path, str]] = []
    seen = {os.path.realpath(directory)}  # a linked folder is read once, and a link loop ends
    for root, folders, names in os.walk(directory, onerror=_unreadable, followlinks=True):
        kept = []
        for folder in sorted(folders):
            real = os.path.realpath(os.path.join(root, folder))
            if not folder.startswith(".") and real not in seen:
                seen.add(real)
                kept.append(folder)
        folders[:] = kept
        for name in sorted(names):
            if name.startswith(".") or not name.lower().endswith(suffixes):
                continue
            path = Path(root) / name
            try:
                kind = not_regular(path.stat().st_mode)
            except OSError:
                kind = "a symlink to no file"
            if kind is None:
                found.append(path)
            else:
                odd.append((path, kind))
    return sorted(found), (min(odd) if odd else None)
