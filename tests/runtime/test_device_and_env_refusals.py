"""Devices no chip is (an SM limit of an Apple chip, all of a chip's SMs, fullwidth text, blank), blank environment
variables, and an autotune cache from the environment that cannot be written: refused before any timing."""

from __future__ import annotations

import os
import stat

import pytest

from zmlx_pipeline.runtime import (BadArgument, BadLookup, UnknownDeviceError, get_device_profile, load_bundle,
                                   predicted_config, tune)
from zmlx_pipeline.runtime import bundle as bundle_mod
from zmlx_pipeline.runtime import cache
from zmlx_pipeline.runtime.lookup import lookup
from zmlx_pipeline.runtime.profiles import profile_table

SHAPE = {"rows": 4096, "cols": 4096}
APPLE_LIMIT = ("'apple-m3-max-40c@20sm': apple-m3-max-40c's cores are not SMs, and a core limit (@<N>sm, CUDA MPS) "
               "is only of an NVIDIA chip; give apple-m3-max-40c itself")
WHOLE_CHIP = ("'nvidia-h200@132sm' limits nvidia-h200 to all of its 132 SMs; a core limit is below the chip's count: "
              "give the chip's own id (nvidia-h200) for the whole chip")
FULLWIDTH = ("'\uff4e\uff56\uff49\uff44\uff49\uff41-h200' holds characters Unicode writes otherwise (as 'nvidia-h200'); "
             "write it in plain characters")


@pytest.fixture
def real(real_bundle):
    load_bundle(real_bundle[1], strict=True)


@pytest.mark.parametrize("device, error, says", [
    ("apple-m3-max-40c@20sm", UnknownDeviceError, APPLE_LIMIT),
    ("nvidia-h200@132sm", UnknownDeviceError, WHOLE_CHIP),
    ("\uff4e\uff56\uff49\uff44\uff49\uff41-h200", BadLookup, FULLWIDTH),
])
def test_a_device_no_chip_is_is_refused_by_every_entry_point(real, device, error, says):
    for call, what in ((lambda: predicted_config("rmsnorm", SHAPE, "float16", device=device), "device"),
                       (lambda: lookup("rmsnorm", SHAPE, "float16", device=device), "device"),
                       (lambda: get_device_profile(device), "family"),
                       (lambda: profile_table([device]), "device")):
        with pytest.raises(error) as exc:
            call()
        assert type(exc.value) is error and str(exc.value) == f"{what} {says}"


def test_an_amd_chip_takes_no_sm_limit_either(real):
    with pytest.raises(UnknownDeviceError) as exc:
        predicted_config("rmsnorm", SHAPE, "float16", device="amd-mi100@10sm")
    assert type(exc.value) is UnknownDeviceError and str(exc.value) == (
        "device 'amd-mi100@10sm': amd-mi100's cores are not SMs, and a core limit (@<N>sm, CUDA MPS) is only of an "
        "NVIDIA chip; give amd-mi100 itself")


def test_a_core_limit_below_the_chips_count_still_answers(real):
    assert predicted_config("rmsnorm", SHAPE, "float16", device="nvidia-h200@66sm").device.startswith("nvidia-h200")


def test_a_tune_refuses_the_environments_apple_sm_limit_before_timing(real, monkeypatch, tmp_path):
    monkeypatch.setenv("ZMLX_CACHE_DIR", str(tmp_path))
    timed = []
    with pytest.raises(UnknownDeviceError) as exc:
        tune("rmsnorm", SHAPE, "float16", device="apple-m3-max-40c@20sm",
             measure=lambda *a: timed.append(a) or ("ok", 10.0))
    assert str(exc.value) == f"device {APPLE_LIMIT}" and timed == []


@pytest.mark.parametrize("family", ["", "   "])
def test_an_empty_or_blank_device_is_a_bad_lookup_everywhere(real, family):
    with pytest.raises(BadLookup) as exc:
        get_device_profile(family)
    assert type(exc.value) is BadLookup and str(exc.value) == (
        f"family must be a chip family such as 'M3' or a device id such as 'nvidia-h200'; got {family!r}")
    with pytest.raises(BadLookup) as exc:
        profile_table([family])
    assert type(exc.value) is BadLookup and str(exc.value) == (
        f"device must be a device id such as 'nvidia-h100-sxm'; got {family!r}")
    with pytest.raises(BadLookup):
        predicted_config("rmsnorm", SHAPE, "float16", device=family)


def test_a_cache_dir_from_the_environment_that_cannot_be_written_is_refused_before_timing(real, monkeypatch,
                                                                                         tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("ZMLX_CACHE_DIR", str(afile))
    timed = []
    with pytest.raises(BadArgument) as exc:
        tune("rmsnorm", {"rows": 3000, "cols": 2048}, "float16", device="nvidia-h200",
             measure=lambda *a: timed.append(a) or ("ok", 10.0))
    assert type(exc.value) is BadArgument and timed == []
    assert str(exc.value) == (
        f"autotune cache {str(afile / 'autotune_v3.json')!r:.80} cannot be written: {str(afile)!r:.80} is a file, "
        "not a directory; give the path of a file such as autotune_v3.json in a directory you can write")


@pytest.mark.parametrize("blank", ["", " ", "\t "])
def test_blank_cache_variables_are_unset(monkeypatch, tmp_path, blank):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ZMLX_PIPELINE_CACHE", blank)
    monkeypatch.setenv("XDG_CACHE_HOME", blank)
    monkeypatch.setenv("ZMLX_CACHE_DIR", blank)
    assert bundle_mod.cache_root() == tmp_path / "home" / ".cache" / "zmlx-pipeline" / "bundles"
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "zmlx"
    assert [p.name for p in tmp_path.iterdir() if not p.name.strip()] == []


def test_a_blank_bundle_variable_is_unset(monkeypatch, recwarn):
    monkeypatch.setenv("ZMLX_PIPELINE_BUNDLE", " ")
    from zmlx_pipeline.runtime.lookup import load_strictly

    load_strictly(None)
    assert bundle_mod.active_bundle() is not None
    assert [w for w in recwarn if "ZMLX_PIPELINE_BUNDLE" in str(w.message)] == []


def test_the_lock_file_is_made_as_the_umask_leaves_it_like_the_cache_file(tmp_path):
    old = os.umask(0o002)
    try:
        cache.save_entries("d_1", {"k": {"config": {"TG": 64}}}, None, tmp_path / "autotune_v3.json")
        cache.writable_path(tmp_path / "other" / "autotune_v3.json")
    finally:
        os.umask(old)
    for lock in (tmp_path / "autotune_v3.json.lock", tmp_path / "other" / "autotune_v3.json.lock"):
        assert stat.S_IMODE(lock.stat().st_mode) == 0o664
    assert stat.S_IMODE((tmp_path / "autotune_v3.json").stat().st_mode) == 0o664


@pytest.mark.parametrize("device", ["nvidia-h200@133sm", "nvidia-h200@999999sm"])
def test_a_core_limit_above_the_chips_count_names_the_largest_that_is_one(device):
    """The largest core limit is one SM below the chip's count (all of them is the chip's own id, refused as such);
    a limit above it is well formed but of no device, a LookupError as one of all the chip's SMs is."""
    with pytest.raises(UnknownDeviceError) as exc:
        predicted_config("rmsnorm", SHAPE, "float16", device=device)
    assert str(exc.value) == (f"device {device!r}: nvidia-h200 has 132 cores, so a core limit is at most @131sm "
                              "(all 132 is the chip itself: nvidia-h200)")
    assert predicted_config("rmsnorm", SHAPE, "float16", device="nvidia-h200@131sm").config is not None


HUGE = "nvidia-h200@" + "9" * 5000 + "sm"  # past the 4,300 digits int() reads: a bare ValueError before


def test_a_core_limit_of_thousands_of_digits_is_the_runtimes_error():
    from zmlx_pipeline.runtime import RuntimeAPIError

    for ask in (lambda: predicted_config("rmsnorm", SHAPE, "float16", device=HUGE), lambda: get_device_profile(HUGE)):
        with pytest.raises(RuntimeAPIError, match="a core limit of 5000 digits is more cores than any chip has"):
            ask()


def test_the_catalog_refuses_a_core_limit_of_thousands_of_digits_in_one_line():
    from zmlx_pipeline.data.catalog import UnknownDevice, core_limited_device

    with pytest.raises(UnknownDevice) as exc:
        core_limited_device(HUGE)
    assert "limits nvidia-h200 to a number of 5000 digits, more SMs than any chip has; it has 132" in str(exc.value)
    assert len(str(exc.value)) < 300


@pytest.mark.parametrize("device, slip", [("nvidia-h200@32sm ", "; it has white space at its start or end"),
                                          (" nvidia-h200@32sm", "; it has white space at its start or end"),
                                          ("nvidia-h200@66SM", "; the unit is lower case: @66sm"),
                                          ("nvidia-h200@066sm", "; the count is written without leading zeros: @66sm"),
                                          ("nvidia-h200@0sm", ""), ("nvidia-h200@x", "")])
def test_a_malformed_core_limit_names_the_slip_where_one_explains_it(device, slip):
    with pytest.raises(BadLookup) as exc:
        predicted_config("rmsnorm", SHAPE, "float16", device=device)
    assert str(exc.value) == (f"device {device!r}: a core limit is written <device>@<cores>sm with cores >= 1 "
                              f"(e.g. nvidia-h200@66sm){slip}")
