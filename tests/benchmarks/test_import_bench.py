"""benchmarks/import_bench.py: the synthetic cache it times imports completely, closed or left open."""

from __future__ import annotations

import json

from bench_scripts import load


def test_both_layouts_import_every_entry(tmp_path, capsys):
    bench = load("import_bench")
    results = bench.main(["--entries", "300", "--repetitions", "3"])
    assert [(r["layout"], r["rows"]) for r in results] == [("closed", 300), ("left open", 300)]
    assert all(r["wall_s"] > 0 and r["peak_mb"] > 0 for r in results)
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_the_open_cache_ends_as_a_stopped_run_leaves_it(tmp_path):
    bench = load("import_bench")
    path = tmp_path / "open.json"
    bench.write_cache(path, 3, 2, closed=False)
    assert path.read_text().endswith("},\n")
    closed = tmp_path / "closed.json"
    bench.write_cache(closed, 3, 2, closed=True)
    assert len(json.loads(closed.read_text())["cache"]) == 3
