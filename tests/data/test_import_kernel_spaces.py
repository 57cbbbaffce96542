"""One kernel name, one config space: a file whose kernel is stored (or given by another file of the import) with
another parameter set or other shape dims is stored under `<kernel>_2`, `<kernel>_3`, ...; `--kernel` refuses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zmlx_pipeline.data.importers import ImportFileError, import_files

A4000 = "nvidia-rtx-a4000"


def write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def cache(params: tuple[str, ...], problem_size=(4096, 4096), kernel_name="conv", time: float = 1.0) -> dict:
    """A Kernel Tuner cache of two configs of `params` (the first parameter 16 or 32, the others 1)."""
    entries = {}
    for first in (16, 32):
        config = {p: (first if i == 0 else 1) for i, p in enumerate(params)}
        entries[",".join(str(config[p]) for p in params)] = {**config, "time": time * first / 16}
    doc = {"device_name": "NVIDIA RTX A4000", "kernel_name": kernel_name, "tune_params_keys": list(params),
           "tune_params": {p: sorted({c[p] for c in ({**e} for e in entries.values())}) for p in params},
           "objective": "time", "cache": entries}
    if problem_size is not None:
        doc["problem_size"] = list(problem_size)
    return doc


def spaces(store) -> dict[str, set[tuple[tuple[str, ...], tuple[str, ...]]]]:
    """kernel -> the (parameter names, shape dims) stored under it."""
    out: dict[str, set] = {}
    for row in store.measurements():
        out.setdefault(row["kernel"], set()).add((tuple(sorted(row["config"])), tuple(sorted(row["shape"]))))
    return out


def snapshot(store) -> tuple:
    return store.measurements(), store.runs(), store.devices()


TWO = ("block_size_x", "block_size_y")
THREE = ("block_size_x", "block_size_y", "tile_size_x")
OTHER = ("threads",)


def test_each_other_parameter_set_gets_a_name_of_its_own(store, tmp_path):
    first = write(tmp_path / "a" / "two.json", cache(TWO))
    (row,) = import_files(store, [first])
    assert row["kernel"] == "conv" and "renamed_from" not in row
    second = write(tmp_path / "b" / "three.json", cache(THREE))
    (row,) = import_files(store, [second])
    assert (row["kernel"], row["renamed_from"], row["added"]) == ("conv_2", "conv", 2)
    assert row["note"] == ("conv has other parameters stored (block_size_x, block_size_y); this file's (block_size_x, "
                           "block_size_y, tile_size_x) stored as conv_2; name it with --kernel NAME")
    third = write(tmp_path / "c" / "other.json", cache(OTHER))
    (row,) = import_files(store, [third])
    assert (row["kernel"], row["renamed_from"]) == ("conv_3", "conv")
    assert spaces(store) == {"conv": {(TWO, ("x", "y"))}, "conv_2": {(THREE, ("x", "y"))},
                             "conv_3": {(OTHER, ("x", "y"))}}
    (run,) = [r for r in store.runs() if r["settings"]["file"] == "other.json"]
    assert run["settings"]["kernel"] == "conv_3" and run["settings"]["kernel_renamed_from"] == "conv"
    # the same files again, in another order: each goes where it went, adding nothing
    before = snapshot(store)
    rows = import_files(store, [third, second, first])
    assert [(r["kernel"], r["added"]) for r in rows] == [("conv_3", 0), ("conv_2", 0), ("conv", 0)]
    assert snapshot(store) == before


def test_files_of_one_import_are_placed_in_order_and_two_of_the_second_set_share_its_name(store, tmp_path):
    files = [write(tmp_path / "a" / "1.json", cache(TWO)),
             write(tmp_path / "a" / "2.json", cache(THREE, problem_size=(1024, 1024))),
             write(tmp_path / "a" / "3.json", cache(THREE, problem_size=(2048, 2048))),
             write(tmp_path / "a" / "4.json", cache(TWO, problem_size=(512, 512)))]
    rows = import_files(store, files)
    assert [(r["kernel"], r.get("renamed_from")) for r in rows] == [
        ("conv", None), ("conv_2", "conv"), ("conv_2", "conv"), ("conv", None)]
    assert "given by 1.json" in rows[1]["note"]
    assert spaces(store) == {"conv": {(TWO, ("x", "y"))}, "conv_2": {(THREE, ("x", "y"))}}
    assert len(store.measurements(kernel="conv_2")) == 4


def test_other_shape_dims_get_a_name_of_their_own(store, tmp_path):
    import_files(store, [write(tmp_path / "a" / "2d.json", cache(TWO))])
    (row,) = import_files(store, [write(tmp_path / "b" / "3d.json", cache(TWO, problem_size=(64, 64, 64)))])
    assert (row["kernel"], row["renamed_from"]) == ("conv_2", "conv")
    assert row["note"].startswith("conv has other shape dims stored (x, y); this file's (x, y, z) stored as conv_2")
    assert spaces(store) == {"conv": {(TWO, ("x", "y"))}, "conv_2": {(TWO, ("x", "y", "z"))}}


def test_a_file_of_unknown_size_fits_any_dims(store, tmp_path):
    import_files(store, [write(tmp_path / "a" / "2d.json", cache(TWO))])
    (row,) = import_files(store, [write(tmp_path / "b" / "unknown.json", cache(TWO, problem_size=None, time=2.0))])
    assert row["kernel"] == "conv" and "renamed_from" not in row
    assert spaces(store) == {"conv": {(TWO, ("x", "y")), (TWO, ())}}


def test_a_stored_kernel_of_unknown_size_takes_a_file_of_any_dims(store, tmp_path):
    import_files(store, [write(tmp_path / "a" / "unknown.json", cache(TWO, problem_size=None))])
    (row,) = import_files(store, [write(tmp_path / "b" / "3d.json", cache(TWO, problem_size=(8, 8, 8)))])
    assert row["kernel"] == "conv"
    # now that conv has 3 dims, a 2-d file is of another space
    (row,) = import_files(store, [write(tmp_path / "c" / "2d.json", cache(TWO))])
    assert row["kernel"] == "conv_2"


def test_an_explicit_kernel_of_another_parameter_set_is_refused_and_stores_nothing(store, tmp_path):
    import_files(store, [write(tmp_path / "a" / "two.json", cache(TWO))])
    path = write(tmp_path / "b" / "three.json", cache(THREE, kernel_name="mine"))
    before = snapshot(store)
    with pytest.raises(ImportFileError) as info:
        import_files(store, [path], kernel="conv")
    assert str(info.value) == (
        f"cannot import {path}: --kernel conv has other parameters stored (block_size_x, block_size_y) than this "
        "file's (block_size_x, block_size_y, tile_size_x): one kernel holds one config space; pass another --kernel "
        "NAME, or leave --kernel out to store the file under a name of its own; nothing of it was stored")
    assert snapshot(store) == before
    # nor of two files of one import naming one kernel, or of other dims
    files = [write(tmp_path / "c" / "1.json", cache(("a",))), write(tmp_path / "c" / "2.json", cache(("b",)))]
    with pytest.raises(ImportFileError, match=r"--kernel new has other parameters given by 1\.json \(a\)"):
        import_files(store, files, kernel="new")
    with pytest.raises(ImportFileError, match=r"--kernel conv has other shape dims stored \(x, y\) than this file's "
                                              r"\(x, y, z\)"):
        import_files(store, [write(tmp_path / "d" / "3d.json", cache(TWO, problem_size=(4, 4, 4)))], kernel="conv")
    assert snapshot(store) == before
    # the stored set is welcome under its name
    (row,) = import_files(store, [write(tmp_path / "e" / "two.json", cache(TWO, (1024, 1024), kernel_name="x"))],
                          kernel="conv")
    assert row["kernel"] == "conv" and row["added"] == 2


def test_a_refused_file_stores_none_of_the_renamed_ones_beside_it(store, tmp_path):
    import_files(store, [write(tmp_path / "a" / "two.json", cache(TWO))])
    before = snapshot(store)
    bad = cache(TWO)
    bad["cache"]["16,1"]["time"] = float("nan")
    files = [write(tmp_path / "b" / "1.json", cache(THREE)), write(tmp_path / "b" / "2.json", bad)]
    with pytest.raises(ImportFileError):
        import_files(store, files)
    assert snapshot(store) == before


def test_a_name_that_cannot_take_a_suffix_is_refused_cleanly(store, tmp_path):
    long = "k" * 99
    import_files(store, [write(tmp_path / "a" / "two.json", cache(TWO, kernel_name=long))])
    before = snapshot(store)
    path = write(tmp_path / "b" / "three.json", cache(THREE, kernel_name=long))
    with pytest.raises(ImportFileError) as info:
        import_files(store, [path])
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"cannot import {path}: {long} has other parameters stored")
    assert "is longer than 100 characters, the most a name may hold; pass --kernel NAME" in message
    assert snapshot(store) == before
    # one character shorter, the derived name fits the limit exactly
    import_files(store, [write(tmp_path / "c" / "two.json", cache(TWO, kernel_name=long[:98]))])
    (row,) = import_files(store, [write(tmp_path / "d" / "three.json", cache(THREE, kernel_name=long[:98]))])
    assert row["kernel"] == long[:98] + "_2" and len(row["kernel"]) == 100


def test_a_derived_name_passes_over_a_name_another_kernel_holds(store, tmp_path):
    # conv_2 is a kernel of its own (another space): the file goes under conv_3
    import_files(store, [write(tmp_path / "a" / "two.json", cache(TWO)),
                         write(tmp_path / "a" / "own.json", cache(OTHER, kernel_name="conv_2"))])
    (row,) = import_files(store, [write(tmp_path / "b" / "three.json", cache(THREE))])
    assert row["kernel"] == "conv_3"


def test_a_derived_name_passes_over_the_names_later_files_of_the_import_give(store, tmp_path):
    # CONV_2 comes later in the same call: conv_2 would be its twin; deconv_2 would take a later file's own name
    files = [write(tmp_path / "a" / "1.json", cache(TWO)), write(tmp_path / "a" / "2.json", cache(THREE)),
             write(tmp_path / "a" / "3.json", cache(OTHER, kernel_name="CONV_2")),
             write(tmp_path / "b" / "1.json", cache(TWO, kernel_name="deconv")),
             write(tmp_path / "b" / "2.json", cache(THREE, kernel_name="deconv")),
             write(tmp_path / "b" / "3.json", cache(OTHER, kernel_name="deconv_2"))]
    rows = import_files(store, files)
    assert [(r["kernel"], r.get("renamed_from")) for r in rows] == [
        ("conv", None), ("conv_3", "conv"), ("CONV_2", None), ("deconv", None), ("deconv_3", "deconv"),
        ("deconv_2", None)]
    assert sorted(spaces(store)) == ["CONV_2", "conv", "conv_3", "deconv", "deconv_2", "deconv_3"]


def test_a_built_in_kernel_name_keeps_its_own_rule(store, tmp_path):
    path = write(tmp_path / "a" / "rms.json", cache(TWO, kernel_name="rmsnorm"))
    with pytest.raises(ImportFileError, match="rmsnorm.* is built in"):
        import_files(store, [path])
    assert store.measurements() == []
