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
    load_catalog,
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
        ("A100 SXM4 80GB", "nvidia-a100-sxm4-80gb"),
        ("NVIDIA A100-PCIE-80GB", "nvidia-a100-pcie-80gb"),
        ("AMD Instinct MI250X", "amd-mi250x"),
        ("Radeon Instinct MI250X", "amd-mi250x"),
        ("Tesla K40m", "nvidia-tesla-k40"),
        ("K40c", "nvidia-tesla-k40"),
        ("AMD Radeon(TM) Pro W6600", "amd-radeon-pro-w6600"),
        ("H100 PCIe", "nvidia-h100-pcie"),
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
    assert name_tokens("Quadro RTX 6000") == ["quadro", "rtx", "6000"]  # not the RTX 6000 Ada


def ids_where(test) -> set[str]:
    return {spec.id for spec in load_catalog() if test(spec)}


@pytest.mark.parametrize(
    "name, expected",
    [
        ("A100 80GB", lambda s: s.id.startswith("nvidia-a100-") and s.memory_gb == 80),
        ("A100 SXM4", lambda s: s.id.startswith("nvidia-a100-sxm4")),
        ("Tesla V100", lambda s: s.id.startswith("nvidia-v100-")),
        ("V100 32GB", lambda s: s.id.startswith("nvidia-v100-") and s.memory_gb == 32),
        ("NVIDIA H100", lambda s: s.id.startswith("nvidia-h100-")),
        ("gfx90a", lambda s: s.architecture == "gfx90a"),
        ("gfx90a:sramecc+:xnack-", lambda s: s.architecture == "gfx90a"),
        # a gfx name stands for every board built on that die, even when the catalog has one of them
        ("gfx1032", lambda s: s.architecture == "gfx1032"),
    ],
)
def test_names_that_do_not_tell_one_chip_are_refused_listing_every_candidate(name, expected):
    candidates = ids_where(expected)
    assert candidates and {spec.id for spec in device_candidates(name)} == candidates
    assert match_device(name) is None
    with pytest.raises(AmbiguousDevice) as info:
        resolve_device(name)
    assert set(info.value.candidates) == candidates
    assert str(info.value).startswith(f"{name!r} does not name one catalog device (it may be ")


def test_a_bare_family_name_is_no_alias_of_one_of_its_chips():
    # "A100" names four catalog chips: no alias files it under one of them (the PCIe 40GB card, once)
    with pytest.raises(AmbiguousDevice) as info:
        resolve_device("A100")
    assert set(info.value.candidates) == {"nvidia-a100-pcie-40gb", "nvidia-a100-pcie-80gb", "nvidia-a100-sxm4-40gb",
                                          "nvidia-a100-sxm4-80gb"}


@pytest.mark.parametrize(
    "name",
    ["NVIDIA H100 SXM5 64GB",  # a memory size no H100 row has: not the 80GB card
     "RTX 3050 Laptop GPU", "RTX_3050_laptop",  # a laptop chip the catalog lacks is not the desktop one
     "Quantum GPU 9000", "gfx9999", "", "  "],
)
def test_names_of_chips_not_in_the_catalog_match_nothing(name):
    assert device_candidates(name) == ()
    assert match_device(name) is None
    with pytest.raises(UnknownDevice) as info:
        resolve_device(name)
    assert not isinstance(info.value, AmbiguousDevice)


def test_ids_resolve_to_themselves():
    assert resolve_device("nvidia-a100-sxm4-80gb") is get_device("nvidia-a100-sxm4-80gb")


@pytest.fixture
def test_rows(monkeypatch):
    """The catalog plus made-up rows written as a test: a Kepler-style K98 and K98X, a GTX 1066 sold with
    6GB (the name alone does not say which memory), and an NVIDIA "Tesla M3" beside the Apple M3."""
    base = get_device("nvidia-tesla-k40")

    def row(row_id, name, *aliases, **figures):
        return dataclasses.replace(base, id=row_id, name=name, variant=row_id, aliases=aliases, **figures)

    rows = load_catalog() + (
        row("nvidia-test-k98", "NVIDIA Tesla K98", "Tesla K98c", "Tesla K98m", gpu_cores=13),
        row("nvidia-test-k98x", "NVIDIA Tesla K98X", "Tesla K98Xm", gpu_cores=14),
        row("nvidia-test-gtx-1066-6gb", "NVIDIA GeForce GTX 1066 6GB", "GTX 1066 6GB", memory_gb=6),
        row("nvidia-test-m3", "NVIDIA Tesla M3", "Tesla M3"),
    )
    monkeypatch.setattr(catalog, "load_catalog", lambda: rows)
    catalog._indexes.cache_clear()
    catalog._by_id.cache_clear()
    yield
    catalog._indexes.cache_clear()
    catalog._by_id.cache_clear()


def test_board_suffixes_name_one_chip_but_an_x_is_another(test_rows):
    assert catalog.validate_catalog(catalog.load_catalog()) == []
    for name in ("K98", "Tesla K98c", "tesla k98m", "NVIDIA Tesla K98"):
        assert resolve_device(name).id == "nvidia-test-k98", name
    for name in ("K98X", "Tesla K98Xm", "NVIDIA Tesla K98X"):
        assert resolve_device(name).id == "nvidia-test-k98x", name


def test_a_name_without_the_memory_its_row_is_named_with_is_not_that_row(test_rows):
    assert resolve_device("GTX 1066 6GB").id == "nvidia-test-gtx-1066-6gb"
    assert resolve_device("GeForce GTX1066 6GB").id == "nvidia-test-gtx-1066-6gb"
    assert match_device("GTX 1066") is None
    with pytest.raises(AmbiguousDevice, match=r"'GTX 1066' does not name one catalog device \(it may be "
                                              r"nvidia-test-gtx-1066-6gb\)"):
        resolve_device("GTX 1066")
    assert device_candidates("GTX 1066 3GB") == ()


def test_brand_words_keep_a_name_to_its_vendor(test_rows):
    assert catalog.validate_catalog(catalog.load_catalog()) == []  # Tesla M3 and Apple M3 do not clash
    assert resolve_device("Tesla M3").id == "nvidia-test-m3"
    assert resolve_device("NVIDIA M3").id == "nvidia-test-m3"
    for name in ("Apple M3", "M3"):  # the Apple M3's binned variants (8 or 10 cores), never the Tesla M3
        with pytest.raises(AmbiguousDevice) as info:
            resolve_device(name)
        assert info.value.candidates == ("apple-m3-8c", "apple-m3-10c")


def test_an_unknown_name_hints_at_the_rows_whose_names_hold_it():
    h100s = ", ".join(spec.id for spec in load_catalog() if spec.id.startswith("nvidia-h100-"))
    with pytest.raises(UnknownDevice) as info:
        resolve_device("NVIDIA H100 SXM5 64GB")  # no 64GB row: never matched, only hinted at
    assert str(info.value) == ("'NVIDIA H100 SXM5 64GB' is neither a catalog id nor a catalog device name "
                               f"(catalog devices whose names hold it: {h100s})")
    with pytest.raises(UnknownDevice) as info:
        resolve_device("Quantum GPU 9000")
    assert str(info.value) == "'Quantum GPU 9000' is neither a catalog id nor a catalog device name"


@pytest.mark.parametrize(
    "device_id, names",
    [
        # laptop chips: nvidia-smi, the desktop-style name, Kernel Tuner file names, the databases' "Mobile"
        ("nvidia-rtx-3060-laptop", ["NVIDIA GeForce RTX 3060 Laptop GPU", "RTX_3060_laptop", "RTX 3060 Mobile",
                                    "GeForce RTX 3060 Laptop GPU", "rtx3060 laptop"]),
        ("nvidia-rtx-3070-laptop", ["NVIDIA GeForce RTX 3070 Laptop GPU", "RTX_3070_Laptop", "RTX 3070 Mobile"]),
        ("nvidia-rtx-3080-laptop", ["NVIDIA GeForce RTX 3080 Laptop GPU", "RTX_3080_laptop"]),
        ("nvidia-rtx-4060-laptop", ["NVIDIA GeForce RTX 4060 Laptop GPU", "RTX_4060_Laptop", "RTX 4060 Mobile"]),
        ("nvidia-rtx-4070-laptop", ["NVIDIA GeForce RTX 4070 Laptop GPU", "RTX_4070_laptop"]),
        ("nvidia-rtx-4080-laptop", ["NVIDIA GeForce RTX 4080 Laptop GPU", "RTX_4080_Laptop_GPU"]),
        ("nvidia-rtx-4090-laptop", ["NVIDIA GeForce RTX 4090 Laptop GPU", "RTX_4090_laptop", "RTX 4090 Mobile"]),
        ("nvidia-quadro-gv100", ["Quadro GV100", "NVIDIA Quadro GV100", "Quadro_GV100"]),
        ("nvidia-quadro-p5000", ["Quadro P5000", "NVIDIA Quadro P5000", "Quadro_P5000"]),
        ("nvidia-quadro-p6000", ["Quadro P6000", "Quadro_P6000"]),
        ("nvidia-quadro-k6000", ["Quadro K6000", "Quadro_K6000"]),
        ("nvidia-rtx-a5500", ["NVIDIA RTX A5500", "RTX_A5500", "A5500"]),
        ("nvidia-rtx-a1000", ["NVIDIA RTX A1000", "RTX_A1000"]),
        ("nvidia-rtx-a2000", ["NVIDIA RTX A2000", "NVIDIA RTX A2000 12GB", "RTX_A2000"]),
        ("nvidia-p100-pcie-12gb", ["Tesla P100-PCIE-12GB", "P100 PCIe 12GB", "Tesla_P100_PCIE_12GB"]),
        ("nvidia-tesla-k10", ["Tesla K10.G1.8GB", "Tesla K10.G2.8GB", "Tesla K10", "Tesla_K10"]),
        ("nvidia-jetson-agx-orin-64gb", ["NVIDIA Jetson AGX Orin 64GB", "Jetson_AGX_Orin_64GB"]),
        ("nvidia-jetson-agx-orin-32gb", ["NVIDIA Jetson AGX Orin 32GB"]),
        ("nvidia-gtx-1650-super", ["NVIDIA GeForce GTX 1650 SUPER", "GTX_1650_Super", "GTX 1650S"]),
        ("nvidia-rtx-2060-super", ["RTX 2060S", "RTX_2060S", "rtx2060s"]),  # SUPER written as an s
        ("amd-radeon-vii", ["AMD Radeon VII", "Radeon VII", "Radeon_VII"]),
        ("amd-radeon-pro-vii", ["AMD Radeon Pro VII", "Radeon PRO VII", "Radeon_Pro_VII"]),
        ("amd-radeon-rx-vega-64", ["Radeon RX Vega 64", "AMD Radeon RX Vega 64", "RX_Vega_64", "Vega 64"]),
        ("amd-radeon-rx-vega-56", ["Radeon RX Vega 56", "RX_Vega_56"]),
        ("amd-radeon-rx-580", ["Radeon RX 580 Series", "AMD Radeon RX 580", "RX580", "RX_580"]),
        ("amd-radeon-rx-590", ["Radeon RX 590 Series", "AMD Radeon RX 590", "RX590"]),
        ("nvidia-gtx-770", ["NVIDIA GeForce GTX 770", "GTX770"]),
        ("nvidia-gtx-960", ["NVIDIA GeForce GTX 960", "GTX_960"]),
        ("nvidia-gtx-1050-ti", ["NVIDIA GeForce GTX 1050 Ti", "GTX1050Ti"]),
        ("nvidia-quadro-p4000", ["Quadro P4000", "Quadro_P4000"]),
        ("nvidia-rtx-4000-sff-ada", ["NVIDIA RTX 4000 SFF Ada Generation", "RTX_4000_SFF_Ada"]),
        ("nvidia-rtx-5880-ada", ["NVIDIA RTX 5880 Ada Generation", "RTX_5880_Ada_Generation"]),
        # KTT's tutorial outputs report it as nvidia-smi does; the databases call it the RTX 500 Mobile Ada Generation
        ("nvidia-rtx-500-ada-laptop", ["NVIDIA RTX 500 Ada Generation Laptop GPU", "RTX 500 Ada Generation Laptop GPU",
                                       "RTX 500 Ada", "RTX_500_Ada_Laptop", "RTX 500 Mobile Ada Generation",
                                       "NVIDIA RTX 500 Ada Generation"]),
        ("nvidia-h200-nvl", ["NVIDIA H200 NVL", "H200_NVL"]),
        ("nvidia-rtx-pro-6000-blackwell-max-q", ["NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"]),
        ("nvidia-rtx-5050", ["NVIDIA GeForce RTX 5050", "RTX_5050"]),
        ("amd-radeon-ai-pro-r9700", ["AMD Radeon AI PRO R9700", "Radeon AI PRO R9700", "R9700"]),
        ("nvidia-a10g", ["NVIDIA A10G", "A10G"]),
        ("nvidia-gt-1030", ["NVIDIA GeForce GT 1030", "GeForce GT 1030", "GT1030", "GT_1030"]),
        ("nvidia-gtx-950", ["NVIDIA GeForce GTX 950", "GTX950", "GTX_950"]),
        ("nvidia-gtx-1050", ["NVIDIA GeForce GTX 1050", "GeForce GTX 1050", "GTX1050", "GTX 1050 2GB"]),
        ("nvidia-gtx-1050-3gb", ["NVIDIA GeForce GTX 1050 3GB", "GTX_1050_3GB", "GTX1050 3GB"]),
        ("nvidia-gtx-1060-3gb", ["NVIDIA GeForce GTX 1060 3GB", "GeForce GTX 1060 3GB", "GTX_1060_3GB"]),
        ("nvidia-gtx-1630", ["NVIDIA GeForce GTX 1630", "GTX1630"]),
        ("nvidia-gtx-1650-gddr6", ["NVIDIA GeForce GTX 1650 GDDR6", "GTX 1650 GDDR6", "GTX_1650_GDDR6"]),
        ("nvidia-rtx-2060-12gb", ["NVIDIA GeForce RTX 2060 12GB", "RTX 2060 12GB", "RTX2060 12GB"]),
        ("nvidia-quadro-p400", ["Quadro P400", "NVIDIA Quadro P400", "Quadro_P400"]),
        ("nvidia-quadro-p600", ["Quadro P600", "NVIDIA Quadro P600"]),
        ("nvidia-quadro-p620", ["Quadro P620", "NVIDIA Quadro P620"]),
        ("nvidia-quadro-p2000", ["Quadro P2000", "NVIDIA Quadro P2000", "Quadro_P2000"]),
        ("nvidia-quadro-p2200", ["Quadro P2200", "NVIDIA Quadro P2200"]),
        ("nvidia-quadro-m4000", ["Quadro M4000", "NVIDIA Quadro M4000"]),
        ("nvidia-quadro-m5000", ["Quadro M5000", "NVIDIA Quadro M5000"]),
        ("nvidia-quadro-m6000", ["Quadro M6000", "Quadro M6000 24GB", "NVIDIA Quadro M6000"]),
        ("nvidia-t400", ["NVIDIA T400", "NVIDIA T400 4GB", "T400"]),
        ("nvidia-t600", ["NVIDIA T600", "T600"]),
        ("nvidia-t1000", ["NVIDIA T1000", "NVIDIA T1000 8GB", "T1000"]),
        ("nvidia-rtx-pro-4000-blackwell", ["NVIDIA RTX PRO 4000 Blackwell", "RTX_PRO_4000_Blackwell"]),
        ("nvidia-rtx-pro-4500-blackwell", ["NVIDIA RTX PRO 4500 Blackwell", "RTX PRO 4500 Blackwell"]),
        ("nvidia-rtx-pro-5000-blackwell", ["NVIDIA RTX PRO 5000 Blackwell", "RTX PRO 5000 Blackwell"]),
        ("amd-radeon-rx-6400", ["AMD Radeon RX 6400", "Radeon RX 6400", "RX6400"]),
        ("amd-radeon-rx-6500-xt", ["AMD Radeon RX 6500 XT", "RX 6500XT", "RX_6500_XT"]),
        ("amd-radeon-pro-v620", ["AMD Radeon PRO V620", "Radeon Pro V620", "V620"]),
    ],
)
def test_each_added_row_resolves_from_its_common_spellings(device_id, names):
    for name in names:
        assert resolve_device(name).id == device_id, name
        assert match_device(name).id == device_id, name


@pytest.mark.parametrize(
    "name",
    # Fermi (before Kepler) is not catalogued: GTX 580 is not the RX 580, Quadro 6000 not a Quadro RTX 6000
    ["NVIDIA GeForce GTX 580", "GTX 580", "GTX_580", "GeForce GTX 590", "GTX 480", "Tesla C2050", "Tesla C2070",
     "Tesla M2090", "Quadro 6000"],
)
def test_fermi_names_are_unknown_never_a_later_chip(name):
    assert device_candidates(name) == () and match_device(name) is None
    with pytest.raises(UnknownDevice) as info:
        resolve_device(name)
    assert not isinstance(info.value, AmbiguousDevice)
    # at most a hint (Quadro 6000 -> the rows whose names hold its words), never a match
    assert str(info.value).startswith(f"{name!r} is neither a catalog id nor a catalog device name")


@pytest.mark.parametrize(
    "name, candidates",
    [("Jetson AGX Orin", {"nvidia-jetson-agx-orin-64gb", "nvidia-jetson-agx-orin-32gb"}),
     ("P100 PCIe", {"nvidia-p100-pcie-12gb", "nvidia-p100-pcie-16gb"}),
     ("gfx803", {"amd-radeon-rx-580", "amd-radeon-rx-590"}),
     ("gfx906", {"amd-mi50", "amd-mi60", "amd-radeon-vii", "amd-radeon-pro-vii"}),
     ("GTX 1060", {"nvidia-gtx-1060-6gb", "nvidia-gtx-1060-3gb"}),  # both cards carry their memory in the name
     ("gfx1034", {"amd-radeon-rx-6400", "amd-radeon-rx-6500-xt"})],
)
def test_names_shared_by_added_rows_list_them_all(name, candidates):
    with pytest.raises(AmbiguousDevice) as info:
        resolve_device(name)
    assert set(info.value.candidates) == candidates


@pytest.mark.parametrize(
    "name, device_id",
    # an edition or form factor the name leaves out is never read into it
    [("NVIDIA H200", "nvidia-h200"), ("NVIDIA A10", "nvidia-a10"),
     ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "nvidia-rtx-pro-6000-blackwell"),
     ("NVIDIA RTX 4000 Ada Generation", "nvidia-rtx-4000-ada"), ("NVIDIA GeForce RTX 3060", "nvidia-rtx-3060"),
     ("NVIDIA GeForce RTX 4090", "nvidia-rtx-4090")],
)
def test_existing_rows_keep_their_names_beside_new_editions(name, device_id):
    assert resolve_device(name).id == device_id


def test_a_name_every_orin_module_reports_is_only_a_hint():
    # CUDA names each Jetson Orin module "Orin": the module (and so its SM count) needs --device
    with pytest.raises(UnknownDevice) as info:
        resolve_device("Orin")
    assert not isinstance(info.value, AmbiguousDevice)
    assert str(info.value).endswith("(catalog devices whose names hold it: nvidia-jetson-agx-orin-64gb, "
                                    "nvidia-jetson-agx-orin-32gb)")


def test_laptop_rows_are_their_own_chips_beside_the_desktop_cards():
    for number in (3060, 3070, 3080, 4060, 4070, 4080, 4090):
        laptop, desktop = resolve_device(f"RTX {number} Laptop GPU"), resolve_device(f"RTX {number}")
        assert laptop.id == f"nvidia-rtx-{number}-laptop" and desktop.id == f"nvidia-rtx-{number}"
        assert laptop.architecture == desktop.architecture
    # the laptop 3060 is a fuller GA106 than the desktop card, and a laptop 4090 is a desktop 4080's chip
    assert resolve_device("RTX 3060 Laptop GPU").gpu_cores == 30 > resolve_device("RTX 3060").gpu_cores
    assert resolve_device("RTX 4090 Laptop GPU").gpu_cores == resolve_device("RTX 4080").gpu_cores == 76


@pytest.mark.parametrize(
    "names",
    # look-alikes: each name gives its own row, none the row of a neighbour
    [{"NVIDIA GeForce GTX 1050": "nvidia-gtx-1050", "NVIDIA GeForce GTX 1050 3GB": "nvidia-gtx-1050-3gb",
      "NVIDIA GeForce GTX 1050 Ti": "nvidia-gtx-1050-ti"},
     {"NVIDIA GeForce GTX 1060 3GB": "nvidia-gtx-1060-3gb", "NVIDIA GeForce GTX 1060 6GB": "nvidia-gtx-1060-6gb"},
     {"NVIDIA GeForce GTX 1650": "nvidia-gtx-1650", "NVIDIA GeForce GTX 1650 GDDR6": "nvidia-gtx-1650-gddr6",
      "NVIDIA GeForce GTX 1650 SUPER": "nvidia-gtx-1650-super"},
     {"NVIDIA GeForce RTX 2060": "nvidia-rtx-2060", "NVIDIA GeForce RTX 2060 12GB": "nvidia-rtx-2060-12gb",
      "NVIDIA GeForce RTX 2060 SUPER": "nvidia-rtx-2060-super", "RTX 2060 6GB": "nvidia-rtx-2060"},
     {"NVIDIA RTX PRO 6000 Blackwell Workstation Edition": "nvidia-rtx-pro-6000-blackwell",
      "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": "nvidia-rtx-pro-6000-blackwell-max-q"},
     {"NVIDIA RTX PRO 4000 Blackwell": "nvidia-rtx-pro-4000-blackwell", "NVIDIA RTX 4000 Ada Generation":
      "nvidia-rtx-4000-ada", "Quadro RTX 4000": "nvidia-quadro-rtx-4000",
      "NVIDIA RTX 4000 SFF Ada Generation": "nvidia-rtx-4000-sff-ada"},
     {"NVIDIA RTX A1000": "nvidia-rtx-a1000", "NVIDIA T1000": "nvidia-t1000"},
     {"NVIDIA RTX 500 Ada Generation Laptop GPU": "nvidia-rtx-500-ada-laptop", "RTX 500 Ada": "nvidia-rtx-500-ada-laptop",
      "NVIDIA RTX 5000 Ada Generation": "nvidia-rtx-5000-ada", "RTX 5000 Ada": "nvidia-rtx-5000-ada"},
     {"NVIDIA T400": "nvidia-t400", "NVIDIA T4": "nvidia-t4", "Tesla T4": "nvidia-t4"},
     {"Quadro P400": "nvidia-quadro-p400", "Quadro P4000": "nvidia-quadro-p4000"},
     {"Quadro P600": "nvidia-quadro-p600", "Quadro P620": "nvidia-quadro-p620", "Quadro P6000": "nvidia-quadro-p6000"},
     {"AMD Radeon RX 6400": "amd-radeon-rx-6400", "AMD Radeon RX 6500 XT": "amd-radeon-rx-6500-xt",
      "AMD Radeon RX 5500 XT": "amd-radeon-rx-5500-xt"}],
)
def test_look_alike_names_each_give_their_own_row(names):
    for name, device_id in names.items():
        assert resolve_device(name).id == device_id, name
        assert match_device(name).id == device_id, name


@pytest.mark.parametrize(
    "name",
    # boards the catalog lacks (figures not confirmed) beside look-alikes it has: never the look-alike
    ["NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000 Blackwell", "Quadro P1000",
     "NVIDIA RTX PRO 4000 Blackwell SFF Edition", "NVIDIA RTX PRO 4500 Blackwell Server Edition",
     "NVIDIA GeForce RTX 3050 6GB", "NVIDIA RTX A400", "GTX 1050 4GB", "AMD Radeon RX 6500",
     # the Ampere RTX A500 and the RTX 5000 Ada's laptop part are neither the RTX 500 Ada nor the desktop RTX 5000 Ada
     "NVIDIA RTX A500 Laptop GPU", "RTX A500", "NVIDIA RTX 5000 Ada Generation Laptop GPU", "RTX 5000 Ada Laptop"],
)
def test_missing_boards_beside_their_look_alikes_match_nothing(name):
    assert device_candidates(name) == () and match_device(name) is None
    with pytest.raises(UnknownDevice) as info:
        resolve_device(name)
    assert not isinstance(info.value, AmbiguousDevice)


def test_memory_variants_with_one_driver_name_keep_the_plain_name():
    # the GTX 1650 GDDR6 reports "GeForce GTX 1650" like the GDDR5 card: the plain name stays the GDDR5 row, and the
    # GDDR6 row (more bandwidth, lower clock, same 14 SMs) is reached only by its own name
    plain, gddr6 = resolve_device("NVIDIA GeForce GTX 1650"), resolve_device("GTX 1650 GDDR6")
    assert (plain.id, gddr6.id) == ("nvidia-gtx-1650", "nvidia-gtx-1650-gddr6")
    assert plain.gpu_cores == gddr6.gpu_cores == 14 and gddr6.memory_bandwidth_gbps > plain.memory_bandwidth_gbps
    # the GTX 1050 2GB and 3GB are different chips (5 and 6 SMs) and the driver names them apart ("GeForce GTX 1050",
    # "GeForce GTX 1050 3GB"): the plain name is the 2 GB card, and a memory size no GTX 1050 has is none of them
    assert resolve_device("NVIDIA GeForce GTX 1050").gpu_cores == 5
    assert resolve_device("NVIDIA GeForce GTX 1050 3GB").gpu_cores == 6
    assert device_candidates("GTX 1050 4GB") == ()
