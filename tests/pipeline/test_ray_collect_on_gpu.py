"""On a CUDA host with two or more GPUs and Ray installed: collect --ray on a local Ray cluster with the real
measurer stores the same keys as collect --gpus on the same GPUs, each once, one run per actor."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ray_cluster():
    ray = pytest.importorskip("ray")
    from zmlx_pipeline.pipeline.gpus import visible_gpu_count

    n = visible_gpu_count()
    if n < 2:
        pytest.skip(f"needs two or more CUDA GPUs (this host shows {n})")
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *sys.path])  # the actors import the package from here
    ray.init(num_cpus=n + 1, num_gpus=n, include_dashboard=False, log_to_driver=False)
    yield n
    ray.shutdown()
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved


def test_a_ray_collect_stores_the_keys_of_a_collect_on_every_gpu_once_each(ray_cluster, tmp_path):
    from zmlx_pipeline.data.detect import detect_device
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.pipeline.collect import TimingSettings, collect
    from zmlx_pipeline.pipeline.gpus import parse_gpus
    from zmlx_pipeline.pipeline.ray_collect import collect_on_ray

    settings = TimingSettings(timer="chain", samples=2)
    limits = {"shapes_limit": 2, "configs_limit": 4}
    device = detect_device()
    with Store(str(tmp_path / "gpus.duckdb")) as store:
        local = collect(store, device, [get_kernel("rmsnorm")], dtypes=("float16", "float32"), preset="smoke",
                        settings=settings, kernel_refs={"rmsnorm": "rmsnorm"}, gpus=parse_gpus("all"), **limits)
        local_rows = store.measurements(device=device.device_id, kernel="rmsnorm")
    with Store(str(tmp_path / "ray.duckdb")) as store:
        out = collect_on_ray(store, [get_kernel("rmsnorm")], {"rmsnorm": "rmsnorm"}, address="local",
                             shard_dir=str(tmp_path / "shards"), dtypes=["float16", "float32"], preset="smoke",
                             settings=settings, **limits)
        ray_rows = store.measurements(device=device.device_id, kernel="rmsnorm")
        runs = store.runs(device=device.device_id)
        again = collect_on_ray(store, [get_kernel("rmsnorm")], {"rmsnorm": "rmsnorm"}, address="local",
                               shard_dir=str(tmp_path / "shards"), dtypes=["float16", "float32"], preset="smoke",
                               settings=settings, **limits)

    def keys(rows):
        return sorted((r["dtype"], r["shape_key"], r["config_key"]) for r in rows)

    assert local.done == local.planned == len(local_rows) > 0
    assert out["planned"] == local.planned and out["remaining"] == 0
    assert sorted(a["gpu"] for a in out["actors"]) == sorted(str(i) for i in range(ray_cluster))
    assert all(a["stopped"] == "finished" and a["device"] == device.device_id for a in out["actors"])
    assert keys(ray_rows) == keys(local_rows) and len(set(keys(ray_rows))) == len(ray_rows)
    assert all(r["status"] == "ok" for r in ray_rows)
    assert {r["run_id"] for r in ray_rows} == {r["run_id"] for r in runs} and len(runs) == ray_cluster
    assert again["planned"] == 0
