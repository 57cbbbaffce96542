"""predicted_config / candidates: evidence, fallbacks that say so, legality for the exact shape, fast repeats."""

import json
import time

import pytest

from bundle_fixtures import TOY_CONFIGS, toy_best
from zmlx_pipeline.runtime import BadLookup, bucket_of, candidates, load_bundle, predicted_config


@pytest.fixture
def toy(toy_bundle):
    return load_bundle(toy_bundle[1], strict=True)


def test_buckets_round_each_dimension_to_the_nearest_power_of_two():
    assert bucket_of([1, 4096]) == (0, 12)
    assert bucket_of([1408, 3000]) == (10, 12)
    assert bucket_of([5, 6]) == (2, 3)


def test_an_off_grid_shape_takes_the_bucket_nearest_its_exact_log2():
    from zmlx_pipeline.runtime.lookup import _Table

    table = _Table({}, {(13, 12): "8192x4096", (15, 12): "32768x4096", (15, 14): "32768x16384"})
    # rounded, 18184 x 6144 is bucket (14, 13): all three are equally near and the first would win
    assert table.nearest((18184, 6144)) == [(15, 12)]
    assert table.nearest((9000, 4096), 2) == [(13, 12), (15, 12)]
    assert _Table({}, {}).nearest((1, 2)) == []


@pytest.mark.parametrize("device", ["nvidia-h100-sxm", "nvidia-h200"])
def test_a_measured_shape_answers_with_its_measured_best(toy, device):
    for shape in ({"rows": 1, "cols": 1024}, {"rows": 4096, "cols": 4096}):
        p = predicted_config("toy_scale", shape, "float16", device=device)
        assert p.evidence == "measured"
        assert p.config == toy_best(device, shape)
        assert p.expected_regret == 1.0
        assert p.candidates[0] == p.config and len(p.candidates) == p.prune_k


def test_an_unmeasured_shape_is_predicted_from_its_bucket(toy):
    p = predicted_config("toy_scale", {"rows": 3000, "cols": 4000}, "float16", device="nvidia-h200")
    assert p.evidence == "predicted"
    assert p.bucket == {"rows": 4096, "cols": 4096}
    assert p.config in TOY_CONFIGS
    assert p.predicted_us is not None and p.predicted_us > 0
    assert "never measured" not in p.note


def test_a_shape_between_buckets_takes_candidates_from_both_neighbours(toy, toy_bundle):
    from bundle_fixtures import latest_dir

    root = latest_dir(toy_bundle[1])
    meta = json.loads((root / "kernels.json").read_text())["kernels"]["toy_scale"]
    tables = json.loads((root / "tables.json").read_text())["devices"]
    buckets = json.loads((root / tables["nvidia-h200"]).read_text())["kernels"]["toy_scale"]["float16"]["buckets"]

    def top(key):
        best, cands = buckets[key][0], buckets[key][1]
        return [meta["configs"][i] for i in [best] + [c for c in cands if c != best]][: meta["prune_k"]]

    # rows 300 (2^8.2) has no bucket of its own: the nearest published is 1024 x 64 (distance 2.2^2),
    # then 4096 x 64 (2^2 + 2.2^2); 1024 x 4096 is 3.8^2 away. Keys are "cols,rows".
    p = predicted_config("toy_scale", {"rows": 300, "cols": 1024}, "float16", device="nvidia-h200")
    near, other = top("10,6"), top("12,6")
    assert p.bucket == {"rows": 64, "cols": 1024} and p.config == near[0]
    assert p.candidates[:2] == [near[0], other[0]] if near[0] != other[0] else p.candidates[0] == near[0]
    assert {json.dumps(c, sort_keys=True) for c in p.candidates} == \
        {json.dumps(c, sort_keys=True) for c in near + other}
    assert p.prune_k == len(p.candidates) >= meta["prune_k"]
    # a shape inside a published bucket keeps that bucket's own top k
    inside = predicted_config("toy_scale", {"rows": 3000, "cols": 1024}, "float16", device="nvidia-h200")
    assert inside.candidates == top("10,12") and inside.prune_k == meta["prune_k"]


def test_an_unmeasured_device_is_predicted_from_its_specs_and_says_so(toy):
    p = predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="apple-m4-max-40c")
    assert p.evidence == "predicted"
    assert "apple-m4-max-40c was never measured: predicted from its specs" in p.note
    assert p.config in TOY_CONFIGS


def test_unknown_kernel_and_device_fall_back_to_the_catalog_default_and_say_so(toy):
    k = predicted_config("no_such_kernel", {"rows": 1, "cols": 1}, "float16", device="nvidia-h200")
    assert (k.evidence, k.config, k.expected_regret) == ("default", {"threadgroup": 256}, None)
    assert "kernel 'no_such_kernel' is not in bundle" in k.note
    d = predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="my-own-gpu")
    assert d.evidence == "default" and d.config["TG"] == 256
    assert "device 'my-own-gpu' is not in the catalog" in d.note
    t = predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float32", device="nvidia-h200")
    assert t.evidence == "default" and "no float32 table" in t.note


def test_a_core_limited_device_answers_for_its_chip(toy):
    p = predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h100-sxm@66sm")
    assert p.device == "nvidia-h100-sxm" and p.evidence == "measured"
    assert "answering for nvidia-h100-sxm" in p.note


def test_shapes_as_mappings_or_dim_order_agree_and_bad_shapes_are_refused(toy):
    dims = toy.kernels["toy_scale"]["dims"]  # no registered spec: the measured keys, sorted
    assert dims == ["cols", "rows"]
    a = predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h200")
    b = predicted_config("toy_scale", [4096, 64], "float16", device="nvidia-h200")
    assert a.config == b.config and a.evidence == b.evidence == "measured"
    with pytest.raises(BadLookup, match="positive integer"):
        predicted_config("toy_scale", {"rows": 0, "cols": 4096}, "float16", device="nvidia-h200")
    with pytest.raises(BadLookup, match="has dims cols, rows"):
        predicted_config("toy_scale", {"rows": 4}, "float16", device="nvidia-h200")


def test_candidates_are_ranked_and_k_is_honoured(toy):
    shape = {"rows": 64, "cols": 4096}
    three = candidates("toy_scale", shape, "float16", k=3, device="nvidia-h200")
    assert len(three) == 3 and three[0] == predicted_config("toy_scale", shape, "float16", "nvidia-h200").config
    assert len({json.dumps(c, sort_keys=True) for c in three}) == 3
    assert candidates("toy_scale", shape, "float16", k=1, device="nvidia-h200") == three[:1]


def test_answers_are_remembered_and_returned_configs_are_copies(toy):
    shape = {"rows": 64, "cols": 4096}
    p = predicted_config("toy_scale", shape, "float16", device="nvidia-h200")
    p.config["TG"] = 1  # the caller's copy
    q = predicted_config("toy_scale", shape, "float16", device="nvidia-h200")
    assert q is p and q.config["TG"] != 1
    start = time.perf_counter()
    for _ in range(10_000):
        predicted_config("toy_scale", shape, "float16", device="nvidia-h200")
    assert (time.perf_counter() - start) / 10_000 < 50e-6  # generous: the benchmark measures the real figure


def test_the_config_is_legal_for_the_exact_shape(real_bundle):
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.kernels.spec import Limits

    load_bundle(real_bundle[1], strict=True)
    spec = get_kernel("rmsnorm")
    for shape in ({"rows": 3, "cols": 1000}, {"rows": 7, "cols": 1030}, {"rows": 5000, "cols": 3000}):
        p = predicted_config("rmsnorm", shape, "float16", device="nvidia-h200")
        legal = spec.legal_configs(shape, "float16", Limits(max_threads=1024, simd_width=32, tg_mem_bytes=49152))
        assert p.config in legal, (shape, p.config, p.note)
        assert all(c in legal for c in p.candidates)
        # where the bucket's own candidates are mostly illegal (odd cols: VEC 1 only), the list is
        # filled from the kernel's overall ranking, so a tuner still has k configs to time
        assert len(p.candidates) == min(p.prune_k, len(legal)), (shape, p.candidates, p.note)


def _between_kernel(prune_k=2):
    from zmlx_pipeline.runtime.lookup import _Kernel

    configs = [{"TG": 32 << i} for i in range(8)]
    return _Kernel("toy", {"dims": ["rows", "cols"], "configs": configs, "prune_k": prune_k})


def _entry(order, us=1.0, regret=1.01):
    return [order[0], order, us, regret, "predicted", 8]


def test_a_shape_between_buckets_leads_with_the_models_ranking_at_its_own_point_and_keeps_the_neighbours():
    from zmlx_pipeline.runtime.lookup import _Table, rank_in_table

    k = _between_kernel()
    buckets = {(9, 13): _entry([0, 1, 2]), (12, 13): _entry([3, 4, 5])}
    own = _entry([6, 1, 7], us=9.0, regret=1.03)
    values, shape = (1078, 9216), {"rows": 1078, "cols": 9216}  # bucket (10, 13): no grid shape there
    plain = rank_in_table(k, _Table({}, buckets), values, shape, {})
    assert [c[0][1] for c in plain.ranked[:4]] == [32, 256, 64, 512]  # the two neighbours, interleaved
    assert plain.bucket_key == (9, 13) and plain.prune_k == 4
    r = rank_in_table(k, _Table({}, buckets, {(10, 13): own}), values, shape, {})
    # the model's pick at 1024 x 8192 first, then each neighbour's best, then each list's second
    assert [dict(c)["TG"] for c in r.ranked[:5]] == [2048, 32, 256, 64, 512]
    assert r.prune_k == 5 and r.bucket_key == (10, 13) and r.entry is own
    assert "the model's ranking at rows~2^10, cols~2^13" in r.note
    # a shape in a published bucket, or measured, never reads the between points
    inside = rank_in_table(k, _Table({}, buckets, {(9, 13): own}), (500, 8192), {"rows": 500, "cols": 8192}, {})
    assert inside.entry is buckets[(9, 13)] and [dict(c)["TG"] for c in inside.ranked][:2] == [32, 64]
