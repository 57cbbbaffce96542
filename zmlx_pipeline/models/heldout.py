"""The held-out cases train records with each model, and when evaluate and report may use them instead of
fitting the same folds again.

Train scores every fold of one split (held-out shapes, else left-out devices) under the `nested`
protocol, the model and every baseline, and records each case's regret@1..10, hit_rank, configs
and first pick in the store (`heldout_cases`), tied to the model id and the data fingerprint of
the rows it was fitted on. Those are the very per-case rows evaluate and report compute for that
split, so while the kernel's newest registered model is of the asked variant, made by this version
of the package, and the store's rows still have its fingerprint, they are read instead of refitted.
Any new, changed or removed row changes the fingerprint, and the folds are fitted again. Train records the
left-out-devices split too (models/train.py recorded_splits), and an evaluation that fitted the folds of the
registered variant on the rows it was trained on records them as train would (recording_model), so the next
evaluate or report reads them.
"""

from __future__ import annotations

import hashlib

import polars as pl

from zmlx_pipeline.data.store import HELDOUT_KS
from zmlx_pipeline.models.features import CASE, KernelFeatures

PROTOCOL = "nested"  # the protocol train scores its held-out folds under (folds.check_protocol)
FINGERPRINT_KEYS = ("device_id", "kernel", "kernel_version", "dtype", "shape_key", "config_key")


def data_fingerprint(frame: pl.DataFrame) -> str:
    """"sha256:<16 hex>" over training rows' keys and median times, independent of row order."""
    df = frame.select(*FINGERPRINT_KEYS, "median_us").sort(list(FINGERPRINT_KEYS))
    h = hashlib.sha256()
    for col in FINGERPRINT_KEYS:
        h.update("\x1f".join(df[col].to_list()).encode())
        h.update(b"\x1e")
    h.update(df["median_us"].cast(pl.Float64).to_numpy().astype("<f8").tobytes())
    return "sha256:" + h.hexdigest()[:16]


def record_cases(store, model_id: str, fingerprint: str, split: str, per_case: pl.DataFrame) -> int:
    """Store a model's per-case rows of one split (evaluate_kernel's frame at ks HELDOUT_KS); returns the rows."""
    return store.add_heldout_cases(model_id, fingerprint, split, PROTOCOL, per_case.with_columns(
        pl.col("hit_rank").cast(pl.Int64), pl.col("configs").cast(pl.Int64)))


def recorded_cases(store, features: KernelFeatures, split: str, protocol: str, model: str,
                   ks=HELDOUT_KS) -> tuple[str, pl.DataFrame] | None:
    """(model id, per-case rows) that train recorded for the kernel's newest registered model, as
    evaluate_kernel would compute them at `ks` with the baselines, in its order; None when they may not
    stand in for a fresh evaluation (another variant, protocol, package version or k, rows changed since)."""
    if protocol != PROTOCOL or not set(ks) <= set(HELDOUT_KS):
        return None
    row = _current_model(store, features, model)
    if row is None:
        return None
    table = store.heldout_cases(row["model_id"], split, protocol)
    if table.num_rows == 0:
        return None
    cases = pl.from_arrow(table)
    if cases["data_fingerprint"].n_unique() != 1 or cases["data_fingerprint"][0] != row["data_fingerprint"]:
        return None
    # evaluate's order: fold by fold, each method's cases sorted (a geometric mean sums in this order)
    fold_order = {name: i for i, name in enumerate(sorted(cases["fold"].unique().to_list()))}
    cases = cases.with_columns(pl.col("fold").replace_strict(fold_order, return_dtype=pl.Int64).alias("_fold"))
    cases = cases.sort(["_fold", "method", *CASE])
    return row["model_id"], cases.select(
        *CASE, *[pl.col(f"r{k}") for k in ks], pl.col("hit_rank").cast(pl.Int64), pl.col("configs").cast(pl.Int64),
        "pick_key", "method", "fold")


def recorded_models(store, kernels, split: str, protocol: str, model: str) -> dict[str, str]:
    """Kernel -> the model id whose recorded cases under `split` may be read: the kernel's newest registered
    model is of variant `model` and has some (recorded_cases still checks the rows). `kernels` None: every
    kernel in the registry. Cheap: asked before the features are built, to decide on worker processes."""
    if protocol != PROTOCOL:
        return {}
    newest: dict[str, dict] = {}
    for row in store.models():  # newest first
        newest.setdefault(row["kernel_filter"], row)
    wanted = newest if kernels is None else [k for k in ([kernels] if isinstance(kernels, str) else kernels)]
    out = {}
    for kernel in wanted:
        row = newest.get(kernel)
        if row is not None and (row.get("params") or {}).get("model") == model and \
                store.heldout_count(row["model_id"], split, protocol):
            out[kernel] = row["model_id"]
    return out


def recording_model(store, features: KernelFeatures, protocol: str, model: str) -> dict | None:
    """The registry row of the kernel's newest model when a fresh nested evaluation of variant `model` on
    `features` (with every baseline) is what train records for that model: same variant and package version,
    rows with its data fingerprint, a writable store. None otherwise (nothing is recorded)."""
    if protocol != PROTOCOL or getattr(store, "read_only", False):
        return None
    return _current_model(store, features, model)


def _current_model(store, features: KernelFeatures, model: str) -> dict | None:
    """The registry row of the kernel's newest model if it is of variant `model`, made by this package
    version from rows with `features`' data fingerprint; None otherwise."""
    from zmlx_pipeline import __version__

    rows = store.models(kernel=features.kernel)
    if not rows:
        return None
    row = rows[0]
    if (row.get("params") or {}).get("model") != model or (row.get("versions") or {}).get("zmlx-pipeline") != __version__:
        return None
    return row if row.get("data_fingerprint") == data_fingerprint(features.frame) else None
