"""Model files: every variant round-trips; a changed, foreign or unsafe file is refused before it runs anything."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.models.variants import MODEL_VARIANTS, fit_kernel_model
from zmlx_pipeline.models.features import store_features
from zmlx_pipeline.models.persist import (
    TRUSTED_TYPES,
    ModelFileError,
    file_sha256,
    load_model_file,
    save_model,
)

DEVICES = ("nvidia-rtx-a4000", "nvidia-rtx-a6000", "apple-m3-max-40c")


@pytest.fixture
def features(store, make_measurement):
    """A small kernel measured on three devices: TG x VEC configs over four row counts."""
    for i, device_id in enumerate(DEVICES):
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
    store.record([
        make_measurement(device_id=d, kernel="k", dtype="float32", shape={"rows": rows, "cols": 1024},
                         config={"TG": tg, "VEC": vec}, median_us=rows * (1 + i) / vec + abs(tg - 128 * (i + 1)) / 8)
        for i, d in enumerate(DEVICES) for rows in (1, 16, 256, 4096) for tg in (64, 256, 1024) for vec in (1, 4)
    ])
    return store_features(store)["k"]


def _rewrite(path, member: str, data: bytes) -> None:
    """Replace one member of a zip archive (what someone tampering with a model file would do)."""
    with zipfile.ZipFile(path) as z:
        items = {n: z.read(n) for n in z.namelist()}
    items[member] = data
    with zipfile.ZipFile(path, "w") as z:
        for name, blob in items.items():
            z.writestr(name, blob)


@pytest.mark.parametrize("variant", sorted(MODEL_VARIANTS))
def test_every_variant_round_trips(features, tmp_path, variant):
    ranker = fit_kernel_model(features, variant)
    path = tmp_path / f"{variant}.zmodel"
    digest = save_model(ranker, path, meta={"kernel": "k"})
    assert digest == file_sha256(path)
    loaded = load_model_file(path, sha256=digest)
    assert type(loaded) is type(ranker)
    # forests sum trees in parallel, so the last bits may differ between two predictions
    np.testing.assert_allclose(loaded.score(features.frame), ranker.score(features.frame), rtol=1e-12, atol=1e-12)
    assert loaded.features.frame.is_empty()  # training rows stay in the store
    assert loaded.features.numeric == ranker.features.numeric


def test_the_file_is_json_and_data_only(features, tmp_path):
    path = tmp_path / "m.zmodel"
    ranker = fit_kernel_model(features, "ensemble")
    save_model(ranker, path)
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        manifest = json.loads(z.read("manifest.json"))
    assert manifest["format"] == "zmlx-pipeline-model"
    assert manifest["root"]["$ranker"]["class"] == type(ranker).__name__
    assert all(n == "manifest.json" or n.endswith((".parquet", ".npy", ".skops")) for n in names)
    assert not any(n.endswith((".pkl", ".pickle", ".joblib")) for n in names)


def test_a_changed_file_is_refused(features, tmp_path):
    path = tmp_path / "m.zmodel"
    digest = save_model(fit_kernel_model(features, "prior"), path)
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(ModelFileError, match="changed since it was registered"):
        load_model_file(path, sha256=digest)


def test_an_unknown_ranker_class_is_refused(features, tmp_path):
    path = tmp_path / "m.zmodel"
    save_model(fit_kernel_model(features, "prior"), path)
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
    manifest["root"]["$ranker"]["class"] = "Popen"
    _rewrite(path, "manifest.json", json.dumps(manifest).encode())
    with pytest.raises(ModelFileError) as err:
        load_model_file(path)
    assert "unknown ranker class 'Popen'" in str(err.value) and "\n" not in str(err.value)


def test_an_untrusted_type_inside_the_sklearn_blob_is_refused(features, tmp_path):
    """A skops blob naming a function (here builtins.print) is refused without being constructed."""
    import skops.io as sio
    from sklearn.preprocessing import FunctionTransformer

    path = tmp_path / "m.zmodel"
    save_model(fit_kernel_model(features, "gbr"), path)
    with zipfile.ZipFile(path) as z:
        blob = next(n for n in z.namelist() if n.endswith(".skops"))
    _rewrite(path, blob, sio.dumps(FunctionTransformer(func=print)))
    with pytest.raises(ModelFileError, match="untrusted types builtins.print"):
        load_model_file(path)
    assert "builtins.print" not in TRUSTED_TYPES


def test_foreign_files_are_refused(tmp_path):
    not_zip = tmp_path / "a.zmodel"
    not_zip.write_bytes(b"\x80\x04K\x01.")  # a pickle
    with pytest.raises(ModelFileError, match="not a zip archive"):
        load_model_file(not_zip)
    other = tmp_path / "b.zmodel"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("manifest.json", json.dumps({"format": "something-else"}))
    other.write_bytes(buf.getvalue())
    with pytest.raises(ModelFileError, match="not a zmlx-pipeline model file"):
        load_model_file(other)
    with pytest.raises(ModelFileError, match="does not exist"):
        load_model_file(tmp_path / "missing.zmodel")


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "directory"])
def test_a_model_path_that_is_no_regular_file_is_named_for_what_it_is_never_read(tmp_path, kind):
    """A FIFO (whose read would block forever), a link to /dev/zero (never ends) or a directory is said for what it
    is, in one line, without opening it; never "does not exist"."""
    import os

    path = tmp_path / "m.zmodel"
    if kind == "fifo":
        os.mkfifo(path)
        says = "a FIFO (named pipe)"
    elif kind == "directory":
        path.mkdir()
        says = "a directory"
    else:
        path.symlink_to("/dev/zero")
        says = "a symlink to /dev/zero, a character device"
    for sha256 in (None, "sha256:" + "0" * 64):  # also where the registry's hash would be checked first
        with pytest.raises(ModelFileError) as refused:
            load_model_file(path, sha256=sha256)
        assert str(refused.value) == (f"model file {path} is {says}, not a model file: remove it and retrain with "
                                      "`zmlx-pipeline train`")


def test_values_without_a_safe_form_are_not_saved(features, tmp_path):
    ranker = fit_kernel_model(features, "prior")
    ranker.hook = lambda x: x  # a callable would have to be pickled
    with pytest.raises(ModelFileError, match="model.hook: values of type builtins.function"):
        save_model(ranker, tmp_path / "m.zmodel")
    assert not (tmp_path / "m.zmodel").exists()


@pytest.mark.parametrize("kind", ["loop", "dangling"])
def test_a_model_path_that_is_a_broken_symlink_says_so(tmp_path, kind):
    """A symlink loop is named a loop, and a link to nothing names where it leads; never a bare "does not exist"."""
    import os

    path = tmp_path / "m.zmodel"
    if kind == "loop":
        os.symlink(path.name, path)  # the link leads to itself
        says = (f"model file {path} is a symlink loop, not a model file: remove it and retrain with "
                "`zmlx-pipeline train`")
    else:
        path.symlink_to(tmp_path / "gone.zmodel")
        says = (f"model file {path} is a symlink to {tmp_path / 'gone.zmodel'}, which does not exist: fix or remove "
                "the link, or retrain with `zmlx-pipeline train`")
    for sha256 in (None, "sha256:" + "0" * 64):
        with pytest.raises(ModelFileError) as refused:
            load_model_file(path, sha256=sha256)
        assert str(refused.value) == says
    assert path.is_symlink() and not (tmp_path / "gone.zmodel").exists()
