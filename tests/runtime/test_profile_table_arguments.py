"""profile_table and the device profiles given device ids that are not text, or one id where a list belongs: the
runtime's BadArgumentType with a one-line message, never Python's AttributeError or TypeError, and the shipped
bundle unchanged."""

from __future__ import annotations

import pytest

from bundle_fixtures import tree_digest
from zmlx_pipeline.runtime import BadArgumentType, RuntimeAPIError
from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR
from zmlx_pipeline.runtime.profiles import profile_for_device, profile_table


@pytest.mark.parametrize("devices, says", [
    (5, "devices must be a list of device ids or None, not int (5)"),
    ("nvidia-h100-sxm", "devices must be a list of device ids or None, not str ('nvidia-h100-sxm')"),
    (b"nvidia-h100-sxm", "devices must be a list of device ids or None, not bytes (b'nvidia-h100-sxm')"),
    ([None], "device must be a string, not NoneType (None)"),
    ([5], "device must be a string, not int (5)"),
    ([b"nvidia-h100-sxm"], "device must be a string, not bytes (b'nvidia-h100-sxm')"),
])
def test_devices_that_are_not_a_list_of_ids_are_refused_in_one_line(devices, says):
    before = tree_digest(DEFAULT_BUNDLE_DIR)
    with pytest.raises(BadArgumentType) as exc:
        profile_table(devices)
    assert isinstance(exc.value, RuntimeAPIError) and str(exc.value) == says
    assert tree_digest(DEFAULT_BUNDLE_DIR) == before


def test_a_device_id_that_is_not_text_is_refused_by_profile_for_device():
    with pytest.raises(BadArgumentType) as exc:
        profile_for_device(5)
    assert str(exc.value) == "device must be a string, not int (5)"


def test_a_list_of_ids_still_answers():
    (row,) = profile_table(["nvidia-h100-sxm"])
    assert row["device_id"] == "nvidia-h100-sxm"
