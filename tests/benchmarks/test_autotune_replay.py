"""benchmarks/autotune_replay.py: a bundle's pruned candidates scored against a stored exhaustive table."""

from __future__ import annotations

import json

import pytest

from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.runtime import load_bundle
from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR
from zmlx_pipeline.runtime.lookup import clear_cache
from zmlx_pipeline.runtime.tuner import pruned_candidates
from bench_scripts import load as load_script


replay = load_script("autotune_replay")

SHAPE = {"rows": 1078, "cols": 9216}


def key(config: dict) -> str:
    return json.dumps({k: int(v) for k, v in config.items()}, sort_keys=True)


@pytest.fixture
def row_and_candidates():
    from zmlx_pipeline.kernels.spec import Limits
    from zmlx_pipeline.runtime.device import catalog_row

    load_bundle(DEFAULT_BUNDLE_DIR, strict=True)
    clear_cache()
    spec = get_kernel("rmsnorm")
    legal = spec.legal_configs(SHAPE, "float16", Limits.from_device_row(catalog_row("nvidia-h200")))
    cands, _ = pruned_candidates(spec, SHAPE, "float16", legal, device="nvidia-h200")
    assert 1 <= len(cands) <= len(legal) // 5
    yield legal, cands
    from zmlx_pipeline.runtime import bundle

    bundle.reset()
    clear_cache()


def test_a_table_best_among_the_candidates_is_a_hit_and_one_outside_is_a_miss(row_and_candidates):
    legal, cands = row_and_candidates
    outside, failed = [c for c in legal if c not in cands][:2]
    times = {key(c): 20.0 for c in legal}
    times[key(cands[-1])] = 10.1  # the last candidate the tuner times: within 2% of the best
    times[key(outside)] = 10.0
    times[key(failed)] = None
    row = {"kernel": "rmsnorm", "shape": SHAPE, "exhaustive_us": times}
    [hit] = replay.replay_rows([row], "nvidia-h200", "float16")
    assert hit["hit"] and hit["regret"] == pytest.approx(1.01) and hit["timed"] == len(cands)
    assert hit["first_regret"] == pytest.approx(2.0)  # the untimed lookup answer: the first candidate
    times[key(cands[-1])] = 12.0
    [miss] = replay.replay_rows([row], "nvidia-h200", "float16")
    assert not miss["hit"] and miss["regret"] == pytest.approx(1.2)
    s = replay.summarize([hit, miss])
    assert (s["shapes"], s["hits"], s["hit_share"]) == (2, 1, 0.5)
    assert s["first_hits"] == 0 and s["first_regret_geomean"] == pytest.approx(2.0)
    assert s["misses"] == [("rmsnorm", SHAPE, 1.2)]


def test_rows_without_exhaustive_times_are_skipped_and_a_run_with_none_is_refused(tmp_path, capsys):
    assert replay.replay_rows([{"kernel": "rmsnorm", "shape": SHAPE}], "nvidia-h200", "float16") == []
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"summary": {"device": "nvidia-h200", "dtype": "float16"},
                               "rows": [{"kernel": "rmsnorm", "shape": SHAPE}]}))
    assert replay.main(["--bundle", str(DEFAULT_BUNDLE_DIR), str(old)]) == 2
    assert "no exhaustive_us" in capsys.readouterr().err
