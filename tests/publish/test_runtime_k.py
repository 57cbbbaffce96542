"""publish/runtime_k.py: the pruning k replayed through the runtime lookup on shapes the table is made to not know."""

import json

import polars as pl

from zmlx_pipeline.publish.runtime_k import runtime_k

# forty configs, TG 32 .. 1280; the lookup keeps them as given, the bundle's overall order is by index
CONFIGS = [{"TG": 32 * (i + 1)} for i in range(40)]
META = {"name": "toy", "dims": ["rows", "cols"], "configs": CONFIGS, "order": list(range(40)), "constraints": [],
        "prune_k": 1}
LIMITS = {"max_threads": 1024, "simd_width": 32, "tg_mem_bytes": 32768, "dtype_bytes": 2}


def _frame(cases):
    """cases: [(shape, {config index: median_us})] on one device and dtype, every config measured."""
    rows = []
    for shape, times in cases:
        key = f"rows={shape['rows']},cols={shape['cols']}"
        for i, us in times.items():
            rows.append({"device_id": "gpu", "dtype": "float16", "shape_key": key, "shape": json.dumps(shape),
                         "config": json.dumps(CONFIGS[i]), "median_us": float(us)})
    return pl.DataFrame(rows)


def _entry(order):
    return {"best": order[0], "ranked": list(order), "time_us": 1.0, "expected_regret": 1.0, "evidence": "predicted",
            "n_legal": len(CONFIGS)}


def _replay(frame, entries, bucket_shapes, n_legal=40, max_k=8):
    return runtime_k(frame, META, {"gpu": {"float16": entries}}, bucket_shapes, lambda d, t: LIMITS,
                     lambda d, t, s: n_legal, max_k)


# the case 64 x 1000: config 5 is its best; config 6 within 1%; everything else 30% slower
TIMES = {i: 130.0 for i in range(40)} | {5: 100.0, 6: 101.0}
SHAPE = {"rows": 64, "cols": 1000}


def test_k_is_the_rank_of_the_first_hit_in_the_neighbouring_bucket():
    # the case's own bucket (2^6, 2^10) holds a prediction made at another shape, ranking config 6 third
    entries = {"measured": {}, "buckets": {"6,10": _entry([0, 1, 6, 5, 2])}}
    rk = _replay(_frame([(SHAPE, TIMES)]), entries, {"6,10": {"rows": 64, "cols": 1024}})
    assert (rk.k, rk.cases, rk.share) == (3, 1, 1.0)


def test_the_cases_own_measurement_is_not_used():
    entries = {"measured": {"64,1000": _entry([5, 6, 0])}, "buckets": {"6,10": _entry([0, 1, 6, 5, 2])}}
    rk = _replay(_frame([(SHAPE, TIMES)]), entries, {"6,10": {"rows": 64, "cols": 1024}})
    assert rk.k == 3  # not 1, which its own measured entry would give


def test_a_bucket_predicted_at_this_very_shape_is_left_out_for_its_neighbours():
    entries = {"measured": {}, "buckets": {"6,10": _entry([5, 0]),        # predicted at 64 x 1000 itself
                                            "6,11": _entry([0, 1, 2, 5]),  # the two nearest others,
                                            "7,10": _entry([1, 0, 2, 3])}}  # interleaved: 0, 1, 2, 5 ...
    shapes = {"6,10": dict(SHAPE), "6,11": {"rows": 64, "cols": 2048}, "7,10": {"rows": 128, "cols": 1024}}
    rk = _replay(_frame([(SHAPE, TIMES)]), entries, shapes)
    # nearest first: (7, 10) ranks 1, 0, 2, 3; (6, 11) ranks 0, 1, 2, 5. Interleaving their top k
    # reaches config 5 only at k = 4 (k = 1 would hit, had the left-out prediction been used)
    assert rk.k == 4


def test_the_tuners_fifth_of_the_legal_configs_caps_what_counts_as_timed():
    entries = {"measured": {}, "buckets": {"6,10": _entry([0, 1, 6, 5, 2])}}
    # 10 legal configs: the tuner times at most 2, so no k finds config 6 (third)
    ten = {i: t for i, t in TIMES.items() if i < 10}
    rk = _replay(_frame([(SHAPE, ten)]), entries, {"6,10": {"rows": 64, "cols": 1024}}, n_legal=10)
    assert rk.k is None and rk.share == 0.0 and rk.cases == 1


def test_ninety_five_percent_of_cases_not_every_one():
    # 20 cases whose bucket ranks the best first, one whose bucket ranks it fifth: k = 1 hits 20 of 21 (95.2%)
    cases, entries, shapes = [], {"measured": {}, "buckets": {}}, {}
    for j in range(21):
        shape = {"rows": 2 ** j, "cols": 1000}
        times = {i: 130.0 for i in range(40)} | {(j % 9) + 1: 100.0}
        cases.append((shape, times))
        b = f"{j},10"
        best = (j % 9) + 1
        entries["buckets"][b] = _entry([best, 0] if j else [0, 2, 3, 4, best])
        shapes[b] = {"rows": 2 ** j, "cols": 1024}
    rk = _replay(_frame(cases), entries, shapes)
    assert rk.cases == 21 and rk.k == 1 and rk.share >= 0.95


def test_cases_not_swept_fully_are_skipped():
    partial = {5: 100.0, 6: 101.0}  # 2 of 40 legal configs measured
    entries = {"measured": {}, "buckets": {"6,10": _entry([0, 1, 6, 5, 2])}}
    rk = _replay(_frame([(SHAPE, partial)]), entries, {"6,10": {"rows": 64, "cols": 1024}})
    assert rk.cases == 0 and rk.k is None


def test_dim_weights_pull_a_shape_towards_buckets_that_match_the_dimension_that_decides():
    from zmlx_pipeline.publish.runtime_k import choose_dim_weights, replay_cases

    # rows 2^7 (own bucket left out: predicted at this shape). Unweighted, three buckets are one step
    # away and the two that differ in cols come first (key order), ranking configs 0, 1, 2; the one that
    # matches cols ranks the case's best (config 5) first. Weighting cols makes it the nearest: k = 1.
    shape = {"rows": 128, "cols": 1024}
    entries = {"measured": {}, "buckets": {"7,10": _entry([0, 1]), "7,11": _entry([0, 1, 2]),
                                            "7,9": _entry([1, 0, 2]), "8,10": _entry([5, 0])}}
    shapes = {"7,10": dict(shape), "7,11": {"rows": 128, "cols": 2048}, "7,9": {"rows": 128, "cols": 512},
              "8,10": {"rows": 256, "cols": 1024}}
    frame = _frame([(shape, TIMES)])
    plain = _replay(frame, entries, shapes)
    assert plain.k is None or plain.k > 1
    cases = replay_cases(frame, META, {"gpu": {"float16": entries}}, shapes, lambda d, t: LIMITS,
                         lambda d, t, s: 40)
    weights, rk = choose_dim_weights(META, cases, 8)
    assert weights == {"rows": 1.0, "cols": 4.0} and rk.k == 1
