"""`zmlx-pipeline report` through click: the committed H200 smoke shard, and one-line errors."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.data.shards import ingest_shards
from zmlx_pipeline.data.store import Store, default_db_path
from zmlx_pipeline.pipeline.cli import cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from report_fixtures import fill_store  # noqa: E402

# a small real shard: the H200 at 32 SMs, thin grid (8 rmsnorm shapes), up to 12 configs a shape
SMOKE = Path(__file__).resolve().parents[2] / "data" / "nvidia-h100-sxm-32sm.parquet"


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny fits run faster on one OpenMP thread, and a busy machine does not oversubscribe."""
    from threadpoolctl import threadpool_limits

    import zmlx_pipeline.models.variants  # noqa: F401  (loads OpenMP, so the limit has a library to hold)

    with threadpool_limits(1):
        yield


@pytest.fixture
def smoke_db(tmp_path) -> Path:
    """A real shard (the H100 at 32 SMs) ingested into the default store."""
    if not SMOKE.exists():
        pytest.skip(f"{SMOKE} not present")
    with Store(default_db_path()) as store:
        ingest_shards(store, [SMOKE])
    return default_db_path()


def test_report_on_the_smoke_shard(smoke_db, tmp_path):
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", "--out", str(out), "--kernel", "rmsnorm", "--heatmaps", "1", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)  # progress goes to stderr, so stdout stays JSON
    progress = result.stderr.splitlines()
    assert progress and all(line.startswith("... report: ") for line in progress), progress
    folds = [line for line in progress if re.search(r"rmsnorm fold \d scored in [\d.]+ s \(\d/\d\)", line)]
    assert len(folds) >= 2 and all(re.search(r"\d+:\d\d elapsed, (about \d+:\d\d left|done)$", f) for f in folds)
    assert "left" in folds[0] and folds[-1].endswith("done")
    assert summary["split"] == "shapes" and summary["kernels"] == ["rmsnorm"]
    assert summary["cases"] == 24  # eight shapes x three dtypes on one device, each held out once
    assert sorted(summary["figures"]) == ["heatmap_rmsnorm_1.png", "predicted_vs_measured.png", "regret_curves.png"]
    assert sorted(p.name for p in out.glob("*.png")) == sorted(summary["figures"])
    page = (out / "index.html").read_text(encoding="utf-8")
    assert all(f"src='{name}'" in page for name in summary["figures"])
    scores = json.loads((out / "scores.json").read_text())
    from zmlx_pipeline.models.variants import DEFAULT_MODEL

    assert {r["method"] for r in scores["results"]} >= {DEFAULT_MODEL, "chip_default"}
    plain = CliRunner().invoke(cli, ["report", "--out", str(out), "-k", "rmsnorm", "--heatmaps", "0"])
    assert plain.exit_code == 0 and plain.stdout.startswith(f"wrote {out / 'index.html'}: 2 figures")


@pytest.mark.parametrize("args, message", [
    (["--split", "devices"], "Error: no held-out cases under --split devices: it needs two devices that measured the "
                             "same kernel (try --split shapes)"),
    (["--split", "lodo"], "Error: no held-out cases under --split devices: it needs two devices that measured the "
                          "same kernel (try --split shapes)"),  # evaluate's alias, read as devices
    (["--kernel", "nope"], "Error: no ok measurements of kernel(s) nope"),
    (["--model", "nope"], "Error: unknown model 'nope'"),
])
def test_bad_requests_are_one_line_errors(smoke_db, tmp_path, args, message):
    result = CliRunner().invoke(cli, ["report", "--out", str(tmp_path / "r"), *args])
    assert result.exit_code == 1
    assert result.output.startswith(message) and result.output.count("\n") == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_empty_store_missing_store_and_unwritable_out(store, tmp_path):
    runner = CliRunner()
    empty = runner.invoke(cli, ["report", "--out", str(tmp_path / "r")])
    assert empty.exit_code == 1 and empty.output.startswith("Error: the store has no ok measurements")
    missing = runner.invoke(cli, ["report", "--db", str(tmp_path / "nowhere.duckdb"), "--out", str(tmp_path / "r")])
    assert missing.exit_code == 1 and missing.output.startswith("Error: ") and missing.output.count("\n") == 1
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    unwritable = runner.invoke(cli, ["report", "--out", str(blocker / "sub")])
    assert unwritable.exit_code == 1
    assert unwritable.output.startswith(f"Error: cannot write the report to {blocker / 'sub'}")
    assert unwritable.output.count("\n") == 1
    bad_split = runner.invoke(cli, ["report", "--out", str(tmp_path / "r"), "--split", "random"])
    assert bad_split.exit_code == 2 and "'random' is not one of 'shapes', 'devices', 'lodo'" in bad_split.output


def test_report_into_a_folder_of_the_users_files_is_refused_in_one_line_and_changes_nothing(smoke_db, tmp_path):
    """A user's own index.html and scores.json are never replaced: one line naming the folder and the fix, before
    any work, exit 1, both files as they were."""
    site = tmp_path / "mysite"
    site.mkdir()
    (site / "index.html").write_text("<h1>my own page</h1>\n")
    (site / "scores.json").write_text('{"mine": true}\n')
    result = CliRunner().invoke(cli, ["report", "--out", str(site), "-k", "rmsnorm", "--heatmaps", "0"])
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.output == (f"Error: cannot write the report to {site}: it holds other files (e.g. index.html), which "
                             "the report's index.html, scores.json and figures would replace or sit among; pass --out "
                             "a new or empty directory, or one an earlier report wrote\n")
    assert sorted(p.name for p in site.iterdir()) == ["index.html", "scores.json"]
    assert (site / "index.html").read_text() == "<h1>my own page</h1>\n"
    assert (site / "scores.json").read_text() == '{"mine": true}\n'


# -- --heatmaps: as many as asked, one per held-out case; a folder written again holds only the new report's figures

@pytest.fixture
def one_device_db() -> Path:
    """The report tests' kernel (rowk) on one device: four shapes, so four held-out cases under --split shapes."""
    with Store(default_db_path()) as store:
        fill_store(store, devices=("nvidia-rtx-a4000",))
    return default_db_path()


def _figures(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("*.png"))


def test_report_draws_the_heatmaps_asked_one_per_case_and_says_why_fewer(one_device_db, tmp_path):
    """`--heatmaps 5` and `--heatmaps 10` drew two heatmaps without a word: the cases chosen stopped at the model's
    worst and median one."""
    before = one_device_db.read_bytes()
    out = tmp_path / "rep"
    three = CliRunner().invoke(cli, ["report", "--out", str(out), "--heatmaps", "3"])
    assert three.exit_code == 0, three.output
    assert three.stdout.splitlines() == [f"wrote {out / 'index.html'}: 5 figures, 4 held-out cases of 1 kernel(s), "
                                         "split shapes; open it in a browser"]
    assert _figures(out) == ["heatmap_rowk_1.png", "heatmap_rowk_2.png", "heatmap_rowk_3.png",
                             "predicted_vs_measured.png", "regret_curves.png"]
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "worst held-out case" in page and "best held-out case" in page
    for asked in ("5", "10"):
        more = CliRunner().invoke(cli, ["report", "--out", str(out), "--heatmaps", asked])
        assert more.exit_code == 0, more.output
        assert more.stdout.splitlines()[1:] == [f"heatmaps: fewer than the {asked} asked per kernel: rowk 4 (4 "
                                                "held-out cases of more than one config, a heatmap each)"]
        assert [n for n in _figures(out) if n.startswith("heatmap_")] == [f"heatmap_rowk_{i}.png" for i in (1, 2, 3, 4)]
    as_json = CliRunner().invoke(cli, ["report", "--out", str(out), "--heatmaps", "5", "--json"])
    assert json.loads(as_json.stdout)["heatmaps"] == {
        "asked_per_kernel": 5, "drawn": {"rowk": 4},
        "fewer": {"rowk": "4 held-out cases of more than one config, a heatmap each"}}
    assert one_device_db.read_bytes() == before  # the store is read, never written


def test_report_help_says_how_heatmaps_are_chosen():
    result = CliRunner().invoke(cli, ["report", "--help"])
    help_text = re.sub(r"-\s+", "-", " ".join(result.output.split()))  # click may wrap a line after a hyphen
    assert result.exit_code == 0 and "one per held-out case" in help_text


def test_a_report_written_again_leaves_none_of_the_earlier_figures_and_keeps_the_users_files(one_device_db, tmp_path):
    """`report --out rep --heatmaps 0` after a report with heatmaps left its heatmap_*.png beside the new page."""
    out = tmp_path / "rep"
    first = CliRunner().invoke(cli, ["report", "--out", str(out), "--heatmaps", "2"])
    assert first.exit_code == 0, first.output
    assert "heatmap_rowk_2.png" in _figures(out)
    (out / "notes.txt").write_text("mine\n")
    (out / "photo.png").write_bytes(b"not the report's\n")
    again = CliRunner().invoke(cli, ["report", "--out", str(out), "--heatmaps", "0"])
    assert again.exit_code == 0, again.output
    assert again.stdout.splitlines() == [f"wrote {out / 'index.html'}: 2 figures, 4 held-out cases of 1 kernel(s), "
                                         "split shapes; open it in a browser"]
    assert _figures(out) == ["photo.png", "predicted_vs_measured.png", "regret_curves.png"]
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "photo.png").read_bytes() == b"not the report's\n"
    assert "heatmap_" not in (out / "index.html").read_text(encoding="utf-8")


def test_an_older_reports_folder_loses_the_figures_named_as_a_reports_only(one_device_db, tmp_path):
    """A folder whose marker lists no figures (a report before the list): a file named as a report's figure is the
    earlier report's; any other file stays."""
    from zmlx_pipeline.report.build import REPORT_MARKER

    out = tmp_path / "rep"
    out.mkdir()
    (out / REPORT_MARKER).write_text("written by zmlx-pipeline report: a later report may replace the files here\n")
    for name in ("heatmap_rowk_1.png", "heatmap_rowk_7.png", "photo.png", "heatmap.png"):
        (out / name).write_bytes(b"x")
    result = CliRunner().invoke(cli, ["report", "--out", str(out), "--heatmaps", "0"])
    assert result.exit_code == 0, result.output
    assert _figures(out) == ["heatmap.png", "photo.png", "predicted_vs_measured.png", "regret_curves.png"]
