"""`publish`, `lookup` and `profiles` through click: JSON shapes, tables, one-line errors."""

import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))

from bundle_fixtures import build_real, build_toy, fill_toy, latest_dir, toy_best  # noqa: E402
from zmlx_pipeline.data.store import Store  # noqa: E402
from zmlx_pipeline.pipeline.cli import cli  # noqa: E402


@pytest.fixture(scope="module")
def toy_bundle(tmp_path_factory):
    """(store path, publish dir) of the toy bundle (tests/runtime/bundle_fixtures.py)."""
    return build_toy(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="module")
def real_bundle(tmp_path_factory):
    """(store path, publish dir) of rmsnorm from the committed 32-SM H100 shard (tests/runtime/bundle_fixtures.py)."""
    return build_real(tmp_path_factory.mktemp("real"))


pytestmark = pytest.mark.usefixtures("fresh_runtime")  # tests/pipeline/conftest.py


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
    assert data["no_entries"] == {}  # every device asked for (and measured) has entries
    progress = result.stderr.splitlines()
    assert all(line.startswith("... publish: ") for line in progress), progress
    assert any(re.fullmatch(r"\.\.\. publish: toy_scale: model fitted-toy_scale-\S+ \(fitted here\) \(1/1\), "
                            r"\d+:\d\d elapsed, done", line) for line in progress), progress
    assert any(re.fullmatch(r"\.\.\. publish: toy_scale: tables built \(1/1\), \d+:\d\d elapsed, done", line)
               for line in progress), progress
    assert (tmp_path / "out" / "latest").read_text().strip() == Path(data["path"]).name
    table = run("publish", "--db", str(db), "--to", str(tmp_path / "out"), "--device", "nvidia-h200")
    assert table.exit_code == 0 and "bundle_id" in table.output and "data_fingerprint" in table.output
    assert "no legal config" not in table.output


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
    three = json.loads(run("lookup", "toy_scale", "--shape", "cols=4096,rows=64", "--dtype", "float16", "--device",
                           "nvidia-h100-sxm", "--bundle", str(out), "-k", "3", "--json").output)
    assert three["config"] == data["config"] and len(three["candidates"]) == 3


def test_lookup_table_and_defaults(toy_bundle):
    result = run("lookup", "toy_scale", "--shape", "rows=64,cols=4096", "--device", "nvidia-h200",
                 "--bundle", str(toy_bundle[1]), "--dtype", "float16")
    assert result.exit_code == 0
    assert "evidence" in result.output and "measured" in result.output and "candidates (best first)" in result.output
    unknown = run("lookup", "toy_scale", "--shape", "rows=64,cols=4096", "--device", "my-own-gpu",
                  "--bundle", str(toy_bundle[1]), "--json")
    assert unknown.exit_code == 1  # a --device typo is refused, not answered with catalog defaults
    assert _one_error_line(unknown).startswith("unknown device 'my-own-gpu'")


def _one_error_line(result) -> str:
    assert result.stdout == "" and "Traceback" not in result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: ")
    return line[len("Error: "):]


def test_lookup_of_a_misspelt_kernel_exits_1_with_the_known_kernels(toy_bundle):
    result = run("lookup", "toy_sclae", "--shape", "rows=64,cols=4096", "--device", "nvidia-h200",
                 "--bundle", str(toy_bundle[1]))
    assert result.exit_code == 1
    assert _one_error_line(result).startswith("unknown kernel 'toy_sclae': bundle ")
    assert result.stderr.rstrip().endswith(" has toy_scale")


@pytest.mark.parametrize("dtype", ["int8", "fp16"])
def test_lookup_of_an_unknown_dtype_exits_1_with_the_known_dtypes(toy_bundle, dtype):
    result = run("lookup", "toy_scale", "--shape", "rows=64,cols=4096", "--dtype", dtype, "--device", "nvidia-h200",
                 "--bundle", str(toy_bundle[1]), "--json")
    assert result.exit_code == 1
    assert _one_error_line(result) == f"unknown dtype '{dtype}': known dtypes are bfloat16, float16, float32"


def test_lookup_with_k_0_is_a_usage_error(toy_bundle):
    result = run("lookup", "toy_scale", "--shape", "rows=64,cols=4096", "--device", "nvidia-h200",
                 "--bundle", str(toy_bundle[1]), "-k", "0")
    assert result.exit_code == 2 and "Invalid value for '-k': 0 is not in the range x>=1" in result.output


@pytest.mark.parametrize("shape", ["rows=1,cols=6", "rows=1,cols=1", "rows=7,cols=3"])
def test_lookup_of_a_shape_no_config_is_legal_for_exits_1_with_the_reason(real_bundle, shape):
    result = run("lookup", "rmsnorm", "--shape", shape, "--device", "nvidia-h200", "--bundle", str(real_bundle[1]))
    assert result.exit_code == 1
    line = _one_error_line(result)
    assert line == (f"no config of 'rmsnorm' is legal for {shape} float16 on nvidia-h200 (every config breaks: "
                    "(TG // ROWS) * VEC <= cols)")


def test_lookup_of_an_apple_chip_says_extrapolated_and_why(real_bundle):
    result = run("lookup", "rmsnorm", "--shape", "rows=4096,cols=4096", "--device", "apple-m3-max-40c",
                 "--bundle", str(real_bundle[1]), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["device"], data["evidence"], data["expected_regret"]) == ("apple-m3-max-40c", "extrapolated", None)
    assert data["predicted_us"] is None  # the bundle's one measured device ran on 32 SMs: its times move nowhere
    assert "extrapolated from nvidia-h100-sxm@32sm" in data["note"]
    assert "no predicted time: nvidia-h100-sxm@32sm ran on part of nvidia-h100-sxm's cores" in data["note"]
    table = run("lookup", "rmsnorm", "--shape", "rows=1048576,cols=4096", "--device", "apple-m3-max-40c",
                "--bundle", str(real_bundle[1]))
    assert table.exit_code == 0
    lines = table.output.split("\n\ncandidates")[0].splitlines()[2:]
    rows = {line.split(None, 1)[0]: line.split(None, 1)[1] if " " in line else "" for line in lines}
    assert rows["evidence"] == "extrapolated" and rows["expected_regret"] == "-" and rows["outside_range"] == "rows"
    assert "outside the measured range (rows 1-32768): no predicted time" in rows["note"]


def test_lookup_loads_neither_duckdb_polars_nor_scikit_learn(toy_bundle, subprocess_env):
    import subprocess

    code = (
        "import json, sys\n"
        "import click\n"
        "from zmlx_pipeline.pipeline.cli import cli\n"
        f"bundle = {str(toy_bundle[1])!r}\n"
        "for kernel in ('toy_scale', 'toy_sclae'):\n"
        "    try:\n"
        "        cli(['lookup', kernel, '--shape', 'rows=64,cols=4096', '--device', 'nvidia-h200', '--bundle', bundle,\n"
        "             '--json'], standalone_mode=False)\n"
        "    except click.ClickException as exc:\n"
        "        print('error:', exc.message)\n"
        "print(json.dumps(sorted(m for m in ('duckdb', 'polars', 'sklearn', 'numpy', 'pyarrow') if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env, check=True)
    lines = out.stdout.splitlines()
    assert json.loads(lines[-1]) == []
    assert lines[-2].startswith("error: unknown kernel 'toy_sclae'") and '"evidence": "measured"' in out.stdout


@pytest.mark.parametrize("args, code, message", [
    (["--shape", "rows=x"], 2, "DIM=N"),
    (["--shape", "rows=0,cols=4"], 2, "must be a positive integer"),
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
    assert len(lines) >= 2 + 87 and any("apple-m4-max-40c" in line and "extrapolated" in line for line in lines)
    assert any("nvidia-h100-pcie" in line and line.endswith("predicted") for line in lines)
    bad = run("profiles", "--device", "not-a-gpu", "--bundle", str(toy_bundle[1]))
    assert bad.exit_code == 1 and "no device 'not-a-gpu'" in bad.output


def test_lookup_and_profiles_read_a_file_url_as_the_path_it_names(toy_bundle):
    from urllib.parse import quote

    url = "file://" + quote(str(toy_bundle[1]))
    by_path = json.loads(run("lookup", "toy_scale", "--shape", "rows=4,cols=4", "--device", "nvidia-h200",
                             "--bundle", str(toy_bundle[1]), "--json").output)
    by_url = run("lookup", "toy_scale", "--shape", "rows=4,cols=4", "--device", "nvidia-h200", "--bundle", url,
                 "--json")
    assert by_url.exit_code == 0, by_url.output
    assert json.loads(by_url.output) == by_path
    assert run("profiles", "--device", "nvidia-h200", "--bundle", "file://localhost" + quote(str(toy_bundle[1]))
               ).exit_code == 0
    remote = run("profiles", "--bundle", "file://otherhost/bundles")
    assert remote.exit_code == 2 and "names a file on host 'otherhost'; give a local path" in remote.output


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("where", ["data", "store folder", "models", "link to a full folder"])
def test_publish_into_a_folder_of_other_files_is_refused_in_one_line_and_writes_nothing(tmp_path, where):
    """--to never puts a bundle and `latest` among other files (data/'s shards, the store's folder, models/, a link
    to a folder such as /etc): one line before any work, every file as it was."""
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "data" / "nvidia-h200.parquet").write_bytes(b"PAR1 shard")
    db = home / "s.duckdb"
    with Store(db) as store:
        fill_toy(store)
    (home / "models").mkdir()
    (home / "models" / "toy.zmodel").write_bytes(b"model")
    (home / "link").symlink_to(home / "data")
    to = {"data": home / "data", "store folder": home, "models": home / "models",
          "link to a full folder": home / "link"}[where]
    first = {"data": "nvidia-h200.parquet", "store folder": "data", "models": "toy.zmodel",
             "link to a full folder": "nvidia-h200.parquet"}[where]
    before = _tree(home)
    result = CliRunner().invoke(cli, ["publish", "--db", str(db), "--to", str(to), "--device", "nvidia-h200"])
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.output == (f"Error: cannot publish to {to}: it holds other files (e.g. {first}); publish into a new "
                             "or empty directory, or an earlier publish's (its latest and bundle versions only)\n")
    assert _tree(home) == before


def test_publish_to_a_path_with_a_newline_keeps_each_table_row_on_one_line(tmp_path):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        fill_toy(store)
    to = tmp_path / "pt" / "new\nline"
    result = CliRunner().invoke(cli, ["publish", "--db", str(db), "--to", str(to), "--device", "nvidia-h200"])
    assert result.exit_code == 0, result.output
    rows = {line.split("  ")[0]: line.split("  ", 1)[1].strip() for line in result.stdout.splitlines()[2:]}
    assert list(rows) == ["bundle_id", "path", "latest", "model_id", "model_source", "data_fingerprint", "kernels",
                          "devices_with_tables", "profiles", "entries", "files", "bytes"]
    assert rows["latest"] == f"{tmp_path}/pt/new\\nline/latest"
    assert (to / "latest").read_text().strip() == rows["bundle_id"]


@pytest.mark.parametrize("device, message", [
    ("nope", "unknown device 'nope': neither a catalog id, a catalog device name nor a device of the store; see "
             "zmlx-pipeline devices"),
    ("nvidia-h200@0sm", "unknown device 'nvidia-h200@0sm': neither a catalog id, a catalog device name nor a device "
                        "of the store; see zmlx-pipeline devices"),
    ("nvidia-h200@066sm", "unknown device 'nvidia-h200@066sm': neither a catalog id, a catalog device name nor a "
                          "device of the store; see zmlx-pipeline devices"),
    ("Apple M1 Pro", "device 'Apple M1 Pro' does not name one chip; it may be apple-m1-pro-14c, apple-m1-pro-16c"),
])
def test_publish_of_an_unknown_device_is_refused_before_any_work(tmp_path, device, message, monkeypatch):
    """--device is resolved before the models are loaded or fitted (it was said only after them), in one line
    naming the candidates of an ambiguous name; nothing is written."""
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        fill_toy(store)

    def no_work(*args, **kwargs):
        raise AssertionError("publish's work started")

    monkeypatch.setattr("zmlx_pipeline.publish.load_models", no_work)
    result = CliRunner().invoke(cli, ["publish", "--db", str(db), "--to", str(tmp_path / "out"), "--device", device])
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.output == f"Error: {message}\n"
    assert not (tmp_path / "out").exists()


def test_publish_takes_a_device_name_and_a_store_device_the_catalog_lacks(tmp_path, monkeypatch):
    """A catalog name resolves to its id; a device the store holds though the catalog lacks it is taken as it is."""
    from zmlx_pipeline.publish.build import resolve_devices

    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        fill_toy(store)
        store.upsert_device({"device_id": "my-lab-gpu"})  # a device the catalog lacks
        assert resolve_devices(store, ["H100 SXM5", "nvidia-h200", "my-lab-gpu", "nvidia-h100-sxm"]) == [
            "nvidia-h100-sxm", "nvidia-h200", "my-lab-gpu"]


@pytest.mark.parametrize("kind", ["notes", "link"])
def test_publish_never_replaces_a_latest_it_did_not_write(tmp_path, kind):
    """A user's file named `latest` (or a link of that name that leads to no bundle) in --to is refused in one line
    before any work, and left as it was."""
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        fill_toy(store)
    to = tmp_path / "pub" / "a"
    to.mkdir(parents=True)
    (tmp_path / "notes.txt").write_text("my notes\n")
    if kind == "notes":
        (to / "latest").write_text("my notes\n")
    else:
        (to / "latest").symlink_to(tmp_path / "notes.txt")
    why = ("does not name a bundle version in the directory, so it is not an earlier publish's pointer; remove it"
           if kind == "notes" else f"is a symbolic link to {str(tmp_path / 'notes.txt')!r}, which leads to no bundle; "
           "remove the link (publish then writes latest as the pointer file to the new bundle; what the link names "
           "is kept)")
    before = _tree(tmp_path / "pub")
    result = CliRunner().invoke(cli, ["publish", "--db", str(db), "--to", str(to), "--device", "nvidia-h200"])
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.output == f"Error: cannot publish to {to}: its latest {why} or choose another --to\n"
    assert _tree(tmp_path / "pub") == before
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"
