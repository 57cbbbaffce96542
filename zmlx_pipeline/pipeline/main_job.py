"""The main job, end to end on the committed data: ingest, train, evaluate, publish, look up.

On a machine with a GPU backend, `collect` (a callable) runs first, so the same command also
measures this machine before learning from everything.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from zmlx_pipeline.core.errors import ZmlxPipelineError

#: a few lookups printed at the end: what a kernel wrapper would launch
DEFAULT_LOOKUPS: tuple[tuple[str, dict[str, int], str, str | None], ...] = (
    ("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", "nvidia-h100-sxm"),
    ("softmax", {"rows": 2048, "cols": 32768}, "bfloat16", "nvidia-h200"),
    ("matmul", {"M": 16, "N": 4096, "K": 4096}, "float16", "nvidia-h200@66sm"),
    ("swiglu", {"rows": 512, "cols": 11008}, "float16", "nvidia-a100-sxm4-80gb"),
    ("rmsnorm", {"rows": 1, "cols": 4096}, "float16", "apple-m4-max-40c"),
)


class MainJobError(ZmlxPipelineError):
    "A learning step (train, evaluate, publish) refused the data; the message names the data directory"


#: each step's share of the main job's time on the committed data (2 cores), for the estimate of the time left
#: (train scores both splits; each evaluation reads train's records)
STEP_SHARES = {"ingest": 0.01, "train": 0.71, "evaluate": 0.005, "publish": 0.265, "lookup": 0.005}


def score_table(result: dict, split: str) -> list[dict]:
    """Per kernel (pooled over devices): the model's regret@1/3/5 and the best baseline at k=1, each
    also noise-aware (`model_tied@1`, `best_baseline_tied@1`: the lowest tied score of any baseline).
    Floors (evaluate's `oracle_device`, chosen with the left-out device's own times) are not baselines."""
    rows: dict[str, dict] = {}
    best: dict[str, tuple[float, str]] = {}
    best_tied: dict[str, float] = {}
    for r in result["results"]:
        if r["device"] is not None or r["regret_geomean"] is None:
            continue
        row = rows.setdefault(r["kernel"], {"split": split, "kernel": r["kernel"]})
        if r["method"] == "model":
            row[f"model@{r['k']}"] = r["regret_geomean"]
            if r["k"] == 1:
                row["cases"] = r["cases"]
                row["hit_2pct"] = r["hit_2pct"]
                row["model_tied@1"] = r.get("regret_tied_geomean")
                row["tie_band"] = r.get("tied_band_source")
        elif r["k"] == 1 and r["method"] not in result.get("floors", {}):  # a floor looks at the answer: no rival
            if r["kernel"] not in best or r["regret_geomean"] < best[r["kernel"]][0]:
                best[r["kernel"]] = (r["regret_geomean"], r["method"])
            tied = r.get("regret_tied_geomean")
            if tied is not None and tied < best_tied.get(r["kernel"], float("inf")):
                best_tied[r["kernel"]] = tied
    for kernel, row in rows.items():
        if kernel in best:
            row["best_baseline@1"], row["baseline"] = best[kernel]
        if kernel in best_tied:
            row["best_baseline_tied@1"] = best_tied[kernel]
    return list(rows.values())


def check_kernels(store, data_dir: str | os.PathLike, kernels: Sequence[str] | None) -> None:
    """MainJobError unless every kernel asked for is in the store or in the shards of `data_dir` (read from their
    kernel column only): a typo is refused before the ingest changes the store."""
    if not kernels:
        return
    from zmlx_pipeline.data.shards import shard_paths

    known = {r["kernel"] for r in store.summary()}
    if any(k not in known for k in kernels):
        import polars as pl

        try:
            for path in shard_paths(data_dir):
                with open(path, "rb") as file:  # a file, never a glob: `h200[1].parquet` is that one shard
                    known.update(pl.read_parquet(file, columns=["kernel"])["kernel"].unique().to_list())
        except Exception:  # noqa: BLE001 - a shard that cannot be read is the ingest's to refuse, with its reason
            return
    missing = [k for k in kernels if k not in known]
    if missing:
        raise MainJobError(f"no kernel {', '.join(map(repr, missing))} in {data_dir} or {store.path}; "
                           f"they hold {', '.join(sorted(k for k in known if k)) or 'none'}")


def main_job(
    store,
    data_dir: str | os.PathLike,
    bundle_dir: str | os.PathLike,
    *,
    kernels: Sequence[str] | None = None,
    splits: Sequence[str] = ("shapes", "devices"),
    collect: Callable[[], Any] | None = None,
    lookups: Sequence[tuple] = DEFAULT_LOOKUPS,
    progress: Callable[[str], None] | None = None,
    model: str | None = None,
) -> dict[str, Any]:
    """Run the loop and return what each step did; every figure comes from the store's real rows.
    `model`: the variant to train and score (None: the default). `progress` gets a line as each step starts and
    ends (elapsed, an estimate of the time left by STEP_SHARES) and publish's lines per kernel, indented.

    Train and both evaluations share one set of feature frames and one pool of worker processes, and both
    splits are read from the cases train recorded (it scores the held-out shapes and the left-out devices
    with the final fits, its workers sharing every fit of the same rows) rather than fitted again
    (models/heldout.py)."""
    from zmlx_pipeline.data.shards import ingest_shards
    from zmlx_pipeline.models.evaluate import evaluate, kernel_features_of, ok_rows
    from zmlx_pipeline.models.pool import KernelPool
    from zmlx_pipeline.models.train import train_models
    from zmlx_pipeline.models.variants import DEFAULT_MODEL
    from zmlx_pipeline.progress import Steps
    from zmlx_pipeline.publish import publish

    say = progress or (lambda _msg: None)
    model = DEFAULT_MODEL if model is None else model
    out: dict[str, Any] = {"timings_s": {}, "model": model}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        value = fn()
        out["timings_s"][name] = round(time.perf_counter() - t, 1)
        return value

    if collect is not None:  # runs for its own budget: the estimate covers the learning steps after it
        say("collect")
        out["collect"] = timed("collect", collect)
    names = ["ingest", "train", *(f"evaluate {s}" for s in splits), "publish", "lookup"]
    share = {n: STEP_SHARES.get(n.split()[0], 0.0) for n in names}
    steps = Steps(say, "run", sum(share.values()), parts=len(names))

    def step(name: str, fn: Callable[[], Any]) -> Any:
        steps.note(f"{name} (step {steps.count + 1} of {len(names)})")
        try:
            value = timed(name, fn)
        except ZmlxPipelineError as exc:
            if name in ("ingest", "lookup"):
                raise
            # what the learning steps refuse comes from the data: say which data
            first = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise MainJobError(f"{first} (data from {data_dir})") from exc
        steps.done(f"{name} done in {out['timings_s'][name]} s", share[name])
        return value

    def sub(message: str) -> None:
        say(f"  {message}")

    out["ingest"] = step("ingest", lambda: ingest_shards(store, [data_dir]))
    features: dict = {}

    def train(pool: KernelPool) -> list[dict]:
        features.update(kernel_features_of(store, kernels))
        pool.attach(features)
        return train_models(store, kernels, model=model, features=features, pool=pool)

    with KernelPool(None, None, rows=ok_rows(store, kernels)) as pool:  # the workers start while features are built
        trained = step("train", lambda: train(pool))
        out["train"] = [{"kernel": r["kernel_filter"], "model_id": r["model_id"], "rows": r["params"]["rows"],
                         "prune_k": r["scores"].get("prune_k")} for r in trained]
        out["scores"] = []
        for split in splits:
            result = step(f"evaluate {split}", lambda split=split: evaluate(
                store, split, kernels=kernels, ks=(1, 3, 5), models=(model,), label_model=True, features=features,
                pool=pool))
            out["scores"].extend(score_table(result, split))
    bundle = step("publish", lambda: publish(store, bundle_dir, kernels=kernels, evaluate=False, progress=sub))
    out["bundle"] = {k: bundle[k] for k in ("bundle_id", "path") if k in bundle}
    out["lookups"] = step("lookup", lambda: _lookups(Path(bundle["path"]), lookups))
    return out


def _lookups(bundle_path: Path, lookups: Sequence[tuple]) -> list[dict]:
    """Answers of the runtime, loading the bundle just published as a kernel wrapper would."""
    from zmlx_pipeline.runtime import load_bundle
    from zmlx_pipeline.runtime.lookup import predicted_or_default

    load_bundle(bundle_path, strict=True)
    rows = []
    for kernel, shape, dtype, device in lookups:
        p = predicted_or_default(kernel, shape, dtype, device=device)  # `run -k` publishes only some kernels
        rows.append({"kernel": kernel, "device": device, "dtype": dtype, "shape": shape, "config": p.config,
                     "evidence": p.evidence, "expected_regret": p.expected_regret, "note": p.note})
    return rows
