"""Test doubles for Ray collect (unit tests only): a fake CUDA device and a measurer that can die mid-job.

Loaded by the actors as `ray_doubles:...` (the test puts this folder on PYTHONPATH). With the file
$FAKE_RAY_DIR/die present, the actor on fake GPU "1" kills its own process after 3 results.
"""

from __future__ import annotations

import os

from zmlx_pipeline.data.detect import detect_device
from zmlx_pipeline.core.keys import mapping_key
from zmlx_pipeline.kernels.harness import Outcome
from zmlx_pipeline.kernels.timing import Timing


def fake_device():
    return detect_device({"device_name": "NVIDIA H200", "architecture": "sm_90"}, backend="cuda", gpu_cores=132)


def fake_measurer(backend, settings):
    count = [0]
    die = os.path.join(os.environ.get("FAKE_RAY_DIR", "/nonexistent"), "die")

    def measure(task):
        count[0] += 1
        if count[0] > 3 and os.environ.get("CUDA_VISIBLE_DEVICES") == "1" and os.path.exists(die):
            os._exit(9)
        h = int(mapping_key({**task.shape, **task.config, "d": task.dtype})[7:13], 16)
        t = 10.0 + h % 1000 / 10.0
        return Outcome("ok", timing=Timing(t, t * 0.9, t * 1.1, 5, 1))

    return measure
