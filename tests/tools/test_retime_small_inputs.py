"""tools/retime_small_inputs.py: every row of a case with an input of 8 bytes or fewer, listed and deleted."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from zmlx_pipeline.kernels.registry import get_kernel

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "retime_small_inputs.py"
_spec = importlib.util.spec_from_file_location("retime_small_inputs", SCRIPT)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

MOE = get_kernel("moe_combine").version
DECODE = {"tokens": 1, "k": 2, "hidden": 4096}     # w: 4 bytes in float16, 8 in float32
WIDE = {"tokens": 1, "k": 8, "hidden": 2048}       # w: 16 bytes in float16


def fill(store, make_measurement):
    rows = [("moe_combine", MOE, "float16", DECODE, tg) for tg in (32, 64)]
    rows += [("moe_combine", MOE, "float32", DECODE, 32), ("moe_combine", MOE, "float16", WIDE, 32),
             ("moe_combine", "sha256:000000000000", "float16", DECODE, 128),   # an older kernel version
             ("convolution_milo", "kt", "float32", {"n": 1}, 32)]              # a kernel unknown here
    for kernel, version, dtype, shape, tg in rows:
        store.record([make_measurement(kernel=kernel, kernel_version=version, dtype=dtype, shape=shape,
                                       config={"TG": tg, "VEC": 1, "ROWS": 1})])
    path = str(store.path)
    store.close()
    return path


def test_lists_every_row_of_the_small_input_cases_only(store, make_measurement, capsys):
    path = fill(store, make_measurement)
    device = make_measurement().device_id
    assert tool.main(["--db", path, "--device", device, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == 3 and out["deleted"] == 0 and out["kernels"] == ["moe_combine"]
    assert sorted(dtype for _, dtype, _ in out["cases"]) == ["float16", "float32"]


def test_delete_removes_them_and_keeps_the_rest(store, make_measurement, capsys):
    path = fill(store, make_measurement)
    device = make_measurement().device_id
    assert tool.main(["--db", path, "--device", device, "--kernel", "moe_combine", "--delete"]) == 0
    assert "2 cases, 3 rows, 3 deleted; kernels: moe_combine" in capsys.readouterr().out
    from zmlx_pipeline.data.store import Store

    with Store(path, read_only=True) as s:
        left = sorted((r["kernel"], r["dtype"], r["shape"].get("k"), r["kernel_version"] == MOE)
                      for r in s.measurements())
    assert left == [("convolution_milo", "float32", None, False), ("moe_combine", "float16", 2, False),
                    ("moe_combine", "float16", 8, True)]


def test_kernel_filter_leaves_other_kernels(store, make_measurement, capsys):
    path = fill(store, make_measurement)
    assert tool.main(["--db", path, "--device", make_measurement().device_id, "--kernel", "softmax"]) == 0
    assert "0 cases, 0 rows; kernels:" in capsys.readouterr().out
