"""Train one model per kernel on the store's data, save it, and register it with its scores.

`train_models` fits the chosen model variant on every (filtered) ok measurement of a kernel,
scores the same variant on held-out data to find the pruning k, saves the fitted ranker as a
model file (models/persist.py) and adds a row to the store's `models` registry:

- model_id: "<kernel>-<UTC time>-<6 hex>", kernel_filter: the kernel;
- data_fingerprint: "sha256:<16 hex>" over the training rows' keys and median times;
- params: the variant, kernel version, device filter, trained devices, rows, cases, shapes,
  the file's sha256 (checked before every load);
- versions: Python and the packages that made it (scikit-learn, numpy, polars, skops, zmlx_pipeline);
- scores (held-out, see evaluate.py): `prune_k` (the smallest k whose top k is within 2% of
  the best in >= 95% of held-out cases: the configs the runtime autotuner times; None when no
  held-out case exists, then time every legal config), `prune_split` ("shapes", else
  "devices" when every kernel shape was measured once), `prune_cases`, `prune_hit` (the
  share reached at prune_k), `configs_max`, `regret1_geomean`/`regret3_geomean`/
  `regret5_geomean`/`regret1_p95`/`hit_2pct` of the model on that split, `fit_s` (the final
  fit) and `train_s` (fit plus recorded folds: seconds of work, in whichever worker process ran them).
The held-out folds are evaluate's folds of that split under its `nested` protocol (each fold's model
makes its own choices inside the fold's training rows), every fold, with the baselines: each case's
rows are recorded in the store with the model (models/heldout.py), and so are the left-out-devices
folds' where the split above is held-out shapes and the kernel has two devices or more (recorded_splits);
`evaluate`, `report` and `publish` read them instead of fitting the same folds again while the store's
rows are unchanged. `heldout_scores`
(which publishing calls for a kernel it fits itself) scores the same folds, so the same data gives
the same pruning k. Read a kernel's pruning k with `prune_k(store, kernel)` or
`load_model(store, kernel).prune_k`.
"""

from __future__ import annotations

import contextlib
import hashlib
import platform
import re
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Sequence

import polars as pl

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.core.files import shell_command
from zmlx_pipeline.data.store import HELDOUT_KS, StoreError
from zmlx_pipeline.models.rankers.base import Ranker
from zmlx_pipeline.models.variants import DEFAULT_MODEL, check_model, fit_kernel_model
from zmlx_pipeline.models.evaluate import _score_folds, gather_folds, kernel_features_of, ok_rows, submit_kernel
from zmlx_pipeline.models.folds import fold_plan
from zmlx_pipeline.models.metrics import PRUNE_SHARE, prune_k as prune_k_of, summarize
from zmlx_pipeline.models.pool import KernelPool, check_jobs, fit_threads
from zmlx_pipeline.models.features import CASE, KernelFeatures
from zmlx_pipeline.models.heldout import data_fingerprint, record_cases
from zmlx_pipeline.models.persist import (
    SUFFIX,
    ModelFileError,
    check_models_dir,
    clear_pending,
    load_model_file,
    mark_pending,
    save_model,
    sweep_orphans,
)

PACKAGES = ("scikit-learn", "numpy", "polars", "skops", "duckdb", "zmlx-pipeline")


class NoTrainedModel(ZmlxPipelineError, LookupError):
    "The registry holds no model for this kernel (or id)"


@dataclass
class TrainedModel:
    """A registered model, loaded: its registry row and the fitted ranker."""

    row: dict
    ranker: Ranker

    @property
    def model_id(self) -> str:
        return self.row["model_id"]

    @property
    def kernel(self) -> str:
        return self.row["kernel_filter"]

    @property
    def features(self) -> KernelFeatures:
        """The kernel's feature description (columns, devices; no training rows)."""
        return self.ranker.features

    @property
    def prune_k(self) -> int | None:
        """The registry's scores["prune_k"]: configs the runtime should time (None: all of them)."""
        return (self.row.get("scores") or {}).get("prune_k")


def default_models_dir(store) -> Path:
    """Where model files go unless told: `models/` next to the store file."""
    return Path(store.path).parent / "models"


def package_versions() -> dict[str, str | None]:
    """Python and the versions of the packages a model file depends on."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    if out.get("zmlx-pipeline") is None:
        from zmlx_pipeline import __version__

        out["zmlx-pipeline"] = __version__
    return out


def heldout_scores(features: KernelFeatures, model: str, ranker: Ranker | None = None,
                   pool: KernelPool | None = None) -> dict:
    """The held-out scores and pruning k of variant `model` on the kernel: held-out shapes, else left-out
    devices, every fold, under evaluate's `nested` protocol (each fold's model makes its own choices, so
    the final fit `ranker` is not needed). train_models and publishing both score these folds, so the same
    data gives the same pruning k. `pool` runs the folds."""
    return _heldout_result(features, model, submit_heldout(features, model, pool, baselines=False))[0]


def heldout_split(features: KernelFeatures) -> str | None:
    """The split the held-out folds use: shapes when any shape fold has test cases, else devices (None: neither)."""
    return next((split for split in ("shapes", "devices") if fold_plan(features, split)), None)


def submit_heldout(features: KernelFeatures, model: str, pool: KernelPool | None = None,
                   baselines: bool = True) -> tuple[str | None, list]:
    """The held-out folds, submitted: the split they use (heldout_split) and their futures, each fold's
    model and (`baselines`) every baseline at k = HELDOUT_KS (train_models submits every kernel's folds
    before reading any)."""
    split = heldout_split(features)
    if split is None:
        return None, []
    return split, submit_kernel(features, split, ks=HELDOUT_KS, models=(model,), baselines=baselines, pool=pool)


def recorded_splits(features: KernelFeatures) -> list[str]:
    """The splits whose cases train records: the held-out split (heldout_split, for the pruning k) and left-out
    devices too where the kernel has folds of them (two devices or more), which evaluate, report and publish read."""
    first = heldout_split(features)
    if first is None:
        return []
    return [first, *(["devices"] if first != "devices" and fold_plan(features, "devices") else [])]


def _heldout_result(features: KernelFeatures, model: str,
                    submitted: tuple[str | None, list]) -> tuple[dict, pl.DataFrame]:
    """The registry's scores of the model's held-out cases, and every method's per-case rows (to record)."""
    split, futures = submitted
    every = gather_folds(futures, HELDOUT_KS)
    per_case = every.filter(pl.col("method") == model)
    if per_case.is_empty():
        return {"prune_k": None, "prune_split": None, "prune_cases": 0, "prune_hit": None,
                "configs_max": _configs_max(features.frame)}, every
    k = prune_k_of(per_case["hit_rank"].to_list(), PRUNE_SHARE)
    hit = float((per_case["hit_rank"].fill_null(10 ** 9) <= k).mean()) if k is not None else None
    r1, r3, r5 = (summarize(per_case[c].to_list()) for c in ("r1", "r3", "r5"))
    return {
        "prune_k": k, "prune_split": split, "prune_cases": per_case.height, "prune_hit": hit,
        "configs_max": int(per_case["configs"].max()),
        "regret1_geomean": r1["regret_geomean"], "regret3_geomean": r3["regret_geomean"],
        "regret5_geomean": r5["regret_geomean"], "regret1_p95": r1["regret_p95"], "hit_2pct": r1["hit_2pct"],
    }, every


def _save(f: KernelFeatures, model: str, devices, folder: Path, ranker: Ranker, store) -> dict:
    """Saves a kernel's model file; returns its registry row, the versions and scores still to be filled in."""
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    model_id = _model_id(f.kernel, now)
    fingerprint = data_fingerprint(f.frame)
    frame = f.frame
    params = {
        "model": model, "kernel": f.kernel, "kernel_version": f.kernel_version,
        "device_filter": None if devices is None else sorted([devices] if isinstance(devices, str) else devices),
        "devices": sorted(frame["device_id"].unique().to_list()),
        "rows": frame.height, "cases": frame.select(CASE).n_unique(),
        "shapes": frame["shape_key"].n_unique(), "dtypes": sorted(frame["dtype"].unique().to_list()),
    }
    path = folder / f"{model_id}{SUFFIX}"
    mark_pending(folder, path, store.path)
    params["file_sha256"] = save_model(ranker, path, meta={"model_id": model_id, "kernel": f.kernel,
                                                           "data_fingerprint": fingerprint, "model": model})
    return {"model_id": model_id, "kernel_filter": f.kernel, "created_at": now, "data_fingerprint": fingerprint,
            "params": params, "versions": None, "scores": None, "path": _stored_path(store, path)}


def _fit_task(features: KernelFeatures, model: str) -> tuple[Ranker, float]:
    """A kernel's final fit (a KernelPool task): the ranker and its seconds."""
    start = time.perf_counter()
    with fit_threads():
        ranker = fit_kernel_model(features, model)
    return ranker, time.perf_counter() - start


def _configs_max(frame: pl.DataFrame) -> int:
    return int(frame.group_by(CASE).len()["len"].max())


#: most characters of a model id (and so of its file name) taken from the kernel name: a file name has at most 255
#: bytes, and the model is first saved as `.<model id>.zmodel.tmp-<pid>-<8 hex>` (about 50 more)
KERNEL_ID_CHARS = 64


def _model_id(kernel: str, now: datetime) -> str:
    """`<kernel>-<time>-<6 hex>`, the kernel name in file-name characters; a longer name than KERNEL_ID_CHARS is its
    start and 8 hex of its sha256 (the same for the same name, told apart from names that start alike)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", kernel).strip("._") or "kernel"
    if len(safe) > KERNEL_ID_CHARS:
        digest = hashlib.sha256(kernel.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        safe = f"{safe[:KERNEL_ID_CHARS - len(digest) - 1]}-{digest}"
    return f"{safe}-{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def _stored_path(store, path: Path) -> str:
    """The path the registry keeps: relative to the store's folder when inside it, else absolute."""
    base = Path(store.path).parent.resolve()
    path = path.resolve()
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def model_path(store, row: dict) -> Path:
    """The model file of a registry row (a relative path is relative to the store's folder)."""
    path = Path(row["path"])
    return path if path.is_absolute() else Path(store.path).parent / path


def train_models(store, kernels: Sequence[str] | str | None = None, devices: Sequence[str] | str | None = None,
                 model: str = DEFAULT_MODEL, models_dir: str | Path | None = None, heldout: bool = True,
                 on_kernel=None, jobs: int | None = None, features: dict[str, KernelFeatures] | None = None,
                 pool: KernelPool | None = None) -> list[dict]:
    """Fit, save and register one model per kernel on the store's (filtered) ok measurements.

    Returns the registry rows (see the module docstring), one per kernel. `heldout=False`
    skips the held-out scores (and so the pruning k) and records nothing. `on_kernel(kernel)` is called as
    each starts. `jobs`: worker processes for the kernels' fits and held-out folds (None: one per CPU; 1: none;
    the results do not depend on it). The per-case rows of every split of recorded_splits, the model's and
    every baseline's, are recorded with the model (models/heldout.py) for evaluate, report and publish to read.
    `features` (kernel_features_of(store, kernels, devices), already built) and an entered `pool` let the
    main job build the features and start the workers once for train and evaluate.
    """
    check_model(model)
    if getattr(store, "read_only", False):
        raise StoreError(f"cannot register models: store {store.path} is open read-only; open it writable")
    jobs = check_jobs(jobs)
    folder = Path(models_dir) if models_dir is not None else default_models_dir(store)
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # what check_models_dir creates
    check_models_dir(folder)  # before minutes of fitting, not after
    try:
        return _train_into(store, kernels, devices, model, folder, heldout, on_kernel, jobs, features, pool)
    except BaseException:  # a refusal or a stop before anything was saved leaves no new, empty folder
        for p in made:
            try:
                p.rmdir()
            except OSError:
                break
        raise


def _train_into(store, kernels, devices, model, folder, heldout, on_kernel, jobs, features, pool) -> list[dict]:
    """train_models once its --models-dir is checked."""
    sweep_orphans(folder, {model_path(store, row).name for row in store.models()}, store.path)  # a killed train's
    versions = package_versions()
    rows = []
    saved: dict[str, dict] = {}  # the registry rows of saved model files, until they are registered
    # the workers start while the features are read
    shared = pool is not None and features is not None
    with contextlib.nullcontext(pool) if shared else KernelPool(None, jobs, rows=ok_rows(store, kernels, devices)) \
            as pool:
        if not shared:
            features = kernel_features_of(store, kernels, devices)
        pool.attach(features)
        order = sorted(features, key=lambda k: -features[k].frame.height)  # the largest kernels first
        # each kernel's tasks: its final fit and the folds of each split it records, a split's folds in one task
        # (they share many fits: an outer device fold's inner fold "leave j out" is outer fold j's "leave i out")
        splits = {kernel: recorded_splits(features[kernel]) if heldout else [] for kernel in order}
        plans = {(kernel, split): tuple(fold_plan(features[kernel], split))
                 for kernel in order for split in splits[kernel]}
        for kernel in order:
            if on_kernel:
                on_kernel(kernel)
        # the final fits first (short, and they fit the per-device `transfer` models every fold of their kernel reuses:
        # the pool's workers share their fits, pool.py), then the splits' folds, the split of the most folds first, so
        # that the tasks left last, while a worker may idle, are short (notes/learning.md, "Training and evaluation
        # time"); tasks of different kernels follow each other, so the two workers rarely wait for each other's fit
        tasks = [(kernel, split) for kernel in order for split in ("fit", *splits[kernel])]
        tasks.sort(key=lambda t: (t[1] != "fit", -len(plans.get(t, ()))))  # stable: the largest kernel first
        futures: dict[tuple, object] = {}
        for kernel, split in tasks:
            if split == "fit":
                futures[kernel, "fit"] = pool.submit(kernel, _fit_task, model)
            else:
                futures[kernel, split] = pool.submit(kernel, _score_folds, plans[kernel, split], split, HELDOUT_KS,
                                                     (model,), True)
        fits = {kernel: futures[kernel, "fit"] for kernel in order}
        held = {kernel: [(split, [futures[kernel, split]]) for split in splits[kernel]]
                for kernel in (order if heldout else ())}
        try:
            for kernel in order:  # saved while the workers score the held-out folds
                saved[kernel] = _save(features[kernel], model, devices, folder, fits[kernel].result()[0], store)
            for kernel, f in features.items():  # registered once the held-out scores are in
                fit_s = fits[kernel].result()[1]
                splits = held.get(kernel) or [(None, [])]  # the pruning k's split first (recorded_splits)
                scores, cases = _heldout_result(f, model, splits[0]) if heldout else \
                    ({"prune_k": None, "prune_split": None}, None)
                recorded = [(splits[0][0], cases), *((split, gather_folds(futs, HELDOUT_KS)) for split, futs in splits[1:])]
                fold_s = sum(fut.result()[1] for _, futs in splits for fut in futs)
                scores.update(fit_s=round(fit_s, 3), train_s=round(fit_s + fold_s, 3))
                row = {**saved[kernel], "versions": versions, "scores": scores}
                store.add_model(row)
                del saved[kernel]
                for split, per_case in recorded:
                    if per_case is not None and not per_case.is_empty():
                        record_cases(store, row["model_id"], row["data_fingerprint"], split, per_case)
                rows.append(row)
        finally:  # an error or a stop (Ctrl-C, SIGTERM): a saved file that is not registered would only confuse
            for row in saved.values():
                model_path(store, row).unlink(missing_ok=True)
            clear_pending(folder)
    return rows


def train_command(store, kernel: str | None = None) -> str:
    """The train command that fills this store (its --db unless it is the default store), quoted to run as shown."""
    from zmlx_pipeline.data.store import default_db_path

    try:
        default = Path(store.path).resolve() == default_db_path().resolve()
    except (OSError, StoreError):
        default = False
    words = ["zmlx-pipeline", "train", *(() if default else ("--db", str(store.path))),
             *(() if kernel is None else ("--kernel", kernel))]
    return shell_command(*words)


def list_models(store, kernel: str | None = None) -> list[dict]:
    """Registry rows (of one kernel), newest first; NoTrainedModel when there is none."""
    rows = store.models(kernel=kernel)
    if not rows:
        what = f" for kernel {kernel!r}" if kernel is not None else ""
        raise NoTrainedModel(f"no trained model{what} in store {store.path}: run `{train_command(store, kernel)}` "
                             "first")
    return rows


def registry_row(store, kernel: str | None = None, model_id: str | None = None) -> dict:
    """The newest registry row of a kernel (or the row of a model id); NoTrainedModel when there is none."""
    if kernel is None and model_id is None:
        raise ValueError("name a kernel or a model id")
    rows = store.models(kernel=kernel, model_id=model_id)
    if not rows:
        what = f"model {model_id!r}" if model_id is not None else f"trained model for kernel {kernel!r}"
        fix = "see `zmlx-pipeline models`" if model_id is not None else \
            f"run `{train_command(store, kernel)}` first"
        raise NoTrainedModel(f"no {what} in store {store.path}: {fix}")
    return rows[0]


def expected_meta(row: dict) -> dict:
    """What a registry row's model file must say it is (its manifest's meta): that model of that kernel."""
    return {"model_id": row["model_id"], "kernel": row.get("kernel_filter")}


def load_model(store, kernel: str | None = None, model_id: str | None = None) -> TrainedModel:
    """The newest registered model of a kernel (or a model id), loaded safely (see persist.py)."""
    row = registry_row(store, kernel, model_id)
    ranker = load_model_file(model_path(store, row), sha256=(row.get("params") or {}).get("file_sha256"),
                             expect=expected_meta(row))
    return TrainedModel(row, ranker)


def verify_models(store, kernel: str | None = None) -> list[dict]:
    """Load every registered model (of a kernel) as load_model would, every one even after a bad one: each row
    gains "verified", "ok" or why its file is refused. BadModelFiles (a ModelFileError) if any is refused."""
    rows = list_models(store, kernel)
    bad = []
    for row in rows:
        try:
            load_model_file(model_path(store, row), sha256=(row.get("params") or {}).get("file_sha256"),
                            expect=expected_meta(row))
            row["verified"] = "ok"
        except (ModelFileError, OSError) as err:  # OSError: a file this user cannot read
            row["verified"] = str(err) if isinstance(err, ModelFileError) else f"cannot read {err.filename}: {err.strerror}"
            bad.append(row)
    if bad:
        raise BadModelFiles(rows, bad)
    return rows


class BadModelFiles(ModelFileError):
    """Some registered model files failed verify_models; `rows` are all the rows checked, each with "verified"."""

    def __init__(self, rows: list[dict], bad: list[dict]) -> None:
        self.rows = rows
        others = f" ({len(bad) - 1} more refused, see the table)" if len(bad) > 1 else ""
        super().__init__(f"{len(bad)} of {len(rows)} model files refused; {bad[0]['model_id']}: "
                         f"{bad[0]['verified']}{others}")


def prune_k(store, kernel: str) -> int | None:
    """The pruning k of a kernel's newest registered model: scores["prune_k"] (None: time every config)."""
    return (registry_row(store, kernel).get("scores") or {}).get("prune_k")
