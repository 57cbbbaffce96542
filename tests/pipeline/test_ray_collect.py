"""Collect on a Ray cluster (needs the `ray` extra; skipped without it): one actor per GPU, shards ingested,
a killed actor's work resumed by the next run. Local Ray with two fake GPUs and a fake measurer."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from zmlx_pipeline.data.store import Store
from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.pipeline.collect import TimingSettings

ray = pytest.importorskip("ray")

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    flag_dir = tmp_path_factory.mktemp("flags")
    saved = {k: os.environ.get(k) for k in ("FAKE_RAY_DIR", "PYTHONPATH")}
    os.environ["FAKE_RAY_DIR"] = str(flag_dir)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), *sys.path])  # the actors import these
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield flag_dir
    ray.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _run(store, shards, **kw):
    from zmlx_pipeline.pipeline.ray_collect import collect_on_ray

    return collect_on_ray(store, [get_kernel("rmsnorm")], {"rmsnorm": "rmsnorm"}, shard_dir=str(shards),
                          dtypes=["float16", "float32"], preset="smoke", settings=TimingSettings(timer="chain"),
                          detect="ray_doubles:fake_device", measurer="ray_doubles:fake_measurer", flush_every=2, **kw)


def test_every_gpu_gets_an_actor_and_a_killed_one_is_resumed_by_the_next_run(cluster, tmp_path):
    shards = tmp_path / "shards"
    (cluster / "die").write_text("")
    with Store(str(tmp_path / "s.duckdb")) as store:
        first = _run(store, shards)
        assert sorted(a["gpu"] for a in first["actors"]) == ["0", "1"]
        lost = [a for a in first["actors"] if a["stopped"].startswith("lost")]
        assert len(lost) == 1 and first["remaining"] > 0
        device = first["actors"][0]["device"]
        partial = store.measurements(device=device, kernel="rmsnorm")
        assert first["planned"] > len(partial) > 0  # the lost actor's flushed results were kept
        (cluster / "die").unlink()
        second = _run(store, shards)
        assert second["planned"] == first["planned"] - len(partial)
        assert all(a["stopped"] == "finished" for a in second["actors"])
        rows = store.measurements(device=device, kernel="rmsnorm")
        keys = [(r["dtype"], r["shape_key"], r["config_key"]) for r in rows]
        assert len(keys) == len(set(keys)) == first["planned"]
        third = _run(store, shards)
        assert third["planned"] == 0
