"""Where an unmeasured chip's answers come from: evidence by architecture family, cross-family regret, work terms."""

import json

import pytest

from bundle_fixtures import TOY_DEVICES, fill_toy, latest_dir
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.publish import publish
from zmlx_pipeline.publish.transfer import family_folds, source_device, work_terms
from zmlx_pipeline.runtime import load_bundle, predicted_config

ROWS = [{"device_id": "a", "vendor": "nvidia", "family": "hopper", "memory_bandwidth_gbps": 3350, "gpu_cores": 132},
        {"device_id": "a@32sm", "vendor": "nvidia", "family": "hopper", "memory_bandwidth_gbps": 3350, "gpu_cores": 32,
         "core_limited_from": "a"},
        {"device_id": "b", "vendor": "nvidia", "family": "hopper", "memory_bandwidth_gbps": 4800, "gpu_cores": 132},
        {"device_id": "m3", "vendor": "apple", "family": "m3", "memory_bandwidth_gbps": 400, "gpu_cores": 40},
        {"device_id": "m3p", "vendor": "apple", "family": "m3", "memory_bandwidth_gbps": 150, "gpu_cores": 18},
        {"device_id": "m4", "vendor": "apple", "family": "m4", "memory_bandwidth_gbps": 546, "gpu_cores": 40}]
DEVICES = {r["device_id"]: r for r in ROWS}


def test_the_source_is_the_nearest_measured_full_chip_of_the_same_family_else_of_any():
    measured = ["a", "a@32sm", "b", "m3"]
    assert source_device("m3p", DEVICES, measured) == ("m3", "predicted")
    assert source_device("m4", DEVICES, ["a", "a@32sm", "b"]) == ("a", "extrapolated")  # nearer than b in bandwidth
    assert source_device("m4", DEVICES, ["a@32sm"]) == ("a@32sm", "extrapolated")  # no full chip: the core-limited one
    assert source_device("m4", DEVICES, []) is None
    assert family_folds(measured, DEVICES) == {("nvidia", "hopper"): ["a", "a@32sm", "b"], ("apple", "m3"): ["m3"]}


def test_work_terms_are_exact_for_multilinear_work_and_refused_otherwise():
    shapes = [{"rows": r, "cols": c} for r in (1, 7, 4096) for c in (6, 1024)]
    terms = work_terms(lambda s: (2 * s["rows"] * s["cols"] + s["cols"]) * 2, ["rows", "cols"], shapes)
    assert sorted((tuple(t["dims"]), t["coef"]) for t in terms) == [(("cols",), 2.0), (("rows", "cols"), 4.0)]
    assert work_terms(lambda s: max(s["rows"], 64) * s["cols"], ["rows", "cols"], shapes) is None
    assert work_terms(lambda s: s["rows"] ** 2, ["rows", "cols"], shapes) is None


@pytest.fixture(scope="module")
def two_families(tmp_path_factory):
    """toy_scale measured on two Hopper chips and an M3 Max: two architecture families."""
    root = tmp_path_factory.mktemp("families")
    with Store(root / "s.duckdb") as store:
        fill_toy(store, devices=(*TOY_DEVICES, "apple-m3-max-40c"))
        publish(store, root / "out", devices=["apple-m3-pro-18c", "apple-m4-max-40c", "amd-mi300x"])
    return root / "out"


def test_with_two_families_measured_publish_validates_jumps_across_them(two_families):
    meta = json.loads((latest_dir(two_families) / "kernels.json").read_text())["kernels"]["toy_scale"]
    regret = meta["expected_regret"]
    assert regret["cross_family"] is not None and regret["cross_family"] >= 1.0
    assert meta["transfer"]["apple-m3-pro-18c"] == {"evidence": "predicted", "from": "apple-m3-max-40c"}
    assert meta["transfer"]["apple-m4-max-40c"]["evidence"] == "extrapolated"
    load_bundle(two_families, strict=True)
    shape = {"rows": 64, "cols": 4096}
    far = predicted_config("toy_scale", shape, "float16", device="amd-mi300x")
    assert far.evidence == "extrapolated" and far.expected_regret == pytest.approx(regret["cross_family"], rel=1e-3)
    assert "no architecture family was left out" not in far.note
    near = predicted_config("toy_scale", shape, "float16", device="apple-m3-pro-18c")
    assert near.evidence == "predicted" and near.expected_regret == pytest.approx(regret["unseen_device"], rel=1e-3)
    assert "predicted from apple-m3-max-40c of its own family (apple m3)" in near.note


def test_no_published_time_is_below_the_roofline_bound_of_its_shape_on_its_chip(real_bundle):
    from bundle_fixtures import latest_dir as latest
    from zmlx_pipeline.kernels.registry import get_kernel

    root = latest(real_bundle[1])
    meta = json.loads((root / "kernels.json").read_text())["kernels"]["rmsnorm"]
    profiles = json.loads((root / "profiles.json").read_text())["devices"]
    tables = json.loads((root / "tables.json").read_text())["devices"]
    spec, checked = get_kernel("rmsnorm"), 0
    for device, name in tables.items():
        bw = profiles[device]["memory_bandwidth_gbps"] * 1e9
        for dtype, table in json.loads((root / name).read_text())["kernels"]["rmsnorm"].items():
            b = 4 if dtype == "float32" else 2
            for key, entry in table["buckets"].items():
                if entry["time_us"] is not None:  # memory-bound rmsnorm: bytes over peak bandwidth
                    assert entry["time_us"] >= spec.bytes_moved(meta["buckets"][key], b) / bw * 1e6 * 0.999, (device, key)
                    checked += 1
    assert checked > 100
    # 32768 x 4096 fp16 moves 537 MB: the 32-SM H100 run that measured it is quoted no faster than 3350 GB/s allow
    def big(device):
        return json.loads((root / tables[device]).read_text())["kernels"]["rmsnorm"]["float16"]["buckets"]["15,12"]

    assert big("nvidia-h100-sxm@32sm")["time_us"] >= 4 * 32768 * 4096 / 3350e9 * 1e6
    assert big("nvidia-h200")["time_us"] is None  # no time moves from a core-limited run (the bundle's only one)


def test_a_guess_is_floored_at_the_rate_the_chip_reached_not_at_fp32_peak_where_it_ran_past_it():
    """16-bit matmul on an H200 was measured at 517 TFLOPs against its 66.9 fp32: a guess is floored at the larger."""
    import polars as pl

    from zmlx_pipeline.publish.build import _at_least_roofline, _flop_rates

    work = {"float16": {"bytes": [{"dims": ["M", "N"], "coef": 2.0}], "flops": [{"dims": ["M", "N"], "coef": 1e6}]}}
    shape = {"M": 1000, "N": 1000}  # 1e12 flops
    frame = pl.DataFrame({"device_id": ["h", "h", "h"], "dtype": ["float16"] * 3, "shape_key": ["a", "a", "b"],
                          "shape": [json.dumps(shape)] * 2 + [json.dumps({"M": 10, "N": 10})],
                          "median_us": [4000.0, 2000.0, 1.0]})
    rates = _flop_rates(frame, work)
    assert rates == {("h", "float16"): pytest.approx(500.0)}  # 1e12 flops in 2 ms (the 10x10 shape: 100 TFLOPs)
    row = {"memory_bandwidth_gbps": 4800, "fp32_tflops": 66.9}
    moved = (2e6, 1e12)
    assert _at_least_roofline(100.0, moved, row) == pytest.approx(1e12 / 66.9e12 * 1e6, rel=1e-3)  # fp32: 14.9 ms
    assert _at_least_roofline(100.0, moved, row, rates[("h", "float16")]) == pytest.approx(2000.0, rel=1e-3)
    assert _at_least_roofline(100.0, moved, row, 10.0) == pytest.approx(1e12 / 66.9e12 * 1e6, rel=1e-3)  # never lower
    assert _at_least_roofline(5000.0, moved, row, 500.0) == 5000.0


def test_a_chip_never_measured_moves_the_sources_measured_time_where_it_measured_the_buckets_shape_with_its_pick():
    from zmlx_pipeline.publish.build import KernelTables, _move_times

    tables = KernelTables("k", ["M", "N"])
    tables.bucket_shapes = {"10,10": {"M": 1024, "N": 1024}, "11,11": {"M": 2048, "N": 2048}}
    src = tables.entries["b"]["float16"]
    src["buckets"] = {"10,10": {"best": 0, "time_us": 900.0}, "11,11": {"best": 0, "time_us": 900.0}}
    src["measured"] = {"1024,1024": {"best": 0, "time_us": 100.0}, "2048,2048": {"best": 3, "time_us": 100.0}}
    dst = tables.entries["a"]["float16"]
    dst["buckets"] = {"10,10": {"best": 0, "time_us": None}, "11,11": {"best": 0, "time_us": None}}
    work = {"float16": {"bytes": [{"dims": ["M", "N"], "coef": 2.0}], "flops": [{"dims": ["M", "N"], "coef": 1.0}]}}
    _move_times(tables, {"a": ("b", "predicted")}, DEVICES, work)
    ratio = DEVICES["b"]["memory_bandwidth_gbps"] / DEVICES["a"]["memory_bandwidth_gbps"]  # bandwidth-bound
    assert dst["buckets"]["10,10"]["time_us"] == pytest.approx(100.0 * ratio, rel=1e-3)  # measured with its pick
    assert dst["buckets"]["11,11"]["time_us"] == pytest.approx(900.0 * ratio, rel=1e-3)  # measured with another pick
    assert {e["evidence"] for e in dst["buckets"].values()} == {"predicted"}


def test_a_moved_time_is_never_faster_than_the_chips_memory_moves_its_bytes():
    """A measurement past its own chip's peak bandwidth (inputs in L2) is not carried past the other chip's peak."""
    from zmlx_pipeline.publish.build import KernelTables, _move_times

    tables = KernelTables("k", ["M", "N"])
    tables.bucket_shapes = {"10,10": {"M": 1024, "N": 1024}}  # 2 MiB moved: 0.626 us at a's 3350 GB/s
    tables.entries["b"]["float16"]["buckets"] = {"10,10": {"best": 0, "time_us": 0.3}}  # 7 TB/s on b's 4800 GB/s
    tables.entries["a"]["float16"]["buckets"] = {"10,10": {"best": 0, "time_us": None}}
    work = {"float16": {"bytes": [{"dims": ["M", "N"], "coef": 2.0}], "flops": [{"dims": ["M", "N"], "coef": 1.0}]}}
    _move_times(tables, {"a": ("b", "predicted")}, DEVICES, work)
    moved = tables.entries["a"]["float16"]["buckets"]["10,10"]
    assert moved["time_us"] == pytest.approx(2 * 1024 * 1024 / 3350e9 * 1e6, rel=1e-3)
    assert moved["time_us"] > 0.3 * 4800 / 3350  # the bandwidth ratio alone would quote 0.43 us


def test_a_compute_bound_time_past_the_sources_fp32_peak_is_moved_within_its_family_only():
    """The fp32 peaks' ratio carries a tensor-core rate to a chip of the same architecture, not to another one."""
    from zmlx_pipeline.publish.build import KernelTables, _move_times

    rows = {"h": {"vendor": "nvidia", "family": "hopper", "memory_bandwidth_gbps": 4800, "fp32_tflops": 66.9},
            "h2": {"vendor": "nvidia", "family": "hopper", "memory_bandwidth_gbps": 2000, "fp32_tflops": 51.2},
            "m": {"vendor": "apple", "family": "m3", "memory_bandwidth_gbps": 400, "fp32_tflops": 14.2}}
    work = {"float16": {"bytes": [{"dims": ["M"], "coef": 2.0}], "flops": [{"dims": ["M"], "coef": 1e9}]}}
    tables = KernelTables("k", ["M"])
    tables.bucket_shapes = {"10": {"M": 1024}, "0": {"M": 1}}  # 1.0e12 flops: 500 TFLOPs in 2 ms; 1e9: 1 TFLOPs
    tables.entries["h"]["float16"]["buckets"] = {"10": {"best": 0, "time_us": 2000.0}, "0": {"best": 0, "time_us": 1000.0}}
    for d in ("h2", "m"):
        tables.entries[d]["float16"]["buckets"] = {"10": {"best": 0, "time_us": None}, "0": {"best": 0, "time_us": None}}
    _move_times(tables, {"h2": ("h", "predicted"), "m": ("h", "extrapolated")}, rows, work)
    same, other = tables.entries["h2"]["float16"]["buckets"], tables.entries["m"]["float16"]["buckets"]
    assert same["10"]["time_us"] == pytest.approx(2000.0 * 66.9 / 51.2, rel=1e-3) and same["10"]["time_bound"] == "compute"
    assert other["10"]["time_us"] is None and other["10"]["time_bound"] is None
    assert other["0"]["time_us"] == pytest.approx(1000.0 * 66.9 / 14.2, rel=1e-3)  # under the fp32 peak: moved


def test_a_core_limited_runs_time_is_moved_to_no_other_device():
    """A shape's best time on 32 of an H200's SMs is up to 4.3x the whole chip's (data/), at the same bandwidth
    figure: the bandwidth ratio cannot carry a core-limited run's time, so the full chip (or any other) is quoted none."""
    from zmlx_pipeline.publish.build import KernelTables, _move_times

    tables = KernelTables("k", ["M", "N"])
    tables.bucket_shapes = {"10,10": {"M": 1024, "N": 1024}}
    tables.entries["a@32sm"]["float16"]["buckets"] = {"10,10": {"best": 0, "time_us": 72.0}}
    tables.entries["b"]["float16"]["buckets"] = {"10,10": {"best": 0, "time_us": 50.0}}
    for d in ("a", "m4"):
        tables.entries[d]["float16"]["buckets"] = {"10,10": {"best": 0, "time_us": None}}
    work = {"float16": {"bytes": [{"dims": ["M", "N"], "coef": 2.0}], "flops": [{"dims": ["M", "N"], "coef": 1.0}]}}
    _move_times(tables, {"a": ("a@32sm", "predicted"), "m4": ("a@32sm", "extrapolated")}, DEVICES, work)
    for d in ("a", "m4"):
        entry = tables.entries[d]["float16"]["buckets"]["10,10"]
        assert entry["time_us"] is None and entry["time_bound"] is None
    assert tables.entries["a"]["float16"]["buckets"]["10,10"]["evidence"] == "predicted"  # the ranking still moves
    _move_times(tables, {"a": ("b", "predicted")}, DEVICES, work)  # from a full chip it is moved
    assert tables.entries["a"]["float16"]["buckets"]["10,10"]["time_us"] == pytest.approx(50.0 * 4800 / 3350, rel=1e-3)
