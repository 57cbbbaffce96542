"""The ZMLX device-profile API, answered from the bundle's learned profile table."""

import pytest

from zmlx_pipeline.runtime import (
    get_current_device_profile,
    get_device_profile,
    get_threadgroup_candidates_for_shape,
    load_bundle,
)


def test_seed_style_lookup_by_family_and_variant():
    p = get_device_profile("M3", "Max")
    assert (p.family, p.variant, p.gpu_cores, p.device_id) == ("M3", "Max", 40, "apple-m3-max-40c")
    assert p.memory_bandwidth_gbps == 400 and p.full_name.startswith("Apple M3 Max")
    assert p.evidence in ("extrapolated", "predicted", "default") and p.is_high_end()
    base = get_device_profile("M2")
    assert (base.variant, base.device_id, base.gpu_cores) == ("", "apple-m2-10c", 10)
    assert get_device_profile("hopper", "h200-sxm").device_id == "nvidia-h200"


def test_a_measured_chip_has_measured_evidence_and_learned_threadgroups():
    p = get_device_profile("nvidia-h100-sxm")  # measured in the shipped bundle (data/)
    assert p.evidence == "measured"
    assert p.default_threadgroup == p.learned["general"]["threadgroup"]
    assert p.threadgroup_candidates and all(c <= 1024 for c in p.threadgroup_candidates)
    assert p.learned["classes"]["row_reduction"]["evidence"] == "measured"


def test_unknown_chips_are_refused_not_given_a_profile_of_zeros():
    """Once a generic profile of gpu_cores 0; now refused (test_unknown_chip_names_and_kernel_types.py)."""
    from zmlx_pipeline.runtime import UnknownDeviceError

    with pytest.raises(UnknownDeviceError, match="unknown chip family 'Z9'"):
        get_device_profile("Z9", "Mega")


def test_candidates_depend_on_the_size_and_kernel_type(toy_bundle):
    load_bundle(toy_bundle[1], strict=True)
    p = get_device_profile("nvidia-h200")
    by_dim = p.learned["classes"]["toy_scale"]["by_dim"]
    assert set(by_dim) == {"10", "12"}  # cols 1024 and 4096 were measured
    assert get_threadgroup_candidates_for_shape(p, 1024, "toy_scale") == tuple(by_dim["10"])
    assert get_threadgroup_candidates_for_shape(p, 5000, "toy_scale") == tuple(by_dim["12"])
    assert get_threadgroup_candidates_for_shape(p, 4096, "general")[0] in (64, 128, 256, 512)
    simd = get_threadgroup_candidates_for_shape(p, 4096, "simd")
    assert all(c % p.simd_width == 0 for c in simd)


def test_the_current_device_profile(monkeypatch):
    monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", "nvidia-h200")
    p = get_current_device_profile()
    assert p.device_id == "nvidia-h200" and p.gpu_cores == 132 and p.full_name


@pytest.mark.parametrize("device", ["apple-m1-7c", "amd-mi300x", "nvidia-t4"])
def test_every_catalog_chip_has_a_profile_with_evidence(device):
    p = get_device_profile(device)
    assert p.device_id == device and p.evidence in ("measured", "predicted", "extrapolated", "default")
    assert p.default_threadgroup in (32, 64, 128, 256, 512, 1024)


MALFORMED = ["nvidia-h200@0sm", "nvidia-h200@999sm", "nvidia-h200@abc", "nvidia-h200@-5sm", "nvidia-h200@",
             "nvidia\x01h200"]


@pytest.mark.parametrize("device", MALFORMED)
def test_a_device_id_lookups_refuse_is_refused_by_the_profile_lookups_too(monkeypatch, device):
    from zmlx_pipeline.runtime import BadArgument, UnknownDeviceError
    from zmlx_pipeline.runtime.device import forget_current_device
    from zmlx_pipeline.runtime.profiles import profile_table

    # a limit past the chip's count is well formed but of no device: a LookupError, as in lookups
    refused = UnknownDeviceError if device.endswith("@999sm") else BadArgument
    monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", device)
    forget_current_device()
    get_current_device_profile.cache_clear()
    with pytest.raises(refused, match="ZMLX_PIPELINE_DEVICE") as info:
        get_current_device_profile()
    assert "\n" not in str(info.value)
    with pytest.raises(refused):
        profile_table([device])
    with pytest.raises(refused):
        get_device_profile(device)
    assert profile_table(["nvidia-h200@32sm"])[0]["device_id"] == "nvidia-h200@32sm"  # a held core limit answers


@pytest.mark.parametrize("device", MALFORMED[:5])
def test_the_profiles_command_refuses_a_malformed_core_limit_in_one_line(device):
    from click.testing import CliRunner

    from zmlx_pipeline.pipeline.cli import cli

    result = CliRunner().invoke(cli, ["profiles", "--device", device])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and "core limit" in lines[0]
