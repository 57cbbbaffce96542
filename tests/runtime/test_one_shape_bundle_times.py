"""A bundle measured at one shape: a shape past that range has its time moved by the kernel's work from the measured
point; a shape below it, whose moved time would be under the least time the chip was ever quoted, has none, since
what a launch costs there was never measured."""

import polars as pl
import pytest

from bundle_fixtures import SMOKE_SHARD
from zmlx_pipeline.runtime import load_bundle, predicted_config

DEVICE = "nvidia-h100-sxm@32sm"  # the device the shard measured
MEASURED = {"rows": 4096, "cols": 16384}


@pytest.fixture(scope="module")
def one_shape(tmp_path_factory):
    from zmlx_pipeline.data.shards import ingest_shards
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.publish import publish

    root = tmp_path_factory.mktemp("one-shape")
    shard = root / "one.parquet"
    pl.read_parquet(SMOKE_SHARD).filter((pl.col("kernel") == "rmsnorm") & (pl.col("dtype") == "float16")
                                        & (pl.col("shape") == '{"cols":16384,"rows":4096}')).write_parquet(shard)
    with Store(root / "one.duckdb") as store:
        ingest_shards(store, [shard])
        publish(store, root / "bundles", kernels=["rmsnorm"], devices=["nvidia-h100-sxm"])
    return root / "bundles"


@pytest.mark.parametrize("shape", [{"rows": 4096, "cols": 32768}, {"rows": 65536, "cols": 16384}])
def test_a_shape_past_a_one_shape_range_has_the_measured_time_moved_by_its_work(one_shape, shape):
    from zmlx_pipeline.kernels.registry import get_kernel

    bundle = load_bundle(one_shape, strict=True)
    assert bundle.kernels["rmsnorm"]["measured_range"] == {"rows": [4096, 4096], "cols": [16384, 16384]}
    measured = predicted_config("rmsnorm", MEASURED, "float16", device=DEVICE)
    assert measured.evidence == "measured" and measured.predicted_us > 0
    p = predicted_config("rmsnorm", shape, "float16", device=DEVICE)
    assert p.outside_range and p.evidence == "predicted"
    assert "time moved by the kernel's work" in p.note
    spec = get_kernel("rmsnorm")  # memory-bound: the measured time times the bytes ratio
    want = measured.predicted_us * spec.bytes_moved(shape, 2) / spec.bytes_moved(MEASURED, 2)
    assert p.predicted_us == pytest.approx(want, rel=1e-3) and p.predicted_us > measured.predicted_us


@pytest.mark.parametrize("device", [DEVICE])
@pytest.mark.parametrize("shape", [{"rows": 4096, "cols": 4096}, {"rows": 1, "cols": 4096}, {"rows": 512, "cols": 16384}])
def test_a_shape_below_a_one_shape_range_has_no_time_under_the_least_the_chip_was_quoted(one_shape, shape, device):
    """Less work than the one measured shape: the work alone would quote a fraction of the only time this chip has,
    and nothing says how much of it a launch's fixed cost would keep, so no time is quoted."""
    load_bundle(one_shape, strict=True)
    measured = predicted_config("rmsnorm", MEASURED, "float16", device=device)
    assert measured.outside_range == () and measured.predicted_us > 0
    p = predicted_config("rmsnorm", shape, "float16", device=device)
    assert p.outside_range and p.config is not None and p.predicted_us is None
    assert "no predicted time: moved by the work it would take less than the least time quoted for any kernel on " \
           f"{p.device} (" in p.note


def test_the_whole_chip_of_a_core_limited_run_is_quoted_no_time_at_any_shape(one_shape):
    """The bundle's one measured device ran on 32 SMs: the whole H100 takes its ranking, never its times."""
    load_bundle(one_shape, strict=True)
    for shape in (MEASURED, {"rows": 1, "cols": 4096}, {"rows": 65536, "cols": 16384}):
        p = predicted_config("rmsnorm", shape, "float16", device="nvidia-h100-sxm")
        assert p.config is not None and p.predicted_us is None
        assert "nvidia-h100-sxm@32sm ran on part of nvidia-h100-sxm's cores" in p.note
