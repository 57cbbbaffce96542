"""The ZMLX device-profile API refuses what names no chip or kernel type, in one line naming what is known, instead of
a profile of zeros (gpu_cores 0, bandwidth 0 would claim facts) or a silent "general" answer. ZMLX 0.10.0 answers
both with a default (M1's figures; the pooled candidates), which its docstrings do not document."""

import pytest

from zmlx_pipeline.runtime import (
    ALL_DEVICE_PROFILES,
    UnknownDeviceError,
    get_current_device_profile,
    get_device_profile,
    get_threadgroup_candidates_for_shape,
)
from zmlx_pipeline.runtime import errors as rt_errors, profiles
from zmlx_pipeline.runtime.device import forget_current_device


@pytest.mark.parametrize("family, variant, says", [
    ("M3", "Maxx", "unknown variant 'Maxx' of chip family 'M3': its variants are '' (the base chip), 'Max', 'Pro', "
                   "'Ultra'"),
    ("M9", "Max", "unknown chip family 'M9' (variant 'Max'): known families are M1, M2, M3, M4, M5,"),
    ("nvidia-h200", "x", "'nvidia-h200' is a device id, which takes no variant (got 'x'): call "
                         "get_device_profile('nvidia-h200')"),
    ("hopper", "h999", "unknown variant 'h999' of chip family 'hopper': its variants are"),
])
def test_a_family_and_variant_no_chip_has_is_refused_naming_what_is_known(family, variant, says):
    with pytest.raises(UnknownDeviceError) as info:
        get_device_profile(family, variant)
    message = str(info.value)
    assert message.startswith(says) and "\n" not in message
    assert isinstance(info.value, LookupError)


def test_known_pairs_still_answer_with_their_chip():
    assert get_device_profile("M3", "Max").device_id == "apple-m3-max-40c"
    assert get_device_profile("m3", "max").gpu_cores == 40
    assert get_device_profile("hopper", "h200-sxm").device_id == "nvidia-h200"


def test_no_profile_claims_zero_cores_or_bandwidth():
    """ZMLX's sixteen chips keep their places; the one no catalog has (the M4 Ultra) says it knows no figures."""
    every = ALL_DEVICE_PROFILES
    assert len(every) == 16
    assert all(p.gpu_cores != 0 and p.memory_bandwidth_gbps != 0 for p in every)
    ultra = next(p for p in every if p.chip_id == "M4_Ultra")
    assert (ultra.gpu_cores, ultra.memory_bandwidth_gbps, ultra.evidence, ultra.device_id) == (None, None, "default", None)
    assert ultra.default_threadgroup == 256 and ultra.threadgroup_candidates


def test_a_gpu_the_catalog_does_not_know_gets_a_default_profile_without_figures(monkeypatch):
    monkeypatch.setattr(profiles, "current_device", lambda: (None, "this GPU is not in the catalog", False))
    get_current_device_profile.cache_clear()
    p = get_current_device_profile()
    assert (p.evidence, p.gpu_cores, p.memory_bandwidth_gbps) == ("default", None, None)
    forget_current_device()


def test_an_unknown_kernel_type_is_refused_naming_the_known_ones():
    p = get_device_profile("nvidia-h200")
    with pytest.raises(rt_errors.UnknownKernelType) as info:
        get_threadgroup_candidates_for_shape(p, 4096, "nosuch")
    message = str(info.value)
    assert message.startswith("unknown kernel_type 'nosuch': known types are ") and "\n" not in message
    for name in ("general", "reduction", "simd", "row_reduction", "matmul"):
        assert name in message
    assert isinstance(info.value, LookupError) and isinstance(info.value, ValueError)
    # ZMLX's three types and the learned classes answer
    for kind in ("general", "reduction", "simd", "row_reduction", "matmul"):
        assert get_threadgroup_candidates_for_shape(p, 4096, kind)


def test_a_kernel_class_of_the_bundle_a_profile_never_learned_answers_with_its_candidates(toy_bundle):
    """ZMLX-style code building its own profile (nothing learned) may name a class of the loaded bundle's kernels."""
    from zmlx_pipeline.runtime import DeviceTuningProfile, load_bundle

    mine = DeviceTuningProfile(family="M9", variant="", gpu_cores=12, memory_bandwidth_gbps=200, default_threadgroup=256)
    with pytest.raises(rt_errors.UnknownKernelType):
        get_threadgroup_candidates_for_shape(mine, 4096, "toy_scale")  # the default bundle has no such class
    load_bundle(toy_bundle[1], strict=True)
    assert get_threadgroup_candidates_for_shape(mine, 4096, "toy_scale") == (128, 256)
