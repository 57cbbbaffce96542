"""The device catalog: sound data, exact figures for binned chips, and whole-name matching."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from zmlx_pipeline.data.catalog import (
    NUMERIC_FIELDS,
    AmbiguousDevice,
    DeviceSpec,
    UnknownDevice,
    arch_generation,
    catalog_sources,
    get_device,
    load_catalog,
    match_device,
    match_gpu_arch,
    mlx_chips_text,
    mlx_runs_on,
    normalize_name,
    resolve_device,
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
    no_arch_source = DeviceSpec.from_json({**_json_row(good), "id": "x-5", "name": "X Five", "aliases": ["X5"],
                                           "sources": {k: v for k, v in good.sources.items() if k != "architecture"}})
    problems = validate_catalog((good, good, bad_figure, uncited, wrong_source, clash, no_arch_source))
    text = "\n".join(problems)
    assert "'nvidia-t4': duplicate id" in text
    assert "'x-1': clock_mhz must be a positive number" in text
    assert "'x-2': l2_bytes cites no source" in text
    assert "'x-3': gpu_cores cites undeclared source 'nowhere'" in text
    assert "alias 'Tesla T4' is listed by more than one device" in text
    assert "'x-5': architecture cites no source" in text


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


# The GPUs people tune on, by family: each id must be a row of that vendor and family.
FAMILY_ROWS = {
    ("nvidia", "kepler"): ["tesla-k20", "tesla-k20x", "tesla-k40", "tesla-k80", "gtx-680", "gtx-780", "gtx-780-ti",
                           "gtx-titan", "gtx-titan-black", "gtx-770", "tesla-k10", "quadro-k6000"],
    ("nvidia", "maxwell"): ["gtx-750-ti", "gtx-960", "gtx-970", "gtx-980", "gtx-980-ti", "gtx-titan-x", "tesla-m40",
                            "tesla-m60",
                            "tesla-m4", "gtx-950", "quadro-m4000", "quadro-m5000", "quadro-m6000"],
    ("nvidia", "pascal"): ["gtx-1050-ti", "gtx-1060-6gb", "gtx-1070", "gtx-1070-ti", "gtx-1080", "gtx-1080-ti",
                           "titan-x-pascal",
                           "titan-xp", "p100-pcie-12gb", "p100-pcie-16gb", "p100-sxm2", "tesla-p40", "tesla-p4",
                           "quadro-p4000", "quadro-p5000", "quadro-p6000", "gt-1030", "gtx-1050", "gtx-1050-3gb",
                           "gtx-1060-3gb", "quadro-p400", "quadro-p600", "quadro-p620", "quadro-p2000",
                           "quadro-p2200"],
    ("nvidia", "volta"): ["v100-pcie-16gb", "v100-pcie-32gb", "v100-sxm2-16gb", "v100-sxm2-32gb", "v100-sxm3-32gb",
                          "v100s-pcie", "titan-v", "quadro-gv100"],
    ("nvidia", "turing"): ["gtx-1650", "gtx-1650-super", "gtx-1660", "gtx-1660-ti", "gtx-1660-super", "rtx-2060",
                           "rtx-2060-super", "rtx-2070", "rtx-2070-super", "rtx-2080", "rtx-2080-super", "rtx-2080-ti",
                           "titan-rtx", "t4",
                           "quadro-rtx-4000", "quadro-rtx-5000", "quadro-rtx-6000", "quadro-rtx-8000", "gtx-1630",
                           "gtx-1650-gddr6", "rtx-2060-12gb", "t400", "t600", "t1000"],
    ("nvidia", "ampere"): ["a100-pcie-40gb", "a100-pcie-80gb", "a100-sxm4-40gb", "a100-sxm4-80gb", "a800-sxm4-80gb",
                           "a800-pcie-80gb", "a10", "a10g", "a30", "a40",
                           "a2", "a16", "rtx-3050", "rtx-3060", "rtx-3060-ti", "rtx-3070", "rtx-3070-ti", "rtx-3080",
                           "rtx-3080-ti", "rtx-3090", "rtx-3090-ti", "rtx-a1000", "rtx-a2000", "rtx-a4000", "rtx-a4500",
                           "rtx-a5000", "rtx-a5500", "rtx-a6000", "rtx-3060-laptop", "rtx-3070-laptop",
                           "rtx-3080-laptop",
                           "jetson-agx-orin-64gb", "jetson-agx-orin-32gb"],
    ("nvidia", "ada"): ["l4", "l20", "l40", "l40s", "rtx-4060", "rtx-4060-ti", "rtx-4070", "rtx-4070-super", "rtx-4070-ti",
                        "rtx-4070-ti-super", "rtx-4080", "rtx-4080-super", "rtx-4090", "rtx-2000-ada", "rtx-4000-ada",
                        "rtx-4500-ada", "rtx-5000-ada", "rtx-6000-ada", "rtx-4060-laptop", "rtx-4070-laptop",
                        "rtx-4080-laptop", "rtx-4090-laptop", "rtx-4000-sff-ada", "rtx-5880-ada", "rtx-500-ada-laptop"],
    ("nvidia", "hopper"): ["h100-pcie", "h100-sxm", "h100-nvl", "h200", "gh200-96gb", "gh200-144gb", "h800-sxm",
                           "h800-pcie", "h20", "h200-nvl"],
    ("nvidia", "blackwell"): ["b200", "gb200", "b300", "gb300", "rtx-5050", "rtx-5060", "rtx-5060-ti", "rtx-5070",
                              "rtx-5070-ti", "rtx-5080", "rtx-5090",
                              "rtx-pro-6000-blackwell", "rtx-pro-6000-blackwell-max-q", "rtx-pro-4000-blackwell",
                              "rtx-pro-4500-blackwell", "rtx-pro-5000-blackwell"],
    ("amd", "gcn4"): ["radeon-rx-580", "radeon-rx-590"],
    ("amd", "gcn5"): ["mi25", "mi50", "mi60", "radeon-vii", "radeon-pro-vii", "radeon-rx-vega-64", "radeon-rx-vega-56"],
    ("amd", "cdna1"): ["mi100"],
    ("amd", "cdna2"): ["mi210", "mi250", "mi250x"],
    ("amd", "cdna3"): ["mi300a", "mi300x", "mi325x"],
    ("amd", "cdna4"): ["mi350x", "mi355x"],
    ("amd", "rdna1"): ["radeon-rx-5500-xt", "radeon-rx-5600-xt", "radeon-rx-5700", "radeon-rx-5700-xt",
                       "radeon-pro-w5700"],
    ("amd", "rdna2"): ["radeon-rx-6600", "radeon-rx-6600-xt", "radeon-rx-6650-xt", "radeon-rx-6700",
                       "radeon-rx-6700-xt", "radeon-rx-6750-xt", "radeon-rx-6800", "radeon-rx-6800-xt",
                       "radeon-rx-6900-xt", "radeon-rx-6950-xt", "radeon-pro-w6600", "radeon-pro-w6800",
                       "radeon-rx-6400", "radeon-rx-6500-xt", "radeon-pro-v620"],
    ("amd", "rdna3"): ["radeon-rx-7600", "radeon-rx-7600-xt", "radeon-rx-7700-xt", "radeon-rx-7800-xt",
                       "radeon-rx-7900-gre", "radeon-rx-7900-xt", "radeon-rx-7900-xtx", "radeon-pro-w7600",
                       "radeon-pro-w7700", "radeon-pro-w7800", "radeon-pro-w7900"],
    ("amd", "rdna4"): ["radeon-rx-9060-xt", "radeon-rx-9070", "radeon-rx-9070-xt", "radeon-ai-pro-r9700"],
}

# Which architectures (sm_XX compute capability, gfx LLVM target) each family spans.
FAMILY_ARCHITECTURES = {
    "kepler": {"sm_30", "sm_35", "sm_37"}, "maxwell": {"sm_50", "sm_52"}, "pascal": {"sm_60", "sm_61"},
    "volta": {"sm_70"}, "turing": {"sm_75"}, "ampere": {"sm_80", "sm_86", "sm_87"}, "ada": {"sm_89"},
    "hopper": {"sm_90"},
    "blackwell": {"sm_100", "sm_103", "sm_120"},
    "gcn4": {"gfx803"}, "gcn5": {"gfx900", "gfx906"}, "cdna1": {"gfx908"}, "cdna2": {"gfx90a"}, "cdna3": {"gfx942"},
    "cdna4": {"gfx950"},
    "rdna1": {"gfx1010", "gfx1011", "gfx1012"}, "rdna2": {"gfx1030", "gfx1031", "gfx1032", "gfx1034"},
    "rdna3": {"gfx1100", "gfx1101", "gfx1102"}, "rdna4": {"gfx1200", "gfx1201"},
}

# FP32 lanes per SM/CU (an FMA is two FLOPs); RDNA3/4 and CDNA4 figures count two FP32 per lane per clock.
FP32_LANES = {
    "sm_30": 192, "sm_35": 192, "sm_37": 192, "sm_50": 128, "sm_52": 128, "sm_60": 64, "sm_61": 128, "sm_70": 64,
    "sm_75": 64, "sm_80": 64, "sm_86": 128, "sm_87": 128, "sm_89": 128, "sm_90": 128, "sm_100": 128, "sm_103": 128,
    "sm_120": 128,
    "gfx803": 64, "gfx900": 64, "gfx906": 64, "gfx908": 64, "gfx90a": 64, "gfx942": 64, "gfx950": 128,
    "gfx1010": 64, "gfx1012": 64, "gfx1030": 64, "gfx1031": 64, "gfx1032": 64, "gfx1034": 64,
    "gfx1100": 128, "gfx1101": 128, "gfx1102": 128, "gfx1200": 128, "gfx1201": 128,
}

# (low, high) bounds a discrete NVIDIA/AMD GPU's figure lies in; a typo (an extra zero, MB for GB) falls outside.
# The low ends are the smallest boards catalogued: Quadro P400 (2 SMs, 32 GB/s, 0.64 TFLOPS), Radeon RX 6400 (12 CUs).
PLAUSIBLE = {
    "memory_bandwidth_gbps": (25, 10_000), "clock_mhz": (700, 3_300), "fp32_tflops": (0.5, 200.0),
    "memory_gb": (2, 300), "l2_bytes": (512 * 1024, 256 * 2**20),
}
CORE_RANGE = {"sms": (2, 200), "cus": (12, 320)}
SPEC_FIELDS = {*NUMERIC_FIELDS, "architecture"}


def _gpus() -> list[DeviceSpec]:
    return [d for d in load_catalog() if d.vendor != "apple"]


@pytest.mark.parametrize("vendor, family", list(FAMILY_ROWS))
def test_every_family_has_the_rows_people_tune_on(vendor, family):
    for name in FAMILY_ROWS[(vendor, family)]:
        spec = get_device(f"{vendor}-{name}")
        assert (spec.vendor, spec.family) == (vendor, family), spec.id
        assert spec.backend == {"nvidia": "cuda", "amd": "rocm"}[vendor]
        assert spec.core_unit == {"nvidia": "sms", "amd": "cus"}[vendor]


def test_every_gpu_row_is_in_a_known_family_with_its_architecture():
    for spec in _gpus():
        assert (spec.vendor, spec.family) in FAMILY_ROWS, spec.id
        assert spec.architecture in FAMILY_ARCHITECTURES[spec.family], spec.id
        assert re.fullmatch(r"sm_\d{2,3}" if spec.vendor == "nvidia" else r"gfx[0-9a-f]{3,4}", spec.architecture)


def test_gpu_figures_are_plausible():
    for spec in _gpus():
        for fname, (low, high) in PLAUSIBLE.items():
            assert low <= getattr(spec, fname) <= high, f"{spec.id}: {fname} = {getattr(spec, fname)}"
        low, high = CORE_RANGE[spec.core_unit]
        assert low <= spec.gpu_cores <= high, spec.id
        assert spec.l2_bytes % (64 * 1024) == 0, f"{spec.id}: L2 of {spec.l2_bytes} bytes is not whole 64 KiB"
        assert isinstance(spec.gpu_cores, int) and isinstance(spec.clock_mhz, int)


def test_fp32_is_cores_times_lanes_times_two_times_clock():
    for spec in _gpus():
        expected = spec.gpu_cores * FP32_LANES[spec.architecture] * 2 * spec.clock_mhz / 1e6
        assert spec.fp32_tflops == pytest.approx(expected, rel=0.03), f"{spec.id}: {spec.fp32_tflops} vs {expected:.2f}"


def test_gpu_limits_are_the_class_values():
    for spec in _gpus():
        assert spec.max_threads_per_threadgroup == 1024 and spec.default_threadgroup == 256
        if spec.vendor == "nvidia":
            assert (spec.simd_width, spec.threadgroup_memory_bytes) == (32, 49152), spec.id
        else:
            assert spec.simd_width == (32 if spec.family.startswith("rdna") else 64), spec.id
            assert spec.threadgroup_memory_bytes == (160 * 1024 if spec.architecture == "gfx950" else 65536), spec.id


def test_every_gpu_figure_cites_a_declared_source_with_title_and_url():
    sources = catalog_sources()
    for spec in _gpus():
        assert set(spec.sources) == SPEC_FIELDS, spec.id
        for source_id in spec.sources.values():
            assert sources[source_id]["title"], source_id
            if not source_id.startswith("convention-"):
                assert sources[source_id]["url"].startswith("https://"), source_id


@pytest.mark.parametrize("device, runs", [
    ("nvidia-t4", True), ("nvidia-rtx-2080-ti", True), ("nvidia-a100-sxm4-80gb", True), ("nvidia-h200", True),
    ("nvidia-rtx-5090", True), ("nvidia-b200", True), ("apple-m1-7c", True), ("apple-m4-max-40c", True),
    ("nvidia-v100-sxm2-32gb", False), ("nvidia-titan-v", False), ("nvidia-gtx-1080-ti", False),
    ("nvidia-p100-sxm2", False), ("nvidia-gtx-titan-x", False), ("nvidia-tesla-k80", False),
    ("amd-mi300x", False), ("amd-radeon-rx-7900-xtx", False)])
def test_mlx_runs_on_metal_and_on_cuda_from_turing_on(device, runs):
    """MLX's CUDA build carries kernels for sm_75 and newer (its install page: Nvidia architecture >= SM 7.5), so a
    Volta, Pascal, Maxwell or Kepler chip gets no lookup table, nor any AMD chip."""
    spec = get_device(device)
    assert mlx_runs_on(spec) is runs and mlx_runs_on(spec.as_row()) is runs


def test_the_chips_mlx_runs_on_cite_a_declared_source():
    rule = json.loads((Path(__file__).parents[2] / "zmlx_pipeline/data/catalog.json").read_text())["mlx"]
    assert rule["backends"] == {"metal": {}, "cuda": {"min_compute_capability": 75}}
    assert all(catalog_sources()[s]["url"].startswith("https://") for s in rule["sources"])
    assert mlx_chips_text() == "metal and cuda at sm_75 or newer"
    assert not mlx_runs_on({"backend": "cuda"}) and not mlx_runs_on({}) and mlx_runs_on({"backend": "metal"})


def test_no_name_or_alias_names_two_rows():
    owners: dict[str, set[str]] = {}
    for spec in load_catalog():
        for label in (spec.name, *spec.aliases):
            owners.setdefault(normalize_name(label), set()).add(spec.name)
    assert {key: names for key, names in owners.items() if len(names) > 1} == {}
    for spec in _gpus():
        for label in (spec.name, *spec.aliases):
            assert match_device(label).id == spec.id, label


def _chips_an_alias_names_without_it(spec, alias: str, monkeypatch) -> set[str]:
    """The names of the chips the catalog's own name rules find for `alias` once it is no alias of `spec`."""
    import dataclasses

    from zmlx_pipeline.data import catalog

    raw, rows = catalog._load()
    trimmed = tuple(dataclasses.replace(row, aliases=tuple(a for a in row.aliases if a != alias))
                    if row is spec else row for row in rows)
    with monkeypatch.context() as patched:
        patched.setattr(catalog, "_load", lambda: (raw, trimmed))
        catalog._indexes.cache_clear()
        try:
            return {row.name for row in catalog.device_candidates(alias)}
        finally:
            catalog._indexes.cache_clear()


def test_no_alias_stands_for_a_family_of_several_chips(monkeypatch):
    """An alias that the name rules, without it, find several chips for ("A100": four A100s; "NVIDIA H800": the SXM5
    and the PCIe board) would file every file of any of them under one; such a name is refused listing them."""
    ambiguous = [(spec.id, alias) for spec in load_catalog() for alias in spec.aliases
                 if len(_chips_an_alias_names_without_it(spec, alias, monkeypatch) - {spec.name}) > 0]
    assert ambiguous == []
    for name, some in (("A100", "nvidia-a100-sxm4-80gb"), ("NVIDIA H800", "nvidia-h800-pcie")):
        with pytest.raises(AmbiguousDevice) as info:
            resolve_device(name)
        assert some in info.value.candidates and len(info.value.candidates) > 1


def test_ids_are_unique_vendor_slugs():
    ids = [d.id for d in load_catalog()]
    assert len(ids) == len(set(ids))
    for spec in load_catalog():
        assert re.fullmatch(rf"{spec.vendor}-[a-z0-9]+(-[a-z0-9]+)*", spec.id), spec.id


@pytest.mark.parametrize(
    "name, device_id",
    [
        ("NVIDIA GeForce RTX 3090", "nvidia-rtx-3090"),
        ("GeForce GTX 1080 Ti", "nvidia-gtx-1080-ti"),
        ("Tesla K20Xm", "nvidia-tesla-k20x"),
        ("Tesla K20c", "nvidia-tesla-k20"),
        ("Tesla M40 24GB", "nvidia-tesla-m40"),
        ("GeForce GTX TITAN X", "nvidia-gtx-titan-x"),
        ("NVIDIA TITAN X (Pascal)", "nvidia-titan-x-pascal"),
        ("GeForce GTX TITAN Black", "nvidia-gtx-titan-black"),
        ("GeForce GTX 1060 6GB", "nvidia-gtx-1060-6gb"),
        ("Tesla V100-SXM3-32GB", "nvidia-v100-sxm3-32gb"),
        ("Quadro RTX 8000", "nvidia-quadro-rtx-8000"),
        ("NVIDIA GeForce RTX 2070 SUPER", "nvidia-rtx-2070-super"),
        ("NVIDIA RTX A2000 12GB", "nvidia-rtx-a2000"),
        ("NVIDIA GeForce RTX 4070 Ti", "nvidia-rtx-4070-ti"),
        ("NVIDIA GeForce RTX 4070 Ti SUPER", "nvidia-rtx-4070-ti-super"),
        ("NVIDIA RTX 4000 Ada Generation", "nvidia-rtx-4000-ada"),
        ("NVIDIA GH200 480GB", "nvidia-gh200-96gb"),
        ("NVIDIA B200", "nvidia-b200"),
        ("NVIDIA GB200", "nvidia-gb200"),
        ("NVIDIA B300 SXM6 AC", "nvidia-b300"),
        ("NVIDIA GB300", "nvidia-gb300"),
        ("NVIDIA H20", "nvidia-h20"),
        ("NVIDIA H800 80GB HBM3", "nvidia-h800-sxm"),
        ("NVIDIA H800 PCIe", "nvidia-h800-pcie"),
        ("NVIDIA A800-SXM4-80GB", "nvidia-a800-sxm4-80gb"),
        ("NVIDIA A800 80GB PCIe", "nvidia-a800-pcie-80gb"),
        ("NVIDIA L20", "nvidia-l20"),
        ("NVIDIA GeForce RTX 5090", "nvidia-rtx-5090"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "nvidia-rtx-pro-6000-blackwell"),
        ("AMD Instinct MI300A", "amd-mi300a"),
        ("AMD Instinct MI355X", "amd-mi355x"),
        ("AMD Instinct MI250X", "amd-mi250x"),
        ("AMD Radeon RX 7900 XT", "amd-radeon-rx-7900-xt"),
        ("Radeon RX 7900 XTX", "amd-radeon-rx-7900-xtx"),
        ("AMD Radeon RX 9070", "amd-radeon-rx-9070"),
        ("AMD Radeon RX 9070 XT", "amd-radeon-rx-9070-xt"),
        ("AMD Radeon(TM) PRO W7700", "amd-radeon-pro-w7700"),
        ("AMD Radeon RX 5700 XT", "amd-radeon-rx-5700-xt"),
        ("NVIDIA GeForce GT 1030", "nvidia-gt-1030"),
        ("NVIDIA GeForce GTX 950", "nvidia-gtx-950"),
        ("NVIDIA GeForce GTX 1050", "nvidia-gtx-1050"),
        ("NVIDIA GeForce GTX 1050 3GB", "nvidia-gtx-1050-3gb"),
        ("NVIDIA GeForce GTX 1060 3GB", "nvidia-gtx-1060-3gb"),
        ("NVIDIA GeForce GTX 1630", "nvidia-gtx-1630"),
        ("NVIDIA GeForce RTX 2060 12GB", "nvidia-rtx-2060-12gb"),
        ("Quadro P400", "nvidia-quadro-p400"),
        ("Quadro M6000 24GB", "nvidia-quadro-m6000"),
        ("NVIDIA T400 4GB", "nvidia-t400"),
        ("NVIDIA T1000 8GB", "nvidia-t1000"),
        ("NVIDIA RTX PRO 4000 Blackwell", "nvidia-rtx-pro-4000-blackwell"),
        ("NVIDIA RTX PRO 5000 Blackwell", "nvidia-rtx-pro-5000-blackwell"),
        ("AMD Radeon RX 6400", "amd-radeon-rx-6400"),
        ("AMD Radeon RX 6500 XT", "amd-radeon-rx-6500-xt"),
        ("AMD Radeon PRO V620", "amd-radeon-pro-v620"),
    ],
)
def test_driver_names_match_their_row(name, device_id):
    assert match_device(name).id == device_id


@pytest.mark.parametrize(
    "name", ["RTX 6000", "RTX 4000", "TITAN X", "GTX 1060", "NVIDIA GH200", "RX 7900", "RTX PRO 6000", "A800",
             "A100", "NVIDIA A100", "H800", "NVIDIA H800"]
)
def test_names_shared_by_several_cards_match_none(name):
    assert match_device(name) is None


def test_per_gpu_rows_of_multi_gpu_boards_and_newest_figures():
    assert get_device("nvidia-tesla-m60").memory_gb == 8 and get_device("nvidia-a16").memory_gb == 16
    b200 = get_device("nvidia-b200")
    assert (b200.gpu_cores, b200.architecture, b200.l2_bytes) == (148, "sm_100", 129536 * 1024)
    assert get_device("nvidia-rtx-5090").architecture == "sm_120"
    # Blackwell Ultra is compute capability 10.3; a GB200/GB300 row is one GPU of the superchip, not the package
    assert get_device("nvidia-b300").architecture == get_device("nvidia-gb300").architecture == "sm_103"
    assert get_device("nvidia-gb200").architecture == "sm_100" and get_device("nvidia-gb200").gpu_cores == 148
    assert get_device("nvidia-h20").gpu_cores == 78 and get_device("nvidia-h20").memory_gb == 96
    assert get_device("amd-mi355x").architecture == "gfx950" and get_device("amd-mi300a").l2_bytes == 24 * 2**20


def test_rtx_500_ada_laptop_is_an_ad107_of_16_sms_on_a_64_bit_bus():
    # KTT's tutorial outputs were timed on it (tests/data/fixtures/kernel_tuner_wild/SOURCE.md)
    spec = get_device("nvidia-rtx-500-ada-laptop")
    assert (spec.vendor, spec.family, spec.backend, spec.architecture, spec.core_unit) == (
        "nvidia", "ada", "cuda", "sm_89", "sms")
    assert (spec.gpu_cores, spec.clock_mhz, spec.memory_bandwidth_gbps, spec.memory_gb, spec.l2_bytes) == (
        16, 2025, 128.0, 4, 16 * 2**20)
    assert spec.fp32_tflops == pytest.approx(16 * 128 * 2 * 2025 / 1e6, rel=1e-3)  # 2048 CUDA cores at 2025 MHz
    assert spec.sources["gpu_cores"] == spec.sources["l2_bytes"] == "rtx-500-ada-device-report"
    assert spec.sources["clock_mhz"] == spec.sources["memory_gb"] == "technical-city-rtx-500-ada"


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
    [("A4000", "nvidia-rtx-a4000"), ("A6000", "nvidia-rtx-a6000"),
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


@pytest.mark.parametrize("device_id, unit", [("apple-m3-8c@4sm", "GPU cores"),
                                             ("apple-m3-max-40c@20sm", "GPU cores"),
                                             ("amd-mi100@10sm", "compute units")])
def test_a_core_limit_of_a_chip_whose_cores_are_no_sms_is_no_device(device_id, unit):
    from zmlx_pipeline.data.catalog import UnknownDevice, core_limited_device, resolve_device

    base, _, cores = device_id.partition("@")
    says = (f"{device_id!r} limits {base} to {cores[:-2]} SMs, but its cores are {unit}, not SMs; a core limit "
            "(@<N>sm, CUDA MPS) is only of an NVIDIA chip (give the chip's own id)")
    for resolve in (core_limited_device, resolve_device):
        with pytest.raises(UnknownDevice) as exc:
            resolve(device_id)
        assert type(exc.value) is UnknownDevice and str(exc.value) == says
    assert resolve_device("nvidia-h200@66sm").core_limited_from == "nvidia-h200"


def test_a_core_limit_may_follow_the_chips_name_as_people_write_it():
    """`NVIDIA H200@66sm` is the H200's 66-SM limit, as `summary --device` reads it; a name of several chips, or a
    limit the chip cannot have, is refused as for its id."""
    from zmlx_pipeline.data.catalog import AmbiguousDevice, UnknownDevice, resolve_device

    assert resolve_device("NVIDIA H200@66sm").id == "nvidia-h200@66sm"
    assert resolve_device("H100 SXM@32sm").id == "nvidia-h100-sxm@32sm"
    with pytest.raises(AmbiguousDevice, match="nvidia-a100-sxm4-80gb"):
        resolve_device("A100@40sm")
    with pytest.raises(UnknownDevice, match="limits nvidia-h200 to 132 SMs, but it has 132"):
        resolve_device("NVIDIA H200@132sm")
    with pytest.raises(UnknownDevice, match="no catalog device with id 'NVIDIA H2000'"):
        resolve_device("NVIDIA H2000@66sm")


@pytest.mark.parametrize("device_id", ["nvidia-h200@66sm@32sm", "NVIDIA H200@66sm@32sm"])
def test_a_core_limit_of_a_core_limited_id_is_no_device(device_id):
    """`nvidia-h200@66sm@32sm` would be stored as a device whose base is itself limited: a limit is of a chip."""
    from zmlx_pipeline.data.catalog import UnknownDevice, core_limited_device, resolve_device

    for resolve in (core_limited_device, resolve_device):
        with pytest.raises(UnknownDevice) as exc:
            resolve(device_id)
        assert str(exc.value) == (f"{device_id!r} limits nvidia-h200@66sm, which is already core-limited; a core "
                                  "limit is of a chip (give nvidia-h200@32sm)")
