"""DeviceTransferRanker's device distance: the weight of the core count, equal by default, chosen by leaving one
training device out in `transfer_cores`."""

import math

import numpy as np
import polars as pl
import pytest

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.data.records import Measurement
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models.features import store_features
from zmlx_pipeline.models.rankers.base import ModelError
from zmlx_pipeline.models.transfer import CORE_WEIGHTS, DeviceTransferRanker, spec_distances
from zmlx_pipeline.models.variants import make_ranker

CHIPS = ("nvidia-h100-sxm", "nvidia-h200", "nvidia-h100-pcie")  # 132, 132 and 114 SMs; 3350, 4800 and 2000 GB/s
DEVICES = (*CHIPS, *[f"{c}@32sm" for c in CHIPS])
TGS = (32, 64, 128, 256, 512, 1024)


def _row(device_id: str) -> dict:
    chip, _, limit = device_id.partition("@")
    spec = get_device(chip)
    if limit:
        spec = spec.with_core_limit(int(limit.removesuffix("sm")))
    return {**spec.as_row(), "device_id": device_id, "in_catalog": not limit}


def _features(tmp_path, best_tg):
    """Kernel "k" on the six devices at ten shapes, 18 configs (the per-device models need rows to split), the
    best TG given by `best_tg(device_id, rows)`."""
    with Store(tmp_path / "store.duckdb") as store:
        for device_id in DEVICES:
            store.upsert_device(_row(device_id))
        store.record([
            Measurement(run_id="run-1", device_id=d, kernel="k", kernel_version="sha256:0000000000000001",
                        dtype="float32", shape={"rows": r, "cols": c}, config={"TG": tg, "VEC": vec}, status="ok",
                        median_us=(2.0 + r * c / 65536 / vec) * (1 + 0.2 * (math.log2(tg) - math.log2(best_tg(d, r))) ** 2),
                        p10_us=None, p90_us=None, samples=10)
            for d in DEVICES for r in (1, 16, 256, 4096, 16384) for c in (1024, 4096) for tg in TGS for vec in (1, 2, 4)
        ])
        return store_features(store)["k"]


def by_cores(device_id: str, rows: int) -> int:
    """Launch configs that follow the core count: fewer SMs, smaller threadgroups."""
    return 64 if "@" in device_id else 512


def by_chip(device_id: str, rows: int) -> int:
    """Launch configs that follow the chip (its memory), whatever its core limit."""
    return 64 if device_id.startswith("nvidia-h100") else 512


def _regret(frame: pl.DataFrame, scores: np.ndarray) -> float:
    """Regret@1: the geometric mean over cases of the lowest-scored config's time over the case's best."""
    picks = frame.with_columns(_s=pl.Series(scores)).sort("_s").group_by("shape_key").first()
    return float(np.exp(picks["log_rel"].mean()))


def test_where_configs_follow_the_core_count_a_new_chip_borrows_from_the_other_chip_not_its_own_limited_runs(tmp_path):
    features = _features(tmp_path, by_cores)
    train = features.frame.filter(pl.col("device_id") != "nvidia-h100-sxm")
    test = features.frame.filter(pl.col("device_id") == "nvidia-h100-sxm")
    chosen = make_ranker(features, "transfer_cores").fit(train)
    equal = make_ranker(features, "transfer").fit(train)  # the default member: equal weights
    assert equal.core_weight == 1.0 and chosen.core_weight > 1.0
    # equal spec weights put the H100's own 32-SM runs nearest: they differ from it in core count alone
    ids, w_equal = equal.device_weights(test)
    assert equal.device_ids[int(w_equal[0].argmax())] == "nvidia-h100-sxm@32sm"
    _, w_chosen = chosen.device_weights(test)
    assert chosen.device_ids[int(w_chosen[0].argmax())] == "nvidia-h200"
    assert _regret(test, chosen.score(test)) < 1.01 < 1.2 < _regret(test, equal.score(test))


def test_where_configs_follow_the_chip_the_core_count_keeps_its_equal_weight(tmp_path):
    features = _features(tmp_path, by_chip)
    train = features.frame.filter(pl.col("device_id") != "nvidia-h100-sxm@32sm")
    test = features.frame.filter(pl.col("device_id") == "nvidia-h100-sxm@32sm")
    ranker = make_ranker(features, "transfer_cores").fit(train)
    assert ranker.core_weight == CORE_WEIGHTS[0] == 1.0
    equal = DeviceTransferRanker(features, core_weights=(1.0,)).fit(train)
    assert np.array_equal(ranker.score(test), equal.score(test))


def test_with_two_training_devices_there_is_nothing_to_choose(tmp_path):
    features = _features(tmp_path, by_cores)
    train = features.frame.filter(pl.col("device_id").is_in(["nvidia-h200", "nvidia-h200@32sm"]))
    assert DeviceTransferRanker(features, core_weights=CORE_WEIGHTS).fit(train).core_weight == 1.0


def test_a_ranker_restored_from_an_older_file_keeps_equal_weights():
    assert DeviceTransferRanker.__new__(DeviceTransferRanker).core_weight == 1.0


@pytest.mark.parametrize("weights", [(), (0.0,), (1.0, float("nan")), (-4.0,)])
def test_core_weights_must_be_positive(tmp_path, weights):
    features = _features(tmp_path, by_cores)
    with pytest.raises(ModelError, match="core weights must be finite and above 0"):
        DeviceTransferRanker(features, core_weights=weights)


def test_column_weights_scale_a_spec_against_the_others():
    train = np.array([[0.0, 0.0], [2.0, 2.0]])  # z-scored: -1 and +1 on both specs
    test = np.array([[2.0, 0.0]])  # +1 on the first spec, -1 on the second
    equal = spec_distances(test, train, ["a"], ["a", "a"])
    heavy = spec_distances(test, train, ["a"], ["a", "a"], column_weights=np.array([16.0, 1.0]))
    assert equal[0, 0] == pytest.approx(equal[0, 1]) == pytest.approx(math.sqrt(2))
    assert heavy[0, 1] < heavy[0, 0]  # the spec weighted 16x decides which training device is nearer
