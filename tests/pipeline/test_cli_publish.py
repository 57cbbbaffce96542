"""`publish`, `lookup` and `profiles` through click: JSON shapes, tables, one-line errors."""

import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))

from bundle_fixtures import build_toy, fill_toy, latest_dir, reset_runtime, toy_best  # noqa: E402
from zmlx_pipeline.data.store import Store  # noqa: E402
from zmlx_pipeline.pipeline.cli import cli  # noqa: E402


@pytest.fixture(scope="module")
def toy_bundle(tmp_path_factory):
    """(store path, publish dir) of the toy bundle (tests/runtime/bundle_fixtures.py)."""
    return build_toy(tmp_path_factory.mktemp("toy"))


@pytest.fixture(autouse=True)
def fresh_runtime():
    reset_runtime()
    yield
    reset_runtime()


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_publish_writes_a_version_and_latest(tmp_path):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        fill_toy(store)
    result = run("publish", "--db", str(db), "--to", str(tmp_path / "out"), "--device", "nvidia-h200", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # progress goes to stderr, so stdout stays JSON
    assert data["kernels"] == ["toy_scale"] and data["profiles"] >= 87 and data["recorded"] is True
    progress = result.stderr.splitlines()
    assert all(line.startswith("... publish: ") for line in progress), progress
    assert any(re.fullmatch(r"\.\.\. publish: toy_scale: model fitted-toy_scale-\S+ \(fitted here\) \(1/1\), "
                            r"\d+:\d\d elapsed, done", line) for line in progress), progress
    assert any(re.fullmatch(r"\.\.\. publish: toy_scale: tables built \(1/1\), \d+:\d\d elapsed, done", line)
               for line in progress), progress
    assert (tmp_path / "out" / "latest").read_text().strip() == Path(data["path"]).name
    table = run("publish", "--db", str(db), "--to", str(tmp_path / "out"), "--device", "nvidia-h200")
    assert table.exit_code == 0 and "bundle_id" in table.output and "data_fingerprint" in table.output


def test_publish_errors_are_one_line(tmp_path):
    empty = tmp_path / "empty.duckdb"
    Store(empty).close()
    result = run("publish", "--db", str(empty), "--to", str(tmp_path / "out"))
    assert result.exit_code == 1 and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "no ok measurements" in errors[0] and "Traceback" not in result.stderr
    missing = run("publish", "--db", str(empty), "--to", str(tmp_path / "out"), "--model", "nope")
    assert missing.exit_code == 1 and "no registered model 'nope'" in missing.output


def test_lookup_json(toy_bundle):
    _, out = toy_bundle
    shape = {"rows": 64, "cols": 4096}
    result = run("lookup", "toy_scale", "--shape", "rows=64,cols=4096", "--dtype", "float16",
                 "--device", "nvidia-h100-sxm", "--bundle", str(out), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"kernel", "device", "dtype", "shape", "config", "evidence", "expected_regret", "candidates"} <= set(data)
    assert (data["kernel"], data["device"], data["dtype"], data["shape"]) == ("toy_scale", "nvidia-h100-sxm", "float16", shape)
    assert data["config"] == toy_best("nvidia-h100-sxm", shape) and data["evidence"] == "measured"
    assert data["expected_regret"] == 1.0 and data["candidates"][0] == data["config"]
    three = json.loads(run("lookup", "toy_scale", "--shape", "4096,64", "--dtype", "float16", "--device",
                           "nvidia-h100-sxm", "--bundle", str(out), "-k", "3", "--json").output)
    assert three["config"] == data["config"] and len(three["candidates"]) == 3


def test_lookup_table_and_defaults(toy_bundle):
    result = run("lookup", "toy_scale", "--shape", "rows=64,cols=4096", "--device", "nvidia-h200",
                 "--bundle", str(toy_bundle[1]), "--dtype", "float16")
    assert result.exit_code == 0
    assert "evidence" in result.output and "measured" in result.output and "candidates (best first)" in result.output
    unknown = json.loads(run("lookup", "mystery", "--shape", "n=5", "--device", "nvidia-h200",
                             "--bundle", str(toy_bundle[1]), "--json").output)
    assert unknown["evidence"] == "default" and "not in bundle" in unknown["note"]


@pytest.mark.parametrize("args, code, message", [
    (["--shape", "rows=x"], 2, "DIM=N"),
    (["--shape", "rows=0,cols=4"], 1, "must be a positive integer"),
    (["--shape", "rows=4,cols=4", "--bundle", "/no/such/bundle"], 1, "no such bundle directory"),
])
def test_lookup_errors_are_one_line(toy_bundle, args, code, message):
    base = ["lookup", "toy_scale", "--device", "nvidia-h200"]
    if "--bundle" not in args:
        base += ["--bundle", str(toy_bundle[1])]
    result = run(*base, *args)
    assert result.exit_code == code and message in result.output
    assert "Traceback" not in result.output


def test_lookup_refuses_a_tampered_bundle(toy_bundle, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(latest_dir(toy_bundle[1]), bad)
    (bad / "profiles.json").write_text((bad / "profiles.json").read_text().replace("hopper", "hoppex", 1))
    result = run("lookup", "toy_scale", "--shape", "rows=4,cols=4", "--bundle", str(bad))
    assert result.exit_code == 1 and "sha256 of profiles.json does not match" in result.output


def test_profiles(toy_bundle):
    one = run("profiles", "--device", "nvidia-h200", "--bundle", str(toy_bundle[1]), "--json")
    assert one.exit_code == 0
    (rec,) = json.loads(one.stdout)
    assert rec["device_id"] == "nvidia-h200" and rec["evidence"] == "measured"
    assert rec["classes"]["toy_scale"]["evidence"] == "measured" and rec["seed"]["candidates"]
    table = run("profiles", "--bundle", str(toy_bundle[1]))
    assert table.exit_code == 0
    lines = table.output.splitlines()
    assert "learned_tg" in lines[0] and "evidence" in lines[0]
    assert len(lines) >= 2 + 87 and any("apple-m4-max-40c" in line and "predicted" in line for line in lines)
    bad = run("profiles", "--device", "not-a-gpu", "--bundle", str(toy_bundle[1]))
    assert bad.exit_code == 1 and "no device 'not-a-gpu'" in bad.output
