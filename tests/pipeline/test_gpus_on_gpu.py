"""On a CUDA host: collect --gpus with the real worker measures every planned config once, each GPU its own run."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.cuda]


def test_collect_on_every_gpu_of_this_host(tmp_path):
    from zmlx_pipeline.data.detect import detect_device
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.pipeline.collect import TimingSettings, collect
    from zmlx_pipeline.pipeline.gpus import parse_gpus

    gpus = parse_gpus("all")[:2]
    device = detect_device()
    with Store(str(tmp_path / "s.duckdb")) as store:
        result = collect(store, device, [get_kernel("rmsnorm")], dtypes=("float16",), preset="smoke",
                         settings=TimingSettings(timer="chain", samples=2), kernel_refs={"rmsnorm": "rmsnorm"},
                         shapes_limit=2, configs_limit=4, gpus=gpus)
        rows = store.measurements(device=device.device_id, kernel="rmsnorm")
    assert result.done == result.planned == len(rows) > 0
    assert result.by_status.get("ok") == result.done, result.by_status
    assert {r["run_id"] for r in rows} <= set(result.gpu_runs.values()) and len(result.gpu_runs) == len(gpus)
