"""profiles.json is checked at load as kernels.json is (runtime/contents.py, bundle_fields.json): each field publish
writes into a profile is of its kind (in_catalog, backend, core_limited_from, core_unit, l2_bytes), and a device
registered in the store (`devices add`) has names detection can find it by: none another registered device has, none a
catalog chip has. A bundle failing one is refused as any malformed bundle is (strict: one BundleError line naming the
file, the device and the field; else one warning, the bundle in use kept); the same bundle with a usable value loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rehashed_bundles import rehashed
from zmlx_pipeline.runtime import BundleError, BundleWarning, active_bundle, load_bundle

sys.path.insert(0, str(Path(__file__).parents[1] / "pipeline"))

from device_records import record  # noqa: E402

#: a second registered device beside device_records' acme-x1 ("Acme X1 Accelerator", alias "Acme X1", 20 SMs)
ACME_X2 = {"id": "acme-x2", "name": "Acme X2 Accelerator", "aliases": ["Acme X2"], "variant": "acme-x2",
           "gpu_cores": 30}


@pytest.fixture(scope="module")
def registered_bundle(tmp_path_factory) -> Path:
    """The publish dir of a toy bundle whose store registered two devices the catalog lacks (acme-x1, acme-x2)."""
    from bundle_fixtures import fill_toy
    from zmlx_pipeline.data.registered import register_device
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.publish import publish

    root = tmp_path_factory.mktemp("registered")
    with Store(root / "s.duckdb") as store:
        fill_toy(store, devices=("nvidia-h200",))
        register_device(store, record(root / "acme-x1.json"))
        register_device(store, record(root / "acme-x2.json", **ACME_X2))
        publish(store, root / "bundles", devices=["acme-x1"], record=False, jobs=1)
    return root / "bundles"


def _set(device: str, **fields):
    def edit(data: dict) -> None:
        data["devices"][device].update(fields)
    return edit


def _limited(core_limited_from: str):
    """An H200 limited to 66 SMs, as a measured core limit's profile is written, naming the chip it is limited from."""
    def edit(data: dict) -> None:
        whole = data["devices"]["nvidia-h200"]
        data["devices"]["nvidia-h200@66sm"] = {**whole, "device_id": "nvidia-h200@66sm", "gpu_cores": 66,
                                               "name": "NVIDIA H200 [66 SMs]", "core_limited_from": core_limited_from}
    return edit


#: case -> (an edit the runtime refuses, the same edit with a usable value, what the refusal names)
CASES = {
    # 0 is no boolean: `in_catalog is False` would not hold, and the device would be taken for a catalog chip
    "in_catalog not a boolean": (_set("acme-x1", in_catalog=0), _set("acme-x1", in_catalog=False),
                                 "devices[acme-x1].in_catalog must be true or false, not int 0"),
    "backend unknown": (_set("acme-x1", backend="vulkan"), _set("acme-x1", backend="rocm"),
                        "devices[acme-x1].backend must be one of metal, cuda, rocm"),
    "core_limited_from not a device id": (_limited("NVIDIA H200"), _limited("nvidia-h200"),
                                          "devices[nvidia-h200@66sm].core_limited_from must be a whole chip's "
                                          "device id"),
    "core_unit unknown": (_set("acme-x1", core_unit="warps"), _set("acme-x1", core_unit="cus"),
                          "devices[acme-x1].core_unit must be one of gpu_cores, sms, cus"),
    "l2_bytes not a size": (_set("acme-x1", l2_bytes="24 MB"), _set("acme-x1", l2_bytes=24 * 2**20),
                            "devices[acme-x1].l2_bytes must be a whole number >= 0"),
    # the same name, spelled otherwise: detection compares names in lower case; binned variants (other cores) may
    "registered name twice": (_set("acme-x2", name="ACME X1 Accelerator"),
                              _set("acme-x2", name="Acme X1 Accelerator", gpu_cores=30),
                              "devices[acme-x2].name 'ACME X1 Accelerator' is also a name or alias of registered "
                              "device acme-x1"),
    # a leading vendor word is no part of a name, as detection compares them
    "registered alias twice": (_set("acme-x2", aliases=["Acme X2", "NVIDIA Acme X1"]),
                               _set("acme-x2", aliases=["Acme X2", "NVIDIA Acme X2"]),
                               "devices[acme-x2].aliases[1] 'NVIDIA Acme X1' is also a name or alias of registered "
                               "device acme-x1"),
    "registered name a catalog chip's": (_set("acme-x1", name="NVIDIA H200"), _set("acme-x1", name="Acme H200"),
                                         "devices[acme-x1].name 'NVIDIA H200' is a name of catalog chip nvidia-h200"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_profile_field_the_runtime_cannot_use_is_refused_at_load_and_a_usable_one_loads(registered_bundle,
                                                                                          tmp_path, case):
    bad_edit, good_edit, says = CASES[case]
    in_use = load_bundle(registered_bundle, strict=True)
    bad = rehashed(registered_bundle, tmp_path / "bad", {"profiles.json": bad_edit})
    with pytest.raises(BundleError) as info:
        load_bundle(bad, strict=True)
    message = str(info.value)
    assert f"{bad}: malformed index files: profiles.json: {says}" in message, message
    assert "\n" not in message and len(message) < 400
    with pytest.warns(BundleWarning, match="bundle refused: .*malformed index files: profiles.json") as caught:
        kept = load_bundle(bad)
    assert len(caught) == 1 and kept is in_use is active_bundle()

    good = rehashed(registered_bundle, tmp_path / "good", {"profiles.json": good_edit})
    loaded = load_bundle(good, strict=True)
    assert loaded is active_bundle() and loaded.root == good


def test_a_device_measured_without_a_registration_may_bear_any_name(registered_bundle, tmp_path):
    """A GPU the catalog lacks, measured but never registered (its profile lists no aliases), keeps the name its
    backend reported, a catalog chip's or a registered device's: only registered devices' names are checked."""
    def edit(data: dict) -> None:
        h200 = data["devices"]["nvidia-h200"]
        for device_id, name in (("unknown-nvidia-h200", "NVIDIA H200"), ("unknown-acme-x1", "Acme X1 Accelerator")):
            data["devices"][device_id] = {**h200, "device_id": device_id, "name": name, "in_catalog": False}
    loaded = load_bundle(rehashed(registered_bundle, tmp_path / "b", {"profiles.json": edit}), strict=True)
    assert loaded.profiles["unknown-nvidia-h200"]["name"] == "NVIDIA H200"


def test_a_published_registered_device_lists_its_aliases_and_the_bundle_loads(registered_bundle):
    bundle = load_bundle(registered_bundle, strict=True)
    profiles = json.loads(bundle.data("profiles.json"))["devices"]
    assert profiles["acme-x1"]["aliases"] == ["Acme X1"] and profiles["acme-x2"]["aliases"] == ["Acme X2"]
    assert profiles["acme-x1"]["in_catalog"] is False and profiles["nvidia-h200"]["in_catalog"] is True
    assert "aliases" not in profiles["nvidia-h200"]


def test_the_known_backends_and_core_units_are_the_catalogs():
    from zmlx_pipeline.data.catalog import BACKENDS, CORE_UNITS
    from zmlx_pipeline.runtime.contents import specs

    assert specs()["choices"]["backend"] == list(BACKENDS)
    assert specs()["choices"]["core_unit"] == list(CORE_UNITS)


def test_a_chip_id_is_a_device_id_as_records_writes_one_without_its_core_limit():
    """contents.py keeps its own copy of the rule (its kind checks run without data/, as the light runtime may):
    the two stay one."""
    from zmlx_pipeline.data.records import DEVICE_ID_PATTERN, MAX_NAME_LENGTH
    from zmlx_pipeline.runtime.contents import CHIP_ID, MAX_ID_CHARS

    assert DEVICE_ID_PATTERN == CHIP_ID.pattern + r"(@[1-9][0-9]*sm)?" and MAX_ID_CHARS == MAX_NAME_LENGTH
