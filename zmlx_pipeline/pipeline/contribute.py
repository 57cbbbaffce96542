"""The contributor path: time every built-in kernel on this machine's GPU within a budget, then write
one shard named after the chip, ready to send."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from zmlx_pipeline.data.detect import slug
from zmlx_pipeline.data.records import DTYPES
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.kernels.spec import KernelSpec
from zmlx_pipeline.pipeline.collect import (
    CollectError,
    CollectResult,
    Measurer,
    collect,
)


@dataclass(frozen=True)
class Contribution:
    """What a contribute run wrote: the shard, its rows, and the collect run before it."""

    path: Path
    rows: int
    device_id: str
    known: bool
    collected: CollectResult

    def as_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "rows": self.rows, "bytes": self.path.stat().st_size,
                "device": self.device_id, "in_catalog": self.known, "collect": self.collected.as_dict()}


def shard_name(device_id: str, day: dt.date) -> str:
    """The shard's file name: the chip's catalog id and the day, e.g. apple-m3-max-40c-2026-03-11.parquet."""
    return f"{slug(device_id)}-{day.isoformat()}.parquet"


def check_out_dir(out_dir: Path) -> None:
    """CollectError (one line) when the shard cannot go into `out_dir`: a file on its path, or a published bundle
    or publish directory (which holds what publish writes alone)."""
    from zmlx_pipeline.runtime.bundle import folder_problem

    problem = folder_problem(out_dir)
    if problem is not None:
        raise CollectError(f"cannot write the shard into {out_dir}: {problem}; choose another --out")


def contribute(
    store: Store,
    device: Any,  # a DetectedDevice
    out_dir: str | Path,
    specs: Sequence[KernelSpec],
    *,
    budget_s: float | None,
    preset: str = "full",
    dtypes: Sequence[str] = DTYPES,
    configs_limit: int | None = None,
    day: dt.date | None = None,
    jobs: int = 1,
    kernel_refs: Mapping[str, str] | None = None,
    measurer: Measurer | None = None,
    on_plan: Callable[[int, int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Contribution:
    """Collect what is missing for `device` (`preset` grid, every dtype) within `budget_s`, then export all
    of the device's measurements in the store (earlier runs' too) as one zstd Parquet shard in `out_dir`."""
    check_out_dir(Path(out_dir))  # before the budget is spent, not after
    result = collect(store, device, specs, dtypes=dtypes, preset=preset, budget_s=budget_s, jobs=jobs,
                     kernel_refs=kernel_refs, configs_limit=configs_limit, measurer=measurer, on_plan=on_plan,
                     clock=clock)
    if result.stopped == "interrupted":  # what it measured is stored, and the next contribute resumes from it
        raise KeyboardInterrupt
    if result.done + result.already == 0:
        raise CollectError(f"nothing of {device.device_id} was measured, so there is no shard to write; "
                           "give a longer --budget")
    path = Path(out_dir) / shard_name(device.device_id, day or dt.date.today())
    rows = store.export_shard(path, device=device.device_id)
    return Contribution(path=path, rows=rows, device_id=device.device_id, known=device.known, collected=result)
