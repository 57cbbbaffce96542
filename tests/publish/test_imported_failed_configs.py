"""An imported kernel's table never ranks a config that failed on that device and never ran there, nor, for a chip
never measured, one that failed on the measured chips of its family and ran on none of them; other families keep it
(Kernel Tuner's convolution: configs of 1,024 threads fail on NVIDIA cards and run fastest on AMD ones)."""

import math
from pathlib import Path

import pytest

from bundle_fixtures import add_device
from zmlx_pipeline.data.records import Measurement
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.runtime import load_bundle, predicted_config

KERNEL = "kt_conv"
NVIDIA = ("nvidia-h100-sxm", "nvidia-h200")  # both Hopper
AMD = ("amd-mi250x", "amd-mi300x")
NEW_HOPPER = "nvidia-h100-pcie"  # never measured: answers from its family
SHAPES = [{"n": n} for n in (1024, 4096, 16384)]
CONFIGS = [{"block_size_x": b, "tile": t} for b in (64, 128, 256, 512, 1024) for t in (1, 2, 4)]
ONLY_H200_FAILS = {"block_size_x": 512, "tile": 4}


def conv_time(shape: dict, config: dict) -> float:
    """Larger blocks are faster everywhere they run: the fastest configs are the ones NVIDIA refuses."""
    return shape["n"] / 1e3 * (1 + 2.0 / math.log2(config["block_size_x"])) * (1 + 0.05 * config["tile"])


def status(device: str, config: dict) -> str:
    if device in NVIDIA and config["block_size_x"] == 1024:
        return "launch_error"
    if device == "nvidia-h200" and config == ONLY_H200_FAILS:
        return "compile_error"
    return "ok"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    from zmlx_pipeline.publish import publish

    root = tmp_path_factory.mktemp("conv")
    with Store(root / "conv.duckdb") as store:
        for device in NVIDIA + AMD:
            add_device(store, device)
            run = store.start_run(device, host="test", backend="cuda", mlx_version="0.30.0",
                                  pipeline_version="0.1.0", settings={}, status="imported")
            rows = []
            for shape in SHAPES:
                for config in CONFIGS:
                    st = status(device, config)
                    rows.append(Measurement(run_id=run, device_id=device, kernel=KERNEL,
                                            kernel_version="sha256:00000000000000cc", dtype="float32", shape=shape,
                                            config=config, status=st,
                                            median_us=conv_time(shape, config) if st == "ok" else None,
                                            samples=10 if st == "ok" else 0,
                                            error=None if st == "ok" else "too many resources requested for launch"))
            store.record(rows)
            store.finish_run(run, "imported")
        publish(store, root / "pub", devices=[NEW_HOPPER, "amd-mi210"], evaluate=False)
    return root / "pub"


def _ranked(device: str, shape: dict) -> list[dict]:
    return predicted_config(KERNEL, shape, "float32", device=device).top(len(CONFIGS))


def test_a_config_that_never_ran_on_a_device_or_its_family_is_never_ranked_there(bundle):
    load_bundle(bundle, strict=True)
    refused = [c for c in CONFIGS if c["block_size_x"] == 1024]
    for shape in SHAPES:
        for device in (*NVIDIA, NEW_HOPPER):
            ranked = _ranked(device, shape)
            assert ranked and not [c for c in ranked if c in refused], device
        h200, h100 = _ranked("nvidia-h200", shape), _ranked("nvidia-h100-sxm", shape)
        assert ONLY_H200_FAILS not in h200 and ONLY_H200_FAILS in h100  # it ran on the H100: kept there
        assert ONLY_H200_FAILS in _ranked(NEW_HOPPER, shape)  # it ran on one chip of the family
        for device in (*AMD, "amd-mi210"):  # the AMD chips ran them all: the fastest lead there
            ranked = _ranked(device, shape)
            assert set(map(str, refused)) <= set(map(str, ranked)) and ranked[0]["block_size_x"] == 1024, device
