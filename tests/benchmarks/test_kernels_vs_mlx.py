"""benchmarks/kernels_vs_mlx.py: the best config for each value of one parameter (`--by`)."""

from __future__ import annotations

from types import SimpleNamespace
from bench_scripts import load as load_script


kvm = load_script("kernels_vs_mlx")


def outcome(us: float):
    return SimpleNamespace(timing=SimpleNamespace(median_us=us))


def test_best_by_keeps_the_fastest_config_of_each_value():
    ok = [
        ({"TG": 256, "CACHE": 0}, outcome(12.0)),
        ({"TG": 512, "CACHE": 0}, outcome(9.5)),
        ({"TG": 512, "CACHE": 2}, outcome(11.0)),
        ({"TG": 1024, "CACHE": 2}, outcome(14.0)),
        ({"TG": 128, "CACHE": 1}, outcome(30.0)),
    ]
    best = kvm.best_by(ok, "CACHE")
    assert list(best) == ["0", "1", "2"]
    assert best["0"] == {"config": {"TG": 512, "CACHE": 0}, "us": 9.5}
    assert best["1"]["us"] == 30.0
    assert best["2"]["config"] == {"TG": 512, "CACHE": 2}


def test_best_by_a_parameter_the_configs_lack_groups_them_under_none():
    best = kvm.best_by([({"TG": 64}, outcome(3.0)), ({"TG": 32}, outcome(2.0))], "CACHE")
    assert best == {"None": {"config": {"TG": 32}, "us": 2.0}}
