"""What a kernel wrapper imports: verified profile bundles, microsecond lookups, and the pruned autotuner.

Standard library only (MLX is imported when something is timed or the device is detected);
importing this package loads neither duckdb, polars nor scikit-learn, and each part below is
imported on first use.

    from zmlx_pipeline.runtime import predicted_config, candidates, autotune, load_bundle
    p = predicted_config("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", device="nvidia-h200")
    p.config, p.evidence, p.expected_regret

It also answers everything `zmlx.device_profile` exports (`get_device_profile`, `ALL_DEVICE_PROFILES`, ...),
from the learned tables.
Every error it raises on purpose is a `RuntimeAPIError`, and also the builtin a caller expects
(an unknown kernel or dtype a LookupError, a malformed argument a ValueError or TypeError).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AutotuneError": "tuner", "TuneResult": "tuner", "autotune": "tuner", "tune": "tuner",
    "LaunchRefused": "tuner", "RefusedConfigWarning": "tuner", "launch_ranked": "tuner",
    "Bundle": "bundle", "BundleError": "bundle", "BundleWarning": "bundle", "FetchError": "bundle",
    "active_bundle": "bundle", "load_bundle": "bundle", "read_bundle": "bundle",
    "BadLookup": "lookup", "Prediction": "lookup", "bucket_of": "lookup", "candidates": "lookup",
    "predicted_config": "lookup",
    "BadArgument": "errors", "BadArgumentType": "errors", "RuntimeAPIError": "errors", "UnknownDtypeError": "errors",
    "UnknownDeviceError": "errors", "UnknownKernelError": "errors", "UnknownKernelType": "errors",
    "UnknownName": "errors",
    "DeviceTuningProfile": "profiles", "get_current_device_profile": "profiles", "get_device_profile": "profiles",
    "get_threadgroup_candidates_for_shape": "profiles", "ALL_DEVICE_PROFILES": "profiles",
}
#: names worked out on each access (they follow the bundle loaded at the time), never kept here
_LIVE = {"ALL_DEVICE_PROFILES"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    if name not in _LIVE:
        globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
