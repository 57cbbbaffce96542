"""Model features, built with polars straight from the store's Arrow tables (no Python row loops).

One frame per kernel: the kernel's `ok` measurements (its newest kernel version), joined with
the device specs of the `devices` table, plus
- problem dimensions: log2 of every shape key, and log2 bytes moved where known;
- config parameters: each numeric parameter as is and, when always positive, its log2; the
  threads of a launch (product of the threadgroup/block-size parameters) against the device's
  SIMD width and thread limit; non-numeric parameters as categories;
- ratios of config parameters to shape dims (log2 p - log2 d), and of shape dims to each
  other (rows vs row length), for dims that vary;
- the kernel's declared derived features (`cfg_x_*`, KernelSpec.features, models/derived.py),
  which say what a parameter means for the shape (softmax: the share of a row held in registers);
  `cfg_xs_*` for those kept out of the per-device models (Feature.per_device False).
The column set is derived per kernel from the JSON keys of its configs and shapes, so our
kernels (TG, VEC, ROWS, ...) and imported ones (block_size_x, tile_size_y, ...) work alike.
- launch geometry relative to the device, for kernels whose tile axes are known (`geo_*`, see
  _axis_features): declared by the kernel (KernelSpec.tiles, as matmul does), or named like Kernel
  Tuner's block_size_x / tile_size_x: tiles, waves over the device's cores, tile waste, work per
  thread, reduction steps; kept apart (`geometry`). The default models use a declared geometry
  (`geometry_declared`); one inferred from parameter names only the models that opt in.
Targets: natural log of the median time (`log_time`) and per-case normalised ones that devices
of different speed share (`log_rel`, `log_med`, `rank_pct`; see case_targets).

Why one long module: every column above is derived from the same joined frame and named by the same prefixes,
which the models, publish's candidate rows and the derived features read; split, each part would re-derive the
frame's column lists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import polars as pl

from zmlx_pipeline.core.dtypes import DTYPE_BYTES
from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.kernels.spec import Feature, TileAxes
from zmlx_pipeline.models.derived import derived_columns

CASE = ("device_id", "kernel", "dtype", "shape_key")
TARGETS = ("log_time", "log_rel", "log_med", "rank_pct")  # what a model may regress (see case_targets)
# Device spec columns of the `devices` table used as features (log2 where the scale is wide).
SPEC_COLUMNS = (
    "gpu_cores", "memory_bandwidth_gbps", "max_threads_per_threadgroup", "simd_width",
    "threadgroup_memory_bytes", "l2_bytes", "clock_mhz", "memory_gb", "default_threadgroup",
)
DEVICE_CATEGORICAL = ("vendor", "backend")
# Parameter names that size a threadgroup: their product is the threads of one launch group.
THREAD_PARAMS = ("TG", "tg", "threadgroup", "threads", "block_size_x", "block_size_y", "block_size_z")
# A single parameter that *is* the threadgroup size (what the catalog's default_threadgroup sets).
THREADGROUP_PARAMS = ("TG", "tg", "threadgroup", "threads")
# Specs of the normalised device distance (log2, z-scored over the devices compared).
DISTANCE_SPECS = (
    "gpu_cores", "memory_bandwidth_gbps", "l2_bytes", "clock_mhz", "simd_width",
    "threadgroup_memory_bytes", "memory_gb", "max_threads_per_threadgroup",
)
_DEVICE_SCHEMA = {
    "device_id": pl.String, "vendor": pl.String, "family": pl.String, "backend": pl.String,
    **{c: pl.Float64 for c in SPEC_COLUMNS},
}

BytesMoved = Callable[[Mapping[str, int], int], float]


class FeatureError(ZmlxPipelineError, ValueError):
    "The measurements cannot be turned into features"


@dataclass(frozen=True)
class KernelFeatures:
    """One kernel's feature frame and the names of its columns."""

    kernel: str
    kernel_version: str
    frame: pl.DataFrame          # ids, config/shape JSON, median_us, TARGETS, features
    numeric: tuple[str, ...]     # numeric feature columns
    categorical: tuple[str, ...]  # string feature columns
    shape_dims: tuple[str, ...]
    params: tuple[str, ...]      # config parameter names
    thread_params: tuple[str, ...]
    threadgroup_param: str | None = None
    devices: pl.DataFrame | None = None  # the devices-table rows of the devices in `frame`
    # launch-geometry columns (geo_*, in `frame`): not in `numeric`, a model opts in (shared_features);
    # in every tree model's features they let it tell the few training devices apart, and it overfits
    geometry: tuple[str, ...] = ()
    # the geometry comes from the kernel's own declaration (KernelSpec.tiles): the default models use
    # it (shared_features); one inferred from Kernel Tuner parameter names stays opt-in (it hurt there)
    geometry_declared: bool = False
    # a declared geometry is read by the models of devices seen in training too (TileAxes.seen); False: by
    # the models of new devices only (SeenUnseenRanker's seen members get `for_seen_devices()`)
    geometry_seen: bool = True

    def for_seen_devices(self) -> "KernelFeatures":
        """These features as the models of a device seen in training read them: without a declared geometry
        that is meant for new devices only (geometry_seen False)."""
        if self.geometry_seen or not self.geometry_declared:
            return self
        return replace(self, geometry=(), geometry_declared=False, geometry_seen=True)

    @property
    def features(self) -> tuple[str, ...]:
        return self.numeric + self.categorical

    @property
    def device_features(self) -> tuple[str, ...]:
        return tuple(c for c in self.features if c.startswith("dev_"))

    @property
    def config_features(self) -> tuple[str, ...]:
        return tuple(c for c in self.features if c.startswith(("cfg_", "ratio_")))


def family_generations() -> dict[str, int]:
    """Apple chip family -> GPU generation of its catalog `gpu_arch` ("m3" -> 15, from "applegpu_g15s")."""
    from zmlx_pipeline.data.catalog import arch_generation, load_catalog

    return {spec.family: arch_generation(spec.gpu_arch) for spec in load_catalog() if spec.gpu_arch}


def devices_frame(store) -> pl.DataFrame:
    """The store's devices as a polars frame of the spec columns (numbers as floats); a row export would refuse is
    CorruptStore (Store.devices checks each), so no feature is computed from it."""
    rows = store.devices()
    cols = list(_DEVICE_SCHEMA)
    return pl.DataFrame([{c: r.get(c) for c in cols} for r in rows], schema=_DEVICE_SCHEMA, orient="row")


def measurements_frame(store, kernels=None, **filters) -> pl.DataFrame:
    """The `ok` measurements (optionally of some kernels) as a polars frame, from Arrow; a row export would refuse
    is CorruptStore (Store.measurements_arrow checks the rows it reads), so no model learns from it."""
    filters = {**filters, "status": "ok"}
    if kernels is not None:
        filters["kernel"] = [kernels] if isinstance(kernels, str) else list(kernels)
    return pl.from_arrow(store.measurements_arrow(**filters))


def _log2(expr: pl.Expr) -> pl.Expr:
    return expr.cast(pl.Float64).log(2)


def _newest_version(df: pl.DataFrame, kernel: str) -> str:
    """The registered kernel's own version when the rows hold it, else the version measured most
    recently (old versions never mix with new timings, and a shard that claims a later version of a
    built-in kernel than its source has cannot displace the timings of the code that runs)."""
    spec = _registered(kernel)
    if spec is not None and (df["kernel_version"] == spec.version).any():
        return spec.version
    return df.group_by("kernel_version").agg(pl.col("measured_at").max()).sort(
        ["measured_at", "kernel_version"], descending=True
    )["kernel_version"][0]


def _unnest_json(df: pl.DataFrame, column: str, prefix: str) -> tuple[pl.DataFrame, list[str]]:
    """Decode a JSON-object column into prefixed columns; returns the frame and the keys.

    Each distinct JSON text is decoded once (schema inferred over all of them), then joined back.
    """
    distinct = df.select(pl.col(column).unique())
    decoded = distinct[column].str.json_decode(infer_schema_length=None)
    if not isinstance(decoded.dtype, pl.Struct):
        raise FeatureError(f"column {column} does not hold JSON objects")
    keys = [f.name for f in decoded.dtype.fields]
    wide = distinct.with_columns(decoded.alias("_j")).unnest("_j").rename({k: prefix + k for k in keys})
    nested = [k for k in keys if wide[prefix + k].dtype.is_nested()]
    if nested:  # a list or object value (an imported kernel's) is one category: its canonical JSON text
        objects = [json.loads(text) for text in wide[column].to_list()]
        wide = wide.with_columns([pl.Series(prefix + k, [None if o.get(k) is None else json.dumps(o[k], sort_keys=True)
                                                         for o in objects], dtype=pl.String) for k in nested])
    return df.join(wide, on=column, how="left", maintain_order="left"), keys


def kernel_features(
    measurements: pl.DataFrame,
    devices: pl.DataFrame,
    kernel: str,
    bytes_moved: BytesMoved | None = None,
    tiles: TileAxes | None = None,
    screen: bool = True,
) -> KernelFeatures:
    """The feature frame of one kernel's ok measurements (its newest kernel version).

    `tiles`: the kernel's tile axes for the geometry features; None looks up the registered kernel
    of that name (declared_tiles), then Kernel Tuner's parameter names (named_tiles).
    `screen`: drop measurements faster than memory allows (drop_implausible). Off for candidate rows
    to be scored, whose times are placeholders."""
    df = measurements.filter((pl.col("kernel") == kernel) & (pl.col("status") == "ok")
                             & (pl.col("median_us") > 0))
    if df.is_empty():
        raise FeatureError(f"no ok measurements of kernel {kernel!r}")
    version = _newest_version(df, kernel)
    df = df.filter(pl.col("kernel_version") == version)
    df = df.select("device_id", "kernel", "kernel_version", "dtype", "shape_key", "shape", "config_key",
                   "config", "median_us", "extra")
    df, dims = _unnest_json(df, "shape", "s_")
    df, params = _unnest_json(df, "config", "c_")
    missing = set(df["device_id"].unique()) - set(devices["device_id"])
    if missing:
        raise FeatureError(f"devices {', '.join(sorted(missing))} have no row in the devices table (rows recorded "
                           "without their device, or a store changed outside zmlx-pipeline): ingest their shards "
                           "again, or restore the store from a copy")
    df = df.join(devices, on="device_id", how="left")
    if screen:
        df = drop_implausible(df, bytes_moved or declared_bytes_moved(kernel))

    exprs: list[pl.Expr] = [
        pl.col("median_us").log().alias("log_time"),
        pl.col("dtype").replace_strict(DTYPE_BYTES, default=4, return_dtype=pl.Float64).alias("dtype_bytes"),
    ]
    numeric: list[str] = ["dtype_bytes"]
    categorical: list[str] = []
    # device specs
    for c in SPEC_COLUMNS:
        exprs.append(_log2(pl.col(c)).alias(f"dev_log2_{c}"))
        numeric.append(f"dev_log2_{c}")
    exprs.append((_log2(pl.col("memory_bandwidth_gbps")) - _log2(pl.col("gpu_cores"))).alias("dev_log2_bw_per_core"))
    exprs.append((_log2(pl.col("gpu_cores")) + _log2(pl.col("clock_mhz"))).alias("dev_log2_core_clock"))
    numeric += ["dev_log2_bw_per_core", "dev_log2_core_clock"]
    # Apple GPU generation (13 = M1 ... 17 = M5; 0 for any other device), only when an Apple chip is among
    # the rows: frames of other devices keep exactly the columns they had, and so the models fitted on them.
    generation = pl.col("family").replace_strict(family_generations(), default=None, return_dtype=pl.Float64)
    if df.select(generation.is_not_null().any()).item():
        exprs.append(generation.fill_null(0.0).alias("dev_gpu_generation"))
        numeric.append("dev_gpu_generation")
    for c in DEVICE_CATEGORICAL:
        exprs.append(pl.col(c).fill_null("unknown").alias(f"dev_{c}"))
        categorical.append(f"dev_{c}")
    # problem dims
    numeric_dims = [d for d in dims if df.schema["s_" + d].is_numeric()]
    for d in numeric_dims:
        exprs.append(_log2(pl.col("s_" + d).clip(lower_bound=1)).alias(f"shape_log2_{d}"))
        numeric.append(f"shape_log2_{d}")
    if numeric_dims:
        exprs.append(pl.sum_horizontal([_log2(pl.col("s_" + d).clip(lower_bound=1)) for d in numeric_dims])
                     .alias("shape_log2_size"))
        numeric.append("shape_log2_size")
    df = df.with_columns(exprs)
    # bytes moved: from the measurement's extra, else the kernel's model when given
    bytes_expr = pl.col("extra").str.json_path_match("$.bytes_moved").cast(pl.Float64, strict=False)
    df = df.with_columns(bytes_expr.alias("_bytes"))
    if bytes_moved is not None:
        shapes = df.select("shape_key", "shape", "dtype_bytes").unique()
        model = pl.DataFrame({
            "shape_key": shapes["shape_key"],
            "dtype_bytes": shapes["dtype_bytes"],
            "_bytes_model": [float(bytes_moved(json.loads(s), int(b)))
                             for s, b in zip(shapes["shape"], shapes["dtype_bytes"])],
        })
        df = df.join(model, on=["shape_key", "dtype_bytes"], how="left").with_columns(
            pl.coalesce("_bytes", "_bytes_model").alias("_bytes")).drop("_bytes_model")
    if df["_bytes"].null_count() < df.height:
        df = df.with_columns(_log2(pl.col("_bytes").clip(lower_bound=1)).alias("shape_log2_bytes"))
        numeric.append("shape_log2_bytes")
    df = df.drop("_bytes")
    # config params
    cfg_exprs: list[pl.Expr] = []
    positive: list[str] = []
    for p in params:
        col = "c_" + p
        dtype = df.schema[col]
        if dtype == pl.Boolean:
            cfg_exprs.append(pl.col(col).cast(pl.Float64).alias(f"cfg_{p}"))
            numeric.append(f"cfg_{p}")
        elif dtype.is_numeric():
            cfg_exprs.append(pl.col(col).cast(pl.Float64).alias(f"cfg_{p}"))
            numeric.append(f"cfg_{p}")
            if df[col].min() is not None and df[col].min() > 0 and df[col].n_unique() > 1:
                cfg_exprs.append(_log2(pl.col(col)).alias(f"cfg_log2_{p}"))
                numeric.append(f"cfg_log2_{p}")
                positive.append(p)
        else:
            cfg_exprs.append(pl.col(col).cast(pl.String).fill_null("none").alias(f"cfg_{p}"))
            categorical.append(f"cfg_{p}")
    thread_params = tuple(p for p in params if p in THREAD_PARAMS and df.schema["c_" + p].is_numeric()
                          and df["c_" + p].min() is not None and df["c_" + p].min() > 0)
    if thread_params:
        threads = pl.sum_horizontal([_log2(pl.col("c_" + p)) for p in thread_params])
        cfg_exprs += [
            threads.alias("cfg_log2_threads"),
            (threads - _log2(pl.col("simd_width"))).alias("cfg_log2_threads_per_simd"),
            (threads - _log2(pl.col("max_threads_per_threadgroup"))).alias("cfg_log2_threads_per_max"),
            (threads - _log2(pl.col("default_threadgroup"))).alias("cfg_log2_threads_per_default"),
            ((2.0 ** threads).round() % pl.col("simd_width") == 0).cast(pl.Float64).alias("cfg_simd_aligned"),
        ]
        numeric += ["cfg_log2_threads", "cfg_log2_threads_per_simd", "cfg_log2_threads_per_max",
                    "cfg_log2_threads_per_default", "cfg_simd_aligned"]
    df = df.with_columns(cfg_exprs)
    # ratios of config params to the shape dims that vary
    varying = [d for d in numeric_dims if df["s_" + d].n_unique() > 1]
    ratio_exprs = []
    for p in positive:
        for d in varying:
            ratio_exprs.append((_log2(pl.col("c_" + p)) - pl.col(f"shape_log2_{d}")).alias(f"ratio_{p}_{d}"))
            numeric.append(f"ratio_{p}_{d}")
    if thread_params:
        for d in varying:
            ratio_exprs.append((pl.col("cfg_log2_threads") - pl.col(f"shape_log2_{d}")).alias(f"ratio_threads_{d}"))
            numeric.append(f"ratio_threads_{d}")
    for i, a in enumerate(varying):  # rows vs row length, and the like
        for b in varying[i + 1:]:
            ratio_exprs.append((pl.col(f"shape_log2_{a}") - pl.col(f"shape_log2_{b}")).alias(f"shape_ratio_{a}_{b}"))
            numeric.append(f"shape_ratio_{a}_{b}")
    df = df.with_columns(ratio_exprs)
    derived = derived_columns(declared_features(kernel), params, numeric_dims)
    if derived:
        df = df.with_columns(derived)
        numeric += [e.meta.output_name() for e in derived]
    declared = tiles if tiles is not None else declared_tiles(kernel)
    axis_cols = _axis_features(df, declared, numeric_dims) if declared is not None else []
    if not axis_cols:
        declared = None
        named = named_tiles(params, numeric_dims)
        axis_cols = _axis_features(df, named, numeric_dims) if named is not None else []
    geometry = [n for n, _ in axis_cols]
    if axis_cols:
        df = df.with_columns([e.alias(n) for n, e in axis_cols])
    df = df.with_columns(case_targets())
    keep = ["device_id", "kernel", "kernel_version", "dtype", "shape_key", "shape", "config_key", "config",
            "median_us", "log_time", *TARGETS[1:], *numeric, *geometry, *categorical]
    return KernelFeatures(
        kernel=kernel, kernel_version=version, frame=df.select(keep),
        numeric=tuple(numeric), categorical=tuple(categorical),
        shape_dims=tuple(numeric_dims), params=tuple(params), thread_params=thread_params,
        threadgroup_param=next((p for p in THREADGROUP_PARAMS if p in thread_params), None),
        devices=devices.filter(pl.col("device_id").is_in(df["device_id"].unique().to_list())),
        geometry=tuple(geometry), geometry_declared=declared is not None and bool(geometry),
        geometry_seen=declared is None or declared.seen,
    )


def case_targets() -> list[pl.Expr]:
    """The per-case normalised targets, from `log_time`: devices of any speed share their scale.

    - `log_rel`: log(time / fastest time of the case), 0 at the case's best;
    - `log_med`: log(time / median time of the case), centred where `log_rel` is anchored at one
      (possibly lucky) fastest config;
    - `rank_pct`: the config's rank in its case scaled to [0, 1] (0 = fastest): no scale at all,
      so a case whose slow configs are 100x slow weighs no more than one where they are 1.2x.
    """
    over = pl.col("log_time")
    n = pl.len().over(CASE)
    return [
        (over - over.min().over(CASE)).alias("log_rel"),
        (over - over.median().over(CASE)).alias("log_med"),
        pl.when(n > 1).then((over.rank("average").over(CASE) - 1.0) / (n - 1).cast(pl.Float64))
        .otherwise(0.0).alias("rank_pct"),
    ]


#: a time that implies more than this many times the device's memory bandwidth, for a working set
#: larger than its L2, cannot be a real run of the kernel (seen: small-M matmuls timed at 6.7 us for
#: 117 MB on an H100, 17 TB/s); such rows are left out of every frame
IMPLAUSIBLE_BANDWIDTH = 1.5


def _registered(kernel: str):
    """The registered kernel spec of this name; None for one the registry does not know (imported data)."""
    from zmlx_pipeline.kernels.registry import UnknownKernel, get_kernel

    if ":" in kernel:  # a module path: never import code named by the data
        return None
    try:
        return get_kernel(kernel)
    except UnknownKernel:
        return None


def declared_bytes_moved(kernel: str) -> BytesMoved | None:
    """The registered kernel's bytes_moved model; None for a kernel the registry does not know."""
    spec = _registered(kernel)
    return spec.bytes_moved if spec is not None else None


def drop_implausible(df: pl.DataFrame, bytes_moved: BytesMoved | None) -> pl.DataFrame:
    """`df` (measurements joined with device specs) without the rows faster than memory allows:
    bytes moved over L2 at more than IMPLAUSIBLE_BANDWIDTH x the device's bandwidth."""
    if bytes_moved is None or df.is_empty():
        return df
    shapes = df.select("shape", "dtype").unique()
    nbytes = pl.DataFrame({
        "shape": shapes["shape"], "dtype": shapes["dtype"],
        "_nbytes": [float(bytes_moved(json.loads(s), DTYPE_BYTES.get(d, 4)))
                    for s, d in zip(shapes["shape"], shapes["dtype"])],
    })
    gbps = pl.col("_nbytes") / pl.col("median_us") / 1e3
    impossible = ((pl.col("_nbytes") > pl.col("l2_bytes").fill_null(float("inf")))
                  & (gbps > IMPLAUSIBLE_BANDWIDTH * pl.col("memory_bandwidth_gbps").fill_null(float("inf"))))
    return (df.join(nbytes, on=["shape", "dtype"], how="left", maintain_order="left")
            .filter(~impossible.fill_null(False)).drop("_nbytes"))


def declared_tiles(kernel: str) -> TileAxes | None:
    """The tile axes the registered kernel of this name declares (KernelSpec.tiles); None for a kernel
    the registry does not know (imported data) or one that declares none."""
    spec = _registered(kernel)
    return spec.tiles if spec is not None else None


def declared_features(kernel: str) -> dict[str, Feature]:
    """The derived features the registered kernel of this name declares (KernelSpec.features); empty
    for a kernel the registry does not know (imported data)."""
    spec = _registered(kernel)
    return spec.derived_features() if spec is not None else {}


def named_tiles(params: Sequence[str], dims: Sequence[str]) -> TileAxes | None:
    """Tile axes by Kernel Tuner's naming: per axis a in x, y, z with a block_size_a parameter and a
    shape dim a, a block spans block_size_a * tile_size_a (tile 1 when absent) with block_size_a
    threads along a. None when no axis is named so (our kernels)."""
    axes = [a for a in ("x", "y", "z") if f"block_size_{a}" in params and a in dims]
    if not axes:
        return None
    return TileAxes(grid={a: (f"block_size_{a}", *([f"tile_size_{a}"] if f"tile_size_{a}" in params else []))
                          for a in axes},
                    threads=tuple(f"block_size_{a}" for a in axes))


def _axis_features(df: pl.DataFrame, tiles: TileAxes, dims: Sequence[str]) -> list[tuple[str, pl.Expr]]:
    """Launch-geometry features of a tiled kernel, relative to the device: they transfer across devices.

    Per grid axis, a threadgroup spans `extent` = the product of its params along shape dim d, so
    ceil(d / extent) threadgroups are launched along it; `threads` = the product of the thread params:
    - `geo_log2_work_per_thread`: log2 of the tile area over the threads (BM*BN/TG; Kernel Tuner's
      product of tile sizes);
    - `geo_log2_blocks`: log2 of the threadgroups launched (product of ceil(d / extent));
    - `geo_tile_waste`: log2 of the padded tile area over the real one (product of ceil(d / e) * e / d);
    - `geo_log2_blocks_per_core`: threadgroups per device core (SM / CU / GPU core): < 0 leaves cores idle;
    - `geo_log2_waves`: log2 of the whole waves (ceil(blocks / cores));
    - `geo_wave_eff`: blocks / (waves * cores), the share of the waves' slots that work;
    - `geo_last_wave_fill`: the share of the cores the last wave occupies (1 = full);
    - `geo_log2_threads_per_core`: all launched threads per core, the parallelism each core gets;
    with reduction steps (a matmul's K in BK):
    - `geo_log2_steps`: log2 of the steps (product of ceil(d / step));
    - `geo_step_waste`: log2 of the padded reduction length over the real one;
    - `geo_log2_tile_reuse`: log2 of the tile area over its perimeter (BM*BN / (BM+BN)), how often each
      operand element loaded into a tile is used.
    None (an empty list) when a name the tiles refer to is not a numeric column, or no core count.
    """
    decl_dims, decl_params = tiles.names()
    if ("gpu_cores" not in df.columns or not set(decl_dims) <= set(dims)
            or any("c_" + p not in df.columns or not df.schema["c_" + p].is_numeric() for p in decl_params)):
        return []

    def product(names: Sequence[str]) -> pl.Expr:
        return pl.lit(1.0) if not names else pl.reduce(
            lambda a, b: a * b, [pl.col("c_" + p).cast(pl.Float64).clip(lower_bound=1) for p in names])

    def dim(d: str) -> pl.Expr:
        return pl.col("s_" + d).cast(pl.Float64).clip(lower_bound=1)

    extents = {d: product(ps) for d, ps in tiles.grid.items()}
    counts = {d: (dim(d) / e).ceil() for d, e in extents.items()}
    log_blocks = pl.sum_horizontal([n.log(2) for n in counts.values()])
    log_area = pl.sum_horizontal([e.log(2) for e in extents.values()])
    log_threads = product(tiles.threads).log(2)
    cores = pl.col("gpu_cores").cast(pl.Float64)
    n_blocks = 2.0 ** log_blocks
    waves = (n_blocks / cores).ceil()
    out = [
        ("geo_log2_work_per_thread", log_area - log_threads),
        ("geo_log2_blocks", log_blocks),
        ("geo_tile_waste", pl.sum_horizontal([(counts[d] * e / dim(d)).log(2) for d, e in extents.items()])),
        ("geo_log2_blocks_per_core", log_blocks - cores.log(2)),
        ("geo_log2_waves", waves.log(2)),
        ("geo_wave_eff", n_blocks / (waves * cores)),
        ("geo_last_wave_fill", (n_blocks - (waves - 1.0) * cores) / cores),
        ("geo_log2_threads_per_core", log_blocks + log_threads - cores.log(2)),
    ]
    if tiles.steps:
        steps = {d: product(ps) for d, ps in tiles.steps.items()}
        out += [
            ("geo_log2_steps", pl.sum_horizontal([(dim(d) / st).ceil().log(2) for d, st in steps.items()])),
            ("geo_step_waste", pl.sum_horizontal([((dim(d) / st).ceil() * st / dim(d)).log(2)
                                                  for d, st in steps.items()])),
            ("geo_log2_tile_reuse", log_area - pl.sum_horizontal(list(extents.values())).log(2)),
        ]
    return out


def build_features(
    measurements: pl.DataFrame,
    devices: pl.DataFrame,
    kernels=None,
    bytes_moved: Mapping[str, BytesMoved] | None = None,
) -> dict[str, KernelFeatures]:
    """Feature frames for every kernel (or the given ones) with ok measurements."""
    names = sorted(measurements.filter(pl.col("status") == "ok")["kernel"].unique().to_list())
    if kernels is not None:
        wanted = [kernels] if isinstance(kernels, str) else list(kernels)
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            raise FeatureError(f"no ok measurements of kernel(s) {', '.join(unknown)}")
        names = [k for k in names if k in wanted]
    return {k: kernel_features(measurements, devices, k, (bytes_moved or {}).get(k)) for k in names}


def store_features(
    store, kernels=None, bytes_moved: Mapping[str, BytesMoved] | None = None
) -> dict[str, KernelFeatures]:
    """Feature frames of the store's ok measurements, per kernel."""
    devices = devices_frame(store)  # also completes any pending result before the Arrow read
    return build_features(measurements_frame(store, kernels), devices, kernels, bytes_moved)



def device_distances(devices: pl.DataFrame, vendor_penalty: float = 0.0) -> tuple[list[str], np.ndarray]:
    """Normalised spec distance between devices: RMS of z-scored log2 specs (+ a penalty across vendors).

    `devices` needs device_id and the DISTANCE_SPECS columns (the devices table, or one row per
    device of a feature frame's raw specs); returns the ids (sorted) and the distance matrix.
    """
    d = devices.unique("device_id").sort("device_id")
    cols = [c for c in DISTANCE_SPECS if c in d.columns]
    x = d.select([_log2(pl.col(c)).fill_null(0.0) for c in cols]).to_numpy().astype(float)
    std = x.std(axis=0)
    keep = std > 0
    z = (x[:, keep] - x[:, keep].mean(axis=0)) / std[keep] if keep.any() else np.zeros((len(d), 1))
    dist = np.sqrt(((z[:, None, :] - z[None, :, :]) ** 2).mean(axis=-1))
    if vendor_penalty and "vendor" in d.columns:
        vendor = d["vendor"].fill_null("unknown").to_numpy()
        dist = dist + vendor_penalty * (vendor[:, None] != vendor[None, :])
    return d["device_id"].to_list(), dist
