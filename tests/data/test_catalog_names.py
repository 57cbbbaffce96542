"""Device names as people write them: spacing, case, suffixes, brand, form-factor and gfx names; never a wrong chip."""

from __future__ import annotations

import dataclasses

import pytest

from zmlx_pipeline.data import catalog
from zmlx_pipeline.data.catalog import (
    AmbiguousDevice,
    UnknownDevice,
    device_candidates,
    get_device,
    match_device,
    name_tokens,
    resolve_device,
)


@pytest.mark.parametrize(
    "name, device_id",
    [
        ("GTX 1080Ti", "nvidia-gtx-1080-ti"),
        ("gtx1080ti", "nvidia-gtx-1080-ti"),
        ("NVIDIA GeForce GTX 1080 Ti", "nvidia-gtx-1080-ti"),
        ("RTX2080Ti", "nvidia-rtx-2080-ti"),
        ("RTX_2080_Ti", "nvidia-rtx-2080-ti"),
        ("NVIDIA GeForce RTX 3090", "nvidia-rtx-3090"),
        ("geforce rtx 3090", "nvidia-rtx-3090"),
        ("Tesla V100-SXM2-32GB", "nvidia-v100-sxm2-32gb"),
        ("V100 SXM2 32GB", "nvidia-v100-sxm2-32gb"),
        ("A100-SXM4-80GB", "nvidia-a100-sxm4-80gb"),
        ("A100 SXM 80GB", "nvidia-a100-sxm4-80gb"),
        ("NVIDIA A100-PCIE-80GB", "nvidia-a100-pcie-80gb"),
        ("AMD Instinct MI250X", "amd-mi250x"),
        ("Radeon Instinct MI250X", "amd-mi250x"),
        ("Tesla K40m", "nvidia-tesla-k40"),
        ("K40c", "nvidia-tesla-k40"),
        ("AMD Radeon(TM) Pro W6600", "amd-radeon-pro-w6600"),
        ("H100 PCIe", "nvidia-h100-pcie"),
        ("Quadro RTX A6000", "nvidia-rtx-a6000"),
    ],
)
def test_names_as_people_write_them_resolve_to_one_row(name, device_id):
    assert resolve_device(name).id == device_id
    assert match_device(name).id == device_id


def test_joined_suffixes_and_brand_words_are_split_and_dropped_by_the_rules_file():
    assert name_tokens("NVIDIA GeForce RTX2070SUPER") == ["rtx", "2070", "super"]
    assert name_tokens("AMD Radeon RX 6900XT") == ["rx", "6900", "xt"]
    assert name_tokens("Tesla K20m") == ["k20"]
    assert name_tokens("Tesla K20Xm") == ["k20x"]  # K20X is another chip: its x stays


@pytest.mark.parametrize(
    "name, candidates",
    [
        ("A100 80GB", {"nvidia-a100-pcie-80gb", "nvidia-a100-sxm4-80gb"}),
        ("A100 SXM4", {"nvidia-a100-sxm4-40gb", "nvidia-a100-sxm4-80gb"}),
        ("Tesla V100", {"nvidia-v100-pcie-16gb", "nvidia-v100-pcie-32gb", "nvidia-v100-sxm2-16gb",
                        "nvidia-v100-sxm2-32gb"}),
        ("V100 32GB", {"nvidia-v100-pcie-32gb", "nvidia-v100-sxm2-32gb"}),
        ("NVIDIA H100", {"nvidia-h100-pcie", "nvidia-h100-sxm", "nvidia-h100-nvl"}),
        ("H100 80GB", {"nvidia-h100-pcie", "nvidia-h100-sxm"}),
        ("gfx90a", {"amd-mi210", "amd-mi250", "amd-mi250x"}),
        ("gfx90a:sramecc+:xnack-", {"amd-mi210", "amd-mi250", "amd-mi250x"}),
    ],
)
def test_ambiguous_names_are_refused_listing_every_candidate(name, candidates):
    assert {spec.id for spec in device_candidates(name)} == candidates
    assert match_device(name) is None
    with pytest.raises(AmbiguousDevice) as info:
        resolve_device(name)
    assert set(info.value.candidates) == candidates
    assert all(c in str(info.value) for c in candidates)


def test_a_catalog_alias_is_the_documented_rule_for_a_bare_family_name():
    # catalog.json lists "A100" as an alias of the PCIe 40GB card, so the bare name is not ambiguous
    assert resolve_device("A100").id == "nvidia-a100-pcie-40gb"


@pytest.mark.parametrize(
    "name",
    ["Tesla P100-PCIE-12GB",  # a memory size no P100 row has: not the 16GB card
     "RTX 3060 Laptop GPU", "RTX_3060_laptop",  # the laptop chip is not the desktop one
     "RTX 2070 SUPER", "GTX Titan X", "K20", "Quantum GPU 9000", "gfx9999", ""],
)
def test_names_of_chips_not_in_the_catalog_match_nothing(name):
    assert device_candidates(name) == ()
    assert match_device(name) is None
    with pytest.raises(UnknownDevice) as info:
        resolve_device(name)
    assert not isinstance(info.value, AmbiguousDevice)


def test_a_gfx_name_resolves_when_one_catalog_chip_has_that_architecture():
    assert resolve_device("gfx1032").id == "amd-radeon-pro-w6600"
    assert resolve_device("AMD gfx942").id == "amd-mi300x"


def test_ids_resolve_to_themselves():
    assert resolve_device("nvidia-a100-sxm4-80gb") is get_device("nvidia-a100-sxm4-80gb")


@pytest.fixture
def kepler_catalog(monkeypatch):
    """The catalog plus two Kepler rows written as a test: K20 (13 SMs) and K20X (14 SMs)."""
    base = get_device("nvidia-tesla-k40")
    k20 = dataclasses.replace(base, id="test-k20", name="NVIDIA Tesla K20", variant="k20", gpu_cores=13,
                              aliases=("Tesla K20c", "Tesla K20m"))
    k20x = dataclasses.replace(base, id="test-k20x", name="NVIDIA Tesla K20X", variant="k20x", gpu_cores=14,
                               aliases=("Tesla K20Xm",))
    rows = catalog.load_catalog() + (k20, k20x)
    monkeypatch.setattr(catalog, "load_catalog", lambda: rows)
    catalog._indexes.cache_clear()
    catalog._by_id.cache_clear()
    yield
    catalog._indexes.cache_clear()
    catalog._by_id.cache_clear()


def test_board_suffixes_name_one_chip_but_k20x_is_another(kepler_catalog):
    assert catalog.validate_catalog(catalog.load_catalog()) == []
    for name in ("K20", "Tesla K20c", "tesla k20m", "NVIDIA Tesla K20"):
        assert resolve_device(name).id == "test-k20", name
    for name in ("K20X", "Tesla K20Xm", "NVIDIA Tesla K20X"):
        assert resolve_device(name).id == "test-k20x", name
