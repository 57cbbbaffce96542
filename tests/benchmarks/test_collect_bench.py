"""benchmarks/collect_bench.py without a GPU: its arithmetic, its arguments, and a clean exit off CUDA."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench_scripts import load as load_script, script_path

bench = load_script("collect_bench")


def test_throughput_is_configs_per_minute():
    assert bench.throughput(90, 45.0) == 120.0
    assert bench.throughput(0, 0.0) is None


def test_gpu_counts_are_read_and_checked():
    assert bench.parse_args(["--gpus", "4,1,2,2"]).counts == [1, 2, 4]
    with pytest.raises(SystemExit):
        bench.parse_args(["--gpus", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--gpus", "two"])


def test_without_a_cuda_gpu_it_says_so_in_one_line(gpu_backend, tmp_path):
    if gpu_backend == "cuda":
        pytest.skip("this machine has a CUDA GPU")
    out = subprocess.run([sys.executable, str(script_path("collect_bench")), "--out", str(tmp_path / "res")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no CUDA GPU" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "res").exists()
