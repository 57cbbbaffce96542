"""Bad input to import that used to pass: guessed chips, unreadable folders, look-alike names, rounded sizes,
hidden characters in device names, and config values no reader holds. Each is one line, and stores nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from zmlx_pipeline.data.catalog import AmbiguousDevice, UnknownDevice, match_device, resolve_device
from zmlx_pipeline.data.importers import ImportFileError, import_files
from zmlx_pipeline.data.importers.kernel_tuner import parse_problem_size

from test_kernel_tuner_import import entry, kt_cache, snapshot, write


def import_refused(store, paths, **options) -> str:
    """The one-line error of a refused import, after checking it left the store as it was."""
    before = snapshot(store)
    with pytest.raises(ImportFileError) as info:
        import_files(store, paths, **options)
    assert "\n" not in str(info.value)
    assert snapshot(store) == before
    return str(info.value)


@pytest.fixture
def cache(tmp_path) -> Path:
    """One Kernel Tuner cache file naming no GPU, of two timed configs."""
    return write(tmp_path / "conv.json", kt_cache({"16,1": entry(16, 1), "32,1": entry(32, 1)}, device_name=None))


# A1: a name of binned variants is never resolved to a guessed chip


@pytest.mark.parametrize("name, candidates", [
    ("Apple M1 Pro", "apple-m1-pro-14c, apple-m1-pro-16c"),
    ("Apple M3 Max", "apple-m3-max-30c, apple-m3-max-40c"),
    ("M3 Max", "apple-m3-max-30c, apple-m3-max-40c"),
    ("apple-m3", "apple-m3-8c, apple-m3-10c"),  # not an id: a name, of two chips
    ("apple-m1-pro", "apple-m1-pro-14c, apple-m1-pro-16c"),
])
def test_a_name_of_binned_variants_resolves_to_none_of_them(name, candidates):
    with pytest.raises(AmbiguousDevice) as info:
        resolve_device(name)
    assert str(info.value) == f"{name!r} does not name one catalog device (it may be {candidates})"


def test_the_full_chip_stays_what_detection_and_the_runtime_get_for_a_name_without_a_core_count():
    assert match_device("Apple M3 Max").id == "apple-m3-max-40c"
    assert match_device("Apple M3 Max", gpu_cores=30).id == "apple-m3-max-30c"
    assert resolve_device("apple-m3-max-30c").id == "apple-m3-max-30c"


def test_device_option_of_binned_variants_is_refused(store, cache):
    assert import_refused(store, [cache], device="Apple M1 Pro") == (
        "--device 'Apple M1 Pro' does not name one catalog device (it may be apple-m1-pro-14c, apple-m1-pro-16c); "
        "give its id")


def test_device_map_value_of_binned_variants_is_refused(store, cache, tmp_path):
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"conv.json": "Apple M3 Max"}))
    assert import_refused(store, [cache], device_map=mapping) == (
        f"--device-map {mapping}: 'conv.json' -> 'Apple M3 Max' does not name one catalog device (it may be "
        "apple-m3-max-30c, apple-m3-max-40c); give its id")


# F3: a core-limited id is a device; hidden characters are not part of a name


def test_a_core_limited_id_imports_as_that_device(store, cache):
    [row] = import_files(store, [cache], device="nvidia-h200@66sm")
    assert row["device"] == "nvidia-h200@66sm" and row["added"] == 2
    [device] = store.devices()
    assert (device["device_id"], device["gpu_cores"], device["core_limited_from"]) == (
        "nvidia-h200@66sm", 66, "nvidia-h200")


@pytest.mark.parametrize("device, says", [
    ("nvidia-h200@132sm", "--device 'nvidia-h200@132sm' limits nvidia-h200 to 132 SMs, but it has 132; a core limit "
                          "is below the chip's count (give the chip's own id for the whole chip); `zmlx-pipeline "
                          "devices` lists them"),
    ("nvidia-h200@999sm", "--device 'nvidia-h200@999sm' limits nvidia-h200 to 999 SMs, but it has 132"),
    ("apple-m3-8c@4sm", "--device 'apple-m3-8c@4sm' limits apple-m3-8c to 4 SMs, but its cores are GPU cores, not "
                        "SMs; a core limit (@<N>sm, CUDA MPS) is only of an NVIDIA chip (give the chip's own id)"),
    ("amd-mi100@10sm", "--device 'amd-mi100@10sm' limits amd-mi100 to 10 SMs, but its cores are compute units, not "
                       "SMs; a core limit (@<N>sm, CUDA MPS) is only of an NVIDIA chip (give the chip's own id)"),
    ("nvidia-h200\u200b", "--device 'nvidia-h200\\u200b' holds a control or format character (U+200B); write the "
                          "name or id without it"),
    ("nvidia-h200\x00", "--device 'nvidia-h200\\x00' holds a control or format character (U+0000)"),
    ("\uff4e\uff56\uff49\uff44\uff49\uff41-h200", "--device 'ｎｖｉｄｉａ-h200' holds characters Unicode writes otherwise "
                                                "(as 'nvidia-h200'); write it in plain characters"),
])
def test_a_device_option_that_is_no_device_as_written_is_refused(store, cache, device, says):
    assert import_refused(store, [cache], device=device).startswith(says)


def test_a_device_map_value_ending_in_nul_is_refused(store, cache, tmp_path):
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"conv.json": "nvidia-h200\x00"}))
    assert import_refused(store, [cache], device_map=mapping) == (
        f"--device-map {mapping}: 'nvidia-h200\\x00' holds a control or format character (U+0000); write the name "
        "or id without it")


def test_resolve_device_refuses_a_core_limit_of_no_catalog_chip():
    with pytest.raises(UnknownDevice, match="no catalog device with id 'nvidia-h999'"):
        resolve_device("nvidia-h999@66sm")


# A2: an unreadable folder below a directory is named, not skipped


def _unreadable(monkeypatch, name: str) -> None:
    """os.scandir (which os.walk lists folders with) refusing every folder called `name`, as for a user without
    permission (permission bits do not bind root, who runs these tests in CI)."""
    real = os.scandir

    def scandir(path="."):
        if os.path.basename(os.fspath(path)) == name:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_a_folder_that_cannot_be_read_refuses_the_import(store, tmp_path, monkeypatch):
    folder = tmp_path / "kt"
    write(folder / "a.json", kt_cache({"16,1": entry(16, 1)}))
    write(folder / "sub" / "b.json", kt_cache({"16,1": entry(16, 1)}, kernel_name="other_kernel"))
    _unreadable(monkeypatch, "sub")
    assert import_refused(store, [folder]) == (
        f"cannot import {folder}: {folder / 'sub'} cannot be read (Permission denied), so its files would be left "
        "out; make it readable or name the files to import; nothing was stored")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="permission bits do not bind root")
def test_a_folder_without_permission_refuses_the_import(store, tmp_path):
    folder = tmp_path / "kt"
    write(folder / "a.json", kt_cache({"16,1": entry(16, 1)}))
    write(folder / "sub" / "b.json", kt_cache({"16,1": entry(16, 1)}, kernel_name="other_kernel"))
    (folder / "sub").chmod(0)
    try:
        assert "sub cannot be read (Permission denied)" in import_refused(store, [folder])
    finally:
        (folder / "sub").chmod(0o755)


# A4: names that look alike are one name, or refused


@pytest.mark.parametrize("kernel, twin", [("RMSNorm", "rmsnorm"), ("\uff52\uff4d\uff53\uff4e\uff4f\uff52\uff4d", "rmsnorm")])
def test_a_kernel_named_like_a_built_in_one_is_refused(store, tmp_path, kernel, twin):
    path = write(tmp_path / "k.json", kt_cache({"16,1": entry(16, 1)}, kernel_name=kernel))
    assert import_refused(store, [path]) == (
        f"cannot import {path}: kernel {kernel!r} differs from kernel {twin!r} only in case, white space or Unicode "
        "compatibility form (NFKC): name one kernel one way; import it under that name or one of its own (its "
        "kernel_name); nothing of it was stored")


def test_a_kernel_named_like_a_stored_one_is_refused(store, tmp_path):
    import_files(store, [write(tmp_path / "a" / "k.json", kt_cache({"16,1": entry(16, 1)}, kernel_name="Conv_2D"))])
    path = write(tmp_path / "b" / "k.json", kt_cache({"16,1": entry(16, 1)}, kernel_name="conv_2d"))
    assert "kernel 'conv_2d' differs from kernel 'Conv_2D' only in case" in import_refused(store, [path])


def test_a_kernel_name_not_in_nfc_is_refused(store, tmp_path):
    path = write(tmp_path / "k.json", kt_cache({"16,1": entry(16, 1)}, kernel_name="cafe\u0301"))
    assert import_refused(store, [path]) == (
        f"cannot import {path}: kernel name 'cafe\\u0301' is not in Unicode's composed form (NFC), which writes it "
        "'caf\\xe9': write it so, or it passes for that name; give the file a kernel_name, or pass --kernel NAME; "
        "nothing of it was stored")


# A5: a problem size is whole numbers, never rounded to them


@pytest.mark.parametrize("text, says", [
    ("1e3", "x=1e3 is not written as a whole number"),
    ("4096.0000000000001", "x=4096.0000000000001 is not written as a whole number"),
    ("[4096, 4096.5]", "y=4096.5 is not a positive integer"),
])
def test_a_problem_size_option_that_is_not_whole_numbers_is_refused(text, says):
    with pytest.raises(ValueError) as info:
        parse_problem_size(text)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_a_whole_float_written_as_one_is_a_size():
    assert parse_problem_size("[4096.0, 2048]") == [4096.0, 2048]


def test_a_file_problem_size_rounded_by_json_is_refused(store, tmp_path):
    text = json.dumps(kt_cache({"16,1": entry(16, 1)}, problem_size=[1])).replace("[1]", "[4096.0000000000001]")
    path = tmp_path / "k.json"
    path.write_text(text)
    assert import_refused(store, [path]) == (
        f"cannot import {path}: problem size [4096.0000000000001]: x=4096.0000000000001 is not written as a whole "
        "number (a size is an integer such as 4096, never rounded to one) (in its file); nothing of it was stored")
    path.write_text(text.replace("4096.0000000000001", "4096.0"))
    [row] = import_files(store, [path])
    assert [m["shape"] for m in store.measurements()] == [{"x": 4096}]


# F4: an imported kernel's parameters may be any JSON value, but one that no reader holds


def test_negative_zero_and_fractional_parameters_of_an_imported_kernel_are_kept(store, tmp_path):
    tune = {"block_size_x": [-16, 0, 16.5], "block_size_y": [1]}
    path = write(tmp_path / "k.json", kt_cache({"-16,1": entry(-16, 1), "0,1": entry(0, 1), "16.5,1": entry(16.5, 1)},
                                              tune_params=tune))
    import_files(store, [path])
    assert sorted(m["config"]["block_size_x"] for m in store.measurements()) == [-16, 0, 16.5]


@pytest.mark.parametrize("value, text, says", [
    (2**63, str(2**63), f"block_size_x={2**63} is an integer outside int64 (-2**63 to 2**63-1)"),
    (float("inf"), "Infinity", "block_size_x=inf is not a finite number"),
])
def test_a_parameter_no_reader_holds_is_refused(store, tmp_path, value, text, says):
    path = tmp_path / "k.json"
    path.write_text(json.dumps(kt_cache({"k,1": {"block_size_x": "X", "block_size_y": 1, "time": 1.5}},
                                        tune_params={"block_size_x": ["X"], "block_size_y": [1]}))
                    .replace('"X"', text).replace('"k,1"', json.dumps(f"{value},1")))
    assert import_refused(store, [path]) == f"cannot import {path}: config parameter {says}; nothing of it was stored"


def test_a_device_map_value_limiting_an_apple_chips_sms_is_refused(store, cache, tmp_path):
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"conv.json": "apple-m3-8c@4sm"}))
    said = import_refused(store, [cache], device_map=mapping)
    assert said.startswith(f"--device-map {mapping}: 'conv.json' -> ") and (
        "'apple-m3-8c@4sm' limits apple-m3-8c to 4 SMs, but its cores are GPU cores, not SMs; a core limit (@<N>sm, "
        "CUDA MPS) is only of an NVIDIA chip (give the chip's own id)") in said and "\n" not in said
    assert store.devices() == []



WILD = Path(__file__).parent / "fixtures" / "kernel_tuner_wild"
HUGE = "1" + "0" * 400  # 10**400: an integer json reads whole, past a float's range
HUGE_SAID = "10000000000000000000... (401 digits), an integer past a float's range: neither a time nor a failure marker"


def _with_huge(name: str, edit) -> str:
    """A fixture's text with one value set by `edit` to 10**400, written as the 401 digits a file would hold."""
    doc = json.loads((WILD / name).read_text())
    edit(doc)
    return json.dumps(doc).replace('"HUGE"', HUGE)


def _t4_value(doc):
    doc["results"][0].pop("times")
    doc["results"][0]["measurements"][0]["value"] = "HUGE"


@pytest.mark.parametrize("name, text, says", [
    ("A4000.json", json.dumps(kt_cache({"16,1": entry(time="HUGE")})), f"cache entry '16,1': 'time' {HUGE_SAID}"),
    ("A4000.json", json.dumps(kt_cache({"16,1": entry(times=[1.5, "HUGE"])})),
     f"cache entry '16,1': its times hold {HUGE_SAID}"),
    ("a.t4.json", _with_huge("vectorAdd_rtx500ada.t4.json", lambda d: d["results"][0]["times"].update(
        runtimes=[90.0, "HUGE"])), f"result 0: its times hold {HUGE_SAID}"),
    ("a.t4.json", _with_huge("vectorAdd_rtx500ada.t4.json", _t4_value), f"result 0: time {HUGE_SAID}"),
    ("a.ktt.json", _with_huge("vectorAdd_rtx500ada.ktt.json", lambda d: d["Results"][0].update(
        TotalDuration="HUGE")), f"result 0: time {HUGE_SAID}"),
    ("A4000.json", _with_huge("vector_add_results.json", lambda d: d["data"][0].update(time="HUGE")),
     f"record 0: time {HUGE_SAID}"),
])
def test_an_integer_time_past_a_float_s_range_is_refused_naming_the_entry(store, tmp_path, name, text, says):
    """float() of a 401-digit time raises: it is refused as a NaN time is, in one line, never a traceback."""
    path = tmp_path / "k" / name
    path.parent.mkdir()
    path.write_text(text.replace('"HUGE"', HUGE))
    assert HUGE in path.read_text()
    device = None if name == "A4000.json" else "nvidia-rtx-4000-ada"
    assert import_refused(store, [path], device=device) == f"cannot import {path}: {says}; nothing of it was stored"


@pytest.mark.parametrize("where", ["kernel_name", "folder"])
def test_a_kernel_name_holding_a_colon_is_refused(store, tmp_path, where):
    """`os:system` would be stored, but `kernels -k os:system` reads it as a module:attr path and never lists it."""
    if where == "kernel_name":
        path = write(tmp_path / "k" / "A4000.json", kt_cache({"16,1": entry()}, kernel_name="os:system"))
    else:
        path = write(tmp_path / "os:system" / "A4000.json", kt_cache({"16,1": entry()}, kernel_name=None))
    assert import_refused(store, [path]) == (
        f"cannot import {path}: kernel name 'os:system' holds ':', which names a module:attr kernel, not an imported "
        "one; give the file a kernel_name, or pass --kernel NAME; nothing of it was stored")
    assert import_refused(store, [path], kernel="examples.row_scale:SPEC") == (
        "--kernel 'examples.row_scale:SPEC' holds ':', which names a module:attr kernel, not an imported one; give a "
        "name without ':'")
    import_files(store, [path], kernel="os_system")
    assert {m["kernel"] for m in store.measurements()} == {"os_system"}
