"""The autotuner: time only the configs the model could not rule out, check each, remember the winner.

    @autotune("rmsnorm", warmup=3, iters=10)
    def rmsnorm(x, w, config=None):
        ...launch with config["TG"], config["VEC"], config["ROWS"]...

On a call with no explicit config, the wrapper's shape and dtype are looked up in the autotune
cache (`~/.cache/zmlx/autotune_v3.json`, this chip and MLX version); on a miss, the bundle's
pruned candidates for that case (top k, at most a fifth of the legal configs) are checked
against the kernel's reference and timed with the collect harness, and the fastest correct one
is written to the cache. `device_aware=False` times every legal config instead (what an
autotuner without a model has to do). Without a GPU backend nothing is timed: the bundle's
predicted config is used, with one warning.

With no kernel named (ZMLX's plain `@autotune(warmup=..., iters=..., device_aware=True)` on a
function taking `threadgroup=`), there is no reference to check against, so nothing is timed:
the wrapper gets the learned threadgroup for the current chip and the row length of its first
array argument.
"""

from __future__ import annotations

import functools
import time
import warnings
from typing import Any, Callable, Mapping, Sequence

from zmlx_pipeline.runtime import cache as cache_file
from zmlx_pipeline.runtime.lookup import predicted_or_default

#: the pruned autotuner never times more than this share of a case's legal configs
MAX_FRACTION = 0.2

Measure = Callable[[Any, Mapping[str, int], Mapping[str, int], str], tuple[str, float | None]]


class AutotuneError(RuntimeError):
    "The autotuner cannot run as configured (unknown kernel, no shape for the call, ...)"


class TuneResult:
    """What one tune gave: the config, how it was chosen (`source`: cache, timed, predicted), every candidate timed."""

    __slots__ = ("kernel", "shape", "dtype", "config", "source", "median_us", "timed", "legal", "wall_s", "key", "note")

    def __init__(self, kernel: str, shape: dict, dtype: str, config: dict, source: str,
                 median_us: float | None = None, timed: list[dict] | None = None, legal: int = 0,
                 wall_s: float = 0.0, key: str = "", note: str = "") -> None:
        self.kernel, self.shape, self.dtype, self.config, self.source = kernel, shape, dtype, config, source
        self.median_us = median_us
        self.timed = timed or []  # {"config", "status", "median_us"} per candidate, in timing order
        self.legal = legal        # legal configs of this case
        self.wall_s = wall_s
        self.key = key
        self.note = note

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return (f"TuneResult({self.kernel} {self.dtype} {self.shape}: {self.config} from {self.source}, "
                f"{len(self.timed)} of {self.legal} legal configs timed)")


# ------------------------------------------------------------------------------------------
# the device and the default measurer (both import MLX; only called when something is timed)


_DEVICES: dict[str | None, tuple[str, str, dict]] = {}
_MEASURERS: dict[tuple[int, int], "Measure"] = {}


def _device_and_mlx(device: str | None) -> tuple[str, str, dict]:
    """(chip id, MLX version, metadata for the cache section), worked out once per device per process."""
    if device not in _DEVICES:
        _DEVICES[device] = _detect_device_and_mlx(device)
    chip, version, meta = _DEVICES[device]
    return chip, version, dict(meta)


def _detect_device_and_mlx(device: str | None) -> tuple[str, str, dict]:
    try:
        import mlx.core as mx

        mlx_version = str(getattr(mx, "__version__", "unknown"))
    except Exception:  # noqa: BLE001
        mlx_version = "unknown"
    row: dict = {}
    if device is None:
        try:
            from zmlx_pipeline.data.detect import detect_device

            detected = detect_device()
            device = detected.device_id
            row = detected.spec.as_row() if detected.spec is not None else {}
        except Exception:  # noqa: BLE001
            device = "unknown"
    if not row:
        from zmlx_pipeline.runtime.device import catalog_row

        row = catalog_row(device) or {}
    from zmlx_pipeline.runtime.profiles import _seed_case

    family, variant = _seed_case(str(row.get("family") or ""), str(row.get("variant") or ""), row.get("vendor"))
    meta = {"device_id": device, "family": family, "variant": variant, "gpu_cores": row.get("gpu_cores"),
            "memory_bandwidth_gbps": row.get("memory_bandwidth_gbps"),
            "default_threadgroup": row.get("default_threadgroup"), "mlx_version": mlx_version}
    return device, mlx_version, {**meta, "limits_row": row}


def harness_measure(warmup: int, iters: int, rotate_bytes: int = 0, timer: str = "chain") -> Measure:
    """A measurer that checks and times a config with the collect harness on this process's GPU (one per setting).

    `rotate_bytes`: rotate through enough input sets to exceed this many bytes, as collect does with
    twice the device's L2, so a config is timed reading memory as the training data were.
    `timer`: "chain" (MLX only), or "gpu"/"auto" for CUPTI kernel durations (imports torch when
    timing; see kernels/timing.py), the timer collect uses where it can.
    """
    key = (warmup, iters, int(rotate_bytes), timer)
    if key not in _MEASURERS:
        _MEASURERS[key] = _new_harness_measure(warmup, iters, int(rotate_bytes), timer)
    return _MEASURERS[key]


def _new_harness_measure(warmup: int, iters: int, rotate_bytes: int = 0, timer: str = "chain") -> Measure:
    from zmlx_pipeline.data.detect import detect_backend
    from zmlx_pipeline.kernels import harness
    from zmlx_pipeline.kernels.timing import resolve_timer

    backend = detect_backend()
    if backend not in ("metal", "cuda"):
        raise harness.NoGpuBackend(f"no Metal or CUDA backend here (MLX runs on the {backend})")
    timer = resolve_timer(timer, backend)
    launchers: dict = {}
    prepared: dict = {}

    def measure(spec, config, shape, dtype) -> tuple[str, float | None]:
        launcher = launchers.get(spec.name)
        if launcher is None:
            launcher = launchers[spec.name] = harness.Launcher(spec, backend)
        extra: dict = {}
        if hasattr(harness, "prepare"):
            key = (spec.name, tuple(sorted(shape.items())), dtype)
            if key not in prepared:
                prepared.clear()
                prepared[key] = harness.prepare(spec, dict(shape), dtype, 0, rotate_bytes)
            extra["prepared"] = prepared[key]
        outcome = harness.measure(launcher, dict(config), dict(shape), dtype, warmup=warmup, samples=iters,
                                  timer=timer, **extra)
        return outcome.status, (outcome.timing.median_us if outcome.timing else None)

    return measure


# ------------------------------------------------------------------------------------------
# tuning one case


def _spec(kernel: Any):
    if hasattr(kernel, "legal_configs"):
        return kernel
    from zmlx_pipeline.kernels.registry import UnknownKernel, get_kernel

    try:
        return get_kernel(str(kernel))
    except UnknownKernel as exc:
        raise AutotuneError(str(exc)) from None


def pruned_candidates(spec, shape: Mapping[str, int], dtype: str, legal: list[dict], k: int | None = None,
                      device: str | None = None) -> tuple[list[dict], str]:
    """The bundle's top-k legal configs for this case, capped at a fifth of the legal ones; and a note."""
    pred = predicted_or_default(spec.name, dict(shape), dtype, device=device)
    cap = max(1, int(len(legal) * MAX_FRACTION))
    want = min(cap, k if k is not None else pred.prune_k)
    legal_keys = {tuple(sorted(c.items())): c for c in legal}
    ranked = [legal_keys[t] for t in (tuple(sorted(c.items())) for c in pred.top(10_000)) if t in legal_keys]
    note = ""
    if pred.evidence == "default" or not ranked:
        # the lookup's own default ranking comes first (so the tuner agrees with predicted_config),
        # then the other legal configs nearest the default threadgroup, to fill k
        tg_param = spec.threadgroup_param
        target = pred.threadgroup or 256
        ranked += sorted(legal, key=lambda c: (abs((c.get(tg_param) or target).bit_length() - target.bit_length()),))
        note = f"no model ranking ({pred.note}); timing the configs nearest the default threadgroup"
    elif pred.kernel_version and pred.kernel_version != spec.version:
        note = f"bundle ranks {spec.name} version {pred.kernel_version}, this kernel is {spec.version}"
    seen: set = set()
    out = []
    for c in ranked:
        t = tuple(sorted(c.items()))
        if t not in seen:
            seen.add(t)
            out.append(c)
        if len(out) >= want:
            break
    return out, note


def tune(kernel: Any, shape: Mapping[str, int], dtype: str, *, k: int | None = None, device_aware: bool = True,
         configs: Sequence[Mapping[str, Any]] | None = None, warmup: int = 3, iters: int = 10,
         use_cache: bool = True, device: str | None = None, measure: Measure | None = None,
         cache_path: str | None = None, threadgroups: Sequence[int] | None = None, timer: str = "chain") -> TuneResult:
    """The best config for one case: from the cache, else by timing the pruned candidates (or all, or `configs`).

    `threadgroups` keeps only legal configs with one of these threadgroup sizes (ZMLX's candidate list).
    `timer` is the harness's timer when `measure` is not given ("chain", "gpu" or "auto").
    """
    from zmlx_pipeline.kernels.spec import Limits

    spec = _spec(kernel)
    shape = {d: int(shape[d]) for d in spec.shape_grid.dims}
    chip, mlx_version, meta = _device_and_mlx(device)
    row = meta.pop("limits_row")
    legal = spec.legal_configs(shape, dtype, Limits.from_device_row(row))
    if threadgroups is not None:
        sizes = {int(t[0] if isinstance(t, (tuple, list)) else t) for t in threadgroups}
        legal = [c for c in legal if c.get(spec.threadgroup_param) in sizes]
    if not legal:
        raise AutotuneError(f"{spec.name}: no legal config for {shape} {dtype} on {chip}")
    key = cache_file.entry_key(spec.name, spec.version, shape, spec.shape_grid.dims, dtype, list(spec.params))
    dkey = cache_file.device_key(chip, mlx_version)
    if use_cache:
        hit = cache_file.load_entries(dkey, cache_path).get(key)
        if isinstance(hit, dict) and isinstance(hit.get("config"), dict):
            return TuneResult(spec.name, shape, dtype, dict(hit["config"]), "cache", hit.get("median_us"),
                              legal=len(legal), key=key)
    note = ""
    if configs is not None:
        legal_keys = {tuple(sorted(c.items())) for c in legal}
        cands = [dict(c) for c in configs if tuple(sorted(c.items())) in legal_keys]
        if not cands:
            raise AutotuneError(f"{spec.name}: none of the {len(configs)} given configs is legal for {shape} {dtype}")
    elif device_aware:
        cands, note = pruned_candidates(spec, shape, dtype, legal, k=k, device=chip)
    else:
        cands = list(legal)
    start = time.perf_counter()
    try:
        # inputs rotated over twice the L2, as collect times: the models and the bundle ranked configs
        # by those timings, and with inputs left in L2 a mid-size shape can rank them differently
        from zmlx_pipeline.kernels.harness import rotate_bytes_for

        measure = measure or harness_measure(warmup, iters, rotate_bytes=rotate_bytes_for(row), timer=timer)
    except Exception as exc:  # noqa: BLE001 - no GPU backend: answer from the bundle, time nothing
        pred = predicted_or_default(spec.name, shape, dtype, device=chip)
        config = pred.config if pred.evidence != "default" else cands[0]
        warnings.warn(f"zmlx-pipeline autotune: nothing timed ({exc}); using the {pred.evidence} config", stacklevel=3)
        return TuneResult(spec.name, shape, dtype, config, "predicted", legal=len(legal), key=key, note=str(exc))
    timed = []
    for cfg in cands:
        status, median = measure(spec, cfg, shape, dtype)
        timed.append({"config": cfg, "status": status, "median_us": median})
    wall = time.perf_counter() - start
    ok = [t for t in timed if t["status"] == "ok" and t["median_us"] is not None]
    if not ok:
        pred = predicted_or_default(spec.name, shape, dtype, device=chip)
        return TuneResult(spec.name, shape, dtype, pred.config, "predicted", None, timed, len(legal), wall, key,
                          "no candidate passed the reference check; using the predicted config (not cached)")
    best = min(ok, key=lambda t: t["median_us"])
    if use_cache:
        launch = spec.launch(best["config"], shape)
        value = cache_file.entry_value(best["config"], dtype, launch.threadgroup, median_us=best["median_us"],
                                       candidates_timed=len(timed), legal_configs=len(legal), source="autotune",
                                       grid=list(launch.grid), tuned_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
        cache_file.save_entries(dkey, {key: value}, meta, cache_path)
    return TuneResult(spec.name, shape, dtype, dict(best["config"]), "timed", best["median_us"], timed, len(legal),
                      wall, key, note)


# ------------------------------------------------------------------------------------------
# the decorator


def _dtype_name(dtype: Any) -> str:
    text = str(dtype)
    return text.rsplit(".", 1)[-1] if text.startswith("mlx.") else text


def _first_array(args: tuple, kwargs: dict):
    for value in list(args) + list(kwargs.values()):
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            return value
    return None


class AutotunedKernel:
    """A kernel wrapper whose config keyword is filled with the tuned (or learned) config."""

    def __init__(self, fn: Callable, kernel: Any = None, *, warmup: int = 3, iters: int = 10,
                 device_aware: bool = True, k: int | None = None, shape: Callable[..., Mapping[str, int]] | None = None,
                 dtype: Callable[..., Any] | None = None, configs: Sequence[Mapping[str, Any]] | None = None,
                 config_arg: str | None = None, measure: Measure | None = None, cache_path: str | None = None,
                 device: str | None = None, threadgroups: Sequence[Any] | None = None) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.kernel = kernel
        self.warmup, self.iters, self.device_aware, self.k = warmup, iters, device_aware, k
        self.shape_fn, self.dtype_fn, self.configs = shape, dtype, configs
        self.config_arg = config_arg
        self.measure, self.cache_path, self.device = measure, cache_path, device
        self.threadgroups = threadgroups
        self._spec = None
        self._memo: dict[tuple, Any] = {}
        self.last: TuneResult | None = None

    def _arg_name(self) -> str:
        if self.config_arg is None:
            import inspect

            params = inspect.signature(self.fn).parameters
            for name in ("config", "threadgroup"):
                if name in params:
                    self.config_arg = name
                    break
            else:
                raise AutotuneError(f"{self.fn.__name__} takes neither a config= nor a threadgroup= keyword; "
                                    "pass config_arg= to @autotune")
        return self.config_arg

    def _case(self, args: tuple, kwargs: dict) -> tuple[dict, str]:
        spec = self._spec
        if self.shape_fn is not None:
            shape = dict(self.shape_fn(*args, **kwargs))
        else:
            arr = _first_array(args, kwargs)
            dims = spec.shape_grid.dims if spec is not None else ("rows", "cols")
            if arr is None or len(dims) != 2 or len(arr.shape) < 1:
                raise AutotuneError(f"{self.fn.__name__}: cannot tell the {'/'.join(dims)} shape of this call; "
                                    "pass shape=lambda *args, **kw: {...} to @autotune")
            rows = 1
            for n in arr.shape[:-1]:
                rows *= int(n)
            shape = {dims[0]: rows, dims[1]: int(arr.shape[-1])}
        if self.dtype_fn is not None:
            dtype = _dtype_name(self.dtype_fn(*args, **kwargs))
        else:
            arr = _first_array(args, kwargs)
            dtype = _dtype_name(arr.dtype) if arr is not None else "float32"
        return shape, dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self._arg_name()
        if kwargs.get(name) is not None:
            return self.fn(*args, **kwargs)
        if self.kernel is None:
            value = self._learned_threadgroup(args, kwargs)
        else:
            if self._spec is None:
                self._spec = _spec(self.kernel)
            shape, dtype = self._case(args, kwargs)
            memo_key = (tuple(sorted(shape.items())), dtype)
            value = self._memo.get(memo_key)
            if value is None:
                self.last = tune(self._spec, shape, dtype, k=self.k, device_aware=self.device_aware,
                                 configs=self.configs, warmup=self.warmup, iters=self.iters, device=self.device,
                                 measure=self.measure, cache_path=self.cache_path, threadgroups=self.threadgroups)
                value = self.last.config
                if name == "threadgroup":
                    value = tuple(self._spec.launch(value, shape).threadgroup)
                self._memo[memo_key] = value
        return self.fn(*args, **{**kwargs, name: value})

    def _learned_threadgroup(self, args: tuple, kwargs: dict) -> Any:
        from zmlx_pipeline.runtime.profiles import get_current_device_profile, get_threadgroup_candidates_for_shape

        arr = _first_array(args, kwargs)
        dim = int(arr.shape[-1]) if arr is not None and len(arr.shape) else 0
        memo_key = ("tg", dim)
        value = self._memo.get(memo_key)
        if value is None:
            profile = get_current_device_profile()
            if self.device_aware:
                cands = get_threadgroup_candidates_for_shape(profile, dim, "general")
                tg = cands[0] if cands else profile.default_threadgroup
            else:
                tg = profile.default_threadgroup
            value = (int(tg), 1, 1) if self._arg_name() == "threadgroup" else {"TG": int(tg)}
            self._memo[memo_key] = value
        return value

    def clear_cache(self) -> None:
        """Forget this wrapper's in-process answers (the cache file is kept)."""
        self._memo.clear()


def autotune(kernel: Any = None, *, warmup: int = 3, iters: int = 10, device_aware: bool = True,
             k: int | None = None, shape: Callable[..., Mapping[str, int]] | None = None,
             dtype: Callable[..., Any] | None = None, configs: Sequence[Mapping[str, Any]] | None = None,
             threadgroups: Sequence[Any] | None = None, config_arg: str | None = None,
             measure: Measure | None = None, cache_path: str | None = None, device: str | None = None):
    """Decorate a kernel wrapper so that its `config=` (or `threadgroup=`) keyword is tuned per shape and dtype.

    `kernel`: a registered kernel name, a `module:attr` path or a KernelSpec (its configs, reference
    and launch are what is timed). `warmup`/`iters`: launches before timing and timed samples per
    candidate. `device_aware`: time the bundle's pruned candidates for this chip (True) or every
    legal config (False). `k`: candidates to time (default: the kernel's pruning k). `shape`/`dtype`:
    functions of the call's arguments giving the kernel's shape dict and dtype (default: the first
    array argument, rows x cols). `configs`: an explicit candidate list; `threadgroups`: only
    configs with these threadgroup sizes.
    """
    if callable(kernel) and not isinstance(kernel, str) and not hasattr(kernel, "legal_configs"):
        return AutotunedKernel(kernel)  # bare @autotune

    def decorator(fn: Callable) -> AutotunedKernel:
        return AutotunedKernel(fn, kernel, warmup=warmup, iters=iters, device_aware=device_aware, k=k, shape=shape,
                               dtype=dtype, configs=configs, config_arg=config_arg, measure=measure,
                               cache_path=cache_path, device=device, threadgroups=threadgroups)

    return decorator
