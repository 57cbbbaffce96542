"""tools/relabel_kernel_versions.py: CUDA rows move to the current version only where the CUDA program is unchanged."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from zmlx_pipeline.data.shards import export_shard
from zmlx_pipeline.data.store import Store

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "relabel_kernel_versions.py"
_spec = importlib.util.spec_from_file_location("relabel_kernel_versions", SCRIPT)
tool = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = tool  # its dataclass looks its module up there
_spec.loader.exec_module(tool)

GPU, MAC = "nvidia-h100-sxm", "apple-m3-max-40"
OLD, NEW = "sha256:00000000old1", "sha256:00000000new1"  # softmax: only its Metal program changed
OLD_MM, NEW_MM = "sha256:00000000old2", "sha256:00000000new2"  # matmul: its CUDA source changed too


def program(version: str, cuda_source: str, metal: str) -> dict:
    return {"version": version, "metal_sha256": metal,
            "cuda": {"header": "// cuda prelude", "source": cuda_source, "template": ["T", "TG"]}}


PROGRAMS = {
    "REV": {"softmax": program(OLD, "body", "metal-v1"), "matmul": program(OLD_MM, "mma v1", "metal-v1")},
    None: {"softmax": program(NEW, "body", "metal-v2"), "matmul": program(NEW_MM, "mma v2", "metal-v2")},
}


def lookup(rev):
    return PROGRAMS[rev]


def add_device(store: Store, make_measurement, device: str, backend: str) -> str:
    """One device with softmax and matmul rows at the old versions; returns the run id."""
    store.upsert_device({"device_id": device, "name": "NVIDIA H100 SXM5 80GB" if device == GPU else device.upper(),
                         "vendor": "nvidia" if backend == "cuda" else "apple", "backend": backend,
                         "in_catalog": True, "reported": {"device_name": device}})
    run = store.start_run(device, host="h", backend=backend, mlx_version="0.29.1", pipeline_version="0.1.0",
                          settings={})
    shapes = {"softmax": {"rows": 64, "cols": 4096}, "matmul": {"M": 64, "N": 4096, "K": 4096}}  # their own dims
    store.record([make_measurement(run_id=run, device_id=device, kernel=kernel, kernel_version=version,
                                   shape=shapes[kernel], config={"TG": tg}, median_us=float(tg),
                                   p10_us=0.95 * tg, p90_us=1.1 * tg)
                  for kernel, version in (("softmax", OLD), ("matmul", OLD_MM)) for tg in (64, 128)])
    store.finish_run(run, "finished")
    return run


@pytest.fixture
def shard(store, make_measurement, tmp_path) -> Path:
    """A shard of a CUDA and a Metal device, with a repeated timing of one CUDA softmax row."""
    add_device(store, make_measurement, GPU, "cuda")
    add_device(store, make_measurement, MAC, "metal")
    repeat_run = store.start_run(GPU, host="h", backend="cuda", mlx_version="0.29.1", pipeline_version="0.1.0",
                                 settings={})
    store.record_repeat([make_measurement(run_id=repeat_run, device_id=GPU, kernel="softmax", kernel_version=OLD,
                                          config={"TG": 64}, median_us=66.0, p10_us=65.0, p90_us=67.0)])
    path = tmp_path / "data" / "all.parquet"
    assert export_shard(store, path) == 8
    return path


def versions(path: Path) -> list[tuple[str, str, str]]:
    return [(r["device_backend"], r["kernel"], r["kernel_version"])
            for r in pq.read_table(path, columns=["device_backend", "kernel", "kernel_version"]).to_pylist()]


def test_relabels_cuda_rows_of_an_unchanged_cuda_program_and_keeps_everything_else(shard, tmp_path, capsys):
    before = pq.read_table(shard)
    meta_before = pq.read_metadata(shard).metadata

    assert tool.main(["--from-rev", "REV", str(shard)], lookup=lookup) == 0
    out = capsys.readouterr().out
    assert "relabelled 2" in out and "left alone: CUDA program differs in source" in out

    expected = [(b, k, NEW if (b, k) == ("cuda", "softmax") else v) for b, k, v in
                ((r["device_backend"], r["kernel"], r["kernel_version"]) for r in before.to_pylist())]
    assert versions(shard) == expected  # same row order; Metal softmax and CUDA matmul keep their versions
    assert ("metal", "softmax", OLD) in expected and ("cuda", "matmul", OLD_MM) in expected
    after = pq.read_table(shard)
    rest = [c for c in before.column_names if c != "kernel_version"]
    assert after.schema == before.schema and after.select(rest).equals(before.select(rest))
    meta = pq.read_metadata(shard)
    assert {k: v for k, v in meta.metadata.items() if k != b"ARROW:schema"} == meta_before
    assert {meta.row_group(0).column(i).compression for i in range(meta.num_columns)} == {"ZSTD"}
    assert [p.name for p in shard.parent.iterdir()] == ["all.parquet"]  # no temporary file left

    # the repeated timing goes with its row: ingested, it belongs to the current version
    with Store(tmp_path / "central.duckdb") as central:
        central.ingest_shard(shard)
        assert [(r["kernel_version"], r["median_us"]) for r in central.repeats(device=GPU)] == [(NEW, 66.0)]
        assert {r["kernel_version"] for r in central.measurements(device=MAC)} == {OLD, OLD_MM}


def test_a_second_run_changes_nothing(shard, capsys):
    assert tool.main(["--from-rev", "REV", str(shard)], lookup=lookup) == 0
    data = shard.read_bytes()
    capsys.readouterr()
    assert tool.main(["--from-rev", "REV", "--json", str(shard)], lookup=lookup) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["shards"] == [{"path": str(shard), "rows": 8, "relabelled": 0, "already_at_new_version": 0,
                                 "written": False}]
    assert shard.read_bytes() == data
    assert tool.main(["--from-rev", "REV", "--check", str(shard)], lookup=lookup) == 0


def test_check_writes_nothing_and_exits_1_when_rows_would_move(shard, capsys):
    data = shard.read_bytes()
    assert tool.main(["--from-rev", "REV", "--check", "--json", str(shard)], lookup=lookup) == 1
    report = json.loads(capsys.readouterr().out)
    assert shard.read_bytes() == data
    assert report["shards"][0]["relabelled"] == 2 and report["shards"][0]["written"] is False
    kernels = {k["kernel"]: k for k in report["kernels"]}
    assert kernels["softmax"]["action"] == "relabel" and kernels["softmax"]["metal_changed"] is True
    assert kernels["matmul"]["action"] == "cuda_changed" and kernels["matmul"]["differs"] == ["source"]


def test_a_key_timed_again_at_the_new_version_keeps_that_timing(store, make_measurement, tmp_path):
    run = add_device(store, make_measurement, GPU, "cuda")
    store.record([make_measurement(run_id=run, device_id=GPU, kernel="softmax", kernel_version=NEW,
                                   config={"TG": 64}, median_us=60.0, p10_us=59.0, p90_us=61.0)])
    path = tmp_path / "gpu.parquet"
    export_shard(store, path)
    report = tool.run("REV", [path], check=False, lookup=lookup)
    assert report["shards"][0]["relabelled"] == 1 and report["shards"][0]["already_at_new_version"] == 1
    rows = pq.read_table(path).to_pylist()
    timed = sorted((r["kernel_version"], r["median_us"]) for r in rows if r["kernel"] == "softmax")
    assert timed == [(NEW, 60.0), (NEW, 128.0), (OLD, 64.0)]  # TG 64's old timing stays at the old version
    with Store(tmp_path / "central.duckdb") as central:
        assert central.ingest_shard(path)["added"] == 5


def test_plan_names_kernels_found_on_one_side_only_and_unchanged_versions():
    old = {"a": program("v1", "x", "m"), "b": program("v2", "x", "m")}
    new = {"a": program("v1", "x", "m"), "c": program("v3", "x", "m")}
    assert [(p.kernel, p.action) for p in tool.plan(old, new)] == [
        ("a", "same_version"), ("b", "only_at_rev"), ("c", "only_now")]


def test_a_file_that_is_not_a_shard_is_refused_before_any_shard_is_written(shard, tmp_path, capsys):
    import pyarrow as pa

    other = tmp_path / "data" / "other.parquet"
    pq.write_table(pa.table({"kernel": ["softmax"]}), other)
    data = shard.read_bytes()
    assert tool.main(["--from-rev", "REV", str(shard), str(other)], lookup=lookup) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {other}: not a zmlx-pipeline shard") and "\n" not in err
    assert shard.read_bytes() == data


def _has_commit(rev: str) -> bool:
    try:
        return subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{rev}^{{commit}}"],
                              capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not (_has_commit("c42107e") and _has_commit("c4c21dc")),
                    reason="needs the repository's git history (c42107e and c4c21dc)")
def test_the_metal_prelude_v2_commit_changed_every_version_and_no_cuda_program():
    before, after = tool.kernel_programs("c42107e"), tool.kernel_programs("c4c21dc")
    assert before["rmsnorm"]["version"] == "sha256:fa43a6a85498"  # as the committed H100 timings had it
    assert [(p.kernel, p.action, p.metal_changed) for p in tool.plan(before, after)] == [
        (name, "relabel", True) for name in sorted(before)]
    with pytest.raises(tool.RelabelError, match="cannot read revision 'no-such-revision'"):
        tool.kernel_programs("no-such-revision")


def test_this_checkout_reads_as_the_installed_kernels():
    from zmlx_pipeline.kernels.registry import builtin_kernels

    now = tool.kernel_programs(None)
    assert {name: p["version"] for name, p in now.items()} == {s.name: s.version for s in builtin_kernels()}
    assert now["matmul"]["cuda"]["source"] == builtin_kernels()[-1].source("cuda")
