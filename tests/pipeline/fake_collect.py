"""Test double of a GPU: runs the real collect stage with a fake measurer (unit tests only).

Usage: python fake_collect.py STORE_PATH [SLEEP_S]
Prints one line per recorded measurement so a test can kill it mid-run.
"""

from __future__ import annotations

import sys
import time

from zmlx_pipeline.data.detect import detect_device
from zmlx_pipeline.core.keys import mapping_key
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.kernels.harness import Outcome
from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.timing import Timing
from zmlx_pipeline.pipeline.collect import collect


def fake_measurer(sleep_s: float):
    def measure(task):
        time.sleep(sleep_s)
        h = int(mapping_key({**task.shape, **task.config, "d": task.dtype})[7:13], 16)
        if h % 11 == 0:
            return Outcome("wrong_result", error="fake mismatch")
        t = 10.0 + h % 1000 / 10.0
        return Outcome("ok", timing=Timing(t, t * 0.9, t * 1.1, 5, 1))

    return measure


def main() -> None:
    path = sys.argv[1]
    sleep_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    device = detect_device({"device_name": "NVIDIA H200", "architecture": "sm_90"}, backend="cuda", gpu_cores=132)
    with Store(path) as store:
        collect(store, device, [get_kernel("rmsnorm")], preset="smoke", measurer=fake_measurer(sleep_s),
                on_result=lambda task, outcome: print("recorded", flush=True))


if __name__ == "__main__":
    main()
