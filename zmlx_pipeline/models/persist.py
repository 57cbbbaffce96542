"""Model files that load without running code from the file.

A model file (`.zmodel`) is a zip archive:
- `manifest.json`: format and version, then the ranker as a tree of plain JSON values in
  which a few tagged objects stand for what JSON cannot hold: {"$ranker": {"class", "state"}},
  {"$features": {...}}, {"$dict": {...}}, {"$tuple": [...]}, and references to the blobs below;
- `blobs/<n>.parquet` (polars frames), `blobs/<n>.npy` (numpy arrays, no object dtype, read
  with allow_pickle=False), `blobs/<n>.skops` (scikit-learn objects, skops format).

Loading never unpickles and never imports by name: a ranker class must be one of the Ranker
subclasses of this package (RANKER_CLASSES), found by class name; a skops blob is opened only
when every type it names is in TRUSTED_TYPES (pinned here, checked on save as well, so an
estimator outside the list fails at training time, not later), and skops itself then audits
it again. A frame of training rows is not saved with the features: a loaded ranker scores new
rows, it is never refitted.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import json
import os
import uuid
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.core.files import not_regular_file
from zmlx_pipeline.models import variants as _variants  # noqa: F401  (imports every class ranker_classes finds)
from zmlx_pipeline.models.rankers.base import Ranker
from zmlx_pipeline.models.features import KernelFeatures

FORMAT = "zmlx-pipeline-model"
FORMAT_VERSION = 1
SUFFIX = ".zmodel"

# Every type a saved scikit-learn object may contain. Review a type before adding it: skops
# rebuilds these from their state, so a type that runs code on construction must never be here.
TRUSTED_TYPES = frozenset({
    "builtins.dict", "builtins.list", "builtins.tuple", "builtins.str", "builtins.int", "builtins.float",
    "builtins.bool", "builtins.slice", "builtins.NoneType",
    "numpy.ndarray", "numpy.dtype", "numpy.float64", "numpy.float32", "numpy.int64", "numpy.int32",
    "numpy.uint64", "numpy.uint32", "numpy.uint8", "numpy.bool_",
    "numpy.random._generator.Generator", "numpy.random._pcg64.PCG64", "numpy.random.mtrand.RandomState",
    "sklearn.pipeline.Pipeline",
    "sklearn.compose._column_transformer.ColumnTransformer",
    "sklearn.preprocessing._encoders.OneHotEncoder",
    "sklearn.preprocessing._encoders.OrdinalEncoder",
    "sklearn.preprocessing._data.StandardScaler",
    "sklearn.preprocessing._function_transformer.FunctionTransformer",
    "sklearn.ensemble._hist_gradient_boosting.gradient_boosting.HistGradientBoostingRegressor",
    "sklearn.ensemble._hist_gradient_boosting.binning._BinMapper",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    "sklearn.ensemble._forest.RandomForestRegressor",
    "sklearn.ensemble._forest.ExtraTreesRegressor",
    "sklearn.tree._classes.DecisionTreeRegressor",
    "sklearn.tree._classes.ExtraTreeRegressor",
    "sklearn.tree._tree.Tree",
    "sklearn.linear_model._ridge.Ridge",
    "sklearn._loss.loss.HalfSquaredError",
    "sklearn._loss._loss.CyHalfSquaredError",
    "sklearn._loss.loss.AbsoluteError",
    "sklearn._loss._loss.CyAbsoluteError",
    "sklearn._loss.link.IdentityLink",
    "sklearn._loss.link.Interval",
})


class ModelFileError(ZmlxPipelineError, ValueError):
    "A model file cannot be written or read (unknown type, tampered or foreign file)"


def ranker_classes() -> dict[str, type]:
    """This package's Ranker subclasses by class name: the only classes a model file may name."""
    found: dict[str, type] = {}
    todo = list(Ranker.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("zmlx_pipeline.") and not getattr(cls, "__abstractmethods__", None):
            found[cls.__name__] = cls
    return found


def _sklearn_types(blob: bytes) -> set[str]:
    """Every `module.class` a skops blob names, read from its schema (nothing is constructed)."""
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            schema = json.loads(z.read("schema.json"))
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise ModelFileError(f"a scikit-learn blob is not a skops file ({exc})") from None
    found: set[str] = set()
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if "__class__" in node and "__module__" in node:
                found.add(f"{node['__module__']}.{node['__class__']}")
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return found


def _untrusted(types: set[str]) -> list[str]:
    return sorted(types - TRUSTED_TYPES)


# ------------------------------------------------------------------------------------------
# save


class _Writer:
    """Turns a ranker into manifest JSON plus blobs; the same object is stored once."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self._seen: dict[int, str] = {}
        self._keep: list[Any] = []  # keeps encoded objects alive so their ids stay unique

    def _blob(self, obj: Any, suffix: str, data: bytes) -> str:
        name = f"blobs/{len(self.blobs)}{suffix}"
        self.blobs[name] = data
        self._seen[id(obj)] = name
        self._keep.append(obj)
        return name

    def encode(self, value: Any, where: str) -> Any:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        if isinstance(value, (np.integer, np.floating, np.bool_)):
            return value.item()
        if isinstance(value, Ranker):
            cls = type(value)
            if ranker_classes().get(cls.__name__) is not cls:
                raise ModelFileError(f"cannot save {where}: {cls.__module__}.{cls.__name__} is not a ranker of this package")
            return {"$ranker": {"class": cls.__name__, "state": self.encode_dict(value.to_state(), where)}}
        if isinstance(value, KernelFeatures):
            fields = {}
            for f in dataclasses.fields(value):
                item = getattr(value, f.name)
                if f.name == "frame" and item is not None:
                    item = item.head(0)  # the columns only: training rows stay in the store
                fields[f.name] = self.encode(item, f"{where}.{f.name}")
            return {"$features": fields}
        if isinstance(value, pl.DataFrame):
            if id(value) in self._seen:
                return {"$frame": self._seen[id(value)]}
            buf = io.BytesIO()
            value.write_parquet(buf, compression="zstd")
            return {"$frame": self._blob(value, ".parquet", buf.getvalue())}
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise ModelFileError(f"cannot save {where}: a numpy array of Python objects")
            buf = io.BytesIO()
            np.save(buf, value, allow_pickle=False)
            return {"$ndarray": self._blob(value, ".npy", buf.getvalue())}
        if _is_sklearn(value):
            if id(value) in self._seen:
                return {"$sklearn": self._seen[id(value)]}
            import skops.io as sio

            data = sio.dumps(value)
            bad = _untrusted(_sklearn_types(data))
            if bad:
                raise ModelFileError(f"cannot save {where}: types {', '.join(bad)} are not in persist.TRUSTED_TYPES "
                                     "(review them and add them there)")
            return {"$sklearn": self._blob(value, ".skops", data)}
        if isinstance(value, tuple):
            return {"$tuple": [self.encode(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [self.encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {"$dict": self.encode_dict(value, where)}
        raise ModelFileError(f"cannot save {where}: values of type {type(value).__module__}.{type(value).__qualname__} "
                             "have no safe file form")

    def encode_dict(self, mapping: dict, where: str) -> dict:
        out = {}
        for key, item in mapping.items():
            if not isinstance(key, str):
                raise ModelFileError(f"cannot save {where}: a dict key {key!r} is not a string")
            out[key] = self.encode(item, f"{where}.{key}")
        return out


def _is_sklearn(value: Any) -> bool:
    """A scikit-learn estimator or transformer (what skops stores)."""
    from sklearn.base import BaseEstimator

    return isinstance(value, BaseEstimator)


def save_model(ranker: Ranker, path: str | os.PathLike, meta: dict | None = None) -> str:
    """Write a fitted ranker as a model file, atomically; returns the file's sha256 ("sha256:<hex>").

    `meta` (plain JSON) is stored in the manifest for people reading the file.
    """
    writer = _Writer()
    root = writer.encode(ranker, "model")
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "meta": meta or {}, "root": root}
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("manifest.json", json.dumps(manifest, sort_keys=True))
            for name, data in writer.blobs.items():
                z.writestr(name, data, compress_type=zipfile.ZIP_STORED)
        digest = file_sha256(tmp)
        os.replace(tmp, target)
    except OSError as exc:  # a full disk: the line names the file, not only the OS's words
        raise ModelFileError(f"cannot save the model file {target}: {exc.strerror or exc}; free space there or "
                             "choose another --models-dir") from None
    finally:
        tmp.unlink(missing_ok=True)
    return digest


PENDING_PREFIX = ".pending-"  # a list of model files a running train saved and has not registered yet


def mark_pending(folder: Path, path: Path, store_path: str | os.PathLike) -> None:
    """Note (before saving it) a model file this process is about to save for the store at `store_path`, so that a
    killed run's file is found, and removed only by a train of that same store (stores may share a folder)."""
    pending = folder / f"{PENDING_PREFIX}{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(pending, "a", encoding="utf-8") as fh:
            fh.write(f"{_store_key(store_path)}\t{path.name}\n")
    except OSError as exc:
        raise ModelFileError(f"cannot save models in {folder} (writing {pending.name}): {exc.strerror or exc}; "
                             "free space there or choose another --models-dir") from None


def _store_key(store_path: str | os.PathLike) -> str:
    return str(Path(store_path).expanduser().resolve())


def clear_pending(folder: Path) -> None:
    """This process registered (or removed) every model file it noted."""
    (folder / f"{PENDING_PREFIX}{os.getpid()}").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def check_models_dir(folder: Path) -> None:
    """Make the folder model files go into, and prove it takes a file, before any fit: ModelFileError (one line)
    when it cannot (a file on its path, no permission, a read-only or special file system)."""
    from zmlx_pipeline.runtime.bundle import folder_problem

    problem = folder_problem(folder)
    if problem is not None:
        raise ModelFileError(f"cannot save models in {folder}: {problem}; choose another --models-dir")
    probe = folder / f".write-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ModelFileError(f"cannot save models in {folder}: {exc.strerror or exc}; choose another --models-dir") \
            from None


def sweep_orphans(folder: Path, registered: set[str], store_path: str | os.PathLike) -> list[Path]:
    """Remove what a killed train of the store at `store_path` left in `folder`: its temp files and its saved,
    never-registered models.

    Only files of processes that no longer run are touched, never a file `registered` names (file names of the
    registry's model paths), and a model file only when the killed train noted it for this very store: another
    store's are left for its own next train (a line that names no store is dropped, its file kept). Returns the
    files removed.
    """
    here = _store_key(store_path)
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        pid_text = None
        if entry.name.startswith(PENDING_PREFIX):
            pid_text = entry.name[len(PENDING_PREFIX):]
        elif entry.name.startswith(".") and ".tmp-" in entry.name:
            pid_text = entry.name.split(".tmp-", 1)[1].split("-", 1)[0]
        if pid_text is None or not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        if entry.name.startswith(PENDING_PREFIX):
            others = []
            for line in entry.read_text(encoding="utf-8", errors="replace").splitlines():
                owner, tab, name = line.rpartition("\t")
                if not tab or not name.strip():
                    continue
                if owner != here:
                    others.append(line)
                    continue
                target = folder / Path(name).name
                if target.name not in registered and target.is_file():
                    target.unlink()
                    removed.append(target)
            if others:  # what a killed train of another store noted: that store's next train sweeps it
                entry.write_text("".join(f"{line}\n" for line in others), encoding="utf-8")
                continue
        entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, as "sha256:<64 hex>"."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


# ------------------------------------------------------------------------------------------
# load


class _Reader:
    def __init__(self, archive: zipfile.ZipFile) -> None:
        self.archive = archive
        self._cache: dict[str, Any] = {}

    def _read(self, name: Any) -> bytes:
        if not isinstance(name, str) or not name.startswith("blobs/") or name not in self.archive.namelist():
            raise ModelFileError(f"it refers to a blob {name!r} it does not hold")
        return self.archive.read(name)

    def decode(self, value: Any) -> Any:
        if value is None or isinstance(value, (bool, str, int, float)):
            return value
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        if not isinstance(value, dict) or len(value) != 1:
            raise ModelFileError("its manifest holds an untagged object")
        (tag, body), = value.items()
        if tag == "$dict":
            return {k: self.decode(v) for k, v in _mapping(body).items()}
        if tag == "$tuple":
            return tuple(self.decode(v) for v in _sequence(body))
        if tag == "$ranker":
            body = _mapping(body)
            cls = ranker_classes().get(body.get("class"))
            if cls is None:
                raise ModelFileError(f"it names an unknown ranker class {body.get('class')!r}")
            state = {k: self.decode(v) for k, v in _mapping(body.get("state")).items()}
            return cls.from_state(state)
        if tag == "$features":
            fields = {k: self.decode(v) for k, v in _mapping(body).items()}
            names = {f.name for f in dataclasses.fields(KernelFeatures)}
            if set(fields) - names:
                raise ModelFileError(f"its features have unknown fields {', '.join(sorted(set(fields) - names))}")
            try:
                return KernelFeatures(**fields)
            except TypeError as exc:
                raise ModelFileError(f"its features are incomplete ({exc})") from None
        if tag in ("$frame", "$ndarray", "$sklearn"):
            if body not in self._cache:
                self._cache[body] = self._blob(tag, body)
            return self._cache[body]
        raise ModelFileError(f"its manifest holds an unknown tag {tag!r}")

    def _blob(self, tag: str, name: str) -> Any:
        data = self._read(name)
        try:
            if tag == "$frame":
                return pl.read_parquet(io.BytesIO(data))
            if tag == "$ndarray":
                return np.load(io.BytesIO(data), allow_pickle=False)
        except Exception as exc:  # noqa: BLE001 - any parse failure is a bad file
            raise ModelFileError(f"its blob {name} is unreadable ({type(exc).__name__})") from None
        types = _sklearn_types(data)
        bad = _untrusted(types)
        if bad:
            raise ModelFileError(f"its blob {name} holds untrusted types {', '.join(bad)}")
        import skops.io as sio

        try:
            return sio.loads(data, trusted=sorted(types))
        except Exception as exc:  # noqa: BLE001 - skops refuses in many ways; all mean "not loadable"
            raise ModelFileError(f"its blob {name} does not load ({type(exc).__name__}: {exc})") from None


def _mapping(value: Any) -> dict:
    if not isinstance(value, dict):
        raise ModelFileError("its manifest holds a malformed object")
    return value


def _sequence(value: Any) -> list:
    if not isinstance(value, list):
        raise ModelFileError("its manifest holds a malformed list")
    return value


def check_model_file(path: str | os.PathLike) -> None:
    """ModelFileError (one line naming the fix) unless `path` is a regular file, said without opening it (a FIFO
    would block the read, /dev/zero never end): missing, a directory, a FIFO, unreadable, a broken symlink."""
    source = Path(path)
    kind = not_regular_file(source)
    if kind is not None and (kind == "missing" or kind.startswith("unreadable")) and source.is_symlink():
        try:  # the link is there; what it leads to is not, or never ends
            source.stat()
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ModelFileError(f"model file {source} is a symlink loop, not a model file: remove it and "
                                     "retrain with `zmlx-pipeline train`") from None
            if exc.errno == errno.ENOENT:
                raise ModelFileError(f"model file {source} is a symlink to {os.readlink(source)}, which does not "
                                     "exist: fix or remove the link, or retrain with `zmlx-pipeline train`") from None
    if kind == "missing":
        raise ModelFileError(f"model file {source} does not exist: retrain with `zmlx-pipeline train`")
    if kind is not None and kind.startswith("unreadable"):
        raise ModelFileError(f"model file {source} is {kind}: make it readable, or retrain with `zmlx-pipeline train`")
    if kind is not None:
        raise ModelFileError(f"model file {source} is {kind}, not a model file: remove it and retrain with "
                             "`zmlx-pipeline train`")


def load_model_file(path: str | os.PathLike, sha256: str | None = None, expect: dict | None = None) -> Ranker:
    """The ranker saved in a model file; ModelFileError (one line) for a changed, foreign or unsafe file.

    With `sha256` (the registry's record) a file whose bytes changed since it was saved is refused
    before anything in it is read; with `expect` ({"model_id": ..., "kernel": ...}, the registry row's), a file
    saved for another model or kernel is refused (a registry row pointed at another model's file).
    """
    source = Path(path)
    check_model_file(source)  # a directory, a FIFO, a broken link: said before anything is opened
    if sha256 is not None and file_sha256(source) != sha256:
        raise ModelFileError(f"model file {source} changed since it was registered (sha256 differs): "
                             "refusing to load it; retrain with `zmlx-pipeline train`")
    try:
        with zipfile.ZipFile(source) as archive:
            try:
                manifest = json.loads(archive.read("manifest.json"))
            except (KeyError, ValueError):
                raise ModelFileError("it has no readable manifest.json") from None
            if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
                raise ModelFileError("it is not a zmlx-pipeline model file")
            if manifest.get("format_version") != FORMAT_VERSION:
                raise ModelFileError(f"it has format version {manifest.get('format_version')!r}, this zmlx-pipeline "
                                     f"reads {FORMAT_VERSION}")
            meta = manifest.get("meta") if isinstance(manifest.get("meta"), dict) else {}
            for field, wanted in (expect or {}).items():
                if wanted is not None and meta.get(field) != wanted:
                    raise ModelFileError(f"it was saved as {field} {meta.get(field)!r}, not the registry's {wanted!r}; "
                                         "retrain with `zmlx-pipeline train`")
            ranker = _Reader(archive).decode(manifest.get("root"))
    except zipfile.BadZipFile:
        raise ModelFileError(f"refusing to load model file {source}: it is not a zip archive") from None
    except ModelFileError as exc:
        raise ModelFileError(f"refusing to load model file {source}: {exc}") from None
    except RecursionError:
        raise ModelFileError(f"refusing to load model file {source}: its manifest nests too deeply") from None
    if not isinstance(ranker, Ranker):
        raise ModelFileError(f"refusing to load model file {source}: it does not hold a ranker")
    return ranker
