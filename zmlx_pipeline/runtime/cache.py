"""The autotune cache file, shared with ZMLX in its v3 layout: `~/.cache/zmlx/autotune_v3.json`.

    {"schema_version": "3.0",
     "devices": {"<chip>_<mlx version>": {"metadata": {...}, "entries": {"<key json>": {...}}, "saved_at": "..."}},
     "zmlx_pipeline": {"entries": {"<device key>": {"<key json>": {...}}},
                       "refused": {"<device key>": [{"kernel", "config", "error", "at"}, ...]}}}

Device sections are named as ZMLX names them (`M3_Max_0.32.4` on Apple chips, `<catalog id>_<mlx>`
elsewhere); on an Apple Pro, Max or Ultra our entries also go to the base chip's section (`M3_0.32.4`),
the one ZMLX 0.10.0's detection actually picks there (device.zmlx_chips). An entry's key is written exactly as ZMLX's `save_autotune_cache` writes its own keys
(`json.dumps` of name, shapes, dtypes, grid, t_params, in that order), so ZMLX loads our entries and
writes them back unchanged; its value keeps ZMLX's fields (`tg`, `template`: every config parameter)
next to ours (`config`, `median_us`, ...). ZMLX's save replaces its device's section with what it
holds in memory, keeping only `tg` and `template` and dropping entries it never loaded, but it keeps
the other top-level keys: so our winners are also kept under `zmlx_pipeline`, put back into their
section on our next write, and a config is recovered from `template` where only that is left. The
configs a chip refused to launch are kept there too, so no later process launches them again.

A v2 file (`autotune_v2.json`: device sections of entries at the top level) or a v1 one is read
and migrated with every entry and every device kept. Writes hold a lock file, re-read the file
and merge into it, then replace it atomically, so two processes writing at once both keep their
entries and a reader never sees half a file. A cache path that is a symlink is written through to
its target (the link stays), and a rewritten file keeps its permissions (a new one gets the umask's).
A v3 file that cannot be read, or whose sections are not the objects (and lists) this layout has, reads as
empty and is moved aside as `<name>.corrupt-<time>` (`-2`, `-3`... after it in the same second: an earlier one is
never replaced), with a warning, by the next write; a file of a newer schema (a newer ZMLX's) is neither read nor
rewritten, with one warning. An entry that contradicts itself (a template parameter named twice, a config the template
disagrees with, a `tg` that is not the threadgroup its parameters launch) is no answer.
$ZMLX_CACHE_DIR moves the directory (as in ZMLX).

Why one long module: reading, migrating, merging and writing the file share its layout, its lock and the entry
checks, and ZMLX's re-saves must round-trip through all of them; split, each part would re-state the layout.
"""

from __future__ import annotations

import json
import os
import stat
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from zmlx_pipeline.core.files import current_umask, url_problem, write_json_atomic
from zmlx_pipeline.runtime.errors import BadArgument, BadArgumentType, caller_stacklevel, home_expanded, plain

SCHEMA_VERSION = "3.0"
V3_NAME = "autotune_v3.json"
OLDER_NAMES = ("autotune_v2.json", "autotune_v1.json")
#: our top-level section: ZMLX's save rewrites `devices[<its device>]` but keeps every other top-level key
OWN_SECTION = "zmlx_pipeline"
#: the key's grid when the launch grid depends on the config still to be chosen
UNFIXED_GRID = (0, 0, 0)


def cache_dir() -> Path:
    explicit = os.environ.get("ZMLX_CACHE_DIR")  # empty or blank (only spaces): unset
    return (Path(home_expanded(explicit, "$ZMLX_CACHE_DIR")) if explicit and explicit.strip()
            else Path.home() / ".cache" / "zmlx")


def cache_path() -> Path:
    return cache_dir() / V3_NAME


def checked_path(path: str | os.PathLike | None = None) -> Path:
    """The regular file a cache path names (there or still to be written; a leading `~` expanded, as reads do), its
    symlinks followed; BadArgument saying why it cannot be one (empty, a NUL byte, a `~user` with no known home, a
    directory, a FIFO or device, a symlink loop, a file where a directory should be, a name too long). Nothing is
    created."""
    if path is None:
        path = cache_path()
    text = os.fspath(path)
    if not isinstance(text, str):
        raise BadArgumentType(f"cache_path must be a file path as text, not {type(text).__name__} ({text!r:.60})")
    hint = "give the path of a file such as autotune_v3.json in a directory you can write"
    if not text.strip():
        raise BadArgument(f"cache_path is an empty string: {hint}")
    if "\0" in text:
        raise BadArgument(f"cache_path {text!r:.80} holds a NUL byte: {hint}")
    if url_problem(text) is not None:  # as a Path, s3://b/c.json is ./s3:/b/c.json, which a save would create
        raise BadArgument(url_problem(text, "cache_path"))
    target = Path(os.path.realpath(home_expanded(text, "cache_path")))
    try:
        mode = os.stat(target).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except OSError as exc:  # a symlink loop, a name too long, no permission
        raise BadArgument(f"autotune cache {text!r:.80} cannot be used ({exc.strerror or exc}): {hint}") from None
    if mode is not None:
        if stat.S_ISDIR(mode):
            raise BadArgument(f"autotune cache {text!r:.80} is a directory: give a file path such as "
                              f"{os.path.join(text, V3_NAME)!r:.80}")
        if not stat.S_ISREG(mode):
            raise BadArgument(f"autotune cache {text!r:.80} is a FIFO, device or socket, not a regular file: {hint}")
        return target
    for parent in target.parents:  # not there yet: the nearest folder that is must be a directory
        try:
            parent_mode = os.stat(parent).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise BadArgument(f"autotune cache {text!r:.80} cannot be used ({exc.strerror or exc}): {hint}") from None
        if not stat.S_ISDIR(parent_mode):
            raise BadArgument(f"autotune cache {text!r:.80} cannot be written: {str(parent)!r:.80} is a file, "
                              f"not a directory; {hint}")
        break
    return target


def writable_path(path: str | os.PathLike | None = None) -> Path:
    """checked_path, with its directory created and its lock file opened as a write does first, so a path no write
    can use is refused before any work that would be saved there; BadArgument naming why."""
    target = checked_path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(str(target) + ".lock", os.O_RDWR | os.O_CREAT, 0o666))
    except OSError as exc:
        raise BadArgument(f"autotune cache {os.fspath(path if path is not None else target)!r:.80} cannot be written "
                          f"({exc.strerror or exc}): give the path of a file in a directory you can write") from None
    return target


def device_key(chip: str, mlx_version: str | None) -> str:
    """A device section's key as ZMLX forms it: its chip name (`M3_Max`, `M3` for an Apple catalog id;
    the id itself for other devices) and the MLX version."""
    from zmlx_pipeline.runtime.device import zmlx_chip

    return f"{zmlx_chip(chip)}_{mlx_version or 'unknown'}"


def device_keys(chip: str, mlx_version: str | None) -> tuple[str, ...]:
    """Every section ZMLX may keep this device's launches in: device_key first, then, on an Apple Pro,
    Max or Ultra, the base chip's (`M3_0.32.4`), where ZMLX 0.10.0's detection puts them (device.zmlx_chips)."""
    from zmlx_pipeline.runtime.device import zmlx_chips

    return tuple(f"{c}_{mlx_version or 'unknown'}" for c in zmlx_chips(chip))


def entry_key(kernel: str, version: str | None, shape: Mapping[str, int], dims: list[str] | tuple[str, ...],
              dtype: str, params: list[str] | tuple[str, ...], grid: Any = None) -> str:
    """The key of one tuned launch, in the exact text ZMLX writes for a key it loaded (so it survives ZMLX's
    save unchanged): the kernel, the shape in `dims` order, the dtype, the grid (UNFIXED_GRID when the
    config decides it), and as template parameters the dtype, every tuned parameter and the kernel version."""
    t_params = [["T", dtype]] + [[p, "tuned"] for p in sorted(params)]
    if version:
        t_params.append(["kernel_version", str(version)])
    return json.dumps({
        "name": kernel,
        "shapes": [[int(shape[d]) for d in dims]],
        "dtypes": [dtype],
        "grid": [int(g) for g in (grid if grid is not None else UNFIXED_GRID)],
        "t_params": t_params,
    })


def entry_value(config: Mapping[str, Any], dtype: str, threadgroup: Any = None, **extra: Any) -> dict:
    """An entry's value: ZMLX's `tg` and `template` (the dtype and every config parameter) plus our `config`
    and whatever else is given."""
    tg = list(threadgroup) if threadgroup is not None else [int(config.get("TG", 1) or 1), 1, 1]
    template = [["T", dtype]] + [[k, v] for k, v in sorted(config.items())]
    return {"tg": tg, "template": template, "config": dict(config), **extra}


def contradiction(value: Any) -> str:
    """Why an entry contradicts itself ("" when it does not): its `template` names a parameter twice, or gives one a
    value its `config` does not (ZMLX launches with the template, we read the config). Such an entry is no answer:
    which of its values was timed cannot be told. (Its `tg` is the launch's threadgroup, which a kernel spec may
    derive from several parameters, so the entry alone cannot tell whether it disagrees with them: the tuner checks
    that with threadgroup_disagreement.)"""
    template = value.get("template") if isinstance(value, Mapping) else None
    if not isinstance(template, list):
        return ""
    pairs = [pair for pair in template
             if isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str)]
    seen: dict[str, Any] = {}
    for name, given in pairs:
        if name in seen:
            return f"its template names {name!r:.40} twice ({seen[name]!r:.20} and {given!r:.20})"
        seen[name] = given
    config = value.get("config")
    if isinstance(config, Mapping):
        for name, given in seen.items():
            if name != "T" and name in config and config[name] != given:
                return f"its config gives {name!r:.40} {config[name]!r:.20}, its template {given!r:.20}"
    return ""


def threadgroup_disagreement(value: Any, threadgroup: Any) -> str:
    """Why an entry's `tg` is not `threadgroup`, the one its config (or template) launches with ("" when it is, or
    when it has no `tg`); a `tg` shorter than three is padded with 1s, as (x,) launches as (x, 1, 1). ZMLX launches
    with `tg`, so an entry that disagrees contradicts itself: which launch was timed cannot be told."""
    tg = value.get("tg") if isinstance(value, Mapping) else None
    if tg is None:
        return ""
    want = [int(t) for t in threadgroup]
    if not isinstance(tg, list) or not 0 < len(tg) <= len(want) or any(
            isinstance(t, bool) or not isinstance(t, int) for t in tg):
        return f"its tg {tg!r:.40} is no threadgroup (its parameters launch {want})"
    if list(tg) + [1] * (len(want) - len(tg)) != want:
        return f"its tg {tg!r:.40} is not the threadgroup its parameters launch ({want})"
    return ""


def config_of(value: Any, params: Any = None) -> dict | None:
    """The config an entry holds: its `config`, else rebuilt from its `template` pairs (all that is left once
    ZMLX has re-saved it), keeping the names in `params` when given; None when it holds neither, or contradicts
    itself (contradiction: a parameter named twice), so it is a miss, never a hit with another config's time."""
    if not isinstance(value, Mapping) or contradiction(value):
        return None
    if isinstance(value.get("config"), Mapping):
        return dict(value["config"])
    template = value.get("template")
    if not isinstance(template, list):
        return None
    wanted = set(params) if params is not None else None
    config = {}
    for pair in template:
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str) and pair[0] != "T":
            if wanted is None or pair[0] in wanted:
                config[pair[0]] = pair[1]
    if wanted is not None and set(config) != wanted:
        return None
    return config or None


# ------------------------------------------------------------------------------------------
# reading and migrating


def _empty() -> dict:
    return {"schema_version": SCHEMA_VERSION, "devices": {}}


def _migrate_entry(value: Any) -> Any:
    """A v1 entry (a JSON string of the threadgroup) as a v2/v3 dict; anything else is kept as is."""
    if isinstance(value, str):
        try:
            tg = json.loads(value)
        except ValueError:
            return value
        if isinstance(tg, list):
            return {"tg": tg, "template": []}
    return value


def from_older(data: Any, origin: str) -> dict:
    """A v2 (or v1) layout {device_key: {entry_key: value}} as v3, keeping every device and entry."""
    out = _empty()
    if not isinstance(data, dict):
        return out
    for dkey, entries in data.items():
        if not isinstance(entries, dict):
            continue
        out["devices"][str(dkey)] = {
            "metadata": {"migrated_from": origin},
            "entries": {str(k): _migrate_entry(v) for k, v in entries.items()},
            "saved_at": None,
        }
    return out


def _version(text: Any) -> tuple[int, ...] | None:
    """A schema_version as numbers without trailing zeros ("3.0" -> (3,), "99.1" -> (99, 1)); None for no version."""
    if not isinstance(text, str) or not all(p.isascii() and p.isdigit() for p in text.split(".")):
        return None
    numbers = [int(p) for p in text.split(".")]
    while numbers and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def newer_schema(data: Any) -> str:
    """The schema_version of a file a newer ZMLX wrote (above 3.0), which this runtime neither reads nor rewrites;
    "" for any other."""
    version = _version(data.get("schema_version")) if isinstance(data, dict) else None
    return data["schema_version"] if version is not None and version > (3,) else ""


def layout_problem(data: dict) -> str:
    """Why a cache file's JSON object is not a layout this runtime reads ("" if it is): a v3 file whose sections are
    not objects (or its own refusals not lists), or a v2 one whose device sections are not; odd entries are fine
    (each is judged where it is used, as ZMLX skips an entry it cannot load)."""
    if "schema_version" not in data:
        if "devices" in data or OWN_SECTION in data:
            return "it has a devices or zmlx_pipeline section but no schema_version"
        odd = [(name, value) for name, value in data.items() if not isinstance(value, dict)]
        return (f"its v2 device section {odd[0][0]!r:.60} is a JSON {_json_kind(odd[0][1])}, not an object"
                if odd else "")
    version = _version(data["schema_version"])
    if version is None or version < (3,):
        return f"its schema_version {data['schema_version']!r:.40} is no version of the v3 layout"
    checks = [("devices", data.get("devices"), dict)]
    if isinstance(data.get("devices"), dict):
        for name, section in data["devices"].items():
            checks.append((f"device section {name!r:.60}", section, dict))
            if isinstance(section, dict):
                checks += [(f"{part} of device section {name!r:.60}", section.get(part), dict)
                           for part in ("entries", "metadata")]
    own = data.get(OWN_SECTION)
    checks.append((OWN_SECTION, own, dict))
    for part, kind in (("entries", dict), ("refused", list)) if isinstance(own, dict) else ():
        checks.append((f"{OWN_SECTION}.{part}", own.get(part), dict))
        if isinstance(own.get(part), dict):
            checks += [(f"{OWN_SECTION}.{part}[{name!r:.60}]", value, kind) for name, value in own[part].items()]
    for what, value, kind in checks:
        if value is not None and not isinstance(value, kind):
            return f"its {what} is a JSON {_json_kind(value)}, not {'an array' if kind is list else 'an object'}"
    return ""


_NEWER_WARNED: set[str] = set()


def _warn_newer(p: Path, version: str) -> None:
    """Say once per file that a newer ZMLX's cache is left alone."""
    where = os.path.realpath(p)
    if where not in _NEWER_WARNED:
        _NEWER_WARNED.add(where)
        warnings.warn(f"zmlx-pipeline: {plain(where)} is an autotune cache of schema {version!r:.40}, "
                      f"newer than this runtime "
                      f"reads ({SCHEMA_VERSION}): it is left as it is, and nothing is read from it or cached in it "
                      "(upgrade zmlx-pipeline, or give another cache_path or $ZMLX_CACHE_DIR)", stacklevel=caller_stacklevel())


def _normalise(data: Any, origin: str) -> dict:
    """Any cache layout read from `origin` as v3 (a layout_problem or newer_schema checked before)."""
    if isinstance(data, dict) and "schema_version" in data:
        devices = data.get("devices")
        out = dict(data)
        out["schema_version"] = SCHEMA_VERSION
        out["devices"] = devices if isinstance(devices, dict) else {}
        return out
    return from_older(data, origin)


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        try:
            return json.load(fh)
        except RecursionError:
            raise ValueError("it is nested too deeply to be an autotune cache") from None


def read_cache(path: str | os.PathLike | None = None) -> dict:
    """The cache as v3: the v3 file, else a v2/v1 file beside it migrated in memory, else empty."""
    p = Path(home_expanded(os.fspath(path), "cache_path")) if path is not None else cache_path()
    if p.is_file():
        try:
            data = _read_json(p)
        except (OSError, ValueError):
            return _empty()
        if newer_schema(data):
            _warn_newer(p, newer_schema(data))
            return _empty()
        if isinstance(data, dict) and layout_problem(data):
            return _empty()  # moved aside, with a warning, by the next write
        return _normalise(data, p.name)
    for name in OLDER_NAMES:
        older = p.with_name(name)
        if older.is_file():
            try:
                return from_older(_read_json(older), name)
            except (OSError, ValueError):
                continue
    return _empty()


def _own(data: Mapping[str, Any], part: str, dkey: str) -> Any:
    section = data.get(OWN_SECTION)
    if not isinstance(section, Mapping) or not isinstance(section.get(part), Mapping):
        return None
    return section[part].get(dkey)


def load_entries(dkey: str, path: str | os.PathLike | None = None, also: tuple[str, ...] = ()) -> dict[str, Any]:
    """The entries of one device section (and of the `also` sections, under it), with our own kept copies of
    entries ZMLX's save dropped or trimmed."""
    data = read_cache(path)
    out: dict[str, Any] = {}
    for name in (*reversed(also), dkey):
        section = data["devices"].get(name)
        entries = section.get("entries") if isinstance(section, dict) else None
        out.update(entries if isinstance(entries, dict) else {})
    kept = _own(data, "entries", dkey)
    if isinstance(kept, Mapping):
        out.update(kept)
    return out


def load_refusals(dkey: str, path: str | os.PathLike | None = None) -> list[dict]:
    """The launches refused on one device: records with `kernel`, `config`, `error` and `at`."""
    refused = _own(read_cache(path), "refused", dkey)
    return [dict(r) for r in refused if isinstance(r, Mapping)] if isinstance(refused, list) else []


# ------------------------------------------------------------------------------------------
# writing


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `<path>.lock` (no-op where fcntl does not exist)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on macOS or Linux
        yield
        return
    fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _current_for_write(p: Path) -> dict | None:
    """What is on disk now (as v3), or None for a newer ZMLX's file, which is never rewritten; an unreadable v3 file,
    or one whose JSON is not an object of a layout this runtime reads, is moved aside, never silently dropped."""
    if p.is_file():
        try:
            data = _read_json(p)
            if not isinstance(data, dict):
                raise ValueError(f"it holds a JSON {_json_kind(data)}, not an object")
            if newer_schema(data):
                _warn_newer(p, newer_schema(data))
                return None
            problem = layout_problem(data)
            if problem:
                raise ValueError(problem)
            return _normalise(data, p.name)
        except (OSError, ValueError) as exc:
            try:
                moved = f"moved aside to {plain(_move_aside(p).name)}"
            except OSError as err:
                moved = f"it could not be moved aside ({plain(err.strerror or err)}) and is replaced"
            warnings.warn(f"zmlx-pipeline: {plain(p)} could not be used as the autotune cache ({plain(exc)}); "
                          f"{moved}", stacklevel=caller_stacklevel())
            return _empty()
    return read_cache(p)


#: the most `<name>.corrupt-<time>-<n>` names tried in one second before a move aside gives up
MAX_ASIDE = 1000


def _move_aside(p: Path) -> Path:
    """Move an unusable cache file to `<name>.corrupt-<time>` (then `-2`, `-3`... when that name is taken: two moved
    aside in one second both stay), a name reserved first with O_EXCL so that no existing file is ever replaced."""
    stamp = int(time.time())
    for n in range(1, MAX_ASIDE + 1):
        aside = p.with_name(f"{p.name}.corrupt-{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            os.close(os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            continue
        try:
            os.replace(p, aside)  # onto the empty file reserved above, never onto another's
        except OSError:
            aside.unlink(missing_ok=True)
            raise
        return aside
    raise FileExistsError(f"{MAX_ASIDE} files named {p.name}.corrupt-{stamp}... are there already")


def _json_kind(value: Any) -> str:
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def _write(p: Path, data: dict) -> None:
    """Replace the cache file atomically, keeping its permissions (a new file gets those the umask leaves)."""
    try:
        mode = stat.S_IMODE(os.stat(p).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~current_umask()
    write_json_atomic(p, data, mode=mode)


def _own_part(data: dict, part: str) -> dict:
    section = data.get(OWN_SECTION)
    if not isinstance(section, dict):
        section = data[OWN_SECTION] = {}
    if not isinstance(section.get(part), dict):
        section[part] = {}
    return section[part]


def save_entries(dkey: str, entries: Mapping[str, Any], metadata: Mapping[str, Any] | None = None,
                 path: str | os.PathLike | None = None, also: tuple[str, ...] = ()) -> Path:
    """Merge entries into one device section (and the `also` sections) under the lock; other devices and
    entries are kept, and entries kept for this device that ZMLX's save dropped or trimmed are put back."""
    p = checked_path(path)
    with _locked(p):
        data = _current_for_write(p)
        if data is None:
            return p
        kept = _own_part(data, "entries")
        mine = kept.get(dkey) if isinstance(kept.get(dkey), dict) else {}
        mine = {**mine, **entries}
        kept[dkey] = mine
        for name in (dkey, *also):
            section = data["devices"].get(name)
            if not isinstance(section, dict):
                section = {"metadata": {}, "entries": {}}
            if not isinstance(section.get("entries"), dict):
                section["entries"] = {}
            section["entries"].update(mine)
            section["metadata"] = {**(section.get("metadata") or {}), **(metadata or {})}
            section["saved_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
            data["devices"][name] = section
        _write(p, data)
    return p


def save_refusal(dkey: str, kernel: str, config: Mapping[str, Any], error: str,
                 path: str | os.PathLike | None = None) -> Path:
    """Record under the lock that this device refused to launch `kernel` with `config` (once per config)."""
    p = checked_path(path)
    with _locked(p):
        data = _current_for_write(p)
        if data is None:
            return p
        refused = _own_part(data, "refused")
        records = refused.get(dkey) if isinstance(refused.get(dkey), list) else []
        stored = json.loads(json.dumps(dict(config)))  # as it reads back (tuples as lists)
        if not any(isinstance(r, Mapping) and r.get("kernel") == kernel and r.get("config") == stored
                   for r in records):
            records.append({"kernel": kernel, "config": stored, "error": str(error)[:400],
                            "at": time.strftime("%Y-%m-%dT%H:%M:%S")})
        refused[dkey] = records
        _write(p, data)
    return p


def migrate(path: str | os.PathLike | None = None) -> int:
    """Write the v3 file from a v2/v1 one when there is no v3 file yet; returns the entries it holds."""
    p = checked_path(path)
    with _locked(p):
        data = _current_for_write(p) or _empty()
        if not p.is_file() and data["devices"]:
            _write(p, data)
    return sum(len(s.get("entries") or {}) for s in data["devices"].values() if isinstance(s, dict))
