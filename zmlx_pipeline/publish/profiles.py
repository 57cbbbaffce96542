"""The device profiles and the ZMLX v3 cache of a bundle, drawn from the kernels' lookup tables.

A device's learned threadgroups per kernel class are voted by the ranked configs of its table entries
(measured entries over predicted ones); its ZMLX-style row (default threadgroup, three candidates)
and ZMLX's `autotune_v3.json` layout of the measured devices' winners come from the same tables.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from zmlx_pipeline.publish.transfer import EVIDENCE_OTHER_FAMILY
from zmlx_pipeline.runtime.cache import device_key, entry_key, entry_value

if TYPE_CHECKING:
    from zmlx_pipeline.publish.build import KernelTables

#: ranked configs of each entry that vote for a device's learned threadgroups
PROFILE_K = 8
PROFILE_FIELDS = ("name", "vendor", "family", "variant", "backend", "architecture", "gpu_cores", "core_unit",
                  "memory_bandwidth_gbps", "max_threads_per_threadgroup", "simd_width", "threadgroup_memory_bytes",
                  "l2_bytes", "clock_mhz", "memory_gb", "fp32_tflops", "in_catalog", "core_limited_from")


def _tg_weights(entries: Iterable[dict], configs: list[dict], tg_param: str) -> dict[int, float]:
    weights: dict[int, float] = defaultdict(float)
    for entry in entries:
        for r, i in enumerate(entry["ranked"][:PROFILE_K]):  # the first PROFILE_K of every entry, whatever its k
            tg = configs[i].get(tg_param)
            if isinstance(tg, (int, float)) and tg > 0:
                weights[int(tg)] += 1.0 / (r + 1)
    return weights


def _ranked(weights: Mapping[int, float], n: int = 3) -> list[int]:
    return [tg for tg, _ in sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def _level(kind: str, levels: set[str]) -> str:
    """A profile's evidence: measured, else the furthest its predicted entries travelled (extrapolated or predicted)."""
    if kind == "measured":
        return kind
    return EVIDENCE_OTHER_FAMILY if EVIDENCE_OTHER_FAMILY in levels else kind


def build_profiles(devices: dict[str, dict], kernel_tables: dict[str, tuple[KernelTables, dict]]) -> dict[str, dict]:
    """The profile table: every device's specs, learned threadgroups per kernel class, a ZMLX-style row, evidence."""
    profiles: dict[str, dict] = {}
    for device_id, row in devices.items():
        catalog_tg = int(row.get("default_threadgroup") or 256)
        classes: dict[str, dict] = {}
        pooled: dict[str, dict[int, float]] = {"measured": defaultdict(float), "predicted": defaultdict(float)}
        pooled_dim: dict[str, dict[int, dict[int, float]]] = {"measured": defaultdict(lambda: defaultdict(float)),
                                                              "predicted": defaultdict(lambda: defaultdict(float))}
        by_class: dict[str, dict[str, Any]] = defaultdict(lambda: {
            "measured": defaultdict(float), "predicted": defaultdict(float),
            "dim": {"measured": defaultdict(lambda: defaultdict(float)),
                    "predicted": defaultdict(lambda: defaultdict(float))}, "levels": set()})
        levels: set[str] = set()  # the bucket entries' evidence: predicted, or extrapolated across families
        for kernel, (tables, meta) in kernel_tables.items():
            tg_param = meta.get("threadgroup_param")
            if not tg_param or device_id not in tables.entries:
                continue
            cls = by_class[meta["class"]]
            row_dim = meta.get("row_dim")
            dim_pos = tables.dims.index(row_dim) if row_dim in tables.dims else None
            for dtype, t in tables.entries[device_id].items():
                for kind, source in (("measured", t["measured"]), ("predicted", t["buckets"])):
                    for key, entry in source.items():
                        if kind == "predicted":
                            levels.add(entry["evidence"])
                            cls["levels"].add(entry["evidence"])
                        w = _tg_weights([entry], tables.configs, tg_param)
                        if dim_pos is not None:
                            value = int(key.split(",")[dim_pos])
                            b = value if kind == "predicted" else int(round(math.log2(value)))
                        else:
                            b = None
                        for tg, weight in w.items():
                            cls[kind][tg] += weight
                            pooled[kind][tg] += weight
                            if b is not None:
                                cls["dim"][kind][b][tg] += weight
                                pooled_dim[kind][b][tg] += weight
        for name, cls in sorted(by_class.items()):
            kind = "measured" if cls["measured"] else "predicted" if cls["predicted"] else None
            if kind is None:
                continue
            classes[name] = {"threadgroup": _ranked(cls[kind], 1)[0], "candidates": _ranked(cls[kind]),
                             "evidence": _level(kind, cls["levels"]), "by_dim": {str(b): _ranked(w) for b, w in sorted(cls["dim"][kind].items())}}
        kind = "measured" if pooled["measured"] else "predicted" if pooled["predicted"] else None
        if kind is not None:
            general = {"threadgroup": _ranked(pooled[kind], 1)[0], "candidates": _ranked(pooled[kind]),
                       "evidence": _level(kind, levels),
                       "by_dim": {str(b): _ranked(w) for b, w in sorted(pooled_dim[kind].items())}}
        else:
            general = {"threadgroup": catalog_tg, "candidates": [], "evidence": "default", "by_dim": {}}
        learned_tg = general["threadgroup"]
        cands = general["candidates"] or _default_triple(catalog_tg, int(row.get("max_threads_per_threadgroup") or 1024))
        rec = {"device_id": device_id, **{k: row.get(k) for k in PROFILE_FIELDS}}
        if row.get("in_catalog") is False and isinstance(row.get("aliases"), list):
            # a registered device (devices add) lists its aliases, maybe none: the runtime finds its GPU by its names
            # and checks that no other registered device or catalog chip has them (runtime/contents.py)
            rec["aliases"] = list(row["aliases"])
        rec.update({
            "catalog_default_threadgroup": catalog_tg,
            "evidence": general["evidence"],
            "default_threadgroup": learned_tg,
            "threadgroup_candidates": cands,
            "classes": classes,
            "general": general,
            "seed": {"gpu_cores": row.get("gpu_cores"), "memory_bandwidth": row.get("memory_bandwidth_gbps"),
                     "default_tg": learned_tg, "candidates": cands},
        })
        profiles[device_id] = rec
    return profiles


def seed_table(profiles: Mapping[str, dict]) -> dict[str, dict]:
    """ZMLX's _DEVICE_SPECS layout ("M3_Max": {gpu_cores, memory_bandwidth, default_tg, candidates}), learned.

    Apple chips are keyed as ZMLX keys them (the full, unbinned chip answers); others by device id.
    """
    from zmlx_pipeline.runtime.profiles import _seed_case

    out: dict[str, dict] = {}
    for device_id, rec in sorted(profiles.items(), key=lambda kv: (kv[1].get("gpu_cores") or 0, kv[0])):
        if rec.get("vendor") == "apple" and rec.get("in_catalog"):
            family, variant = _seed_case(str(rec.get("family") or ""), str(rec.get("variant") or ""), "apple")
            key = f"{family}_{variant}" if variant else family
        else:
            key = device_id
        out[key] = {**rec["seed"], "device_id": device_id, "evidence": rec["evidence"]}
    return dict(sorted(out.items()))


def _default_triple(tg: int, limit: int) -> list[int]:
    return [c for c in (tg // 2, tg, tg * 2) if 1 <= c <= limit] or [tg]


def build_autotune_v3(kernel_tables: dict[str, tuple[KernelTables, dict]], devices: dict[str, dict],
                      mlx_versions: Mapping[str, str], measured_devices: set[str]) -> dict:
    """Winners of measured devices in ZMLX's autotune_v3.json layout (measured shapes and predicted buckets)."""
    from zmlx_pipeline.runtime.profiles import _seed_case

    specs = {}
    for kernel in kernel_tables:
        try:
            from zmlx_pipeline.kernels.registry import get_kernel

            specs[kernel] = get_kernel(kernel) if kernel_tables[kernel][1]["spec"] == "registered" else None
        except Exception:  # noqa: BLE001 - an imported kernel has no spec: no grid in its key
            specs[kernel] = None
    out: dict[str, Any] = {"schema_version": "3.0", "devices": {}}
    for device_id in sorted(measured_devices):
        row = devices.get(device_id, {})
        family, variant = _seed_case(str(row.get("family") or ""), str(row.get("variant") or ""), row.get("vendor"))
        entries: dict[str, Any] = {}
        for kernel, (tables, meta) in kernel_tables.items():
            spec = specs.get(kernel)
            for dtype, t in tables.entries.get(device_id, {}).items():
                for kind, source in (("measured", t["measured"]), ("predicted", t["buckets"])):
                    for key, entry in source.items():
                        shape = (dict(zip(tables.dims, (int(v) for v in key.split(",")))) if kind == "measured"
                                 else tables.bucket_shapes.get(key))
                        if shape is None:
                            continue
                        config = tables.configs[entry["best"]]
                        tg = grid = None
                        if spec is not None:
                            launch = spec.launch(config, shape)
                            tg, grid = launch.threadgroup, launch.grid
                        ek = entry_key(kernel, meta["version"], shape, tables.dims, dtype, meta["params"], grid)
                        if ek in entries and kind == "predicted":
                            continue
                        tg_param = meta.get("threadgroup_param")
                        entries[ek] = entry_value(config, dtype, tg if tg is not None else
                                                  [int(config.get(tg_param, 1) or 1) if tg_param else 1, 1, 1],
                                                  median_us=entry["time_us"] if kind == "measured" else None,
                                                  predicted_us=entry["time_us"] if kind == "predicted" else None,
                                                  source=kind)
        dkey = device_key(device_id, mlx_versions.get(device_id))
        out["devices"][dkey] = {
            "metadata": {"device_id": device_id, "family": family, "variant": variant,
                         "gpu_cores": row.get("gpu_cores"), "memory_bandwidth_gbps": row.get("memory_bandwidth_gbps"),
                         "default_threadgroup": row.get("default_threadgroup"),
                         "mlx_version": mlx_versions.get(device_id), "source": "zmlx-pipeline bundle"},
            "entries": entries,
            "saved_at": None,
        }
    return out
