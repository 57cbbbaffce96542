"""The models a bundle is built from: the registry's latest per kernel (or named ones), else fitted here.

Each kernel needs a ranker (orders configs), a time model (the predicted time of the pick),
its pruning k and its expected regret. Registered models (`zmlx-pipeline train`) are loaded
from their files (models/persist.py: no code runs from a file) with the held-out scores the
registry recorded. A kernel with no registered model, or whose model was trained on another
kernel version than the store now holds, is fitted here with the default variant and scored
on held-out data the same way (models/train.py `heldout_scores`, the call train_models makes, so
both record the same pruning k). A registered model is never fitted again: publishing from it
gives the bundle a fit at publish would (tests/publish/test_build.py). The time model is a plain
gradient-boosting regressor on log time over the store's data, fitted by publish where the tables
are built (its worker processes: time_model_due).

Expected regret (regret@1 geometric mean on held-out data) is recorded per kernel as
`seen_device` when the held-out split was unseen shapes of measured devices, `unseen_device`
when it was left-out devices; the other stays null (unknown). `cross_family` is the regret on
architecture families left out of training (publish/transfer.py), null with one family measured. The pruning k is the registry's
scores["prune_k"] when present, else DEFAULT_PRUNE_K.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import polars as pl

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.models.rankers.base import Ranker
from zmlx_pipeline.models.variants import DEFAULT_MODEL, fit_kernel_model, make_ranker
from zmlx_pipeline.models.features import KernelFeatures
from zmlx_pipeline.progress import Say, Steps

#: the pruning k when the model records none (no held-out case): the candidates the runtime autotuner times
DEFAULT_PRUNE_K = 5


class ModelSourceError(ZmlxPipelineError, ValueError):
    "No model can be found or fitted for publishing"


@dataclass
class KernelModel:
    """What publishing needs of one kernel's model."""

    kernel: str
    features: KernelFeatures          # the store's feature frame (training rows: anchors and measured tables)
    ranker: Ranker
    time_model: Ranker | None
    prune_k: int
    regret: dict[str, Any]
    variant: str
    model_id: str
    source: str                       # "registry" or "fitted"
    data_fingerprint: str
    note: str = ""
    time_model_due: bool = False      # not fitted yet: fitted where the tables are built (publish's workers)
    # (model file, its sha256) the ranker is read from where the tables are built (ranker None until then)
    ranker_file: tuple[str, str | None, dict] | None = None  # (path, sha256, what the file must say it is)


@dataclass
class ModelSet:
    """The models of one publish, one per kernel, and the ids that name them together."""

    kernels: dict[str, KernelModel]
    params: dict[str, Any] = field(default_factory=dict)
    reused: dict[str, str] = field(default_factory=dict)  # kernel -> model id whose recorded cases gave its regret

    @property
    def model_id(self) -> str:
        """The model's id when there is one kernel; else an id over every kernel's model id."""
        ids = sorted(km.model_id for km in self.kernels.values())
        if len(ids) == 1:
            return ids[0]
        return "models-" + hashlib.sha256("\n".join(ids).encode()).hexdigest()[:12]

    @property
    def data_fingerprint(self) -> str:
        """One fingerprint over every kernel's training-data fingerprint."""
        parts = sorted(f"{k}={km.data_fingerprint}" for k, km in self.kernels.items())
        if len(parts) == 1:
            return self.kernels[next(iter(self.kernels))].data_fingerprint
        return "sha256:" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]

    @property
    def source(self) -> str:
        kinds = {km.source for km in self.kernels.values()}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    def describe(self) -> dict[str, dict]:
        return {k: {"model_id": km.model_id, "source": km.source, "variant": km.variant,
                    "data_fingerprint": km.data_fingerprint, "prune_k": km.prune_k,
                    "kernel_version": km.features.kernel_version, **({"note": km.note} if km.note else {})}
                for k, km in sorted(self.kernels.items())}


def regret_from_scores(scores: dict | None) -> dict[str, Any]:
    """The registry's held-out scores as expected regret: seen_device / unseen_device by the split scored."""
    scores = scores or {}
    split = scores.get("prune_split")
    r1 = scores.get("regret1_geomean")
    return {
        "split": split,
        "seen_device": r1 if split == "shapes" else None,
        "unseen_device": r1 if split == "devices" else None,
        "regret3": scores.get("regret3_geomean"),
        "regret5": scores.get("regret5_geomean"),
        "cases": scores.get("prune_cases"),
        "cross_family": None,
    }


def fit_time_model(features: KernelFeatures) -> Ranker | None:
    """The time model: plain gradient boosting on log time over all of the kernel's rows (None when it cannot fit)."""
    try:
        return make_ranker(features, "gbr").fit(features.frame)
    except ValueError:
        return None


def fit_kernel(features: KernelFeatures, variant: str = DEFAULT_MODEL, heldout: bool = True,
               note: str = "", time_model: bool = True) -> KernelModel:
    """Fit the variant on all of a kernel's rows and score it on held-out data (no registry involved);
    `time_model` False leaves the time model to be fitted later (time_model_due)."""
    from zmlx_pipeline.models.train import data_fingerprint, heldout_scores

    ranker = fit_kernel_model(features, variant)
    scores = heldout_scores(features, variant, ranker) if heldout else {}  # as train_models scores
    fingerprint = data_fingerprint(features.frame)
    return KernelModel(
        kernel=features.kernel, features=features, ranker=ranker,
        time_model=fit_time_model(features) if time_model else None, time_model_due=not time_model,
        prune_k=int(scores.get("prune_k") or DEFAULT_PRUNE_K), regret=regret_from_scores(scores), variant=variant,
        model_id=f"fitted-{features.kernel}-{variant}-{fingerprint.split(':')[-1][:8]}", source="fitted",
        data_fingerprint=fingerprint, note=note,
    )


def load_models(store, model_ids: Sequence[str] | str | None = None, kernels: Sequence[str] | None = None,
                evaluate: bool = True, progress: Say | None = None, time_models: bool = True,
                jobs: int | None = None, started: float | None = None, rankers: bool = True) -> ModelSet:
    """The newest registered model of each kernel (named ids replace their kernel's); others fitted here.
    `progress` gets a line per kernel loaded (or fitted) and scored, with an estimate of the time left;
    `time_models` False leaves each time model due, for the table builder to fit (in its workers); `rankers`
    False leaves each registered ranker in its file (ranker_file; with_ranker reads it, in those workers); `jobs`:
    worker processes for the regret on left-out devices (None: one per CPU); `started`: when the command
    began (time.monotonic), for the elapsed time in progress lines."""
    from zmlx_pipeline.models.evaluate import EvaluationError, kernel_features_of

    named = [model_ids] if isinstance(model_ids, str) else list(model_ids or [])
    chosen: dict[str, dict] = {}
    for mid in named:
        rows = store.models(model_id=mid)
        if not rows:
            raise ModelSourceError(f"no registered model {mid!r} in store {store.path}: see `zmlx-pipeline models`, "
                                   "or publish without --model to use the newest")
        kernel = rows[0]["kernel_filter"]
        if kernel in chosen and chosen[kernel]["model_id"] != mid:
            raise ModelSourceError(f"models {chosen[kernel]['model_id']} and {mid} are both for kernel {kernel}: "
                                   "name one model per kernel")
        chosen[kernel] = rows[0]
    if kernels is not None:
        left_out = sorted(k for k in chosen if k not in kernels)
        if left_out:
            ids = ", ".join(chosen[k]["model_id"] for k in left_out)
            raise ModelSourceError(f"model {ids} is for kernel {', '.join(left_out)}, which the kernels asked for "
                                   f"({', '.join(kernels)}) leave out: add it to --kernel or drop the --model")
    wanted = list(kernels) if kernels is not None else (sorted(chosen) if named else None)
    try:
        feats = kernel_features_of(store, wanted)
    except EvaluationError as exc:
        raise ModelSourceError(str(exc)) from None
    out: dict[str, KernelModel] = {}
    steps = Steps(progress, "publish", sum(f.frame.height for f in feats.values()), parts=len(feats),
                  started=started)
    for name, f in feats.items():
        km = out[name] = _kernel_model(store, name, f, chosen.get(name), named, evaluate, time_models, rankers)
        steps.done(f"{name}: model {km.model_id} ({'registered' if km.source == 'registry' else 'fitted here'})",
                   f.frame.height)
    if not out:
        raise ModelSourceError("no kernel to publish: the store holds no ok measurements (collect, import or ingest first)")
    reused: dict[str, str] = {}
    if evaluate:
        from zmlx_pipeline.publish.build import device_records
        from zmlx_pipeline.publish.transfer import cross_family_regret, families_are_devices

        scored = [km for km in out.values() if km.regret.get("unseen_device") is None]
        reused = _score_unseen(scored, progress, jobs, started, store=store)
        fresh = {km.kernel for km in scored}  # their left-out-device regret is of the store's rows now
        records = device_records(store)
        for km in out.values():
            if km.kernel in fresh and families_are_devices(km.features.frame, records):
                # each family is one device: its folds are the left-out-device folds just scored on these rows
                km.regret["cross_family"] = km.regret["unseen_device"]
            else:
                km.regret["cross_family"] = cross_family_regret(km.features, km.variant, records)
    return ModelSet(out, {"evaluated": evaluate}, reused)


def _score_unseen(todo: Sequence[KernelModel], progress: Say | None, jobs: int | None,
                  started: float | None = None, store=None) -> dict[str, str]:
    """unseen_device_regret of each kernel model (set in its regret): read from the left-out-device cases train
    recorded (recorded_unseen) where they hold, else the folds of every remaining kernel fitted in `jobs` worker
    processes at once (a small store scores here); a progress line per kernel with an estimate of the time left.
    Returns kernel -> the model id whose records were read."""
    from zmlx_pipeline.models.variants import MODEL_VARIANTS
    from zmlx_pipeline.models.evaluate import gather_folds, submit_kernel
    from zmlx_pipeline.models.metrics import summarize
    from zmlx_pipeline.models.pool import KernelPool

    for km in todo:
        if km.features.frame["device_id"].n_unique() < 2 or km.variant not in MODEL_VARIANTS:
            km.regret["unseen_device"] = None
    todo = sorted((km for km in todo if km.features.frame["device_id"].n_unique() >= 2
                   and km.variant in MODEL_VARIANTS), key=lambda km: -km.features.frame.height)
    if not todo:
        return {}
    steps = Steps(progress, "publish", sum(km.features.frame.height for km in todo), parts=len(todo),
                  started=started)
    reused: dict[str, str] = {}
    for km in list(todo) if store is not None else ():
        found = recorded_unseen(store, km.features, km.variant)
        if found is not None:
            reused[km.kernel], km.regret["unseen_device"] = found
            todo.remove(km)
            steps.done(f"{km.kernel}: regret on left-out devices read from the cases recorded with model {found[0]}",
                       km.features.frame.height)
    if not todo:
        return reused

    def submit(km: KernelModel, pool: KernelPool) -> list:
        return submit_kernel(km.features, "devices", ks=(1,), models=(km.variant,), baselines=False, pool=pool)

    with KernelPool({km.kernel: km.features for km in todo}, jobs) as pool:
        submitted = {km.kernel: submit(km, pool) for km in todo} if pool.parallel else {}
        for km in todo:
            per_case = gather_folds(submitted.get(km.kernel) or submit(km, pool), (1,))
            km.regret["unseen_device"] = (summarize(per_case["r1"].to_list())["regret_geomean"]
                                          if not per_case.is_empty() else None)
            steps.done(f"{km.kernel}: regret on left-out devices scored", km.features.frame.height)
    return reused


def recorded_unseen(store, features: KernelFeatures, variant: str) -> tuple[str, float | None] | None:
    """(model id, regret@1 geometric mean of `variant` on left-out devices) from the cases train recorded under
    the `devices` split (models/heldout.py), in the order the folds give them, so the very figure a refit
    gives; None when no record may stand in for the folds (another variant or package version, rows changed)."""
    from zmlx_pipeline.models.heldout import PROTOCOL, recorded_cases
    from zmlx_pipeline.models.metrics import summarize

    found = recorded_cases(store, features, "devices", PROTOCOL, variant, ks=(1,))
    if found is None:
        return None
    cases = found[1].filter(pl.col("method") == variant)
    if cases.is_empty():
        return None
    return found[0], summarize(cases["r1"].to_list())["regret_geomean"]


def with_ranker(km: KernelModel) -> KernelModel:
    """The kernel model with its ranker read from its file when it was left there (load_models' `rankers`)."""
    from dataclasses import replace

    from zmlx_pipeline.models.persist import load_model_file

    if km.ranker is not None or km.ranker_file is None:
        return km
    path, sha256, expect = km.ranker_file
    try:
        ranker = load_model_file(path, sha256=sha256, expect=expect)
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"cannot load model {km.model_id}: {exc}") from None
    return replace(km, ranker=ranker, ranker_file=None)


def _kernel_model(store, name: str, f: KernelFeatures, row: dict | None, named: Sequence[str],
                  evaluate: bool, time_models: bool, rankers: bool = True) -> KernelModel:
    """One kernel's model: the registered one (`row`, else the kernel's newest) when it is for the store's
    kernel version, else one fitted here; `rankers` False leaves a registered ranker in its file."""
    from zmlx_pipeline.models.persist import ModelFileError, check_model_file
    from zmlx_pipeline.models.train import NoTrainedModel, expected_meta, load_model, model_path

    if row is None:
        rows = store.models(kernel=name)
        row = rows[0] if rows else None
    if row is None:
        return fit_kernel(f, heldout=evaluate, note="no registered model: fitted at publish", time_model=time_models)
    version = (row.get("params") or {}).get("kernel_version")
    if version and version != f.kernel_version:
        if row["model_id"] in named:
            raise ModelSourceError(f"model {row['model_id']} ranks {name} version {version}, but the store's data "
                                   f"is version {f.kernel_version}: retrain with zmlx-pipeline train")
        return fit_kernel(f, heldout=evaluate, time_model=time_models,
                          note=f"registered model {row['model_id']} is for kernel version {version}: fitted at publish")
    ranker, ranker_file = None, None
    if rankers:
        try:
            ranker = load_model(store, model_id=row["model_id"]).ranker
        except NoTrainedModel as exc:
            raise ModelSourceError(str(exc)) from None
        except (OSError, ValueError) as exc:
            raise ModelSourceError(f"cannot load model {row['model_id']}: {exc}") from None
    else:  # read where the tables are built; a file it cannot be (missing, a directory) is said now, before that work
        path = model_path(store, row)
        if not os.path.lexists(path):
            raise ModelSourceError(f"cannot load model {row['model_id']}: no model file {path} (train again, or "
                                   "publish from the store the model was trained with)")
        try:
            check_model_file(path)  # what it is instead, as models --verify says
        except ModelFileError as exc:
            raise ModelSourceError(f"cannot load model {row['model_id']}: {exc}") from None
        ranker_file = (str(path), (row.get("params") or {}).get("file_sha256"), expected_meta(row))
    scores = row.get("scores") or {}
    return KernelModel(
        kernel=name, features=f, ranker=ranker, ranker_file=ranker_file,
        time_model=fit_time_model(f) if time_models else None,
        time_model_due=not time_models,
        prune_k=int(scores.get("prune_k") or DEFAULT_PRUNE_K), regret=regret_from_scores(scores),
        variant=(row.get("params") or {}).get("model", "?"), model_id=row["model_id"], source="registry",
        data_fingerprint=row.get("data_fingerprint") or "", note="" if scores.get("prune_k") else
        f"no pruning k recorded: default {DEFAULT_PRUNE_K}",
    )


def unseen_device_regret(features: KernelFeatures, variant: str) -> float | None:
    """Regret@1 geometric mean of the variant on devices left out of training (None with one device);
    load_models scores it for every kernel at once (_score_unseen), the same folds."""
    from zmlx_pipeline.models.evaluate import evaluate_kernel
    from zmlx_pipeline.models.metrics import summarize
    from zmlx_pipeline.models.variants import MODEL_VARIANTS

    if features.frame["device_id"].n_unique() < 2 or variant not in MODEL_VARIANTS:
        return None
    per_case = evaluate_kernel(features, "devices", ks=(1,), models=(variant,), baselines=False)
    return summarize(per_case["r1"].to_list())["regret_geomean"] if not per_case.is_empty() else None
