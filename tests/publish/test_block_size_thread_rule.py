"""A kernel imported from Kernel Tuner names no threadgroup parameter but its thread block (block_size_x,
block_size_y, block_size_z): a device registered with 256 threads per threadgroup is published, and offered by
lookups, no block of more threads than that (the product of the block's sizes), as a kernel with a threadgroup
parameter is held to its limit; a catalog chip of 1024 keeps its widest blocks."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).parents[1] / "pipeline"))

from bundle_fixtures import add_device  # noqa: E402
from device_records import record  # noqa: E402
from zmlx_pipeline.data.records import Measurement  # noqa: E402
from zmlx_pipeline.data.registered import register_device  # noqa: E402
from zmlx_pipeline.data.store import Store  # noqa: E402
from zmlx_pipeline.publish import publish  # noqa: E402
from zmlx_pipeline.runtime.lookup import thread_rule  # noqa: E402

#: blocks of 64 to 1024 threads (x times y); the 1024-thread ones fastest everywhere
CONFIGS = [{"block_size_x": x, "block_size_y": y} for x in (64, 128, 256, 512, 1024) for y in (1, 2)
           if x * y <= 1024]
SHAPES = [{"n": n} for n in (1024, 65536, 1 << 20)]


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("blocks")
    with Store(root / "s.duckdb") as store:
        for device in ("nvidia-h100-sxm", "nvidia-h200"):
            add_device(store, device)
            run = store.start_run(device, host="test", backend="cuda", mlx_version="0.30.0",
                                  pipeline_version="0.1.0", settings={}, status="imported")
            store.record([Measurement(run_id=run, device_id=device, kernel="kt_vec",
                                      kernel_version="sha256:00000000000000ab", dtype="float32", shape=shape,
                                      config=cfg, status="ok", p10_us=None, p90_us=None, samples=10,
                                      median_us=1 + abs(math.log2(cfg["block_size_x"] * cfg["block_size_y"]) - 10))
                          for shape in SHAPES for cfg in CONFIGS])
            store.finish_run(run, "imported")
        register_device(store, record(root / "acme.json", id="acme-x256", name="Acme X256", aliases=["Acme X256"],
                                      variant="acme-x256", max_threads_per_threadgroup=256))
        publish(store, root / "out", devices=["acme-x256", "nvidia-h200"], record=False, jobs=1)
    return root / "out"


def test_the_rule_reads_the_block_sizes_a_kernel_has():
    assert thread_rule({"params": ["block_size_x", "block_size_y", "loop"], "constraints": []}) == [
        "block_size_x * block_size_y <= max_threads"]
    assert thread_rule({"params": ["block_size_x"], "constraints": ["block_size_x <= max_threads // 2"]}) == []
    assert thread_rule({"threadgroup_param": "TG", "params": ["TG", "block_size_x"], "constraints": []}) == [
        "TG <= max_threads"]


@pytest.mark.parametrize("device, most", [("acme-x256", 256), ("Acme X256", 256), ("nvidia-h200", 1024)])
def test_lookups_offer_no_block_past_the_devices_limit(published, device, most):
    from zmlx_pipeline.runtime import load_bundle, predicted_config

    load_bundle(published, strict=True)
    answer = predicted_config("kt_vec", {"n": 65536}, "float32", device=device)
    threads = [c["block_size_x"] * c["block_size_y"] for c in (answer.config, *answer.candidates)]
    assert max(threads) == most
