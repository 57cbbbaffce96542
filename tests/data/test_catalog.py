"""The device catalog: sound data, exact figures for binned chips, and whole-name matching."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from zmlx_pipeline.data.catalog import (
    DeviceSpec,
    UnknownDevice,
    arch_generation,
    get_device,
    load_catalog,
    match_device,
    match_gpu_arch,
    normalize_name,
    validate_catalog,
)

KERNEL_TUNER = Path("/work/shared/datasets/kernel-tuner")

APPLE_VARIANTS = {
    "m1": [7, 8], "m1-pro": [14, 16], "m1-max": [24, 32], "m1-ultra": [48, 64],
    "m2": [8, 10], "m2-pro": [16, 19], "m2-max": [30, 38], "m2-ultra": [60, 76],
    "m3": [8, 10], "m3-pro": [14, 18], "m3-max": [30, 40], "m3-ultra": [60, 80],
    "m4": [8, 10], "m4-pro": [16, 20], "m4-max": [32, 40],
    "m5": [10], "m5-pro": [20], "m5-max": [40],
}


def test_catalog_validates_cleanly():
    assert validate_catalog() == []


def test_validate_catalog_reports_each_kind_of_problem():
    good = get_device("nvidia-t4")
    bad_figure = DeviceSpec.from_json({**_json_row(good), "id": "x-1", "name": "X One", "aliases": ["X1"], "clock_mhz": 0})
    uncited = DeviceSpec.from_json({**_json_row(good), "id": "x-2", "name": "X Two", "aliases": ["X2"],
                                    "sources": {k: v for k, v in good.sources.items() if k != "l2_bytes"}})
    wrong_source = DeviceSpec.from_json({**_json_row(good), "id": "x-3", "name": "X Three", "aliases": ["X3"],
                                         "sources": {**good.sources, "gpu_cores": "nowhere"}})
    clash = DeviceSpec.from_json({**_json_row(good), "id": "x-4", "name": "X Four", "aliases": ["Tesla T4"]})
    problems = validate_catalog((good, good, bad_figure, uncited, wrong_source, clash))
    text = "\n".join(problems)
    assert "'nvidia-t4': duplicate id" in text
    assert "'x-1': clock_mhz must be a positive number" in text
    assert "'x-2': l2_bytes cites no source" in text
    assert "'x-3': gpu_cores cites undeclared source 'nowhere'" in text
    assert "alias 'Tesla T4' is listed by more than one device" in text


def _json_row(spec: DeviceSpec) -> dict:
    row = {**spec.as_row(), "aliases": list(spec.aliases), "sources": dict(spec.sources)}
    row.pop("core_limited_from")
    return row


def test_ids_and_aliases_are_unique():
    devices = load_catalog()
    assert len({d.id for d in devices}) == len(devices)
    aliases = [a for d in devices for a in d.aliases]
    assert len(set(aliases)) == len(aliases)


def test_every_apple_variant_is_present_with_its_core_count():
    for chip, cores in APPLE_VARIANTS.items():
        for n in cores:
            spec = get_device(f"apple-{chip}-{n}c")
            assert spec.gpu_cores == n and spec.vendor == "apple" and spec.backend == "metal"
    assert sum(d.vendor == "apple" for d in load_catalog()) == 33


@pytest.mark.parametrize(
    "device_id, bandwidth",
    [
        ("apple-m1-7c", 68.25), ("apple-m1-max-24c", 400), ("apple-m2-max-30c", 400),
        ("apple-m3-pro-14c", 150), ("apple-m3-max-30c", 300), ("apple-m3-max-40c", 400),
        ("apple-m3-ultra-60c", 819), ("apple-m3-ultra-80c", 819), ("apple-m4-8c", 120), ("apple-m4-10c", 120),
        ("apple-m4-pro-16c", 273), ("apple-m4-pro-20c", 273), ("apple-m4-max-32c", 410), ("apple-m4-max-40c", 546),
    ],
)
def test_binned_variants_have_their_own_bandwidth(device_id, bandwidth):
    assert get_device(device_id).memory_bandwidth_gbps == bandwidth


def test_apple_limits_slc_and_clock_per_generation():
    m1_max = get_device("apple-m1-max-32c")
    assert (m1_max.max_threads_per_threadgroup, m1_max.simd_width, m1_max.threadgroup_memory_bytes) == (1024, 32, 32768)
    assert m1_max.l2_bytes == 48 * 2**20 and m1_max.clock_mhz == 1296
    assert get_device("apple-m1-8c").l2_bytes == 8 * 2**20
    assert get_device("apple-m4-pro-20c").clock_mhz == 1578
    assert get_device("apple-m3-max-40c").architecture == "apple9"


def test_enough_non_apple_gpus_across_generations():
    devices = load_catalog()
    assert sum(d.vendor != "apple" for d in devices) >= 40
    families = {d.family for d in devices if d.vendor == "nvidia"}
    assert {"kepler", "pascal", "volta", "turing", "ampere", "ada", "hopper"} <= families
    for device_id in ("nvidia-tesla-k80", "nvidia-tesla-k40", "nvidia-p100-pcie-16gb", "nvidia-v100-pcie-16gb",
                      "nvidia-v100-sxm2-16gb", "nvidia-t4", "nvidia-a10", "nvidia-a30", "nvidia-a40",
                      "nvidia-a100-pcie-40gb", "nvidia-a100-sxm4-40gb", "nvidia-a100-sxm4-80gb", "nvidia-rtx-a4000",
                      "nvidia-rtx-a5000", "nvidia-rtx-a6000", "nvidia-l4", "nvidia-l40s", "nvidia-h100-pcie",
                      "nvidia-h100-sxm", "nvidia-h200", "nvidia-gtx-1080-ti", "nvidia-rtx-2080-ti", "nvidia-rtx-3060",
                      "nvidia-rtx-3080", "nvidia-rtx-3090", "nvidia-rtx-4070", "nvidia-rtx-4080", "nvidia-rtx-4090",
                      "nvidia-titan-v", "amd-mi50", "amd-mi60", "amd-mi100", "amd-mi210", "amd-mi250", "amd-mi250x",
                      "amd-mi300x", "amd-radeon-pro-w6600", "amd-radeon-pro-w6800", "amd-radeon-pro-w7800",
                      "amd-radeon-pro-w7900"):
        get_device(device_id)


def test_vendor_limits():
    h100 = get_device("nvidia-h100-sxm")
    assert (h100.gpu_cores, h100.architecture, h100.threadgroup_memory_bytes, h100.simd_width) == (132, "sm_90", 49152, 32)
    assert get_device("amd-mi250x").simd_width == 64 and get_device("amd-radeon-pro-w6600").simd_width == 32
    assert get_device("amd-mi250x").threadgroup_memory_bytes == 65536
    assert get_device("amd-mi250x").gpu_cores == 110  # one GCD, as HIP sees it


def _kernel_tuner_names() -> set[str]:
    names = set()
    for path in sorted(KERNEL_TUNER.glob("*/*.json.gz")):
        with gzip.open(path, "rt") as f:
            head = f.read(600)
        if '"device_name"' in head:
            names.add(json.loads(head[: head.index('"kernel_name"')].rstrip().rstrip(",") + "}")["device_name"])
    return names


@pytest.mark.skipif(not KERNEL_TUNER.exists(), reason="Kernel Tuner datasets not present")
def test_every_kernel_tuner_device_name_matches_a_row():
    names = _kernel_tuner_names()
    assert {"NVIDIA A100-PCIE-40GB", "NVIDIA RTX A4000", "NVIDIA RTX A6000", "AMD Radeon PRO W6600", ""} <= names
    expected = {"NVIDIA A100-PCIE-40GB": "nvidia-a100-pcie-40gb", "NVIDIA RTX A4000": "nvidia-rtx-a4000",
                "NVIDIA RTX A6000": "nvidia-rtx-a6000", "AMD Radeon PRO W6600": "amd-radeon-pro-w6600"}
    for name in names - {""}:
        assert match_device(name).id == expected[name]


@pytest.mark.parametrize(
    "stem, device_id",
    [("A100", "nvidia-a100-pcie-40gb"), ("A4000", "nvidia-rtx-a4000"), ("A6000", "nvidia-rtx-a6000"),
     ("MI250X", "amd-mi250x"), ("W6600", "amd-radeon-pro-w6600")],
)
def test_kernel_tuner_file_names_match(stem, device_id):
    assert match_device(stem).id == device_id


@pytest.mark.parametrize(
    "name, device_id",
    [
        ("NVIDIA H200", "nvidia-h200"),
        ("NVIDIA H100 80GB HBM3", "nvidia-h100-sxm"),
        ("A100-PCIE-40GB", "nvidia-a100-pcie-40gb"),
        ("nvidia a100 pcie 40gb", "nvidia-a100-pcie-40gb"),
        ("NVIDIA A100-SXM4-80GB", "nvidia-a100-sxm4-80gb"),
        ("Tesla V100-SXM2-32GB", "nvidia-v100-sxm2-32gb"),
        ("NVIDIA GeForce RTX 4090", "nvidia-rtx-4090"),
        ("GeForce RTX 4090", "nvidia-rtx-4090"),
        ("AMD Instinct MI300X", "amd-mi300x"),
        ("Radeon PRO W7900", "amd-radeon-pro-w7900"),
        ("40GB PCIe A100 NVIDIA", "nvidia-a100-pcie-40gb"),  # token-set fallback
    ],
)
def test_reported_names_match_exactly_one_row(name, device_id):
    assert match_device(name).id == device_id


def test_apple_name_is_never_a_prefix_match():
    assert match_device("Apple M3 Max").id == "apple-m3-max-40c"
    assert match_device("Apple M3").id == "apple-m3-10c"
    assert match_device("Apple M3 Pro").id == "apple-m3-pro-18c"
    assert match_device("Apple M4 Max").id == "apple-m4-max-40c"


def test_apple_binned_variant_is_picked_by_core_count():
    assert match_device("Apple M3 Max", gpu_cores=30).id == "apple-m3-max-30c"
    assert match_device("Apple M3 Max", gpu_cores=40).id == "apple-m3-max-40c"
    assert match_device("Apple M4 Max", gpu_cores=32).memory_bandwidth_gbps == 410
    assert match_device("Apple M3", gpu_cores=8).id == "apple-m3-8c"
    assert match_device("Apple M3 Max", gpu_cores=35) is None
    assert match_device("Apple M3", gpu_cores=40) is None


@pytest.mark.parametrize("name", ["NVIDIA Future GPU 9000", "Apple M9 Max", "NVIDIA H100", "M3 Max Extreme", "", "  "])
def test_unmatched_names_return_none(name):
    assert match_device(name) is None


def test_normalize_name_drops_case_punctuation_and_vendor_words():
    assert normalize_name("NVIDIA A100-PCIE-40GB") == "a100 pcie 40gb"
    assert normalize_name("Apple M3 Max") == "m3 max"
    assert normalize_name("AMD Radeon(TM) PRO W6600") == "radeon pro w6600"


def test_get_device_suggests_close_ids():
    with pytest.raises(UnknownDevice, match="apple-m3-max-40c"):
        get_device("apple-m3-max-40")


def test_as_row_is_flat_without_sources_or_aliases():
    row = get_device("apple-m3-max-30c").as_row()
    assert "sources" not in row and "aliases" not in row
    assert row["id"] == "apple-m3-max-30c" and row["memory_bandwidth_gbps"] == 300 and row["core_limited_from"] is None
    assert all(not isinstance(v, (dict, list, tuple)) for v in row.values())


def test_with_core_limit_is_a_device_of_its_own():
    h100 = get_device("nvidia-h100-sxm")
    limited = h100.with_core_limit(66, reported_name="NVIDIA H100 80GB HBM3")
    assert limited.id == "nvidia-h100-sxm@66sm"
    assert limited.name == "NVIDIA H100 80GB HBM3 [66 SMs]"
    assert limited.gpu_cores == 66 and limited.core_limited_from == "nvidia-h100-sxm"
    assert limited.memory_bandwidth_gbps == h100.memory_bandwidth_gbps and limited.l2_bytes == h100.l2_bytes
    assert h100.with_core_limit(33).name == "NVIDIA H100 SXM5 80GB [33 SMs]"
    with pytest.raises(ValueError):
        h100.with_core_limit(0)


def test_catalog_loads_as_package_data():
    from importlib import resources

    assert resources.files("zmlx_pipeline.data").joinpath("catalog.json").is_file()
    assert load_catalog() is load_catalog()


def test_m5_family_figures():
    m5, pro, mx = get_device("apple-m5-10c"), get_device("apple-m5-pro-20c"), get_device("apple-m5-max-40c")
    assert (m5.gpu_cores, m5.memory_bandwidth_gbps, m5.memory_gb, m5.clock_mhz) == (10, 153, 32, 1740)
    assert (pro.gpu_cores, pro.memory_bandwidth_gbps, pro.memory_gb) == (20, 307, 64)
    assert (mx.gpu_cores, mx.memory_bandwidth_gbps, mx.memory_gb) == (40, 614, 128)
    assert m5.fp32_tflops == pytest.approx(10 * 128 * 2 * 1.74e9 / 1e12, abs=0.01)
    assert (m5.gpu_arch, mx.gpu_arch) == ("applegpu_g17g", "applegpu_g17s")
    assert match_device("Apple M5 Max", gpu_cores=40) is mx and match_device("Apple M5", gpu_cores=10) is m5
    assert match_device("Apple M5 Max", gpu_cores=32) is None  # no published binned M5 Max yet


@pytest.mark.parametrize("family, generation", [("m1", 13), ("m2", 14), ("m3", 15), ("m4", 16), ("m5", 17)])
def test_every_apple_row_has_the_gpu_arch_of_its_generation(family, generation):
    rows = [d for d in load_catalog() if d.vendor == "apple" and d.family == family]
    assert rows and all(arch_generation(d.gpu_arch) == generation for d in rows)
    assert all(d.sources["gpu_arch"] in ("recorded-apple-gpu-arch", "mlx-metal-device-arch") for d in rows)


def test_non_apple_rows_have_no_gpu_arch():
    assert all(d.gpu_arch is None for d in load_catalog() if d.vendor != "apple")


@pytest.mark.parametrize("text, generation", [
    ("applegpu_g13g", 13), ("applegpu_g15s", 15), ("APPLEGPU_G17S", 17), ("applegpu_g18p", 18),
    ("apple9", None), ("sm_90", None), ("", None), (None, None), ("applegpu_g16", None),
])
def test_arch_generation(text, generation):
    assert arch_generation(text) == generation


def test_match_gpu_arch_uses_generation_and_cores():
    assert match_gpu_arch("applegpu_g15s", 30).id == "apple-m3-max-30c"
    assert match_gpu_arch("applegpu_g15s", 14).id == "apple-m3-pro-14c"
    assert match_gpu_arch("applegpu_g15g", 14).id == "apple-m3-pro-14c"  # tier letter not needed with cores
    assert match_gpu_arch("applegpu_g14d").id == "apple-m2-ultra-76c"  # one chip: the full one
    assert match_gpu_arch("applegpu_g16s") is None  # M4 Pro or M4 Max: no guess without cores
    assert match_gpu_arch("applegpu_g15s", 36) is None
    assert match_gpu_arch("applegpu_g18s", 40) is None and match_gpu_arch("applegpu_g18s") is None


def test_validate_catalog_checks_gpu_arch():
    m3 = get_device("apple-m3-max-40c")
    bad = DeviceSpec.from_json({**_json_row(m3), "id": "x-5", "name": "X Five", "aliases": [], "gpu_arch": "apple9"})
    uncited = DeviceSpec.from_json({**_json_row(m3), "id": "x-6", "name": "X Six", "aliases": [], "gpu_cores": 41,
                                    "sources": {k: v for k, v in m3.sources.items() if k != "gpu_arch"}})
    other_gen = DeviceSpec.from_json({**_json_row(m3), "id": "x-7", "name": "X Seven", "aliases": [], "gpu_cores": 42,
                                      "gpu_arch": "applegpu_g16s"})
    same_cores = DeviceSpec.from_json({**_json_row(m3), "id": "x-8", "name": "X Eight", "aliases": []})
    nvidia = DeviceSpec.from_json({**_json_row(get_device("nvidia-t4")), "id": "x-9", "name": "X Nine", "aliases": [],
                                   "gpu_arch": "applegpu_g15s"})
    text = "\n".join(validate_catalog((m3, bad, uncited, other_gen, same_cores, nvidia)))
    assert "'x-5': gpu_arch must look like 'applegpu_g15s', got 'apple9'" in text
    assert "'x-6': gpu_arch cites no source" in text
    assert "'x-7': gpu_arch generation 16 differs from the rest of family 'm3' (15)" in text
    assert "'x-8': generation 15 with 40 cores also names 'apple-m3-max-40c'" in text
    assert "'x-9': gpu_arch is for Apple rows only" in text
