"""tools/retime_first.py: the row each run timed first in each (kernel, dtype) block, listed and deleted."""

from __future__ import annotations

import importlib.util
from datetime import datetime, timedelta
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "retime_first.py"
_spec = importlib.util.spec_from_file_location("retime_first", SCRIPT)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

T0 = datetime(2026, 11, 22, 19, 0, 0)


def row(run, kernel, dtype, config, second):
    return {"run_id": run, "kernel": kernel, "dtype": dtype, "config_key": config,
            "measured_at": T0 + timedelta(seconds=second)}


def test_blocks_start_where_the_run_turns_to_another_kernel_or_dtype_in_time_order():
    rows = [
        row("a", "swiglu", "float16", "c2", 2), row("a", "swiglu", "float16", "c1", 1),  # c1 was first
        row("a", "swiglu", "float32", "c1", 3), row("a", "swiglu", "float32", "c2", 4),
        row("a", "softmax", "float32", "c1", 5),
        row("b", "swiglu", "float16", "c3", 0), row("b", "swiglu", "float16", "c4", 9),
    ]
    first = tool.first_in_blocks(rows)
    assert [(r["run_id"], r["kernel"], r["dtype"], r["config_key"]) for r in first] == [
        ("a", "swiglu", "float16", "c1"), ("a", "swiglu", "float32", "c1"), ("a", "softmax", "float32", "c1"),
        ("b", "swiglu", "float16", "c3")]


def test_delete_removes_just_those_rows_and_skips_a_kernel(store, make_measurement, capsys):
    made = []
    for i, (kernel, tg) in enumerate([("softmax", 32), ("softmax", 64), ("matmul", 32), ("matmul", 64)]):
        m = make_measurement(kernel=kernel, config={"threadgroup": tg})
        store.record([m])
        made.append(m)
    path = str(store.path)
    store.close()
    assert tool.main(["--db", path, "--device", made[0].device_id, "--skip-kernel", "matmul", "--delete"]) == 0
    assert "1 rows, 1 deleted; kernels: softmax" in capsys.readouterr().out
    from zmlx_pipeline.data.store import Store

    with Store(path, read_only=True) as s:
        left = sorted((r["kernel"], r["config"]["threadgroup"]) for r in s.measurements())
    assert left == [("matmul", 32), ("matmul", 64), ("softmax", 64)]
