"""The CLI through click's CliRunner: exact JSON shapes, one-line errors with non-zero exits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.pipeline.cli import cli


def invoke(*args):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def filled(store, make_measurement, tmp_path):
    """A store with two devices' worth of measurements, one shape all failed, timed on 2026-03-05 and 2026-03-07."""
    from datetime import datetime

    store.upsert_device({"device_id": "nvidia-h200", "name": "NVIDIA H200 SXM 141GB", "vendor": "nvidia"})
    ms = [
        make_measurement(device_id="nvidia-h200", kernel="rmsnorm", shape={"rows": 1, "cols": 512}, config={"TG": 32},
                         measured_at=datetime(2026, 3, 7, 7, 19, 6)),
        make_measurement(device_id="nvidia-h200", kernel="rmsnorm", shape={"rows": 1, "cols": 512}, config={"TG": 64},
                         status="launch_error", error="x", measured_at=datetime(2026, 3, 5, 9, 4, 43)),
        make_measurement(device_id="nvidia-h200", kernel="rmsnorm", shape={"rows": 8, "cols": 512}, config={"TG": 32},
                         status="wrong_result", error="y", measured_at=datetime(2026, 3, 6)),
    ]
    store.record(ms)
    return store


def test_devices_json_lists_the_catalog_and_the_current_device():
    result = invoke("devices", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    non_apple = [d for d in data["devices"] if d["vendor"] != "apple"]
    assert len(non_apple) >= 40
    ids = {d["id"] for d in data["devices"]}
    assert {"apple-m3-max-30c", "apple-m3-max-40c", "apple-m4-max-32c", "apple-m1-ultra-48c"} <= ids
    assert data["current"]["backend"] in ("cpu", "cuda", "metal")
    assert sum(d["current"] for d in data["devices"]) <= 1


def test_devices_table_marks_nothing_on_a_cpu_machine_and_says_so():
    result = invoke("devices", "--vendor", "nvidia")
    assert result.exit_code == 0
    assert "current device:" in result.output
    assert "apple-m1" not in result.output


def test_summary_json_rows_have_the_documented_keys(filled):
    filled.close()
    result = invoke("summary", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row == {"device": "nvidia-h200", "kernel": "rmsnorm", "dtype": "float16", "measurements": 3,
                   "by_status": {"ok": 1, "wrong_result": 1, "launch_error": 1}, "shapes": 2, "shapes_ok": 1,
                   "first_measured_at": "2026-03-05T09:04:43Z", "last_measured_at": "2026-03-07T07:19:06Z"}


def test_summary_says_on_which_days_the_rows_were_timed(filled):
    filled.close()
    result = invoke("summary")
    assert result.exit_code == 0, result.output
    header, _, row = result.output.splitlines()
    assert header.split() == ["device", "kernel", "dtype", "measurements", "by_status", "shapes", "shapes_ok",
                              "measured"]
    assert row.split()[-1] == "2026-03-05..2026-03-07"


@pytest.mark.parametrize("device", ["NVIDIA-H200", "NVIDIA H200", "H200", " nvidia-h200"])
def test_summary_and_export_read_a_device_as_people_write_it_as_lookup_does(filled, tmp_path, device):
    filled.close()
    result = invoke("summary", "--json", "--device", device)
    assert result.exit_code == 0, result.output
    assert [row["device"] for row in json.loads(result.output)] == ["nvidia-h200"]
    result = invoke("export", "--device", device, str(tmp_path / "h200.parquet"))
    assert result.exit_code == 0 and "wrote 3 measurements" in result.output, result.output
    result = invoke("summary", "--device", "NVIDIA H100")  # a chip the store does not hold: still refused
    assert result.exit_code == 1 and "no measurements of device 'NVIDIA H100'" in result.output


def test_export_then_ingest_into_another_store(filled, tmp_path):
    filled.close()
    shard = tmp_path / "h200.parquet"
    assert invoke("export", str(shard)).exit_code == 0
    other = tmp_path / "other.duckdb"
    first = invoke("ingest", "--db", str(other), str(shard), "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.output)["added"] == 3
    again = invoke("ingest", "--db", str(other), str(shard), "--json")
    assert json.loads(again.output)["added"] == 0


def test_ingest_of_a_bad_file_is_one_line_and_changes_nothing(filled, tmp_path):
    filled.close()
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    result = invoke("ingest", str(bad))
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1
    assert "bad.parquet" in result.output
    assert json.loads(invoke("summary", "--json").output)[0]["measurements"] == 3


def test_corrupt_database_is_a_clear_error(tmp_path):
    db = tmp_path / "corrupt.duckdb"
    db.write_bytes(b"\x00garbage" * 100)
    result = invoke("summary", "--db", str(db))
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1
    assert "Traceback" not in result.output


def test_collect_without_a_gpu_backend_says_so_in_one_line(gpu_backend):
    if gpu_backend != "cpu":
        pytest.skip("this machine has a GPU backend")
    result = invoke("collect", "-k", "rmsnorm")
    assert result.exit_code == 1
    assert result.output.startswith("Error: no Metal or CUDA backend")
    assert result.output.count("\n") == 1


def test_collect_rejects_a_bad_budget():
    result = invoke("collect", "--budget", "soon")
    assert result.exit_code == 2
    assert "use e.g. 90s, 10m or 1.5h" in result.output


def test_unknown_kernel_is_a_one_line_error():
    result = invoke("kernels", "-k", "nope")
    assert result.exit_code == 1
    assert result.output.startswith("Error: unknown kernel 'nope'")


REPO_DATA = Path(__file__).resolve().parents[2] / "data"


def _two_shards(tmp_path: Path) -> Path:
    """A data directory holding two committed shards (the H100 at 66 and 32 SMs)."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("nvidia-h100-sxm-66sm.parquet", "nvidia-h100-sxm-32sm.parquet"):
        if not (REPO_DATA / name).exists():
            pytest.skip(f"data/{name} not present")
        shutil.copy(REPO_DATA / name, data / name)
    return data


def test_run_is_the_whole_loop_on_real_shards(tmp_path):
    """Two committed shards (the H100 at 66 and 32 SMs), rmsnorm only: ingest, train, both splits, publish, look up."""
    data = _two_shards(tmp_path)
    bundles = tmp_path / "bundles"
    result = invoke("run", "--db", str(tmp_path / "fresh.duckdb"), "--data", str(data), "--bundle-dir", str(bundles),
                    "-k", "rmsnorm", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)  # progress lines go to stderr
    assert out["ingest"]["files"] == 2 and out["ingest"]["added"] > 500
    assert [t["kernel"] for t in out["train"]] == ["rmsnorm"] and out["train"][0]["prune_k"] >= 1
    splits = {(s["split"], s["kernel"]) for s in out["scores"]}
    assert splits == {("shapes", "rmsnorm"), ("devices", "rmsnorm")}
    for s in out["scores"]:
        assert s["model@1"] >= s["model@3"] >= s["model@5"] >= 1.0 and s["cases"] > 0
    assert (Path(out["bundle"]["path"]) / "manifest.json").is_file()
    by_kernel = {(r["kernel"], r["device"]): r for r in out["lookups"]}
    assert by_kernel[("rmsnorm", "nvidia-h100-sxm")]["evidence"] in ("predicted", "default")
    assert by_kernel[("softmax", "nvidia-h200")]["evidence"] == "default"  # not trained here: says so
    assert all(r["config"] for r in out["lookups"])
    # every device the main job asks about is a catalog chip, and an Apple chip says how far the answer travelled
    from zmlx_pipeline.data.catalog import get_device

    assert all(get_device(r["device"].split("@")[0]) for r in out["lookups"])
    apple = [r for (kernel, device), r in by_kernel.items() if device.startswith("apple-")]
    assert apple and all(r["evidence"] == "extrapolated" and r["expected_regret"] is None for r in apple)


def test_run_trains_and_scores_the_model_it_is_given(tmp_path):
    """`run --model robust_fast`: that variant is registered and both splits are its own recorded cases."""
    data = _two_shards(tmp_path)
    db = tmp_path / "fresh.duckdb"
    result = invoke("run", "--db", str(db), "--data", str(data), "--bundle-dir", str(tmp_path / "b"), "-k", "rmsnorm",
                    "--model", "robust_fast", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["model"] == "robust_fast"
    assert {(s["split"], s["kernel"]) for s in out["scores"]} == {("shapes", "rmsnorm"), ("devices", "rmsnorm")}
    from zmlx_pipeline.data.store import Store

    with Store(db, read_only=True) as store:
        assert [r["params"]["model"] for r in store.models(kernel="rmsnorm")] == ["robust_fast"]


def test_run_with_an_unknown_model_is_refused_before_anything_is_stored(tmp_path):
    db = tmp_path / "s.duckdb"
    result = invoke("run", "--db", str(db), "--data", str(REPO_DATA), "--bundle-dir", str(tmp_path / "b"),
                    "--model", "robust_fats")
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if not line.startswith("... ")]
    assert len(lines) == 1 and lines[0].startswith("Error: unknown model 'robust_fats'; expected one of ")
    assert "robust_fast" in lines[0]
    assert not db.exists() and not (tmp_path / "b").exists()


def test_run_on_an_empty_data_directory_is_a_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()
    result = invoke("run", "--db", str(tmp_path / "s.duckdb"), "--data", str(tmp_path / "empty"),
                    "--bundle-dir", str(tmp_path / "b"))
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if not line.startswith("... ")]  # progress on stderr
    assert len(errors) == 1 and "empty: no .parquet shard in this directory" in errors[0], result.output



def test_noise_without_repeats_is_a_one_line_error(store):
    store.close()
    result = invoke("noise")
    assert result.exit_code == 1
    assert result.output.startswith("Error: no repeated timings in the store") and result.output.count("\n") == 1


def test_repeat_without_a_gpu_is_a_one_line_error():
    result = invoke("repeat", "-k", "rmsnorm")
    assert result.exit_code == 1
    assert result.output.startswith("Error: no Metal or CUDA backend") and result.output.count("\n") == 1



@pytest.mark.parametrize("cores, kernel, says", [
    (132, "rmsnorm", "of nvidia-h200 to repeat in {db} (it has nvidia-h200@32sm): run `zmlx-pipeline collect` on "
                     "this GPU first"),
    (32, "softmax", "of softmax on nvidia-h200@32sm to repeat in {db} (it has rmsnorm): collect those kernels first"),
])
def test_repeat_with_nothing_of_this_gpu_or_kernel_is_one_line_and_changes_nothing(store, monkeypatch, cores,
                                                                                   kernel, says):
    """Not "0 of 0 repeated" and exit 0: a store of other GPUs' (or other kernels') data has nothing to repeat."""
    from fake_collect import fake_measurer  # the collect tests' GPU double

    from zmlx_pipeline.data import detect
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.pipeline import collect as stage

    def h200(sms):
        return detect.detect_device({"device_name": "NVIDIA H200", "architecture": "sm_90"}, backend="cuda",
                                    gpu_cores=sms)

    stage.collect(store, h200(32), [get_kernel("rmsnorm")], dtypes=["float16"], preset="smoke",
                  measurer=fake_measurer(0.0), configs_limit=2)
    store.close()
    before = store.path.read_bytes()
    this_gpu = h200(cores)
    monkeypatch.setattr(detect, "detect_device", lambda: this_gpu)
    monkeypatch.setattr(stage, "GpuMeasurer", lambda backend, settings: fake_measurer(0.0))
    result = invoke("repeat", "-k", kernel, "--fraction", "1")
    assert result.exit_code == 1, result.output
    assert result.output == f"Error: no ok measurements {says.format(db=store.path)}\n"
    assert store.path.read_bytes() == before

def test_ingest_of_a_directory_with_one_bad_shard_is_one_line_and_changes_nothing(filled, tmp_path):
    import duckdb

    shards = tmp_path / "shards"
    filled.export_shard(shards / "good.parquet")
    con = duckdb.connect()
    con.execute(
        "COPY (SELECT * REPLACE (CASE WHEN status = 'ok' THEN -1.0 ELSE median_us END AS median_us) "
        f"FROM read_parquet(?)) TO '{shards / 'neg.parquet'}' (FORMAT parquet)", [str(shards / "good.parquet")],
    )
    con.close()
    db = str(tmp_path / "central.duckdb")
    result = invoke("ingest", "--db", db, str(shards))
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "neg.parquet, row " in lines[0], lines
    assert "an ok row needs a finite positive median_us, not -1.0; nothing was ingested" in lines[0]
    assert not Path(db).exists()  # good.parquet did not go in, and the store this ingest created is gone again


@pytest.mark.parametrize("command", [("summary",), ("ingest", "DATA"), ("collect", "-k", "rmsnorm")])
def test_a_db_path_under_a_regular_file_is_one_line(tmp_path, command):
    (tmp_path / "plain").write_text("x")
    args = [a if a != "DATA" else str(tmp_path) for a in command]
    result = invoke(*args, "--db", str(tmp_path / "plain" / "store.duckdb"))
    assert result.exit_code == 1 and result.exception is None or isinstance(result.exception, SystemExit), result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.output
    assert "Traceback" not in result.output


def test_export_under_a_regular_file_is_one_line_and_writes_nothing(filled, tmp_path):
    (tmp_path / "plain").write_text("x")
    result = invoke("export", "--db", str(filled.path), str(tmp_path / "plain" / "out.parquet"))
    assert result.exit_code == 1, result.output
    assert result.output.strip() == (f"Error: cannot put the shard at {tmp_path / 'plain' / 'out.parquet'}: "
                                     f"{tmp_path / 'plain'} is a file, not a directory; choose another path")
    assert (tmp_path / "plain").read_text() == "x"
