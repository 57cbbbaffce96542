"""contribute: collect this machine within a budget, then one shard named after the chip."""

from __future__ import annotations

import datetime as dt
import json
import tomllib
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from fake_collect import fake_measurer  # the collect tests' GPU double

from zmlx_pipeline.data import detect
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.kernels.registry import builtin_kernels, get_kernel
from zmlx_pipeline.pipeline import collect as stage
from zmlx_pipeline.pipeline.cli import cli
from zmlx_pipeline.pipeline.contribute import contribute, shard_name

DETECT = detect.detect_device  # the real one, before a test stands it in for this machine's
FIXTURES = Path(__file__).parents[1] / "data" / "fixtures" / "apple_macs.toml"
M5_MAX = next(m for m in tomllib.loads(FIXTURES.read_text(encoding="utf-8"))["mac"]
              if m["label"].startswith("M5 Max 40-core"))


def _m5_max():
    """The M5 Max as a recorded device_info and ioreg describe it (no GPU needed)."""
    return DETECT(dict(M5_MAX["device_info"]), backend="metal", ioreg=M5_MAX["ioreg"])


def _shard_keys(path: Path) -> list[tuple]:
    return duckdb.sql(f"SELECT device_id, kernel, dtype, shape_key, config_key FROM read_parquet('{path}') "
                      "ORDER BY ALL").fetchall()


def _store_keys(store: Store, device: str) -> list[tuple]:
    return sorted((r["device_id"], r["kernel"], r["dtype"], r["shape_key"], r["config_key"])
                  for r in store.measurements(device=device))


def test_shard_name_is_the_catalog_id_and_the_day():
    assert shard_name("apple-m3-max-40c", dt.date(2026, 3, 11)) == "apple-m3-max-40c-2026-03-11.parquet"
    assert shard_name("nvidia-h100-sxm@66sm", dt.date(2026, 3, 11)) == "nvidia-h100-sxm-66sm-2026-03-11.parquet"


def _small(store, out, device, **kw):
    """One kernel, one dtype, a few configs per shape: the whole path, quickly."""
    return contribute(store, device, out, [get_kernel("rmsnorm")], preset="smoke", dtypes=["float16"],
                      configs_limit=3, measurer=fake_measurer(0.0), **kw)


def test_contribute_writes_every_measurement_of_the_device(store, tmp_path):
    device = _m5_max()
    store.upsert_device({"device_id": "nvidia-h200", "name": "NVIDIA H200 SXM 141GB"})
    made = _small(store, tmp_path / "out", device, budget_s=None, day=dt.date(2026, 3, 11))
    assert made.path == tmp_path / "out" / "apple-m5-max-40c-2026-03-11.parquet" and made.known
    assert made.collected.stopped == "finished" and made.rows == made.collected.done > 0
    assert _shard_keys(made.path) == _store_keys(store, "apple-m5-max-40c")
    assert made.as_dict() == {"path": str(made.path), "rows": made.rows, "bytes": made.path.stat().st_size,
                              "device": "apple-m5-max-40c", "in_catalog": True, "collect": made.collected.as_dict()}
    # a second run measures nothing new and writes the same rows again
    again = _small(store, tmp_path / "out", device, budget_s=None, day=dt.date(2026, 3, 11))
    assert again.collected.done == 0 and again.rows == made.rows


def test_an_unknown_gpu_still_gets_a_shard_under_its_reported_name(store, tmp_path):
    future = DETECT({"device_name": "Apple M6 Max", "architecture": "applegpu_g18s"}, backend="metal", ioreg="")
    made = _small(store, tmp_path, future, budget_s=None, day=dt.date(2027, 1, 2))
    assert made.path.name == "unknown-apple-m6-max-2027-01-02.parquet" and not made.known and made.rows > 0
    (device,) = duckdb.sql(f"SELECT DISTINCT device_flagged_unknown FROM read_parquet('{made.path}')").fetchall()
    assert device == (True,)


def test_contribute_refuses_to_write_an_empty_shard(store, tmp_path):
    # a clock past the budget at once: not even the first case starts
    ticks = iter(range(0, 10_000, 100))
    with pytest.raises(stage.CollectError, match="nothing of apple-m5-max-40c was measured"):
        _small(store, tmp_path, _m5_max(), budget_s=1, clock=lambda: next(ticks))
    assert not list(tmp_path.glob("*.parquet"))


def test_cli_contribute_collects_every_builtin_kernel_and_writes_the_chips_shard(tmp_path, monkeypatch):
    monkeypatch.setattr(detect, "detect_device", lambda: _m5_max())
    monkeypatch.setattr(stage, "GpuMeasurer", lambda backend, settings: fake_measurer(0.0))
    out = tmp_path / "shards"
    result = CliRunner().invoke(cli, ["contribute", "--budget", "1s", "--out", str(out)])
    assert result.exit_code == 0, result.output
    name = f"apple-m5-max-40c-{dt.date.today().isoformat()}.parquet"
    with Store(tmp_path / "store.duckdb", read_only=True) as store:
        keys = _store_keys(store, "apple-m5-max-40c")
        (run,) = store.runs()
    assert _shard_keys(out / name) == keys and len(keys) > 0
    assert run["settings"]["kernels"] == [s.name for s in builtin_kernels()] and run["settings"]["preset"] == "full"
    assert run["settings"]["dtypes"] == ["float16", "bfloat16", "float32"]
    lines = result.output.splitlines()
    planned = int(lines[0].split(": ")[1].split()[0])  # "apple-m5-max-40c: N measurements to make, ..."
    assert planned > len(keys)  # the budget stopped it
    assert lines[-2] == (f"wrote {len(keys)} measurements of apple-m5-max-40c to {out / name} "
                         f"({(out / name).stat().st_size / 1024:.1f} KiB); {planned - len(keys)} left, "
                         "run the same command again to add them")
    assert lines[-1].startswith(f"send {name} to the zmlx-pipeline maintainers")


def test_cli_contribute_without_a_gpu_backend_is_one_line_and_exit_1(tmp_path, monkeypatch):
    cpu = DETECT({"device_name": "Intel Xeon", "architecture": "x86_64"}, backend="cpu")
    monkeypatch.setattr(detect, "detect_device", lambda: cpu)
    result = CliRunner().invoke(cli, ["contribute", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output == ("Error: no Metal or CUDA backend on this machine (MLX runs on the cpu): contribute on "
                             "Apple silicon, or on an NVIDIA GPU with `pip install 'mlx[cuda13]'`\n")
    assert not list(tmp_path.glob("*.parquet")) and not (tmp_path / "store.duckdb").exists()


def test_cli_contribute_rejects_a_bad_budget(tmp_path):
    result = CliRunner().invoke(cli, ["contribute", "--budget", "soon", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "cannot read duration 'soon'" in result.output


def test_cli_contribute_refuses_an_out_under_a_file_before_measuring(tmp_path, monkeypatch):
    monkeypatch.setattr(detect, "detect_device", lambda: _m5_max())
    monkeypatch.setattr(stage, "GpuMeasurer", lambda backend, settings: pytest.fail("measured"))
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    result = CliRunner().invoke(cli, ["contribute", "--budget", "1s", "--out", str(blocker / "shards")])
    assert result.exit_code == 1, result.output
    assert result.output == (f"Error: cannot write the shard into {blocker / 'shards'}: {blocker} is a file, not a "
                             "directory; choose another --out\n")
    assert blocker.read_text() == "x" and not (tmp_path / "store.duckdb").exists()
