"""A device the caller names (argument or $ZMLX_PIPELINE_DEVICE) is a chip the runtime knows, or an error: never a
default answer for a typo, nor the largest of the chips a name may stand for. The GPU the process detects is never
refused: a chip the catalog does not know still gets the default config."""

import types

import pytest

import zmlx_pipeline.runtime as rt
from zmlx_pipeline.runtime.device import forget_current_device

S = {"rows": 4096, "cols": 4096}

H100 = "device 'nvidia-h100' does not name one chip; it may be nvidia-h100-pcie, nvidia-h100-sxm, nvidia-h100-nvl"
M3 = "device 'apple-m3' does not name one chip; it may be apple-m3-8c, apple-m3-10c"
M3_MAX = "device 'M3 Max' does not name one chip; it may be apple-m3-max-30c, apple-m3-max-40c"
M1_PRO = "device 'Apple M1 Pro' does not name one chip; it may be apple-m1-pro-14c, apple-m1-pro-16c"


def _bundle_id() -> str:
    return rt.active_bundle().bundle_id


def test_the_error_class_is_the_runtimes_lookup_error_for_devices():
    assert issubclass(rt.UnknownDeviceError, rt.RuntimeAPIError) and issubclass(rt.UnknownDeviceError, LookupError)
    assert issubclass(rt.UnknownDeviceError, rt.UnknownName)
    assert "UnknownDeviceError" in rt.__all__


@pytest.mark.parametrize("device, message", [("nvidia-h100", H100), ("apple-m3", M3), ("M3 Max", M3_MAX),
                                             ("Apple M1 Pro", M1_PRO)])
def test_a_name_of_several_chips_is_refused_listing_them(device, message):
    for ask in (lambda: rt.predicted_config("rmsnorm", S, "float16", device=device),
                lambda: rt.candidates("rmsnorm", S, "float16", device=device)):
        with pytest.raises(rt.UnknownDeviceError) as info:
            ask()
        assert str(info.value) == message


def test_an_unknown_device_is_refused_with_the_catalog_ids_like_it():
    with pytest.raises(rt.UnknownDeviceError) as info:
        rt.predicted_config("rmsnorm", S, "float16", device="nvidia-h100-sxm9")
    assert str(info.value) == (
        "unknown device 'nvidia-h100-sxm9': neither a catalog id, a core limit of one (nvidia-h200@66sm) nor a "
        f"device of bundle {_bundle_id()}; catalog ids like it: nvidia-h100-sxm, nvidia-h800-sxm, nvidia-p100-sxm2")
    with pytest.raises(rt.UnknownDeviceError) as info:
        rt.candidates("rmsnorm", S, "float16", device="garbage-gpu")
    assert str(info.value) == (
        "unknown device 'garbage-gpu': neither a catalog id, a core limit of one (nvidia-h200@66sm) nor a "
        f"device of bundle {_bundle_id()}; see zmlx-pipeline devices")
    with pytest.raises(rt.UnknownDeviceError, match=r"^unknown device 'H100 SXM5@66sm': "):
        rt.predicted_config("rmsnorm", S, "float16", device="H100 SXM5@66sm")  # a core limit is of an id, not a name


@pytest.mark.parametrize("device, answered", [
    ("nvidia-h100-sxm", "nvidia-h100-sxm"), ("nvidia-h200@66sm", "nvidia-h200@66sm"),
    ("nvidia-h100-sxm@20sm", "nvidia-h100-sxm@32sm"), ("NVIDIA H100 80GB HBM3", "nvidia-h100-sxm"),
    ("Apple M3 Max (40-core GPU)", "apple-m3-max-40c"), ("amd-mi300x", "amd-mi300x")])
def test_an_id_a_core_limit_of_one_or_a_name_of_one_chip_still_answers(device, answered):
    p = rt.predicted_config("rmsnorm", S, "float16", device=device)
    assert p.device == answered and p.config


@pytest.mark.parametrize("value, message", [
    ("nvidia-h100", H100.replace("device", "$ZMLX_PIPELINE_DEVICE", 1)),
    ("apple-m3", M3.replace("device", "$ZMLX_PIPELINE_DEVICE", 1))])
def test_the_device_the_environment_names_is_refused_alike(monkeypatch, value, message):
    monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", value)
    forget_current_device()
    with pytest.raises(rt.UnknownDeviceError) as info:
        rt.predicted_config("rmsnorm", S, "float16")
    assert str(info.value) == message
    with pytest.raises(rt.UnknownDeviceError) as info:
        rt.get_current_device_profile()
    assert str(info.value) == message


def _unknown_gpu(monkeypatch):
    """This process's GPU: one the catalog does not know (detected, not named)."""
    import zmlx_pipeline.data.detect as detect
    from zmlx_pipeline.runtime import tuner

    found = types.SimpleNamespace(device_id="nvidia-z9000", reported_name="NVIDIA Z9000", backend="cuda",
                                  known=False, spec=None)
    monkeypatch.setattr(detect, "detect_device", lambda *a, **k: found)
    monkeypatch.setattr(tuner, "_DEVICES", {})
    forget_current_device()


@pytest.mark.parametrize("blank", [None, "", "  "])
def test_a_detected_gpu_the_catalog_does_not_know_still_gets_the_default(monkeypatch, blank):
    if blank is None:
        monkeypatch.delenv("ZMLX_PIPELINE_DEVICE", raising=False)
    else:  # an empty or blank $ZMLX_PIPELINE_DEVICE is treated as unset
        monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", blank)
    _unknown_gpu(monkeypatch)
    p = rt.predicted_config("rmsnorm", S, "float16")
    assert (p.device, p.evidence, p.config) == (None, "default", {"ROWS": 1, "TG": 256, "VEC": 4})
    assert p.note.startswith("this GPU (NVIDIA Z9000) is not in the catalog")
    assert rt.get_current_device_profile().evidence == "default"
    result = rt.tune("rmsnorm", S, "float16", measure=lambda spec, cfg, shape, dtype: ("ok", float(cfg["TG"])),
                     use_cache=False, k=2)
    assert result.source == "timed" and len(result.timed) == 2


def test_autotune_and_tune_refuse_a_named_device_they_cannot_answer_for():
    with pytest.raises(rt.UnknownDeviceError) as info:
        rt.tune("rmsnorm", S, "float16", device="apple-m3", use_cache=False,
                measure=lambda spec, cfg, shape, dtype: ("ok", 1.0))
    assert str(info.value) == M3
    with pytest.raises(rt.UnknownDeviceError) as info:
        rt.autotune("rmsnorm", device="nvidia-h100")
    assert str(info.value) == H100


def test_the_profile_lookups_refuse_a_device_they_cannot_answer_for():
    from zmlx_pipeline.runtime.profiles import profile_table

    with pytest.raises(rt.UnknownDeviceError) as info:
        rt.get_device_profile("apple-m3")
    assert str(info.value) == M3.replace("device", "family", 1)
    with pytest.raises(rt.UnknownDeviceError, match=r"^unknown family 'garbage-gpu': "):
        rt.get_device_profile("garbage-gpu")
    with pytest.raises(rt.UnknownDeviceError) as info:
        profile_table(["M3 Max"])
    assert str(info.value) == M3_MAX
    with pytest.raises(rt.UnknownDeviceError) as info:
        profile_table(["garbage-gpu"])
    assert str(info.value) == "no device 'garbage-gpu' in the bundle or the catalog; see zmlx-pipeline devices"
    # ZMLX's (family, variant) form keeps its answers: the full chip of binned variants; an unknown pair is refused
    # (test_unknown_chip_names_and_kernel_types.py), where it once got a generic profile of 0 cores
    assert rt.get_device_profile("M3", "Max").device_id == "apple-m3-max-40c"
    assert rt.get_device_profile("M3").device_id == "apple-m3-10c"
    with pytest.raises(rt.UnknownDeviceError, match=r"^unknown chip family 'Z9'"):
        rt.get_device_profile("Z9", "Mega")
    assert len(rt.ALL_DEVICE_PROFILES) == 16


@pytest.mark.parametrize("name, chip", [("NVIDIA H200", "nvidia-h200"), ("RTX A4000", "nvidia-rtx-a4000"),
                                        ("H100 SXM", "nvidia-h100-sxm")])
def test_a_chip_named_as_people_write_it_is_that_chips_own_record_and_answer(name, chip):
    """Its profile is the chip's record (learned threadgroups, catalog default, classes), not a catalog stand-in
    noted "not in the bundle"; a lookup says how the name was read, not that the chip is missing."""
    from zmlx_pipeline.runtime.profiles import profile_table

    (by_name,), (by_id,) = profile_table(devices=[name]), profile_table(devices=[chip])
    assert {k: v for k, v in by_name.items() if k != "note"} == by_id
    assert by_name["note"] == f"{name!r} read as {chip}"
    p = rt.predicted_config("rmsnorm", S, "float16", device=name)
    assert p.device == chip and p.note.startswith(f"device {name!r} read as {chip}.")
    assert "not in the bundle" not in p.note
    assert p.config == rt.predicted_config("rmsnorm", S, "float16", device=chip).config
