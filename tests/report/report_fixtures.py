"""A small real store for the report's tests (three devices, four shapes, 12 configs of one kernel, times from
a formula) and checks of the files a report writes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.data.records import Measurement
from zmlx_pipeline.data.store import Store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DEVICES = {"nvidia-rtx-a4000": 448.0, "nvidia-rtx-a6000": 768.0, "apple-m3-max-40c": 400.0}
BEST_TG = {"nvidia-rtx-a4000": 256, "nvidia-rtx-a6000": 512, "apple-m3-max-40c": 128}


def synthetic_time(device: str, rows: int, cols: int, tg: int, vec: int) -> float:
    """A bandwidth-bound time with a best TG per device (shifting with the row length) and VEC 4 best."""
    base = rows * cols * 4 / DEVICES[device] / 1e3 + 2.0
    best_tg = BEST_TG[device] * (2 if cols >= 4096 else 1)
    return base * (1 + 0.3 * abs(math.log2(tg / best_tg))) * (1 + 0.1 * abs(math.log2(vec / 4)))


def fill_store(store: Store, kernel: str = "rowk", devices=tuple(DEVICES)) -> None:
    """Three devices x four shapes x 12 configs (TG x VEC) of one kernel, ROWS fixed at 1."""
    for d in devices:
        store.upsert_device({**get_device(d).as_row(), "device_id": d, "in_catalog": True})
    store.record([
        Measurement(run_id="run-1", device_id=d, kernel=kernel, kernel_version="sha256:0000000000000001",
                    dtype="float16", shape={"rows": rows, "cols": cols}, config={"TG": tg, "VEC": vec, "ROWS": 1},
                    status="ok", median_us=t, p10_us=t * 0.95, p90_us=t * 1.05, samples=10)
        for d in devices for rows, cols in ((1, 1024), (16, 4096), (256, 1024), (1024, 8192))
        for tg in (64, 128, 256, 512, 1024) for vec in (1, 2, 4)
        for t in [synthetic_time(d, rows, cols, tg, vec)]
    ])


def assert_png(path: Path, min_side: int = 200) -> np.ndarray:
    """The file is a PNG matplotlib can read, of a sensible size, and not a single colour."""
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_MAGIC, path
    img = imread(path)
    assert img.ndim == 3 and min(img.shape[:2]) >= min_side, (path, img.shape)
    assert float(img[..., :3].std()) > 0.02, f"{path} is blank"
    return img
