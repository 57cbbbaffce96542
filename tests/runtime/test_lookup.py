"""predicted_config / candidates: evidence, fallbacks that say so, legality for the exact shape, fast repeats."""

import json
import time

import pytest

from bundle_fixtures import TOY_CONFIGS, toy_best
from zmlx_pipeline.runtime import BadLookup, UnknownDeviceError, bucket_of, candidates, load_bundle, predicted_config


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
        best, cands = buckets[key]["best"], buckets[key]["ranked"]
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


def test_an_unmeasured_device_of_a_measured_family_is_predicted_and_says_from_which_chip(toy):
    # toy_scale was measured on an H100 SXM and an H200 (both Hopper): the H100 PCIe is one of theirs
    p = predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h100-pcie")
    assert p.evidence == "predicted" and p.config in TOY_CONFIGS
    assert "nvidia-h100-pcie was never measured: predicted from nvidia-h100-sxm of its own family" in p.note
    # its expected regret is that of left-out devices (the H100 and the H200 each left out once)
    assert p.expected_regret == toy.kernels["toy_scale"]["expected_regret"]["unseen_device"] is not None


def test_a_chip_of_an_unmeasured_family_is_extrapolated_with_no_expected_regret(toy):
    p = predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="apple-m4-max-40c")
    assert (p.evidence, p.expected_regret) == ("extrapolated", None)
    assert "apple-m4-max-40c was never measured, nor any apple m4 of its family: extrapolated from" in p.note
    assert "no architecture family was left out" in p.note
    # toy_scale has no registered spec, so no work terms: no time is moved to the chip
    assert p.predicted_us is None and "no predicted time" in p.note and p.config in TOY_CONFIGS


def test_an_unknown_kernel_is_an_error_that_lists_the_known_ones(toy):
    from zmlx_pipeline.runtime import RuntimeAPIError, UnknownKernelError

    with pytest.raises(UnknownKernelError) as info:
        predicted_config("toy_scael", {"rows": 1, "cols": 1}, "float16", device="nvidia-h200")
    assert isinstance(info.value, LookupError) and isinstance(info.value, RuntimeAPIError)
    assert str(info.value) == f"unknown kernel 'toy_scael': bundle {toy.bundle_id} has toy_scale"


def test_an_unknown_kernel_of_100000_characters_is_named_by_its_start_and_length(toy):
    from zmlx_pipeline.runtime import UnknownKernelError

    with pytest.raises(UnknownKernelError) as info:
        predicted_config("k" * 100_000, {"rows": 1, "cols": 1}, "float16", device="nvidia-h200")
    message = str(info.value)
    assert len(message) < 300 and "(100000 characters)" in message and message.endswith("has toy_scale")


@pytest.mark.parametrize("dtype", ["int8", "fp16", "float64"])
def test_an_unknown_dtype_is_an_error_that_lists_the_known_ones(toy, dtype):
    from zmlx_pipeline.runtime import UnknownDtypeError

    with pytest.raises(UnknownDtypeError, match=f"^unknown dtype '{dtype}': known dtypes are bfloat16, float16, float32$"):
        predicted_config("toy_scale", {"rows": 64, "cols": 4096}, dtype, device="nvidia-h200")


def test_an_unknown_named_device_is_refused_and_so_is_a_dtype_the_kernel_was_never_measured_in(toy):
    """toy_scale is no built-in kernel, and was measured in float16 alone: the bundle holds no float32 table of it
    for any device, so a float32 lookup is an error, never the catalog default of a kernel that may not exist so."""
    from zmlx_pipeline.runtime import UnknownDeviceError, UnknownDtypeError

    with pytest.raises(UnknownDeviceError, match="^unknown device 'my-own-gpu': neither a catalog id"):
        predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="my-own-gpu")
    assert toy.kernels["toy_scale"]["dtypes"] == ["float16"]
    with pytest.raises(UnknownDtypeError, match=r"^kernel 'toy_scale' has no float32 tables in bundle \S+: it was "
                                                r"measured in float16 only$"):
        predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float32", device="nvidia-h200")
    assert predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h200").config


def test_a_core_limit_no_table_holds_takes_its_chips_ranking_but_claims_neither_its_time_nor_its_regret(toy):
    shape = {"rows": 64, "cols": 4096}
    chip = predicted_config("toy_scale", shape, "float16", device="nvidia-h100-sxm")
    assert chip.evidence == "measured" and chip.predicted_us is not None and chip.expected_regret is not None
    p = predicted_config("toy_scale", shape, "float16", device="nvidia-h100-sxm@66sm")
    assert p.device == "nvidia-h100-sxm" and p.config == chip.config and p.candidates == chip.candidates
    assert p.evidence == "predicted" and p.predicted_us is None and p.expected_regret is None
    assert "answering for nvidia-h100-sxm" in p.note and "no table was made for nvidia-h100-sxm@66sm's core count" in p.note
    with pytest.raises(UnknownDeviceError) as exc:  # every SM: that is the chip's own id, as import refuses it
        predicted_config("toy_scale", shape, "float16", device="nvidia-h100-sxm@132sm")
    assert str(exc.value) == ("device 'nvidia-h100-sxm@132sm' limits nvidia-h100-sxm to all of its 132 SMs; a core "
                              "limit is below the chip's count: give the chip's own id (nvidia-h100-sxm) for the "
                              "whole chip")


def test_a_core_limit_takes_the_table_nearest_its_core_count(real):
    assert {"nvidia-h100-sxm", "nvidia-h100-sxm@32sm"} <= set(real.tables)
    shape = {"rows": 64, "cols": 4096}
    for device, source in (("nvidia-h100-sxm@20sm", "nvidia-h100-sxm@32sm"), ("nvidia-h100-sxm@48sm", "nvidia-h100-sxm@32sm"),
                           ("nvidia-h100-sxm@100sm", "nvidia-h100-sxm")):
        p = predicted_config("rmsnorm", shape, "float16", device=device)
        assert p.device == source and p.config == predicted_config("rmsnorm", shape, "float16", device=source).config
        assert p.evidence != "measured" and p.predicted_us is None and p.expected_regret is None


def test_shapes_of_a_kernel_without_a_spec_are_named_and_bad_shapes_are_refused(toy):
    dims = toy.kernels["toy_scale"]["dims"]  # no registered spec: the measured keys, sorted
    assert dims == ["cols", "rows"]
    a = predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h200")
    assert a.evidence == "measured"
    with pytest.raises(BadLookup, match=r"its dims \(cols, rows\) have no order to read 2 values in: name each"):
        predicted_config("toy_scale", [4096, 64], "float16", device="nvidia-h200")  # read as cols, rows before
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
    with pytest.raises(BadLookup, match=r"^k must be >= 1 \(got 0\)"):
        candidates("toy_scale", shape, "float16", k=0, device="nvidia-h200")
    with pytest.raises(BadLookup, match=r"^k must be >= 1 \(got -2\)"):
        predicted_config("toy_scale", shape, "float16", "nvidia-h200").top(-2)


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
    return {"best": order[0], "ranked": order, "time_us": us, "expected_regret": regret, "evidence": "predicted",
            "n_legal": 8}


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


# ------------------------------------------------------------------------------------------
# rmsnorm from the committed 32-SM H100 shard: limits of what was measured


@pytest.fixture
def real(real_bundle):
    return load_bundle(real_bundle[1], strict=True)


@pytest.mark.parametrize("shape", [{"rows": 1, "cols": 6}, {"rows": 1, "cols": 1}, {"rows": 7, "cols": 3}])
@pytest.mark.parametrize("device", ["nvidia-h200", None])
def test_a_shape_no_config_is_legal_for_returns_no_config_and_says_so(real, shape, device, monkeypatch):
    # rmsnorm needs (TG // ROWS) * VEC <= cols with TG // ROWS a multiple of the SIMD width: no config fits 6 columns
    monkeypatch.delenv("ZMLX_PIPELINE_DEVICE", raising=False)  # None: no GPU here, the catalog default path
    p = predicted_config("rmsnorm", shape, "float16", device=device)
    assert (p.config, p.evidence, p.candidates, p.predicted_us, p.threadgroup) == (None, "none", [], None, None)
    text = ",".join(f"{d}={v}" for d, v in shape.items())
    assert p.note.startswith(f"no config of 'rmsnorm' is legal for {text} float16")
    # the rule every config breaks, not all of the kernel's constraints (VEC=1 passes cols % VEC == 0)
    assert p.note.endswith("(every config breaks: (TG // ROWS) * VEC <= cols)") and "\n" not in p.note
    assert "cols % VEC == 0" not in p.note
    assert p.as_dict()["config"] is None


def _published(bundle, device, dtype="float16"):
    return bundle.json(bundle.tables[device])["kernels"]["rmsnorm"][dtype]


def test_a_shape_outside_every_measured_range_is_marked_and_its_time_moved_by_the_work(real):
    from zmlx_pipeline.kernels.registry import get_kernel

    spec, meta = get_kernel("rmsnorm"), real.kernels["rmsnorm"]
    device = "nvidia-h100-sxm@32sm"  # the measured device
    assert meta["measured_range"]["rows"] == [1, 32768]
    big = {"rows": 1_048_576, "cols": 4096}
    p = predicted_config("rmsnorm", big, "float16", device=device)
    assert p.outside_range == ("rows",) and p.evidence == "predicted" and p.config is not None
    assert "outside the measured range (rows 1-32768): time moved by the kernel's work" in p.note
    key = "15,12"  # the nearest published bucket, 32768 x 4096
    rep = meta["buckets"][key]
    entry = _published(real, device)["buckets"][key]
    assert p.bucket == {"rows": 32768, "cols": 4096}
    # memory-bound (4 flops per 4 bytes, far below the H100's ridge): the bucket's time times the bytes ratio
    want = entry["time_us"] * spec.bytes_moved(big, 2) / spec.bytes_moved(rep, 2)
    assert p.predicted_us == pytest.approx(want, rel=1e-3) and p.predicted_us > 30 * entry["time_us"]
    inside = predicted_config("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", device=device)
    assert inside.outside_range == () and "outside" not in inside.note
    # its expected regret was scored on held-out shapes of the range's buckets: a shape of none of them has none
    assert inside.expected_regret is not None and p.expected_regret is None
    assert "no expected regret: rows rounds to no bucket of the measured range" in p.note
    edge = predicted_config("rmsnorm", {"rows": 40_000, "cols": 4096}, "float16", device=device)  # rounds to 2**15
    assert edge.outside_range == ("rows",) and edge.expected_regret == inside_bucket_regret(real, device, "15,12")


def inside_bucket_regret(bundle, device, key):
    return _published(bundle, device)["buckets"][key]["expected_regret"]


def test_an_apple_chip_is_extrapolated_with_no_regret_and_no_time_from_a_core_limited_run(real):
    """The bundle's one measured device is a run on 32 of an H100's SMs: its ranking moves to other chips, its times
    do not (a shape's best time on 32 of an H200's SMs is up to 4.3x the whole chip's, at the same bandwidth figure)."""
    meta = real.kernels["rmsnorm"]
    assert meta["expected_regret"]["cross_family"] is None  # one family measured: no jump validated
    assert meta["transfer"]["apple-m3-max-40c"] == {"evidence": "extrapolated", "from": "nvidia-h100-sxm@32sm"}
    shape = {"rows": 4096, "cols": 4096}
    p = predicted_config("rmsnorm", shape, "float16", device="Apple M3 Max (40-core GPU)")
    assert (p.device, p.evidence, p.expected_regret, p.predicted_us) == ("apple-m3-max-40c", "extrapolated", None, None)
    assert p.config is not None
    assert "extrapolated from nvidia-h100-sxm@32sm (measured families: nvidia hopper)" in p.note
    assert ("no predicted time: nvidia-h100-sxm@32sm ran on part of nvidia-h100-sxm's cores, and how its times carry "
            "to another chip is unknown") in p.note
    assert "no architecture family was left out" in p.note
    # a chip of the measured family is predicted from it, with no time either
    h200 = predicted_config("rmsnorm", shape, "float16", device="nvidia-h200")
    assert h200.evidence == "predicted" and h200.predicted_us is None
    assert "predicted from nvidia-h100-sxm@32sm of its own family (nvidia hopper)" in h200.note
    # the measured device itself quotes its own times
    assert predicted_config("rmsnorm", shape, "float16", device="nvidia-h100-sxm@32sm").predicted_us is not None


# ------------------------------------------------------------------------------------------
# malformed arguments: the runtime's own error, also the builtin a caller expects, one line


def _profile():
    from zmlx_pipeline.runtime import get_device_profile

    return get_device_profile("hopper", "h200-sxm")


BAD_CALLS = [
    ("predicted_config", lambda rt: rt.predicted_config("toy_scale", None, "float16", device="nvidia-h200"),
     TypeError, "shape must be a mapping of dims"),
    ("predicted_config", lambda rt: rt.predicted_config("toy_scale", 4096, "float16", device="nvidia-h200"),
     TypeError, "shape must be a mapping of dims"),
    ("predicted_config", lambda rt: rt.predicted_config("toy_scale", "4096,64", "float16", device="nvidia-h200"),
     TypeError, "shape must be a mapping of dims"),
    ("predicted_config", lambda rt: rt.predicted_config("toy_scale", {"rows": float("inf"), "cols": 4}, "float16"),
     ValueError, "shape dimension rows=inf must be a positive integer"),
    ("predicted_config", lambda rt: rt.predicted_config("toy_scale", {"rows": 2.5, "cols": 4}, "float16"),
     ValueError, "shape dimension rows=2.5 must be a positive integer"),
    ("predicted_config", lambda rt: rt.predicted_config("toy_scale", {"rows": "64", "cols": 4}, "float16"),
     TypeError, "shape dimension rows='64' must be a positive integer, not str"),
    ("predicted_config", lambda rt: rt.predicted_config("toy_scale", {"rows": 64, "cols": 4}, ["float16"]),
     TypeError, "dtype must be a name such as 'float16' or an mlx dtype, not list"),
    ("predicted_config", lambda rt: rt.predicted_config("toy_scale", {"rows": 64, "cols": 4}, "float16", device=123),
     TypeError, "device must be a string or None, not int"),
    ("predicted_config", lambda rt: rt.predicted_config(None, {"rows": 64, "cols": 4}, "float16"),
     TypeError, "kernel must be a string, not NoneType"),
    ("candidates", lambda rt: rt.candidates("toy_scale", None, "float16", device="nvidia-h200"),
     TypeError, "shape must be a mapping of dims"),
    ("candidates", lambda rt: rt.candidates("toy_scale", {"rows": 64, "cols": 4}, "float16", k=0),
     ValueError, "k must be >= 1 (got 0)"),
    ("candidates", lambda rt: rt.candidates("toy_scale", {"rows": 64, "cols": 4}, "float16", k="3"),
     TypeError, "k must be a whole number >= 1, not str"),
    ("candidates", lambda rt: rt.candidates("toy_scale", {"rows": 64, "cols": 4}, {"f": 1}, device="nvidia-h200"),
     TypeError, "dtype must be a name"),
    ("candidates", lambda rt: rt.candidates("toy_scale", {"rows": 64, "cols": 4}, "float16", device=1.5),
     TypeError, "device must be a string or None, not float"),
    ("load_bundle", lambda rt: rt.load_bundle(None), TypeError, "a bundle is a directory path or an http(s) URL, not NoneType"),
    ("load_bundle", lambda rt: rt.load_bundle(123, strict=True), TypeError, "not int"),
    ("load_bundle", lambda rt: rt.load_bundle(""), ValueError, "not an empty string"),
    ("read_bundle", lambda rt: rt.read_bundle(["a"]), TypeError, "not list"),
    ("get_device_profile", lambda rt: rt.get_device_profile(None), TypeError, "family must be a string, not NoneType"),
    ("get_device_profile", lambda rt: rt.get_device_profile("M3", 3), TypeError, "variant must be a string or None, not int"),
    ("get_threadgroup_candidates_for_shape", lambda rt: rt.get_threadgroup_candidates_for_shape("M3", 4096),
     TypeError, "profile must be a DeviceTuningProfile"),
    ("get_threadgroup_candidates_for_shape", lambda rt: rt.get_threadgroup_candidates_for_shape(_profile(), "4096"),
     TypeError, "dim_size must be a whole number, not str"),
    ("get_threadgroup_candidates_for_shape", lambda rt: rt.get_threadgroup_candidates_for_shape(_profile(), -1),
     ValueError, "dim_size must be from 0 to 2147483647 (got -1)"),
    # ints Python will not write out (over 4300 digits) are named by their size, not repr()'d into a ValueError
    ("get_threadgroup_candidates_for_shape", lambda rt: rt.get_threadgroup_candidates_for_shape(_profile(), 10 ** 5000),
     ValueError, "dim_size must be from 0 to 2147483647 (got an integer of about 5000 digits)"),
    ("bucket_of", lambda rt: rt.bucket_of([1, 10 ** 5000]), ValueError,
     "shape dimension d1=an integer of about 5000 digits is larger than an array dimension can be"),
    ("candidates", lambda rt: rt.candidates("toy_scale", {"rows": 64, "cols": 4}, "float16", k=-10 ** 5000),
     ValueError, "k must be >= 1 (got a negative integer of about 5000 digits)"),
    ("predicted_config", lambda rt: rt.predicted_config("toy_scale", {"rows": 10 ** 5000, "cols": 4}, "float16"),
     ValueError, "shape dimension rows=an integer of about 5000 digits is larger"),
    ("get_threadgroup_candidates_for_shape", lambda rt: rt.get_threadgroup_candidates_for_shape(_profile(), 2 ** 70),
     ValueError, "dim_size must be from 0 to 2147483647 (got 1180591620717411303424)"),
    ("get_threadgroup_candidates_for_shape", lambda rt: rt.get_threadgroup_candidates_for_shape(_profile(), 64, None),
     TypeError, "kernel_type must be a string, not NoneType"),
    ("get_threadgroup_candidates_for_shape", lambda rt: rt.get_threadgroup_candidates_for_shape(_profile(), 2.5),
     ValueError, "dim_size must be a whole number from 0 to 2147483647 (got 2.5)"),
    # a family or variant is refused for the characters a device id is refused for
    ("get_device_profile", lambda rt: rt.get_device_profile("M3\n", "Max"), ValueError,
     "family 'M3\\n' holds a control character"),
    ("get_device_profile", lambda rt: rt.get_device_profile("M3", "Max\t"), ValueError,
     "variant 'Max\\t' holds a control character"),
    ("get_device_profile", lambda rt: rt.get_device_profile("M3", "\uff2dax"), ValueError,
     "variant '\uff2dax' holds characters Unicode writes otherwise (as 'Max')"),
    # only the form an mlx dtype prints as (mlx.core.float16) is read as its name
    ("predicted_config", lambda rt: rt.predicted_config("toy_scale", {"rows": 64, "cols": 4}, "mlx.junk.float16"),
     LookupError, "unknown dtype 'mlx.junk.float16'"),
    ("predicted_config", lambda rt: rt.predicted_config("toy_scale", {"rows": 64, "cols": 4}, "mlx.float16"),
     LookupError, "unknown dtype 'mlx.float16'"),
]


@pytest.mark.parametrize("entry, call, builtin, message", BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_a_malformed_argument_raises_the_runtimes_own_error(toy, entry, call, builtin, message):
    import zmlx_pipeline.runtime as rt

    with pytest.raises(rt.RuntimeAPIError) as info:
        call(rt)
    assert isinstance(info.value, builtin), type(info.value).__mro__
    text = str(info.value)
    assert message in text and "\n" not in text
    active = rt.active_bundle()
    assert active is toy  # a refused argument changes nothing: the bundle in use stays


def test_the_cli_entry_point_checks_its_arguments_before_loading_anything(toy):
    from zmlx_pipeline.runtime import BadArgumentType, active_bundle
    from zmlx_pipeline.runtime.lookup import lookup

    with pytest.raises(BadLookup, match=r"^k must be >= 1 \(got 0\)"):
        lookup("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h200", bundle="/no/such", k=0)
    with pytest.raises(BadArgumentType, match="shape must be a mapping"):
        lookup("toy_scale", None, "float16", device="nvidia-h200")
    assert active_bundle() is toy


def test_a_zero_dimensional_integer_array_is_taken_as_its_int():
    np = pytest.importorskip("numpy")
    want = predicted_config("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", device="nvidia-h200")
    for _ in range(2):  # the second call finds what the first remembered, or answers again: the same either way
        p = predicted_config("rmsnorm", {"rows": np.array(4096), "cols": 4096}, "float16", device="nvidia-h200")
        assert p.config == want.config and p.shape == {"rows": 4096, "cols": 4096}
        assert type(p.shape["rows"]) is int
        assert predicted_config("rmsnorm", [np.array(4096), np.int64(4096)], "float16", "nvidia-h200").config == want.config
    assert candidates("rmsnorm", {"rows": np.array(4096), "cols": 4096}, "float16", device="nvidia-h200") == \
        want.candidates
    with pytest.raises(BadLookup):
        predicted_config("rmsnorm", {"rows": np.array(4096.5), "cols": 4096}, "float16", device="nvidia-h200")


def test_the_text_an_mlx_dtype_prints_as_is_its_name():
    want = predicted_config("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", device="nvidia-h200")
    got = predicted_config("rmsnorm", {"rows": 4096, "cols": 4096}, "mlx.core.float16", device="nvidia-h200")
    assert got.dtype == "float16" and got.config == want.config


def test_a_whole_float_of_any_numpy_float_type_is_read_as_a_python_float_is():
    np = pytest.importorskip("numpy")
    from zmlx_pipeline.runtime import get_threadgroup_candidates_for_shape

    want = predicted_config("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", device="nvidia-h200")
    profile = _profile()
    row = get_threadgroup_candidates_for_shape(profile, 4096)
    for v in (4096.0, np.float64(4096), np.float32(4096), np.float16(4096), np.longdouble(4096)):
        for _ in range(2):  # answered, then found among the remembered answers
            p = predicted_config("rmsnorm", {"rows": v, "cols": 4096}, "float16", device="nvidia-h200")
            assert p.config == want.config and p.shape == {"rows": 4096, "cols": 4096}
            assert type(p.shape["rows"]) is int
        assert get_threadgroup_candidates_for_shape(profile, v) == row
    assert get_threadgroup_candidates_for_shape(profile, np.int64(4096)) == row
    assert get_threadgroup_candidates_for_shape(profile, np.float32(0)) == get_threadgroup_candidates_for_shape(profile, 0)
    for v in (np.float32(4096.5), np.float32("nan"), np.float16("inf")):
        with pytest.raises(BadLookup, match="must be a positive integer"):
            predicted_config("rmsnorm", {"rows": v, "cols": 4096}, "float16", device="nvidia-h200")
    with pytest.raises(BadLookup, match="larger than an array dimension can be"):
        predicted_config("rmsnorm", {"rows": np.float32(2**40), "cols": 4096}, "float16", device="nvidia-h200")
    with pytest.raises(ValueError, match=r"dim_size must be from 0 to 2147483647 \(got np.float32\(-1.0\)\)"):
        get_threadgroup_candidates_for_shape(profile, np.float32(-1))


@pytest.mark.parametrize("remembered", [False, True])
def test_a_shape_given_as_an_iterator_is_read_once_and_answered(remembered):
    from zmlx_pipeline.runtime.lookup import lookup

    want = predicted_config("rmsnorm", [4096, 2048], "float16", device="nvidia-h200") if remembered else None
    for shape in ((v for v in (4096, 2048)), map(int, ("4096", "2048")), iter([4096, 2048])):
        p = predicted_config("rmsnorm", shape, "float16", device="nvidia-h200")
        assert p.shape == {"rows": 4096, "cols": 2048} and p.config
        assert want is None or p is want
    assert candidates("rmsnorm", iter([4096, 2048]), "float16", device="nvidia-h200") == p.candidates
    assert lookup("rmsnorm", iter([4096, 2048]), "float16", device="nvidia-h200")["shape"] == p.shape
    with pytest.raises(BadLookup, match="got 3 values"):
        predicted_config("rmsnorm", iter([1, 2, 3]), "float16", device="nvidia-h200")


def test_a_mapping_whose_iteration_differs_from_its_values_order_is_answered_for_its_own_shape_alone():
    class SortedKeys(dict):  # iterates its names sorted, while values() keeps the order they were given in
        def __iter__(self):
            return iter(sorted(dict.keys(self)))

    truth = predicted_config("rmsnorm", {"rows": 4096, "cols": 16}, "float16", device="nvidia-h200")
    assert truth.config is None and truth.evidence == "none"
    odd = predicted_config("rmsnorm", SortedKeys(rows=16, cols=4096), "float16", device="nvidia-h200")
    assert odd.shape == {"rows": 16, "cols": 4096} and odd.config is not None
    later = predicted_config("rmsnorm", {"cols": 16, "rows": 4096}, "float16", device="nvidia-h200")
    assert later.shape == {"cols": 16, "rows": 4096} and later.config is None and later.evidence == "none"


@pytest.mark.parametrize("device, dtype", [("nvidia-h100-sxm", "float16"), ("nvidia-h100-sxm", "float32"),
                                           ("nvidia-h200", "float16")])
def test_a_shape_past_the_range_is_timed_from_the_edge_at_its_own_other_dims(device, dtype):
    """moe_combine's tokens end at 16384 and its nearest published bucket past them is of another hidden size: twice
    the tokens at hidden 2048 is the edge's time moved by the work, never a faster guess from hidden 4096."""
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR

    bundle = load_bundle(DEFAULT_BUNDLE_DIR, strict=True)
    assert bundle.kernels["moe_combine"]["measured_range"]["tokens"][1] == 16384
    spec, size = get_kernel("moe_combine"), {"float16": 2, "float32": 4}[dtype]
    edge = predicted_config("moe_combine", {"tokens": 16384, "k": 2, "hidden": 2048}, dtype, device=device)
    assert edge.outside_range == () and edge.predicted_us > 0
    for tokens in (32768, 65536):
        shape = {"tokens": tokens, "k": 2, "hidden": 2048}
        p = predicted_config("moe_combine", shape, dtype, device=device)
        assert p.outside_range == ("tokens",)
        work = spec.bytes_moved(shape, size) / spec.bytes_moved({**shape, "tokens": 16384}, size)
        assert p.predicted_us == pytest.approx(edge.predicted_us * work, rel=2e-3) and p.predicted_us > edge.predicted_us


@pytest.mark.parametrize("device", ["nvidia-h100-pcie", "nvidia-h200", "apple-m3-max-40c"])
def test_past_the_measured_range_a_larger_shape_is_never_predicted_faster(device):
    """Every built-in kernel of the shipped bundle, each dim pushed past its range's top with the others at the low
    end, a power of two near the middle or the top of theirs: the quoted times grow with the work from the edge's."""
    import itertools
    import math

    from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR

    bundle = load_bundle(DEFAULT_BUNDLE_DIR, strict=True)
    checked = 0
    for kernel, meta in sorted(bundle.kernels.items()):
        ranges = meta.get("measured_range") or {}
        points = {d: sorted({lo, 1 << round(math.log2(lo * hi) / 2), hi}) for d, (lo, hi) in ranges.items()}
        for dim, (_lo, hi) in ranges.items():
            others = [d for d in ranges if d != dim]
            for values in itertools.product(*(points[d] for d in others)):
                base, times = dict(zip(others, values)), []
                for value in (hi, hi + 1, hi * 3 // 2, hi * 2, hi * 4):
                    p = predicted_config(kernel, {**base, dim: value}, "float16", device=device)
                    if p.config is None:  # no config is legal there (topk_gating's k above its KMAX): no time either
                        assert p.predicted_us is None
                        continue
                    assert (p.outside_range == ()) == (value == hi), (kernel, dim, value)
                    times.append(p.predicted_us)
                given = [t for t in times if t is not None]
                assert given == sorted(given), (kernel, base, dim, times)
                checked += len(given) > 1
    assert checked >= 60  # most kernels, dims and points quote times there


def test_a_bucket_whose_shape_was_measured_with_its_pick_is_timed_from_that_measurement():
    """matmul's float16 bucket 2^11 x 2^12 x 2^12 on the H200 publishes the time model's guess, while its own shape,
    2048 x 4096 x 4096, measured 150.4 us with the same config: M=2047 is that measurement moved by the work. The
    guess is floored at the rate 16-bit matmul reached on the chip, not at its fp32 peak (1027 us here, 7x the
    measurement, before)."""
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR

    bundle = load_bundle(DEFAULT_BUNDLE_DIR, strict=True)
    table = bundle.json(bundle.tables["nvidia-h200"])["kernels"]["matmul"]["float16"]
    fp32_floor = 2 * 2048 * 4096 * 4096 / (bundle.profiles["nvidia-h200"]["fp32_tflops"] * 1e12) * 1e6
    assert table["buckets"]["11,12,12"]["time_us"] != table["measured"]["2048,4096,4096"]["time_us"]
    assert table["buckets"]["11,12,12"]["time_us"] < fp32_floor / 3
    at = predicted_config("matmul", {"M": 2048, "N": 4096, "K": 4096}, "float16", device="nvidia-h200")
    near = predicted_config("matmul", {"M": 2047, "N": 4096, "K": 4096}, "float16", device="nvidia-h200")
    assert at.evidence == "measured" and near.evidence == "predicted" and near.config == at.config
    spec = get_kernel("matmul")
    work = spec.flops({"M": 2047, "N": 4096, "K": 4096}) / spec.flops({"M": 2048, "N": 4096, "K": 4096})
    assert near.predicted_us == pytest.approx(at.predicted_us * work, rel=2e-3)


@pytest.mark.parametrize("device", ["nvidia-h100-pcie", "nvidia-h200", "apple-m3-max-40c"])
def test_below_the_measured_range_no_time_is_quoted_under_the_least_the_chip_was_quoted(device):
    """Every built-in kernel of the shipped bundle, each dim pushed below its range's bottom: a quoted time is never
    under the least time any kernel is quoted on the chip (a launch's fixed cost), where the work alone would quote
    picoseconds; a shape whose moved time stays above it keeps it."""
    import itertools
    import math

    from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR

    bundle = load_bundle(DEFAULT_BUNDLE_DIR, strict=True)
    tables = bundle.json(bundle.tables[device])["kernels"]
    least = min(e["time_us"] for per_dtype in tables.values() for t in per_dtype.values()
                for part in ("measured", "buckets") for e in (t.get(part) or {}).values() if e.get("time_us"))
    dropped = kept = 0
    for kernel, meta in sorted(bundle.kernels.items()):
        ranges = meta.get("measured_range") or {}
        points = {d: sorted({lo, 1 << round(math.log2(lo * hi) / 2), hi}) for d, (lo, hi) in ranges.items()}
        for dim, (lo, _hi) in ranges.items():
            if lo < 2:
                continue
            others = [d for d in ranges if d != dim]
            for values in itertools.product(*(points[d] for d in others)):
                for value in (lo // 2, max(1, lo // 64)):
                    p = predicted_config(kernel, {**dict(zip(others, values)), dim: value}, "float16", device=device)
                    if p.config is None:
                        continue
                    assert dim in p.outside_range
                    if p.predicted_us is None:
                        dropped += "it would take less than the least time quoted for any kernel" in p.note
                    else:
                        assert p.predicted_us >= least * (1 - 1e-3), (kernel, dim, value, p.predicted_us)
                        kept += 1
    assert dropped >= 5 and kept >= 5  # both happen: tiny shapes lose their time, moderate ones keep it


def test_a_matmul_below_the_range_keeps_its_moved_time_until_it_would_beat_a_launch():
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR

    load_bundle(DEFAULT_BUNDLE_DIR, strict=True)
    spec = get_kernel("matmul")
    edge = predicted_config("matmul", {"M": 1, "N": 4096, "K": 4096}, "float16", device="nvidia-h200")
    half = predicted_config("matmul", {"M": 1, "N": 2048, "K": 4096}, "float16", device="nvidia-h200")
    assert edge.outside_range == () and half.outside_range == ("N",)
    work = spec.bytes_moved({"M": 1, "N": 2048, "K": 4096}, 2) / spec.bytes_moved({"M": 1, "N": 4096, "K": 4096}, 2)
    assert half.predicted_us == pytest.approx(edge.predicted_us * work, rel=2e-3)
    tiny = predicted_config("matmul", {"M": 16, "N": 64, "K": 64}, "float16", device="nvidia-h200")
    assert tiny.config is not None and tiny.predicted_us is None and tiny.outside_range == ("K", "N")
    assert "no predicted time: moved by the work it would take less than the least time quoted for any kernel on " \
           "nvidia-h200" in tiny.note


def test_a_default_answer_of_a_kernel_without_a_threadgroup_parameter_says_what_it_chose(toy):
    """Kernel Tuner kernels name no threadgroup parameter: the default is the first legal config of the kernel's
    ranking, and the note says so rather than claiming the config nearest the catalog's threadgroup."""
    from zmlx_pipeline.runtime.lookup import _default, _Kernel

    meta = {**toy.kernels["toy_scale"], "threadgroup_param": None}
    k = _Kernel("toy_scale", meta)
    p = _default(toy, "toy_scale", k, "nvidia-h200", "float16", {"rows": 64, "cols": 4096}, "no table here")
    assert p.note == "no table here: the first legal config of the kernel's ranking"
    assert p.config == dict(k.configs[k.order[0]]) and p.threadgroup is None
    named = _default(toy, "toy_scale", _Kernel("toy_scale", toy.kernels["toy_scale"]), "nvidia-h200", "float16",
                     {"rows": 64, "cols": 4096}, "no table here")
    assert named.note.startswith("no table here: the config nearest ")


def test_where_no_one_constraint_rules_out_every_config_all_of_them_are_named():
    from zmlx_pipeline.runtime.lookup import _Kernel, _no_legal

    k = _Kernel("pair", {"dims": ["n"], "configs": [{"A": 1}, {"A": 2}],
                         "constraints": ["A == 1 or n > 5", "A == 2 or n > 5", "A >= 1"]})
    p = _no_legal(None, "pair", k, "nvidia-h200", "float16", {"n": 1})
    assert p.config is None and p.note == ("no config of 'pair' is legal for n=1 float16 on nvidia-h200 (constraints: "
                                           "A == 1 or n > 5; A == 2 or n > 5; A >= 1)")
    k = _Kernel("pair", {"dims": ["n"], "configs": [{"A": 1}, {"A": 2}], "constraints": ["A >= n", "A >= 1"]})
    assert _no_legal(None, "pair", k, None, "float16", {"n": 3}).note.endswith("(every config breaks: A >= n)")


@pytest.mark.parametrize("device", ["nvidia-h200", "nvidia-h200@32sm", "nvidia-h100-sxm"])
def test_a_matmul_past_the_measured_rows_keeps_the_rate_its_edge_was_measured_at(device):
    """M past the measured 2048 on a measured shape's N and K: the edge's measured time times the flops ratio (the
    work that grows most), so the quoted rate is the measured one; moved by a roofline of fp32 TFLOPs, a core limit
    without that figure was moved by its bytes alone (2.2 PFLOP/s quoted on 32 SMs)."""
    from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR

    load_bundle(DEFAULT_BUNDLE_DIR, strict=True)
    edge = predicted_config("matmul", {"M": 2048, "N": 14336, "K": 4096}, "float16", device=device)
    assert edge.evidence == "measured" and edge.outside_range == ()
    for m in (4096, 65536):
        p = predicted_config("matmul", {"M": m, "N": 14336, "K": 4096}, "float16", device=device)
        assert p.outside_range == ("M",)
        assert p.predicted_us == pytest.approx(edge.predicted_us * m / 2048, rel=2e-3)


def test_the_bucket_an_answer_names_is_the_shape_whose_entry_answered():
    """matmul's published bucket M~2^11 N~2^12 K~2^14 is the shape 2048 x 4096 x 14336: an answer from it names that
    shape, never 16384 (no shape of it was measured or published); a measured shape names itself."""
    from zmlx_pipeline.runtime import load_bundle
    from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR

    bundle = load_bundle(DEFAULT_BUNDLE_DIR, strict=True)
    rep = bundle.kernels["matmul"]["buckets"]["11,12,14"]
    assert rep == {"M": 2048, "N": 4096, "K": 14336}
    near = predicted_config("matmul", {"M": 2000, "N": 4000, "K": 12000}, "float16", device="nvidia-h200")
    assert near.evidence == "predicted" and near.bucket == rep and list(near.bucket) == ["M", "N", "K"]
    exact = predicted_config("matmul", rep, "float16", device="nvidia-h200")
    assert exact.evidence == "measured" and exact.bucket == rep


def test_an_answer_echoes_the_shape_in_the_kernels_dim_order_however_it_was_given():
    from zmlx_pipeline.runtime.lookup import lookup

    given = predicted_config("rmsnorm", {"cols": 4096, "rows": 3000}, "float16", device="nvidia-h200")
    assert list(given.shape) == ["rows", "cols"] == list(given.bucket)
    assert given.shape == {"rows": 3000, "cols": 4096}
    assert list(lookup("rmsnorm", {"cols": 4096, "rows": 3000}, "float16", device="nvidia-h200")["shape"]) == [
        "rows", "cols"]
