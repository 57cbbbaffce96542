"""What goes into a bundle: per-device lookup tables, the kernels' config lists, the device profiles.

For each kernel with a model, every published device (each catalog chip and each device in the
store) gets, per dtype and shape bucket, the model's ranked configs (the best STORE_K, so the
runtime can still drop ones illegal for an exact shape), the predicted time of the pick (never below
the roofline bound of the shape on that chip, where a tree model can guess below it) and the
expected regret; every shape measured on a device also gets its measured ranking. Buckets are
the shapes of the kernel's grids and the measured shapes, each dimension rounded to a power of
two (one representative shape per bucket, the one closest to the bucket's centre). Devices that were
measured also get the model's ranking at every power-of-two point of a built-in kernel's grid box that
no bucket holds (`between`): the lookup merges it with the nearest buckets' lists for a shape there,
so an autotuner between grid shapes also times what the model ranks at its own point. Built-in
kernels (and any kernel whose registered spec matches the measured parameters) rank only the
configs legal on that device and shape; imported kernels rank the configs that were measured, less
those that failed on that device (or, for one never measured, on the measured chips of its family)
and never ran there (failed_configs). Every entry, measured ones too, also keeps to the rule a lookup
adds to the constraints (runtime/lookup.py thread_rule: the threadgroup within the device's
max_threads where no constraint reads it), so none names a config the runtime would not launch there;
where no config is legal there is no entry, and the lookup answers evidence `none`; a device left with no
entry of a kernel is named in the summary's `no_entries`, with why (runtime/lookup.py no_legal_reason).

A device never measured answers from the measured chip nearest it (publish/transfer.py): its entries
say `predicted` when that chip is of its own architecture family, `extrapolated` otherwise, carry the
matching held-out regret (left-out devices, or left-out families: None when only one family was
measured) and the source's time moved by the roofline bound of the bucket's shape on both chips.
kernels.json records, per kernel, where each such device answers from (`transfer`), the measured
range of each dim (`measured_range`) and the spec's bytes and flops as terms (`work`), so the runtime
can mark a shape outside that range and move its time by the work.

The profile table (every device) holds the learned default threadgroup per kernel class and a
ZMLX-style row (default threadgroup, three candidates), with evidence: `measured` (from this
device's measurements), `predicted` / `extrapolated` (from the model, for a device never measured,
from a measured chip of its own family / of another family) or `default` (the catalog's default
threadgroup: no model covers that class).

Why one long module: the per-kernel tables (build_kernel), the moved times of devices never
measured and the assembly of the files all read the one KernelTables; the profiles drawn from them
are in publish/profiles.py.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from typing import Any, Callable, Iterable, Mapping, Sequence

import polars as pl

from zmlx_pipeline.data.catalog import mlx_not_on, mlx_runs_on
from zmlx_pipeline.data.records import DTYPES
from zmlx_pipeline.progress import Steps
from zmlx_pipeline.publish.legal import LegalConfigs
from zmlx_pipeline.publish.models import KernelModel, ModelSet
from zmlx_pipeline.models.features import CASE
from zmlx_pipeline.publish.predict import (
    all_devices_frame,
    candidate_rows,
    featurize,
    predict_log_time,
    score_rows,
    top_per_case,
)
from zmlx_pipeline.core.constraints import ConstraintSet, limit_values
from zmlx_pipeline.publish.profiles import build_autotune_v3, build_profiles, seed_table
from zmlx_pipeline.publish.transfer import (
    EVIDENCE_OTHER_FAMILY,
    EVIDENCE_SAME_FAMILY,
    family_key,
    kernel_work,
    scaled_time,
    source_device,
    work_of,
)
from zmlx_pipeline.core.dtypes import DTYPE_BYTES
from zmlx_pipeline.runtime.lookup import bucket_of, no_legal_reason, thread_rule
from zmlx_pipeline.runtime.roofline import bound_s

#: ranked configs kept per entry (at least the pruning k), and the most the lookup-path replay
#: (publish/runtime_k.py) tries; 16 rather than 8 moved no kernel's replayed hit share by more than 0.02
#: (the tuner's fifth of the legal configs binds first), but lets a large config space time more
STORE_K = 16
#: candidate rows scored at once (bounds memory on large config spaces)
CHUNK_ROWS = 200_000
#: the dimension a kernel's threadgroup spans, for the per-row-length threadgroup tables
ROW_DIMS = ("cols", "hidden", "experts", "N", "K")
Progress = Callable[[str], None]


def _round(x: float | None, digits: int = 4) -> float | None:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return None
    return float(f"{x:.{digits}g}")


def matching_spec(features):
    """The registered KernelSpec of a modelled kernel when its dims and parameters match the data; else None."""
    try:
        from zmlx_pipeline.kernels.registry import UnknownKernel, get_kernel

        spec = get_kernel(features.kernel)
    except (UnknownKernel, ImportError, ValueError):
        return None
    if set(spec.shape_grid.dims) != set(features.shape_dims) or set(spec.params) != set(features.params):
        return None
    return spec


def device_records(store) -> dict[str, dict]:
    """Every publishable device (catalog and store) with its catalog/store facts; a device registered in the store
    (`devices add`) has its record's, fp32 peak included, as a catalog chip has the catalog's."""
    from zmlx_pipeline.data.catalog import load_catalog

    out: dict[str, dict] = {}
    for spec, catalogued in [*((s, True) for s in load_catalog()), *((s, False) for s in store.registered_devices())]:
        row = spec.as_row()
        row["device_id"] = row.pop("id")
        row["in_catalog"] = catalogued
        if not catalogued:
            row["aliases"] = list(spec.aliases)
        out.setdefault(row["device_id"], row)  # a catalog chip's id stays the catalog's
    for row in store.devices():
        merged = {**out.get(row["device_id"], {}), **{k: v for k, v in row.items() if v is not None}}
        merged.setdefault("in_catalog", False)
        out[row["device_id"]] = merged
    return out


def resolve_devices(store, devices: Sequence[str]) -> list[str]:
    """The ids of the devices a person named for publish's lookup tables (a catalog id, a device name as people
    write it, a device registered in the store by its id or name, or a device the store holds though the catalog
    lacks it, a measured core limit such as `nvidia-h200@66sm` included), checked before any work: UnknownDevice for
    one neither knows, AmbiguousDevice (listing the ids) for a name of several chips. A core limit the store never
    measured is refused saying so: a table is made for a chip or a measured device, and a lookup answers such a limit
    from its chip's table (or its nearest measured limit), so the chip's own id is what to publish."""
    from zmlx_pipeline.data.catalog import CORE_LIMITED_ID, AmbiguousDevice, UnknownDevice, resolve_device

    records = device_records(store)
    registered = store.registered_devices()
    out: list[str] = []
    for name in devices:
        if name in records:
            out.append(name)
            continue
        try:
            spec = resolve_device(name, registered)
        except AmbiguousDevice as exc:
            raise UnknownDevice(f"device {name!r} does not name one chip; it may be {', '.join(exc.candidates)}") \
                from None
        except UnknownDevice:
            limited = CORE_LIMITED_ID.fullmatch(name)
            if limited is not None and limited.group(1) in records:  # a limit its chip cannot have: the reason
                raise
            spec = None
        if spec is not None and spec.core_limited_from and spec.id not in records:
            raise UnknownDevice(f"device {name!r} is a core limit of {spec.core_limited_from} that the store holds no "
                                "measurements of, which publish cannot build a table for (a lookup answers it from "
                                f"its chip's table or nearest measured limit): give --device {spec.core_limited_from}")
        if spec is None or spec.id not in records:
            raise UnknownDevice(f"unknown device {name!r}: neither a catalog id, a catalog device name nor a device "
                                "of the store; see zmlx-pipeline devices")
        out.append(spec.id)
    return list(dict.fromkeys(out))


def _limits_key(row: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """A device's constraint limits as a hashable key (devices alike in them share legal-config lists)."""
    return tuple(sorted(limit_values(row).items()))


def _bucket_shapes(dims: Sequence[str], shapes: Iterable[Mapping[str, int]]) -> dict[tuple[int, ...], dict]:
    """One representative shape per bucket: the shape closest (log2) to the bucket's power-of-two centre."""
    best: dict[tuple[int, ...], tuple[float, dict]] = {}
    for s in shapes:
        values = [int(s[d]) for d in dims]
        b = bucket_of(values)
        dist = sum((math.log2(v) - e) ** 2 for v, e in zip(values, b))
        if b not in best or dist < best[b][0] - 1e-12:
            best[b] = (dist, {d: int(s[d]) for d in dims})
    return {b: v[1] for b, v in sorted(best.items())}


def _between_shapes(dims: Sequence[str], shapes: Iterable[Mapping[str, int]],
                    taken: set[tuple[int, ...]]) -> list[dict]:
    """Every power-of-two point inside the shapes' bounding box (per dimension, log2-rounded) whose bucket
    no shape holds: where an unseen shape falls between the grid's buckets."""
    shapes = list(shapes)
    if not shapes or not dims:
        return []
    exps = [[bucket_of([int(s[d])])[0] for s in shapes] for d in dims]
    axes = [range(min(e), max(e) + 1) for e in exps]
    return [{d: 1 << e for d, e in zip(dims, point)} for point in itertools.product(*axes) if point not in taken]


class KernelTables:
    """The published tables of one kernel: its config list, and per device/dtype the measured and bucket entries."""

    def __init__(self, kernel: str, dims: Sequence[str]) -> None:
        self.kernel = kernel
        self.dims = list(dims)
        self.config_index: dict[str, int] = {}
        self.configs: list[dict] = []
        self.weight: dict[int, float] = defaultdict(float)
        # device -> dtype -> {"buckets": {...}, "measured": {...}}
        self.entries: dict[str, dict[str, dict[str, dict]]] = defaultdict(lambda: defaultdict(
            lambda: {"buckets": {}, "measured": {}}))
        self.bucket_shapes: dict[str, dict] = {}
        #: device -> why it has no entry of this kernel (no config is legal there), for publish to say; not written
        self.unserved: dict[str, str] = {}

    def plain(self) -> "KernelTables":
        """The same tables with plain dicts for entries (the nested defaults cannot be pickled), for a worker
        to send back; lookups of devices or dtypes that were never filled must then use `in` or .get."""
        self.entries = {d: {t: dict(kinds) for t, kinds in per.items()} for d, per in self.entries.items()}
        self.weight = dict(self.weight)
        return self

    def index(self, config_key: str, config: dict | str) -> int:
        """The config's place in the list (added when new); `config` as a dict or its JSON text (parsed only
        when new: most rows name a config already listed)."""
        i = self.config_index.get(config_key)
        if i is None:
            i = self.config_index[config_key] = len(self.configs)
            self.configs.append(json.loads(config) if isinstance(config, str) else config)
        return i

    def key(self, shape: Mapping[str, int]) -> str:
        return ",".join(str(int(shape[d])) for d in self.dims)

    def bucket_key(self, shape: Mapping[str, int]) -> str:
        return ",".join(str(e) for e in bucket_of(int(shape[d]) for d in self.dims))


def table_entry(ranked: list[int], time_us: float | None, regret: float | None, evidence: str, n_legal: int) -> dict:
    """A table entry with named fields (runtime/lookup.py ENTRY_FIELDS): its best config is the first ranked."""
    return {"best": ranked[0], "ranked": ranked, "time_us": time_us, "expected_regret": regret, "evidence": evidence,
            "n_legal": n_legal}


def _measured(km: KernelModel, tables: KernelTables, store_k: int,
              allowed: Callable[[str, str, str | dict], bool] | None = None) -> set[str]:
    """Measured rankings of every (device, dtype, shape) of the training data, less the configs `allowed(device,
    config_key, config_json)` refuses (the runtime's thread rule); returns the measured devices."""
    import json

    frame = km.features.frame.sort(["device_id", "dtype", "shape_key", "median_us", "config_key"])
    cases = frame.group_by(["device_id", "dtype", "shape_key"], maintain_order=True).agg(
        pl.col("shape").first(), pl.col("config_key"), pl.col("config"), pl.col("median_us"))
    for row in cases.iter_rows(named=True):
        ranked = list(zip(row["config_key"], row["config"], row["median_us"]))
        if allowed is not None:
            ranked = [r for r in ranked if allowed(row["device_id"], r[0], r[1])]
            if not ranked:  # no measured config may launch there: the lookup answers from the buckets
                continue
        idx = [tables.index(k, c) for k, c, _ in ranked[:store_k]]
        shape = json.loads(row["shape"])
        tables.entries[row["device_id"]][row["dtype"]]["measured"][tables.key(shape)] = table_entry(
            idx, _round(ranked[0][2]), 1.0, "measured", len(ranked))
    return set(frame["device_id"].unique().to_list())


def _thread_check(rule: Sequence[str],
                  devices: Mapping[str, Mapping[str, Any]]) -> Callable[[str, str, str | dict], bool]:
    """`allowed(device, config_key, config_json)`: whether the runtime's thread rule (runtime/lookup.py thread_rule)
    lets the config launch on the device, judged as a lookup judges it (core ConstraintSet, the device's limits)."""
    check = ConstraintSet(rule)
    seen: dict[tuple, bool] = {}

    def allowed(device: str, key: str, config: str | dict) -> bool:
        limits = _limits_key(devices.get(device) or {})
        verdict = seen.get((limits, key))
        if verdict is None:
            verdict = seen[limits, key] = check.legal(
                json.loads(config) if isinstance(config, str) else config, {}, dict(limits))
        return verdict

    return allowed


def failed_configs(store, models: ModelSet) -> dict[str, dict[str, frozenset[str]]]:
    """Per imported kernel (no registered spec) and device: the config keys of its newest version that failed
    there (compile, launch, check or timeout, as Kernel Tuner's failure strings import) and never ran ok there.
    A built-in kernel's configs are its spec's legal ones instead, and a launch refusal is learned at run time."""
    out: dict[str, dict[str, frozenset[str]]] = {}
    for name, km in sorted(models.kernels.items()):
        if km.features is None or matching_spec(km.features) is not None:
            continue
        rows = pl.from_arrow(store.measurements_arrow(kernel=[name])).filter(
            pl.col("kernel_version") == km.features.kernel_version)
        if rows.is_empty() or (rows["status"] == "ok").all():
            continue
        per: dict[str, frozenset[str]] = {}
        for (device,), part in rows.group_by(["device_id"], maintain_order=True):
            ran = set(part.filter(pl.col("status") == "ok")["config_key"].to_list())
            bad = frozenset(set(part.filter(pl.col("status") != "ok")["config_key"].to_list()) - ran)
            if bad:
                per[str(device)] = bad
        if per:
            out[name] = per
    return out


def _never_ran(device: str, devices: Mapping[str, Mapping[str, Any]], failed: Mapping[str, frozenset[str]],
               ran: Mapping[str, set[str]]) -> set[str]:
    """The config keys an imported kernel's table leaves out on `device`: those that failed there and never ran
    there; on a device never measured, those that failed on a measured chip of its family (vendor and catalog
    family) and ran on none of them (Kernel Tuner convolution: 30 configs fail on every Ampere card measured)."""
    if device in failed or device in ran:
        return set(failed.get(device, ()))
    family = family_key(devices.get(device))
    if family == ("", ""):
        return set()
    members = [m for m in set(failed) | set(ran) if family_key(devices.get(m)) == family]
    bad = set().union(*(failed.get(m, ()) for m in members))
    return bad - set().union(*(ran.get(m, set()) for m in members))


def build_kernel(km: KernelModel, devices: dict[str, dict], device_frame: pl.DataFrame,
                 only_devices: Sequence[str] | None, progress: Progress | None = None,
                 failed: Mapping[str, frozenset[str]] | None = None) -> tuple[KernelTables, dict]:
    """Tables and kernels.json metadata of one kernel; `failed`: an imported kernel's failed_configs."""
    import json

    f = km.features
    spec = matching_spec(f)
    dims = list(spec.shape_grid.dims) if spec is not None else list(f.shape_dims)
    tg_param = spec.threadgroup_param if spec is not None else f.threadgroup_param
    params = list(spec.params) if spec is not None else list(f.params)
    constraints = list(spec.constraints) if spec is not None else []
    # the constraint a lookup adds to these (the threadgroup within the device's limit where none reads it): no
    # entry of any device names a config the runtime would refuse to launch there
    rule = thread_rule({"threadgroup_param": tg_param, "params": params, "constraints": constraints})
    allowed = _thread_check(rule, devices) if rule else None
    tables = KernelTables(f.kernel, dims)
    store_k = max(STORE_K, int(km.prune_k))
    measured_devices = _measured(km, tables, store_k, allowed)
    measured_shapes = [json.loads(s) for s in f.frame.unique("shape_key", maintain_order=True)["shape"].to_list()]
    grid_shapes: list[dict] = []
    if spec is not None:
        for preset in spec.shape_grid.presets:
            grid_shapes.extend(spec.shape_grid.shapes(preset))
        dtypes = list(DTYPES)
    else:
        dtypes = sorted(f.frame["dtype"].unique().to_list())
    buckets = _bucket_shapes(dims, measured_shapes + grid_shapes)
    work = kernel_work(spec, DTYPE_BYTES, list(buckets.values())) if spec is not None else None
    tables.bucket_shapes = {tables.bucket_key(s): s for s in buckets.values()}
    if spec is None:
        measured_configs = [(k, json.loads(c)) for k, c in
                            f.frame.unique("config_key", maintain_order=True).select("config_key", "config").iter_rows()]
        ran = {str(d): set(part["config_key"].to_list())
               for (d,), part in f.frame.select("device_id", "config_key").group_by(["device_id"])}
        runnable: dict[str, list[dict]] = {}
    targets = [d for d in devices if (only_devices is None or d in only_devices or d in measured_devices)]
    if spec is not None:
        targets = [d for d in targets if mlx_runs_on(devices[d]) or d in measured_devices]
    legal_cache: dict[tuple, list[dict]] = {}
    legal_configs = LegalConfigs(spec, rule) if spec is not None else None

    def configs_for(device: str, dtype: str, shape: dict) -> list[dict]:
        if spec is None:
            if device not in runnable:
                never = _never_ran(device, devices, failed or {}, ran)
                legal = [(k, c) for k, c in measured_configs if allowed is None or allowed(device, k, c)]
                runnable[device] = ([c for k, c in legal if k not in never]
                                    or [c for _, c in legal])  # all failed somewhere: rank them all
            return runnable[device]
        from zmlx_pipeline.kernels.spec import Limits

        lk = _limits_key(devices[device])
        key = (lk, dtype, tuple(shape[d] for d in dims))
        if key not in legal_cache:
            legal_cache[key] = legal_configs(shape, dtype, Limits(**dict(lk)))
        return legal_cache[key]

    regret = km.regret or {}
    needed = [c for m in (km.ranker, km.time_model) if m is not None
              for c in getattr(getattr(m, "features", None), "features", ())]
    # where each device never measured answers from, and how far that is (publish/transfer.py)
    transfer = {d: source_device(d, devices, measured_devices) for d in targets if d not in measured_devices}

    def expected(device: str) -> float | None:
        """Held-out regret@1: unseen shapes for a measured device (left-out devices if that is all there is),
        left-out devices for one predicted from its own family, left-out families for an extrapolated one
        (None, unknown, when no such fold exists)."""
        if device in measured_devices:
            order: tuple[str, ...] = ("seen_device", "unseen_device")
        elif (transfer.get(device) or ("", EVIDENCE_OTHER_FAMILY))[1] == EVIDENCE_SAME_FAMILY:
            order = ("unseen_device",)
        else:
            order = ("cross_family",)
        for label in order:
            if regret.get(label) is not None:
                return _round(regret[label])
        return None

    # per dtype and shape text of the candidates: the shape, its bucket key, its bytes and flops
    shape_of: dict[tuple[str, str], tuple[dict, str, tuple]] = {}
    reached = _flop_rates(f.frame, work)  # per (device, dtype): the most flops per second a measurement reached
    regret_of: dict[str, float | None] = {}  # per device: expected()

    def flush(pending: list, kind: str = "buckets") -> None:
        rows = candidate_rows(f, pending)
        if rows.is_empty():
            return
        feats = featurize(f, rows, device_frame, needed)
        top = top_per_case(score_rows(km.ranker, feats), store_k)
        best = feats.join(top.filter(pl.col("rank") == 1).select(*CASE, "config_key"), on=[*CASE, "config_key"],
                          how="semi")
        times = best.select(*CASE).with_columns(pl.Series("_log_time", predict_log_time(km.time_model, best)))
        grouped = top.group_by(list(CASE), maintain_order=True).agg(
            pl.col("shape").first(), pl.col("config_key"), pl.col("config"), pl.col("n_legal").first()
        ).join(times, on=list(CASE), how="left")
        index, weight = tables.index, tables.weight
        for device, dtype, text, keys, configs, n_legal, t in grouped.select(
                "device_id", "dtype", "shape", "config_key", "config", "n_legal", "_log_time").iter_rows():
            idx = [index(k, c) for k, c in zip(keys, configs)]
            if kind == "buckets":  # the overall ranking stays the grid's vote
                for r, i in enumerate(idx):
                    weight[i] += 1.0 / (r + 1)
            known = shape_of.get((dtype, text))
            if known is None:
                shape = json.loads(text)
                known = shape_of[dtype, text] = (shape, tables.bucket_key(shape), work_of(work, dtype, shape))
            if device not in regret_of:
                regret_of[device] = expected(device)
            pred_us = _at_least_roofline(math.exp(t) if t is not None and not math.isnan(t) else None,
                                         known[2], devices[device], reached.get((device, dtype)))
            table = tables.entries[device][dtype]
            table.setdefault(kind, {})[known[1]] = table_entry(idx, pred_us, regret_of[device], "predicted",
                                                               int(n_legal))

    # the model's rankings at the power-of-two points between the grid's buckets, for the devices that
    # were measured (where an autotuner runs); the lookup merges one with the nearest buckets' lists
    between = _between_shapes(dims, measured_shapes + grid_shapes, set(buckets)) if spec is not None else []
    for kind, shapes, devs in (("buckets", list(buckets.values()), targets),
                               ("between", between, [d for d in targets if d in measured_devices])):
        pending: list = []
        n_rows = done = 0
        for device in devs:
            for dt in dtypes:
                for shape in shapes:
                    cfgs = configs_for(device, dt, shape)
                    if cfgs:
                        pending.append((device, dt, shape, cfgs))
                        n_rows += len(cfgs)
            done += 1
            if n_rows >= CHUNK_ROWS or done == len(devs):
                if progress:
                    progress(f"{f.kernel}: scored {done} of {len(devs)} devices ({kind})")
                flush(pending, kind)
                pending, n_rows = [], 0
    _move_times(tables, transfer, devices, work)
    tables.unserved = _unserved(tables, targets, devices, dtypes, list(buckets.values()), [*constraints, *rule],
                                spec.configs() if spec is not None else [c for _, c in measured_configs])
    order = sorted(range(len(tables.configs)), key=lambda i: (-tables.weight.get(i, 0.0), i))
    row_dim = next((d for d in ROW_DIMS if d in dims), dims[-1] if dims else None)
    meta = {
        "version": f.kernel_version,
        "class": spec.kernel_class if spec is not None else f.kernel,
        "dims": dims,
        "params": params,
        "threadgroup_param": tg_param,
        "row_dim": row_dim,
        "configs": tables.configs,
        "constraints": constraints,
        "order": order,
        "prune_k": int(km.prune_k),
        "stored_k": store_k,
        "expected_regret": {k: _round(v) if isinstance(v, float) else v for k, v in regret.items()},
        "model": km.variant,
        "model_id": km.model_id,
        "model_source": km.source,
        "dtypes": dtypes,
        "buckets": tables.bucket_shapes,
        "trained_devices": sorted(measured_devices),
        "trained_dtypes": sorted(f.frame["dtype"].unique().to_list()),
        "spec": "registered" if spec is not None else "measured configs only",
        "measured_range": {d: [min(int(x[d]) for x in measured_shapes), max(int(x[d]) for x in measured_shapes)]
                           for d in dims} if measured_shapes else {},
        "work": work,
        "transfer": {d: {"evidence": t[1], "from": t[0]} for d, t in sorted(transfer.items()) if t is not None},
    }
    meta.update(_runtime_prune_k(km, tables, meta, devices, configs_for, store_k, progress))
    return tables, meta


def _unserved(tables: KernelTables, targets: Sequence[str], devices: Mapping[str, Mapping[str, Any]],
              dtypes: Sequence[str], shapes: Sequence[dict], constraints: Sequence[str],
              configs: Sequence[dict]) -> dict[str, str]:
    """Per device of `targets` the tables hold no entry for: why, as a lookup there words it (runtime/lookup.py
    no_legal_reason over the kernel's configs at every bucket shape and dtype, the thread rule included)."""
    out: dict[str, str] = {}
    for device in targets:
        if any(kind for per in tables.entries.get(device, {}).values() for kind in per.values()):
            continue
        limits = limit_values(devices[device])
        out[device] = no_legal_reason(constraints, configs, [
            (shape, {**limits, "dtype_bytes": DTYPE_BYTES.get(dt, 4)}) for dt in dtypes for shape in shapes])
    return out


def _flop_rates(frame: pl.DataFrame, work: Mapping[str, dict] | None) -> dict[tuple[str, str], float]:
    """Per (device, dtype), the most TFLOPs one of the frame's measurements reached (each shape's fastest), where the
    kernel has flops terms: a chip's ceiling for that kernel and dtype is at least this, whatever the catalog's fp32
    peak says (16-bit matmul on Hopper tensor cores: 517 TFLOPs measured on an H200 against its 66.9 fp32)."""
    if not work or frame.is_empty():
        return {}
    fastest = frame.group_by("device_id", "dtype", "shape_key").agg(pl.col("shape").first(), pl.col("median_us").min())
    out: dict[tuple[str, str], float] = {}
    for device, dtype, shape, median_us in fastest.select("device_id", "dtype", "shape", "median_us").iter_rows():
        flops = work_of(work, dtype, json.loads(shape))[1]
        if flops and median_us and median_us > 0:
            rate = flops / (median_us * 1e-6) / 1e12
            out[device, dtype] = max(out.get((device, dtype), 0.0), rate)
    return out


def _at_least_roofline(time_us: float | None, moved_flops: tuple[float | None, float | None],
                       row: Mapping[str, Any], reached_tflops: float | None = None) -> float | None:
    """The time model's guess, never below the roofline bound of the shape (its bytes and flops: work_of) on the
    chip (its peak bandwidth, and the larger of its fp32 TFLOPs and the TFLOPs this kernel and dtype were measured
    to reach there): a tree model's guess for a large shape can be faster than memory allows, and a 16-bit matmul
    runs far past the fp32 peak, which floored its guesses 7x too slow. A core-limited device, whose fp32 peak the
    catalog does not give, is floored at the rate measured there (fp32 matmul on 32 of an H200's SMs was guessed at
    37 TFLOPs, past the 16 its SMs peak at; it measured 11)."""
    if time_us is None:
        return None
    if reached_tflops and reached_tflops > float(row.get("fp32_tflops") or 0.0):
        row = {**row, "fp32_tflops": reached_tflops}
    bound = bound_s(*moved_flops, row)
    return _round(max(time_us, bound[0] * 1e6) if bound else time_us)


def _move_times(tables: KernelTables, transfer: Mapping[str, tuple[str, str] | None], devices: dict[str, dict],
                work: Mapping[str, dict] | None) -> None:
    """Entries of devices never measured: their evidence (predicted / extrapolated) and, in place of the time
    model's guess, the source device's time (its measurement of the bucket's shape where that was measured with
    the bucket's pick, else its predicted time) moved by the roofline bound of the bucket's shape on both chips
    (`time_bound` names the bound: bandwidth or compute); None without the kernel's work terms, and None for a
    compute-bound move to another architecture family from a source that ran past its fp32 peak, and None from a
    core-limited source (a run on some of a chip's cores)."""
    for device, source in transfer.items():
        if device not in tables.entries:
            continue
        for dtype, table in tables.entries[device].items():
            src = tables.entries.get(source[0], {}).get(dtype, {}) if source else {}
            src_table, src_measured = src.get("buckets", {}), src.get("measured", {})
            for key, entry in table.get("buckets", {}).items():
                entry["evidence"] = source[1] if source else EVIDENCE_OTHER_FAMILY
                src_entry = src_table.get(key)
                shape = tables.bucket_shapes.get(key)
                time_us, basis = None, None
                # a run limited to some of a chip's cores (MPS) tells its time on those cores only: how much of the
                # memory bandwidth they reach is unknown, so its times are moved to no other device
                limited = bool(source and devices[source[0]].get("core_limited_from"))
                if source and src_entry is not None and shape is not None and work and not limited:
                    moved, flops = work_of(work, dtype, shape)
                    # the source's time as its own lookup quotes it: the measurement of the bucket's shape where
                    # that shape was measured with the bucket's pick (runtime/lookup.py, _anchored_time)
                    seen = src_measured.get(tables.key(shape))
                    anchored = (seen["time_us"] if seen is not None and seen.get("best") == src_entry.get("best")
                                and seen.get("time_us") else src_entry["time_us"])
                    time_us, basis = scaled_time(anchored, devices[source[0]], devices[device], moved, flops)
                    if basis == "compute" and source[1] != EVIDENCE_SAME_FAMILY and _past_fp32(
                            anchored, flops, devices[source[0]]):
                        # the source ran past its fp32 peak (tensor cores): how far another architecture runs past
                        # its own is unknown (an RTX 4090 would be quoted 630 TFLOPs, an M3 Max 109), so no time
                        time_us, basis = None, None
                    # a measurement past its chip's peak (L2 hits) moves no faster than this chip's memory
                    time_us = _at_least_roofline(time_us, (moved, None), devices[device])
                entry["time_us"] = _round(time_us)
                entry["time_bound"] = basis


def _past_fp32(time_us: float | None, flops: float | None, row: Mapping[str, Any]) -> bool:
    """Whether `time_us` for `flops` is a rate above the chip's fp32 peak (a 16-bit matmul on tensor cores)."""
    peak = float(row.get("fp32_tflops") or 0.0)
    return bool(time_us and flops and peak) and flops / (time_us * 1e-6) > peak * 1e12


def _runtime_prune_k(km: KernelModel, tables: KernelTables, meta: dict, devices: dict[str, dict],
                     configs_for: Callable[[str, str, dict], list], store_k: int,
                     progress: Progress | None) -> dict[str, Any]:
    """The published prune_k: the larger of training's and the one measured through the lookup path
    (publish/runtime_k.py), with both and the replay's hit share recorded beside it."""
    from zmlx_pipeline.publish.runtime_k import choose_dim_weights, replay_cases

    def limits_for(device: str, dtype: str) -> dict:
        lk = _limits_key(devices[device])
        return {**dict(lk), "dtype_bytes": DTYPE_BYTES[dtype]}

    measured = [d for d in meta["trained_devices"] if d in devices]
    max_k = min(store_k, len(tables.configs))  # an entry holds at most this many candidates
    named = {**meta, "name": km.features.kernel}
    cases = replay_cases(km.features.frame, named, tables.entries, tables.bucket_shapes, limits_for,
                         lambda d, t, s: len(configs_for(d, t, s)), devices=measured)
    weights, rk = choose_dim_weights(named, cases, max_k)
    if progress:
        progress(f"{km.features.kernel}: prune k {km.prune_k} from training, {rk.k} through the lookup "
                 f"({rk.cases} cases, hit share {rk.share}, dim weights {weights})")
    through_lookup = rk.k if rk.k is not None else (max_k if rk.cases else None)
    return {
        "prune_k": max(int(km.prune_k), through_lookup or 0),
        "prune_k_trained": int(km.prune_k),
        "prune_k_lookup": {"k": rk.k, "hit_share": _round(rk.share), "cases": rk.cases, "max_k": rk.max_k},
        "dim_weights": weights,
    }


# ------------------------------------------------------------------------------------------
# the whole bundle


def _build_task(features, km: KernelModel, records: dict[str, dict], device_frame: pl.DataFrame,
                only_devices: Sequence[str] | None, progress: Progress | None,
                failed: Mapping[str, frozenset[str]] | None = None) -> tuple[KernelTables, dict]:
    """build_kernel where a KernelPool runs it (a worker, or this process): the ranker read from its file and the
    time model fitted first when they are due, on one OpenMP thread; the tables come back as plain data."""
    from dataclasses import replace

    from zmlx_pipeline.models.pool import fit_threads
    from zmlx_pipeline.models.rankers.base import remembered_predictions
    from zmlx_pipeline.publish.models import fit_time_model, with_ranker

    km = with_ranker(replace(km, features=features))
    with fit_threads():
        if km.time_model_due:
            km = replace(km, time_model=fit_time_model(features), time_model_due=False)
        with remembered_predictions():  # the chunks of devices ask the models many of the same rows
            tables, meta = build_kernel(km, records, device_frame, only_devices, progress, failed)
    return tables.plain(), meta


#: a candidate row of a measured device's `between` points costs about this many rows of the other buckets
#: (the ensemble's seen setting fits more members); measured on the committed data's eight kernels
BETWEEN_ROW_COST = 4.0


def table_cost(km: KernelModel, devices: dict[str, dict], only_devices: Sequence[str] | None = None) -> float:
    """About how much build_kernel has to do for a kernel: the candidate rows it scores (each device's legal
    configs at every bucket and dtype, counted at the limits most of the devices share, and BETWEEN_ROW_COST
    times the measured devices' rows between the buckets); the frame's rows for a kernel without a registered
    spec. build_kernels starts the costliest kernels first and counts its progress in this."""
    import json
    from collections import Counter

    from zmlx_pipeline.kernels.spec import Limits

    f = km.features
    spec = matching_spec(f)
    if spec is None:
        return float(f.frame.height)
    dims = list(spec.shape_grid.dims)
    measured = sorted(set(f.frame["device_id"].unique().to_list()) & set(devices))
    shapes = [json.loads(t) for t in f.frame.unique("shape_key", maintain_order=True)["shape"].to_list()]
    shapes += [s for preset in spec.shape_grid.presets for s in spec.shape_grid.shapes(preset)]
    buckets = list(_bucket_shapes(dims, shapes).values())
    between = _between_shapes(dims, shapes, {bucket_of(int(s[d]) for d in dims) for s in buckets})
    others = [d for d, row in devices.items() if d not in measured and mlx_runs_on(row)
              and (only_devices is None or d in only_devices)]
    legal = LegalConfigs(spec)

    def rows(device: str, at: list[dict]) -> int:
        limits = Limits(**dict(_limits_key(devices[device])))
        return sum(len(legal(s, dt, limits)) for s in at for dt in DTYPES)

    cost = sum(rows(d, buckets) + BETWEEN_ROW_COST * rows(d, between) for d in measured[:1]) * len(measured)
    if others:
        common = Counter(_limits_key(devices[d]) for d in others).most_common(1)[0][0]
        cost += rows(next(d for d in others if _limits_key(devices[d]) == common), buckets) * len(others)
    return float(cost)


def build_kernels(models: ModelSet, records: dict[str, dict], device_frame: pl.DataFrame,
                  only_devices: Sequence[str] | None = None, progress: Progress | None = None,
                  jobs: int | None = None, started: float | None = None,
                  failed: Mapping[str, Mapping[str, frozenset[str]]] | None = None,
                  ) -> dict[str, tuple[KernelTables, dict]]:
    """Every kernel's tables (build_kernel), the costliest kernels first (table_cost), in `jobs` worker processes
    (None: one per CPU; a small store builds here); a progress line as each kernel is done, with an estimate of
    the time left. The tables do not depend on where they were built."""
    from concurrent.futures import FIRST_COMPLETED, wait
    from dataclasses import replace

    from zmlx_pipeline.models.pool import KernelPool

    kms = models.kernels
    built: dict[str, tuple[KernelTables, dict]] = {}
    # one kernel gains nothing from workers, which only add their start and the frame's copy
    with KernelPool({name: km.features for name, km in kms.items()}, jobs if len(kms) > 1 else 1) as pool:
        cost = {name: table_cost(km, records, only_devices) for name, km in kms.items()}  # while the workers start
        order = sorted(kms, key=lambda k: (-cost[k], k))
        steps = Steps(progress, "publish", sum(cost.values()), parts=len(kms), started=started)
        if not pool.parallel:
            for name in order:
                built[name] = pool.submit(name, _build_task, kms[name], records, device_frame, only_devices,
                                          steps.note if progress else None, (failed or {}).get(name)).result()
                steps.done(f"{name}: tables built", cost[name])
        else:
            steps.note(f"building {len(kms)} kernels' tables in {pool.jobs} worker processes")
            pending = {pool.submit(name, _build_task, replace(kms[name], features=None), records, device_frame,
                                   only_devices, None, (failed or {}).get(name)): name for name in order}
            while pending:  # short waits: Ctrl-C and SIGTERM reach this thread between them
                ready, _ = wait(list(pending), timeout=0.25, return_when=FIRST_COMPLETED)
                for future in ready:
                    name = pending.pop(future)
                    built[name] = future.result()
                    steps.done(f"{name}: tables built", cost[name])
    return {name: built[name] for name in sorted(built)}


def _check_table_devices(models: ModelSet, records: Mapping[str, dict], devices: Sequence[str] | None) -> None:
    """Refuse, before any table is built, a --device no kernel of this publish would get a table for: a chip MLX
    does not run on (AMD), where every kernel is built in (an imported kernel's tables go to any chip) and none
    measured it."""
    from zmlx_pipeline.data.catalog import UnknownDevice

    if devices is None or any(matching_spec(km.features) is None for km in models.kernels.values()):
        return
    measured = {d for km in models.kernels.values() for d in km.features.frame["device_id"].unique().to_list()}
    for device in devices:
        why = mlx_not_on(records[device])
        if why and device not in measured:
            raise UnknownDevice(f"MLX does not run on device {device} ({why}) and no kernel of this publish measured "
                                "it, so no lookup table is built for it; its profile is in every bundle (zmlx-pipeline "
                                f"profiles --device {device})")


def _check_shaped(models: ModelSet) -> None:
    """Refuse, before any work, a kernel measured at no problem size (a Kernel Tuner file that names none, imported
    as one case of an empty shape): a bundle's lookups find a kernel's tables by its shape's dims."""
    from zmlx_pipeline.publish.writer import PublishError

    for kernel, km in models.kernels.items():
        if not list(km.features.shape_dims):
            raise PublishError(f"cannot publish kernel {kernel!r}: it was measured at no problem size, and lookups "
                               "find a kernel's answers by its shape; import its files again with --problem-size "
                               "(or a search-spaces file beside them), or publish the other kernels with --kernel")


def _check_scalar_configs(models: ModelSet) -> None:
    """Refuse, before any work, a kernel whose configs hold a list or object value (an imported kernel may): a
    bundle's lookups compare configs value by value, so such a kernel cannot be published; the others can."""
    import json

    from zmlx_pipeline.publish.writer import PublishError

    for kernel, km in models.kernels.items():
        for text in km.features.frame["config"].unique().to_list():
            bad = next(((k, v) for k, v in json.loads(text).items() if isinstance(v, (list, dict))), None)
            if bad is not None:
                raise PublishError(f"cannot publish kernel {kernel!r}: its parameter {bad[0]!r} holds "
                                   f"{json.dumps(bad[1])[:40]}, a list or object, which a bundle cannot carry "
                                   "(lookups compare one value per parameter); publish the other kernels with "
                                   "--kernel")


def build_contents(store, models: ModelSet, devices: Sequence[str] | None = None,
                   progress: Progress | None = None, jobs: int | None = None,
                   started: float | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(files: name -> JSON-able object, summary) of a bundle built from `models` on the store's devices;
    `jobs` worker processes build the kernels' tables (build_kernels)."""
    import hashlib
    import json

    records = device_records(store)
    if devices is not None:
        unknown = [d for d in devices if d not in records]
        if unknown:
            from zmlx_pipeline.data.catalog import UnknownDevice

            raise UnknownDevice(f"no catalog or store device {', '.join(map(repr, unknown))}: see zmlx-pipeline devices")
    _check_shaped(models)
    _check_scalar_configs(models)
    _check_table_devices(models, records, devices)
    frame = all_devices_frame(store)
    kernel_tables = build_kernels(models, records, frame, devices, progress, jobs, started,
                                  failed_configs(store, models))
    measured_devices = set()
    no_entries: dict[str, dict[str, str]] = defaultdict(dict)
    for kernel, (tables, meta) in kernel_tables.items():
        measured_devices.update(meta["trained_devices"])
        for device, why in tables.unserved.items():
            no_entries[device][kernel] = why
    profiles = build_profiles(records, kernel_tables)
    files: dict[str, Any] = {}
    device_files: dict[str, str] = {}
    for device_id in sorted({d for t, _ in kernel_tables.values() for d in t.entries}):
        content = {"kernels": {k: {dt: t.entries[device_id][dt] for dt in sorted(t.entries[device_id])}
                               for k, (t, _) in sorted(kernel_tables.items()) if device_id in t.entries}}
        text = json.dumps(content, sort_keys=True, separators=(",", ":"))
        name = f"devices/{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
        files[name] = content
        device_files[device_id] = name
    mlx_versions = {}
    for run in store.runs():
        if run.get("mlx_version"):
            mlx_versions[run["device_id"]] = run["mlx_version"]
    files["kernels.json"] = {"kernels": {k: meta for k, (_, meta) in sorted(kernel_tables.items())}}
    files["profiles.json"] = {"devices": profiles, "seed_table": seed_table(profiles)}
    files["tables.json"] = {"devices": device_files}
    files["autotune_v3.json"] = build_autotune_v3(kernel_tables, records, mlx_versions, measured_devices)
    summary = {
        "kernels": sorted(kernel_tables),
        "devices_with_tables": len(device_files),
        "table_files": len(set(device_files.values())),
        "profiles": len(profiles),
        "measured_devices": sorted(measured_devices),
        "entries": sum(len(kind) for tb, _ in kernel_tables.values()  # measured, buckets and between
                       for per in tb.entries.values() for t in per.values() for kind in t.values()),
        # per device a table was built or asked for, the kernels it has no entry for and why (no legal config)
        "no_entries": {d: dict(sorted(no_entries[d].items())) for d in sorted(no_entries)},
    }
    return files, summary
