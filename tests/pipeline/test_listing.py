"""pipeline/listing.py's kernel records: registered kernels without a store, stored ones from a real store."""

from __future__ import annotations

import pytest

from zmlx_pipeline.core.errors import UnknownKernel
from zmlx_pipeline.kernels.builtin import BUILTIN
from zmlx_pipeline.pipeline.listing import kernel_listing


def never():
    raise AssertionError("the store was opened though no stored kernel was asked for")


def test_registered_names_never_open_the_store():
    records = kernel_listing(["softmax", "rmsnorm", "softmax"], never)
    assert [(r["name"], r["source"]) for r in records] == [("softmax", "built-in"), ("rmsnorm", "built-in")]


def test_a_collected_kernel_no_spec_describes_is_listed_as_collected_with_every_value_sort(store, make_measurement):
    """A kernel collected through module:attr elsewhere, its rows ingested here: its values of every JSON sort."""
    run = store.start_run("nvidia-h100-sxm", host="h", backend="cuda", mlx_version="0", pipeline_version="0",
                          settings={"preset": "smoke"})
    configs = [{"mode": "fast", "tile": 64, "flag": True, "cap": None}, {"mode": "exact", "tile": 8, "flag": False,
                                                                         "cap": 2.5}]
    store.record([make_measurement(run_id=run, device_id="nvidia-h100-sxm", kernel="my_scale", config=c,
                                   shape={"rows": r, "cols": 4096}, median_us=1.0 + i)
                  for i, (c, r) in enumerate([(configs[0], 64), (configs[1], 64), (configs[1], 128)])])
    store.finish_run(run, "finished")
    every = kernel_listing([], lambda: store)
    assert [r["name"] for r in every] == [*BUILTIN, "my_scale"]
    (record,) = kernel_listing(["my_scale"], lambda: store)
    assert record["source"] == "collected" and record["imports"] == []
    assert record["collected_runs"] == 1 and record["collected_rows"] == 3
    assert record["parameters"] == {"cap": [2.5, None], "flag": [False, True], "mode": ["exact", "fast"],
                                    "tile": [8, 64]}
    assert record["dim_values"] == {"cols": [4096], "rows": [64, 128]} and len(record["shapes"]) == 2
    assert [(d["device"], d["rows"], d["dtypes"]) for d in record["devices"]] == [("nvidia-h100-sxm", 3, ["float16"])]


def test_a_name_neither_registered_nor_stored_lists_both(store, make_measurement):
    store.record([make_measurement(kernel="conv_" + "x" * 70, device_id="nvidia-h100-sxm")])
    with pytest.raises(UnknownKernel) as err:
        kernel_listing(["conv"], lambda: store)
    assert str(err.value) == (f"unknown kernel 'conv'; known kernels: {', '.join(BUILTIN)}; in the store {store.path}: "
                              f"{'conv_' + 'x' * 55!r}... (75 characters) (or give a module:attr path)")
    with pytest.raises(UnknownKernel, match=r"known kernels: rmsnorm, .*, matmul \(or give a module:attr path\)$"):
        kernel_listing(["conv"], lambda: None)
