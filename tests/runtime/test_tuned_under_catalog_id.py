"""A catalog chip tuned under a name that is not its id (`NVIDIA-H200`, `nvidia-h200 `) is cached under its id, as
lookups answer such a name: one cache section per chip, never one per spelling, and other entries kept."""

import json
import math

import mlx.core as mx
import pytest

from zmlx_pipeline.runtime import cache, tune

SHAPE = {"rows": 3000, "cols": 2048}


def measure(spec, config, shape, dtype):
    return "ok", 10 * (1 + abs(math.log2(config["TG"]) - 8) + 0.1 * config["VEC"])


@pytest.mark.parametrize("name", ["NVIDIA-H200", "nvidia-h200 ", "H200"])
def test_a_chip_named_otherwise_is_tuned_and_cached_under_its_catalog_id(tmp_path, name):
    path = tmp_path / "autotune_v3.json"
    cache.save_entries("Other_0.1", {"kept": {"config": {"TG": 64}}}, path=path)

    first = tune("rmsnorm", SHAPE, "float16", device=name, measure=measure, cache_path=str(path))
    assert first.source == "timed"
    sections = json.loads(path.read_text())["devices"]
    assert sorted(sections) == ["Other_0.1", cache.device_key("nvidia-h200", mx.__version__)]
    assert sections["Other_0.1"]["entries"] == {"kept": {"config": {"TG": 64}}}

    again = tune("rmsnorm", SHAPE, "float16", device="nvidia-h200", measure=measure, cache_path=str(path))
    assert again.source == "cache" and again.config == first.config

