"""Ctrl-C while a command measures: what was measured stays stored, and the command does not end as a finished one."""

from __future__ import annotations

import duckdb
import pytest
from click.testing import CliRunner

from zmlx_pipeline.pipeline.cli import cli


def _device(name: str):
    from zmlx_pipeline.data import detect

    if name == "h200":
        return detect.detect_device({"device_name": "NVIDIA H200", "architecture": "sm_90"}, backend="cuda",
                                    gpu_cores=132)
    return detect.detect_device({"device_name": "Apple M5 Max", "architecture": "applegpu_g17s"}, backend="metal",
                                gpu_cores=40)


def _stopping_after(n: int):
    """The collect tests' GPU double, with Ctrl-C arriving during measurement n + 1."""
    from fake_collect import fake_measurer

    measure, made = fake_measurer(0.0), []

    def measurer(task):
        if len(made) == n:
            raise KeyboardInterrupt
        made.append(task)
        return measure(task)

    return measurer


def _rows(path) -> int:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute("SELECT count(*) FROM measurements").fetchone()[0]


@pytest.fixture
def gpu(monkeypatch, request):
    """This machine's GPU (an H200, or with parameter "m5" an M5 Max, which contribute measures in one process),
    timed by the double."""
    from zmlx_pipeline.data import detect
    from zmlx_pipeline.pipeline import collect as stage

    device = _device(getattr(request, "param", "h200"))
    monkeypatch.setattr(detect, "detect_device", lambda: device)
    monkeypatch.setattr(stage, "GpuMeasurer", lambda backend, settings: _stopping_after(3))


@pytest.mark.parametrize("as_json", [False, True])
def test_collect_stopped_by_ctrl_c_says_what_it_saved_and_exits_non_zero(gpu, tmp_path, as_json):
    db = tmp_path / "s.duckdb"
    result = CliRunner().invoke(cli, ["collect", "--db", str(db), "-k", "rmsnorm", "--dtypes", "float16",
                                      "--preset", "smoke", *(["--json"] if as_json else [])])
    assert result.exit_code == 1, result.output
    assert result.output.rstrip().endswith("Aborted!") and "Traceback" not in result.output
    assert ('"stopped": "interrupted"' if as_json else "stopped: interrupted") in result.output
    assert _rows(db) == 3  # the three measured before the stop are kept; the next collect resumes after them


@pytest.mark.parametrize("gpu", ["m5"], indirect=True)
def test_contribute_stopped_by_ctrl_c_writes_no_shard_and_keeps_what_it_measured(gpu, tmp_path):
    db, out = tmp_path / "s.duckdb", tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(cli, ["contribute", "--db", str(db), "--out", str(out), "--budget", "1m"])
    assert result.exit_code == 1, result.output
    assert result.output.rstrip().endswith("Aborted!") and "Traceback" not in result.output
    assert list(out.iterdir()) == []  # no shard of a run cut short
    assert _rows(db) == 3
