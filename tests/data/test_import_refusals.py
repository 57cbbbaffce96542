"""Imports a fuzz pass found taken silently or the wrong way: a config given twice, a key given other results than
the store holds, over-long names, blank kernel names, problem sizes and device maps as people write them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from zmlx_pipeline.data.importers import ImportFileError, import_files

A4000 = "nvidia-rtx-a4000"


def snapshot(store) -> tuple:
    return store.measurements(), store.runs(), store.devices()


def write(path: Path, doc, raw: bytes | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw if raw is not None else json.dumps(doc).encode())
    return path


def cache(times: dict, device_name="NVIDIA RTX A4000", kernel_name="vector_add") -> dict:
    """A Kernel Tuner cache of block_size_x -> time (ms)."""
    return {"device_name": device_name, "kernel_name": kernel_name, "problem_size": [4096],
            "tune_params_keys": ["block_size_x"], "tune_params": {"block_size_x": sorted(times)},
            "objective": "time", "cache": {str(bx): {"block_size_x": bx, "time": t} for bx, t in times.items()}}


def t4(results: list, metadata: dict | None = None) -> dict:
    return {"schema_version": "1.0.0", "metadata": {"timeunit": "ms", "kernel_name": "vector_add",
                                                    "device_name": "NVIDIA RTX A4000", "problem_size": [4096],
                                                    **(metadata or {})},
            "results": results}


def t4_result(bx: int, time: float = 1.0) -> dict:
    return {"configuration": {"block_size_x": bx}, "invalidity": "correct", "times": {"runtimes": [time]},
            "measurements": [{"name": "time", "value": time, "unit": "ms"}]}


def refused(store, paths, says: str, **options) -> str:
    """The one-line refusal of an import (checked: it names `says`, and the store is left as it was)."""
    before = snapshot(store)
    with pytest.raises(ImportFileError) as info:
        import_files(store, paths, **options)
    message = str(info.value)
    assert "\n" not in message and says in message, message
    assert snapshot(store) == before
    return message


# -- C1: one config twice in one file --------------------------------------------------------------------------------


def test_a_t4_file_giving_one_config_twice_is_refused_naming_both_results(store, tmp_path):
    path = write(tmp_path / "vec" / "a.json", t4([t4_result(32, 1.0), t4_result(64, 2.0), t4_result(32, 3.0)]))
    message = refused(store, [path], "result 0 and result 2 are the same config")
    assert message == (f"cannot import {path}: result 0 and result 2 are the same config ({{\"block_size_x\":32}}, "
                       "float32): which of their timings is the config's cannot be told; keep one of them in the "
                       "file; nothing of it was stored")


def test_a_ktt_file_giving_one_config_twice_is_refused(store, tmp_path):
    result = lambda block, total: {"Configuration": [{"Name": "block", "Value": block}], "KernelName": "k",  # noqa: E731
                                   "Status": "Ok", "TotalDuration": total}
    doc = {"Metadata": {"Device": "NVIDIA RTX A4000", "TimeUnit": "Milliseconds"},
           "Results": [result(32, 1.0), result(32, 2.0)]}
    refused(store, [write(tmp_path / "k" / "a.json", doc)], "result 0 and result 1 are the same config")


def test_a_results_file_giving_one_config_twice_is_refused(store, tmp_path):
    record = lambda bx, t: {"device_name": "NVIDIA_RTX_A4000", "problem_size": "4096",  # noqa: E731
                            "tunable_parameters": {"block_size_x": bx}, "time": t}
    doc = {"version_number": "1.0", "kernel_name": "vector_add", "tunable_parameters": ["block_size_x"],
           "objective": "time", "data": [record(32, 1.0), record(64, 1.0), record(32, 0.5)]}
    refused(store, [write(tmp_path / "r" / "results.json", doc)], "record 0 and record 2 are the same config")


# -- C2: a key given another result than the store holds, or than another file of the import -------------------------


def test_a_key_stored_with_another_time_is_refused_and_replace_replaces_it(store, tmp_path):
    slow = write(tmp_path / "slow" / "a.json", cache({32: 2.0, 64: 4.0}))
    fast = write(tmp_path / "fast" / "a.json", cache({32: 1.0, 64: 4.0, 128: 3.0}))
    assert import_files(store, [slow])[0]["added"] == 2
    message = refused(store, [fast], "is stored with 2000 us, and this file gives 1000 us")
    assert message == (f"cannot import {fast}: config {{\"block_size_x\":32}} (float32, shape {{\"x\":4096}}) of "
                       f"vector_add on {A4000} is stored with 2000 us, and this file gives 1000 us; pass --replace to "
                       "replace the stored results with this file's, or leave the file out; nothing of it was stored")
    (row,) = import_files(store, [fast], replace=True)
    assert (row["added"], row["replaced"]) == (1, 1)
    times = {m["config"]["block_size_x"]: m["median_us"] for m in store.measurements()}
    assert times == {32: 1000.0, 64: 4000.0, 128: 3000.0}
    # the same results again: the idempotent re-import, with or without --replace
    assert import_files(store, [fast])[0]["added"] == 0
    assert "replaced" not in import_files(store, [fast], replace=True)[0]
    assert len(store.runs()) == 2


def test_two_files_of_one_import_giving_one_key_other_times_are_refused_in_either_order(store, tmp_path):
    slow = write(tmp_path / "slow" / "a.json", cache({32: 2.0}))
    fast = write(tmp_path / "fast" / "a.json", cache({32: 1.0}))
    for first, second in ((slow, fast), (fast, slow)):
        for replace in (False, True):
            message = refused(store, [first, second], f"but {'2000' if first == slow else '1000'} us by {first}",
                              replace=replace)
            assert message.startswith(f"cannot import {second}: ") and "import one of them" in message


def test_the_same_file_imported_again_adds_nothing_and_refuses_nothing(store, tmp_path):
    path = write(tmp_path / "vec" / "a.json", cache({32: 2.0, 64: 4.0}))
    copy = write(tmp_path / "copy" / "a.json", cache({32: 2.0, 64: 4.0}))
    assert [r["added"] for r in import_files(store, [path, copy])] == [2, 0]
    assert import_files(store, [path])[0]["added"] == 0


# -- F2: names longer than a name may be -------------------------------------------------------------------------------


def test_a_kernel_name_of_300_characters_is_refused_showing_it_shortened(store, tmp_path):
    path = write(tmp_path / "vec" / "a.json", cache({32: 1.0}, kernel_name="k" * 300))
    message = refused(store, [path], "is longer than 100 characters")
    assert message == (f"cannot import {path}: kernel name {'k' * 40!r}... (300 characters) is longer than 100 "
                       "characters, the most a name may hold; give the file a kernel_name, or pass --kernel NAME; "
                       "nothing of it was stored")
    assert import_files(store, [write(tmp_path / "ok" / "a.json", cache({32: 1.0}, kernel_name="k" * 100))])


# -- C5: a directory stands for the files below it, hidden ones left out, a FIFO refused ------------------------------


def test_a_directory_imports_the_files_below_it_but_not_hidden_copies(store, tmp_path):
    root = tmp_path / "hub"
    write(root / "vec" / "a.json", cache({32: 1.0}))
    write(root / "vec" / "deeper" / "b.json", cache({32: 1.0}, kernel_name="other"))
    write(root / "vec" / ".ipynb_checkpoints" / "a-checkpoint.json", cache({32: 9.0}))  # would conflict if read
    write(root / ".c.json", None, raw=b"not json")
    rows = import_files(store, [root])
    assert [Path(r["file"]).relative_to(root).as_posix() for r in rows] == ["vec/a.json", "vec/deeper/b.json"]
    assert sorted(m["median_us"] for m in store.measurements()) == [1000.0, 1000.0]


def test_a_fifo_below_an_import_directory_is_refused_never_skipped(store, tmp_path):
    import os

    root = tmp_path / "hub"
    write(root / "vec" / "a.json", cache({32: 1.0}))
    os.mkfifo(root / "vec" / "pipe.json")
    before = snapshot(store)
    with pytest.raises(ImportFileError) as info:
        import_files(store, [root])
    assert str(info.value) == (f"cannot import {root}: {root / 'vec' / 'pipe.json'} is a FIFO (named pipe), not a "
                               "file to read; remove it or name the files to import; nothing was stored")
    assert snapshot(store) == before


# -- D2: a family name of several chips is refused listing them, never filed under one ---------------------------------

A100S = "nvidia-a100-pcie-40gb, nvidia-a100-pcie-80gb, nvidia-a100-sxm4-40gb, nvidia-a100-sxm4-80gb"


@pytest.mark.parametrize("file_name, device_name", [("a.json", "NVIDIA A100"), ("A100.json", ""),
                                                    ("A100_T4.json", None)])
def test_a_bare_a100_is_refused_listing_the_four_a100s(store, tmp_path, file_name, device_name):
    doc = cache({32: 1.0}, device_name=device_name)
    if device_name is None:
        del doc["device_name"]
    path = write(tmp_path / "vec" / file_name, doc)
    named = device_name or file_name.split(".")[0].split("_")[0]
    message = refused(store, [path], f"device {named!r} does not name one catalog device (it may be {A100S})")
    assert message.endswith("pass --device <its id> or map the file in --device-map; nothing of it was stored")


# -- F5: a T4 file's empty kernel_name is refused, as a cache's is ------------------------------------------------------


@pytest.mark.parametrize("blank", ["", "   "])
def test_a_t4_file_whose_kernel_name_is_empty_is_refused_not_named_after_its_folder(store, tmp_path, blank):
    path = write(tmp_path / "t4" / "a.json", t4([t4_result(32)], {"kernel_name": blank}))
    message = refused(store, [path], "its metadata's kernel_name is empty")
    assert message == (f"cannot import {path}: its metadata's kernel_name is empty; give the file a kernel_name, or "
                       "pass --kernel NAME; nothing of it was stored")
    (row,) = import_files(store, [path], kernel="vector_add")  # a kernel given for it: imported under that name
    assert row["kernel"] == "vector_add" and row["added"] == 1


# -- F6: a device map with a byte-order mark, "4096X4096", a file gzipped twice or otherwise compressed ---------------


def test_a_device_map_with_a_byte_order_mark_is_read_as_tuning_files_with_one_are(store, tmp_path):
    path = write(tmp_path / "vec" / "a.json", cache({32: 1.0}, device_name="Lab GPU 7"))
    for suffix, text in ((".json", '{"Lab GPU 7": "nvidia-rtx-a4000"}'), (".toml", '"Lab GPU 7" = "nvidia-rtx-a4000"\n')):
        mapping = write(tmp_path / f"map{suffix}", None, raw="\ufeff".encode() + text.encode())
        assert import_files(store, [path], device_map=mapping)[0]["device"] == A4000


def test_a_problem_size_joined_by_a_capital_x_reads_as_one_joined_by_x(store, tmp_path):
    record = {"device_name": "NVIDIA_RTX_A4000", "tunable_parameters": {"block_size_x": 32}, "time": 1.0}
    for joined in ("4096x2048", "4096X2048"):
        doc = {"version_number": "1.0", "kernel_name": "vector_add", "tunable_parameters": ["block_size_x"],
               "objective": "time", "data": [{**record, "problem_size": joined}]}
        (row,) = import_files(store, [write(tmp_path / joined / "results.json", doc)])
        assert row["rows"] == 1
    assert [m["shape"] for m in store.measurements()] == [{"x": 4096, "y": 2048}]


def test_a_file_gzipped_twice_or_compressed_otherwise_is_named_as_such(store, tmp_path):
    text = json.dumps(cache({32: 1.0})).encode()
    twice = write(tmp_path / "vec" / "twice.json.gz", None, raw=gzip.compress(gzip.compress(text)))
    assert refused(store, [twice], "gzip-compressed twice") == (
        f"cannot import {twice}: gzip-compressed twice: decompress it once (gunzip) and import the result; nothing of "
        "it was stored")
    import lzma

    xz = write(tmp_path / "vec" / "a.json.xz.json", None, raw=lzma.compress(text))
    assert refused(store, [xz], "xz-compressed data") == (
        f"cannot import {xz}: xz-compressed data, not JSON: decompress it and import the result (gzip is read as it "
        "is); nothing of it was stored")


# -- schema versions ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.0.0", "1.0.1", "1.1.0", "1.2.0"])
def test_a_cache_of_any_schema_1_minor_version_imports(store, tmp_path, version):
    path = write(tmp_path / "a.json", {**cache({64: 1.0, 128: 2.0}), "schema_version": version})
    import_files(store, [path])
    assert len(store.measurements()) == 2


@pytest.mark.parametrize("make, kind", [(lambda v: {**cache({64: 1.0}), "schema_version": v}, "cache"),
                                        (lambda v: {**t4([t4_result(64)]), "schema_version": v}, "T4")])
def test_a_new_major_schema_or_a_version_that_is_no_version_is_refused(store, tmp_path, make, kind):
    message = refused(store, [write(tmp_path / "a.json", make("2.0.0"))], f"Kernel Tuner {kind} schema '2.0.0'")
    assert "reads schema 1.x" in message
    refused(store, [write(tmp_path / "b.json", make(1.1))], "its schema_version is float '1.1', not text naming a version")
    refused(store, [write(tmp_path / "c.json", make("\u0661.0.0"))], "is not a version number")  # Arabic-Indic digit
    assert "write the file again with a Kernel Tuner of schema 1.x" in refused(
        store, [write(tmp_path / "d.json", make("0.9"))], f"Kernel Tuner {kind} schema '0.9'")


def test_a_test_device_name_in_a_file_named_for_its_gpu_is_refused_naming_that_gpu_as_a_hint(store, tmp_path):
    """Kernel Tuner's test runs write "Testing" or "arm" as the GPU: the file name's GPU is offered, never taken."""
    message = refused(store, [write(tmp_path / "RTX_A4000.json", cache({64: 1.0}, device_name="Testing"))],
                      "device 'Testing' is not in the catalog")
    assert f"its file name names {A4000}: pass --device {A4000} if it ran there" in message
    message = refused(store, [write(tmp_path / "run_14_iters.json", cache({64: 1.0}, device_name="arm"))],
                      "device 'arm' is not in the catalog")
    assert "file name names" not in message
    import_files(store, [tmp_path / "RTX_A4000.json"], device=A4000)
    assert len(store.measurements()) == 1
