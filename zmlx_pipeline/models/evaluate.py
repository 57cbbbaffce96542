"""Scores on data a model did not train on: regret@k per case, splits and baselines.

A case is one (device, kernel, dtype, shape); every method ranks the case's measured-ok
configs (what the runtime would choose among). regret@k = measured time of the best of the
method's top k / measured best time of the case; per (kernel, method, k) we report the
geometric mean, the 95th percentile, the share of cases within 2% of the best (`hit_2pct`)
and the number of cases, per device and pooled (device None).

Splits and folds: models/folds.py; regret, pruning and the noise-aware score: models/metrics.py;
worker processes: models/pool.py.

Baselines (models/baselines.py), built from the same training rows only:
- `chip_default`: the config whose threadgroup is closest to the device's catalog default
  threadgroup (ties broken by `common_top10`); kernels with no threadgroup parameter get
  `common_top10` instead: configs by how often they are in a training case's top 10;
- `seed_candidates`: the seed autotuner (Hmbown/ZMLX's device profiles): its three
  threadgroup candidates of the device (SEED_PROFILES: Apple base chips 64/128/256, Pro and
  Max 128/256/512, Ultra and M4 Max 256/512/1024, any other device the seed's fallback
  64/128/256), its default threadgroup first; the kernel's other parameters at the values of
  the `common_top10` leader. Its top 3 is what the seed times; kernels without thread
  parameters have no such baseline. The threadgroup of a config is the product of its thread
  parameters (TG, or block_size_x * block_size_y ... for imported kernels);
- `most_common_best`: the config most often best on that device in training (over all
  training devices when the device has none, as under `devices`);
- `nearest_shape`: the measured ranking of the nearest training shape on that device (log2
  dims); none under `devices`;
- `other_device_best`: the measured ranking of the most similar other device (normalised
  spec distance) on the same shape and dtype in training; none under `shapes`.
A method with nothing to say about a case does not score it (its `cases` count says so).
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Future
from typing import Mapping, Sequence

import numpy as np
import polars as pl

from zmlx_pipeline.models.baselines import _from_source_case, baseline_names, baseline_scores
from zmlx_pipeline.models.variants import DEFAULT_MODEL, MODEL_VARIANTS, make_ranker
from zmlx_pipeline.models.features import (
    CASE,
    KernelFeatures,
    build_features,
    devices_frame,
    measurements_frame,
)
from zmlx_pipeline.models.folds import (
    EvaluationError,
    canonical_split,
    check_protocol,
    fold_plan,
    fold_rows,
    folds,
)
from zmlx_pipeline.data.store import HELDOUT_KS
from zmlx_pipeline.models.heldout import record_cases, recorded_cases, recorded_models, recording_model
from zmlx_pipeline.models.metrics import NoiseBands, case_regrets, noise_bands, regret_rows, tied_regrets
from zmlx_pipeline.models.pool import KernelPool, check_jobs, fit_threads

# the after-the-fact floor of the devices split: not a method one could use (it picks with the test device's times)
ORACLE = "oracle_device"
FLOORS = {ORACLE: "after the fact: for each left-out device, the one other device whose measured ranking "
                  "(same shape and dtype) gives the lowest regret on it, chosen per k with the left-out "
                  "device's own times; a floor for what copying one device can reach, not a method"}


def oracle_device(features: KernelFeatures, ks: Sequence[int]) -> pl.DataFrame:
    """Per-case regrets of the after-the-fact floor of the devices split (ORACLE), method column ORACLE.

    For each left-out device, every other device's measured ranking of the same (kernel, dtype, shape) is
    scored on the left-out device's cases; per k the other device with the lowest mean log regret@k wins
    (among those covering the most cases). hit_rank, configs and pick_key are those of the smallest k's winner.
    """
    ks = tuple(ks)
    frame, parts = features.frame, []
    for name, train_filter, test_filter in folds(frame, "devices"):
        train, test = fold_rows(frame, "devices", train_filter, test_filter)
        per_source = {}
        for src in sorted(train["device_id"].unique().to_list()):
            mapping = test.select(CASE).unique().with_columns(
                pl.lit(src).alias("_src_device_id"), *[pl.col(c).alias(f"_src_{c}") for c in CASE if c != "device_id"])
            mapping = mapping.select(*CASE, *[f"_src_{c}" for c in CASE])
            scores = _from_source_case(train.filter(pl.col("device_id") == src), test, mapping)
            # a case the source did not measure: all its rows get _LAST (one _src_ key, no _v), so drop it
            known = test.select(CASE).with_columns(scores.alias("_s")).with_columns(
                (pl.col("_s") < 1e8).any().over(CASE).alias("_k"))["_k"].to_numpy()
            regrets = case_regrets(test, np.where(known, scores.to_numpy(), np.nan), ks)
            if not regrets.is_empty():
                per_source[src] = regrets
        if not per_source:
            continue
        most = max(r.height for r in per_source.values())
        full = {s: r for s, r in per_source.items() if r.height == most}
        chosen = {k: min(full, key=lambda s: (full[s][f"r{k}"].log().mean(), s)) for k in ks}
        first = full[chosen[min(ks)]]
        out = first.select(*CASE, "hit_rank", "configs", "pick_key")
        for k in ks:
            out = out.join(full[chosen[k]].select(*CASE, f"r{k}"), on=list(CASE), how="left", maintain_order="left")
        parts.append(out.select(*CASE, *[f"r{k}" for k in ks], "hit_rank", "configs", "pick_key").with_columns(
            pl.lit(ORACLE).alias("method"), pl.lit(name).alias("fold")))
    return pl.concat(parts) if parts else gather_folds([], ks)


def fixed_selections(features: KernelFeatures, models: Sequence[str]) -> dict | None:
    """The `fixed` protocol's settings: each model's selection() from one fit on every row of the kernel
    (None where a model has nothing to select)."""
    out = {}
    with fit_threads():
        for model in models:
            ranker = make_ranker(features, model)
            selection = getattr(ranker, "selection", None)
            if callable(selection):
                out[model] = ranker.fit(features.frame).selection()
    return out or None


def evaluate_kernel(
    features: KernelFeatures,
    split: str,
    ks: Sequence[int] = (1, 3, 5),
    models: Sequence[str] = (DEFAULT_MODEL,),
    baselines: bool = True,
    enough_cases: int | None = None,
    fixed: dict | None = None,
    pool: KernelPool | None = None,
) -> pl.DataFrame:
    """Per-case regrets of each model and baseline on one kernel: columns CASE, r{k}, hit_rank, configs, method, fold.

    With `enough_cases`, folds stop once that many cases are scored (folds interleave the shapes,
    so the first ones are a spread sample); by default every fold is scored. `fixed` maps a model
    to settings set as its rankers' `fixed` (CVEnsembleRanker.selection: no inner selection per
    fold). `pool` runs the folds in its workers (default: here, one after the other).
    """
    return gather_folds(submit_kernel(features, split, ks, models, baselines, enough_cases, fixed, pool), ks)


def submit_kernel(features: KernelFeatures, split: str, ks: Sequence[int] = (1, 3, 5),
                  models: Sequence[str] = (DEFAULT_MODEL,), baselines: bool = True,
                  enough_cases: int | None = None, fixed: dict | None = None,
                  pool: KernelPool | None = None, together: bool = False) -> list[Future]:
    """One future per scored fold of the kernel (fold_plan), each of _score_fold's (per-method frames, seconds).

    `together`: in a pool of workers, all the kernel's folds are one task (one future with every fold's
    frames), so they run in one worker and share its fit cache: leaving one device out leaves the other
    devices' rows as they are, so a per-device `transfer` model, and an inner fold's fits on the same
    devices, are made once per kernel rather than once per worker that scores one of its folds."""
    split = canonical_split(split)
    plan = fold_plan(features, split, enough_cases)
    args = (split, tuple(ks), tuple(models), baselines, fixed)
    if pool is None:
        pool = KernelPool({features.kernel: features}, jobs=1)
    if together and pool.parallel and len(plan) > 1:
        return [pool.submit(features.kernel, _score_folds, tuple(plan), *args)]
    return [pool.submit(features.kernel, _score_fold, i, *args) for i in plan]


def _score_folds(features: KernelFeatures, indices: Sequence[int], *args) -> tuple[list[pl.DataFrame], float]:
    """_score_fold of several folds, one after the other in one process: their frames and seconds together."""
    parts, seconds = [], 0.0
    for i in indices:
        frames, s = _score_fold(features, i, *args)
        parts += frames
        seconds += s
    return parts, seconds


def gather_folds(futures: Sequence[Future], ks: Sequence[int]) -> pl.DataFrame:
    """The per-case rows of submitted folds, in fold order."""
    parts = [part for f in futures for part in f.result()[0]]
    if not parts:
        return pl.DataFrame(schema={**{c: pl.String for c in CASE}, **{f"r{k}": pl.Float64 for k in ks},
                                    "hit_rank": pl.Int64, "configs": pl.Int64, "pick_key": pl.String,
                                    "method": pl.String, "fold": pl.String})
    return pl.concat(parts)


def _score_fold(features: KernelFeatures, index: int, split: str, ks: Sequence[int], models: Sequence[str],
                baselines: bool, fixed: dict | None = None) -> tuple[list[pl.DataFrame], float]:
    """Fold `index` of a kernel: every model and baseline fitted on its training rows, regrets on its test
    rows (one frame per method), and the seconds it took."""
    start = time.perf_counter()
    frame = features.frame
    name, train_filter, test_filter = folds(frame, split)[index]
    train, test = fold_rows(frame, split, train_filter, test_filter)
    seen = test["device_id"].is_in(train["device_id"].unique().to_list())
    scores: dict[str, np.ndarray] = {}
    with fit_threads():
        for model in models:
            ranker = make_ranker(features, model)
            if fixed and fixed.get(model):
                ranker.fixed = fixed[model]
            if hasattr(ranker, "only"):  # an ensemble fits only the setting this fold's test rows use
                ranker.only = "seen" if seen.all() else "unseen" if not seen.any() else None
            scores[model] = ranker.fit(train).score(test)
        if baselines:
            scores.update({k: v.to_numpy() for k, v in baseline_scores(features, train, test).items()})
    return [case_regrets(test, s, ks).with_columns(pl.lit(method).alias("method"), pl.lit(name).alias("fold"))
            for method, s in scores.items()], time.perf_counter() - start


def evaluate_features(
    features: dict[str, KernelFeatures],
    split: str,
    ks: Sequence[int] = (1, 3, 5),
    models: Sequence[str] = (DEFAULT_MODEL,),
    baselines: bool = True,
    label_model: bool = False,
    noise: NoiseBands | None = None,
    jobs: int | None = None,
    pool: KernelPool | None = None,
    protocol: str | None = None,
    oracle: bool = True,
    recorded: Mapping[str, tuple[str, pl.DataFrame]] | None = None,
    keep: dict[str, pl.DataFrame] | None = None,
) -> dict:
    """evaluate() on prepared feature frames (one per kernel); `noise` gives the tie bands
    (None: no repeats known, so the fallback band, and the result says so); `jobs` worker
    processes score the folds (KernelPool, which checks it; None: one per CPU, 1: in this process),
    or an entered `pool` does (its features are set to these). `recorded` maps a kernel to (model id,
    the per-case rows train recorded: heldout.recorded_cases), which stand in for its folds. `keep`: the
    kernels whose fitted folds are to be recorded; their folds are scored at HELDOUT_KS too, and each one's
    per-case rows at those ks (train's records: heldout.record_cases) are put there."""
    split = canonical_split(split)
    ks = tuple(int(k) for k in ks)
    if not ks or min(ks) < 1:
        raise EvaluationError("k must be at least 1")
    models = tuple(models)
    unknown = [m for m in models if m not in MODEL_VARIANTS]
    if unknown:
        raise EvaluationError(f"unknown model {unknown[0]!r}; expected one of {', '.join(MODEL_VARIANTS)}")
    if not models and not baselines:
        raise EvaluationError("nothing to evaluate: name a model or keep the baselines")
    labels = {models[0]: "model"} if label_model and len(models) == 1 else {}
    noise = noise if noise is not None else NoiseBands()
    protocol = check_protocol(protocol, split)
    oracle = oracle and baselines and split == "devices"
    recorded = recorded or {}
    rows = []
    with (KernelPool(features, jobs) if pool is None else contextlib.nullcontext(pool)) as pool:
        pool.attach(features)
        # every kernel's folds at once, the largest kernels first (the longest tasks start first); under
        # left-out devices a kernel's folds run in one worker, sharing its fits (submit_kernel's `together`)
        order = sorted((k for k in features if k not in recorded), key=lambda k: -features[k].frame.height)
        together = split == "devices" and len(order) >= 2 * pool.jobs
        fixed = {k: fixed_selections(features[k], models) for k in order} if protocol == "fixed" else {}
        keep = {} if keep is None else keep
        fold_ks = {k: tuple(sorted(set(ks) | set(HELDOUT_KS))) if k in keep else ks for k in order}
        futures = {k: submit_kernel(features[k], split, fold_ks[k], models, baselines, fixed=fixed.get(k), pool=pool,
                                    together=together) for k in order}
        for kernel, f in features.items():
            if kernel in recorded:
                per_case = recorded[kernel][1].select(gather_folds([], ks).columns)
                if not baselines:
                    per_case = per_case.filter(pl.col("method").is_in(models))
            else:
                per_case = gather_folds(futures[kernel], fold_ks[kernel])
                if kernel in keep:
                    keep[kernel] = per_case.select(gather_folds([], HELDOUT_KS).columns)
                    per_case = per_case.select(gather_folds([], ks).columns)
            if oracle:
                per_case = pl.concat([per_case, oracle_device(f, ks)])
            per_case = tied_regrets(per_case, f.frame, noise, ks)
            methods = list(models) + (baseline_names(f) if baselines else []) + ([ORACLE] if oracle else [])
            rows += regret_rows(per_case, kernel, ks, methods, labels)
    return {"split": split, "ks": list(ks), "models": list(models), "protocol": protocol, "results": rows,
            "floors": {m: d for m, d in FLOORS.items() if oracle}, "noise": noise.summary(),
            "reused": {k: recorded[k][0] for k in features if k in recorded}}


def evaluate(store, split: str, kernels=None, ks: Sequence[int] = (1, 3, 5),
             models: Sequence[str] = (DEFAULT_MODEL,), baselines: bool = True, label_model: bool = False,
             jobs: int | None = None, protocol: str | None = None, oracle: bool = True,
             refit: bool = False, features: dict[str, KernelFeatures] | None = None,
             pool: KernelPool | None = None) -> dict:
    """Regret@k of the model(s) and the baselines on a split (`shapes` or `devices`) of the store's ok measurements.

    Returns {"split", "ks", "models", "results", "noise"}: results are flat dicts {kernel, device
    (None when pooled), method, k, regret_geomean, regret_p95, hit_2pct, cases, regret_tied_geomean,
    hit_tied, tied_band, tied_band_source}; a model's method is its variant name, or "model" with
    `label_model` and one model (the CLI's contract); "noise" describes the tie bands (the store's
    repeats, or the fallback). `jobs`: worker processes for the folds (None: one per CPU; 1: none).
    `protocol` (check_protocol): `nested` (default) or `fixed`. Under `devices` the results also hold the
    after-the-fact floor ORACLE (`oracle`, with the baselines), and "floors" says what it is.

    A kernel whose newest registered model is the one model asked for, and whose rows are those it was
    trained on, is scored from the held-out cases train recorded for this split (models/heldout.py: the
    same numbers, no fit); "reused" maps each such kernel to that model id. `refit` fits every fold anyway.
    Folds fitted for a kernel's newest registered model of that variant, on the rows it was trained on, with
    the baselines, are recorded with it when the store is writable (heldout.recording_model), as train
    records its own, so the next evaluation or report reads them.

    `features` (kernel_features_of(store, kernels), already built) and an entered `pool` let a caller that
    runs several steps on the same rows (the main job) build the features and start the workers once.
    """
    split = canonical_split(split)
    protocol = check_protocol(protocol, split)
    jobs = check_jobs(jobs)  # before the features are read, which takes a while on a big store
    models = tuple(models)
    ks = tuple(int(k) for k in ks)
    may = {} if refit or len(models) != 1 else recorded_models(store, kernels, split, protocol, models[0])

    def run(features: dict[str, KernelFeatures], pool: KernelPool, recorded: dict | None = None) -> dict:
        if recorded is None:
            recorded = recorded_for(store, features, may, split, protocol, models[0], ks) if may else {}
        owners = {k: row for k, f in features.items() if k not in recorded and baselines and len(models) == 1
                  and (row := recording_model(store, f, protocol, models[0])) is not None}
        keep = dict.fromkeys(owners)
        result = evaluate_features(features, split, ks, models, baselines, label_model, noise=noise_bands(store),
                                   pool=pool, protocol=protocol, oracle=oracle, recorded=recorded, keep=keep)
        for kernel, row in owners.items():  # what was fitted for the registered model: read next time
            if keep[kernel] is not None and not keep[kernel].is_empty():
                record_cases(store, row["model_id"], row["data_fingerprint"], split, keep[kernel])
        return result

    if features is not None and pool is not None:
        return run(features, pool)
    if may and (kernels is None or set(may) >= set([kernels] if isinstance(kernels, str) else kernels)):
        # every kernel may be read from records: read the features first, then start workers only for what is not
        features = kernel_features_of(store, kernels)
        recorded = recorded_for(store, features, may, split, protocol, models[0], ks)
        rest = {k: f for k, f in features.items() if k not in recorded}
        with KernelPool(None, jobs, rows=sum(f.frame.height for f in rest.values())) as pool:
            return run(features, pool, recorded)
    with KernelPool(None, jobs, rows=ok_rows(store, kernels)) as pool:  # workers start while the features are read
        return run(kernel_features_of(store, kernels), pool)


def recorded_for(store, features: Mapping[str, KernelFeatures], may: Mapping[str, str], split: str,
                 protocol: str, model: str, ks: Sequence[int]) -> dict[str, tuple[str, pl.DataFrame]]:
    """Kernel -> recorded_cases of the kernels that have records (`may`: recorded_models), where they still hold."""
    out = {}
    for kernel in may:
        if kernel in features:
            found = recorded_cases(store, features[kernel], split, protocol, model, ks)
            if found is not None:
                out[kernel] = found
    return out


def ok_rows(store, kernels=None, devices=None) -> int:
    """The store's ok measurements of these kernels on these devices (None: all): what decides, before the
    features are built, whether a KernelPool uses workers."""
    kernels = None if kernels is None else set([kernels] if isinstance(kernels, str) else kernels)
    devices = None if devices is None else set([devices] if isinstance(devices, str) else devices)
    return sum(r["by_status"].get("ok", 0) for r in store.summary()
               if (kernels is None or r["kernel"] in kernels) and (devices is None or r["device"] in devices))


def kernel_features_of(store, kernels=None, devices=None) -> dict[str, KernelFeatures]:
    """The store's feature frames (of some kernels, measured on some devices), with one-line errors for
    an empty store or a kernel it has no ok measurement of."""
    wanted = None if kernels is None else ([kernels] if isinstance(kernels, str) else list(kernels))
    devices = None if devices is None else ([devices] if isinstance(devices, str) else list(devices))
    if devices:  # a device filter naming a device nothing was measured on is a typo, not a narrower selection
        stored = {r["device"] for r in store.summary()}
        unknown = [d for d in devices if d not in stored]
        if unknown:
            raise EvaluationError(f"no measurements of device(s) {', '.join(unknown)} in {store.path}; it has "
                                  f"{', '.join(sorted(stored)) or 'none'}")
    specs = devices_frame(store)  # first: completes any pending result before the Arrow read
    measurements = measurements_frame(store, wanted, device=devices)
    known = set(measurements["kernel"].unique().to_list())
    missing = sorted(set(wanted or ()) - known)
    if not known or missing:
        have = sorted({r["kernel"] for r in store.summary() if r["by_status"].get("ok")
                       and (not devices or r["device"] in devices)})
        where = f" on device(s) {', '.join(devices)}" if devices else ""
        if not have:
            raise EvaluationError(f"the store has no ok measurements{where}: run `zmlx-pipeline run`, `import` or "
                                  "`collect` first, or pass another --db")
        raise EvaluationError(f"no ok measurements of kernel(s) {', '.join(missing)}{where}; "
                              f"the store has {', '.join(have)}")
    return build_features(measurements, specs, wanted)
