"""The rows collect writes and every later stage reads: a measurement and its statuses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zmlx_pipeline.core.dtypes import DTYPE_BYTES
from zmlx_pipeline.core.keys import canonical_json, mapping_key

STATUSES = ("ok", "wrong_result", "launch_error", "compile_error", "timeout")
DTYPES = tuple(DTYPE_BYTES)


@dataclass(frozen=True)
class Measurement:
    """One timed (or failed) launch config of one kernel, dtype and shape on one device."""

    run_id: str
    device_id: str
    kernel: str
    kernel_version: str
    dtype: str
    shape: dict[str, int]
    config: dict[str, Any]
    status: str
    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    samples: int = 0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; expected one of {', '.join(STATUSES)}")

    @property
    def shape_key(self) -> str:
        return mapping_key(self.shape)

    @property
    def config_key(self) -> str:
        return mapping_key(self.config)

    @property
    def shape_json(self) -> str:
        return canonical_json(self.shape)

    @property
    def config_json(self) -> str:
        return canonical_json(self.config)
