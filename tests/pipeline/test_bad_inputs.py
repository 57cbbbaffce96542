"""Bad input to every command, as a new user meets it: one `Error:` line, a non-zero exit, nothing stored lost.

Each case runs one command through click's CliRunner against a small real store (and, for the
runtime's commands, a copy of the packaged bundle), then checks the exit code, that the output
is the one error line (a usage error too: one `Error:` line naming the command's --help), and that
every file under the test's directory (store, bundles, caches, inputs) has the same content
digest as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.pipeline.cli import cli
from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR

REPO = Path(__file__).resolve().parents[2]
SMALL_SHARD = REPO / "data" / "nvidia-h100-sxm-32sm.parquet"


def digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root, by relative path (what a bad command must leave as it was)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


#: commands that report progress on stderr as they go; their error is still one line, and the last
PROGRESS = {"run", "train", "publish"}


def assert_one_line_error(result, code: int = 1, progress: bool = False) -> None:
    """Exit `code`, no traceback, nothing on stdout, exactly one `Error:` line and it is the last: alone (after any
    progress lines of a command that reports them); a usage error (exit 2) too, naming the command's --help where
    click would print its usage text."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert result.stdout == "", result.stdout
    lines = result.output.splitlines()
    assert [line for line in lines if line.startswith("Error:")] == [lines[-1]], result.output
    if code == 2:
        assert len(lines) == 1 and lines[0].endswith(" --help)"), result.output
    elif not progress:
        assert len(lines) == 1, result.output
    assert len(lines[-1]) > len("Error: ") + 10  # says what is wrong, not just that something is


@pytest.fixture(autouse=True)
def fresh_runtime():
    """Each command starts as in a new process: no bundle loaded, no answer remembered."""
    from zmlx_pipeline.runtime import bundle, lookup

    bundle.reset()
    lookup.clear_cache()
    yield
    bundle.reset()
    lookup.clear_cache()


@pytest.fixture
def home(tmp_path, monkeypatch, make_measurement):
    """tmp_path as the working directory, with a small real store at $ZMLX_PIPELINE_DB and files to misuse."""
    from zmlx_pipeline.data.store import Store, default_db_path

    monkeypatch.chdir(tmp_path)
    with Store(default_db_path()) as store:
        store.upsert_device({"device_id": "nvidia-h200", "name": "NVIDIA H200 SXM 141GB", "vendor": "nvidia"})
        store.record([make_measurement(device_id="nvidia-h200", kernel="rmsnorm", shape={"rows": r, "cols": 512},
                                       config={"TG": tg}, median_us=float(tg + r))
                      for r in (1, 8) for tg in (32, 64)])
    (tmp_path / "notes.txt").write_text("just some words\n")
    (tmp_path / "empty.json").write_bytes(b"")
    (tmp_path / "list.json").write_text("[1, 2, 3]\n")
    (tmp_path / "text.parquet").write_text("this is not parquet\n")
    (tmp_path / "empty.parquet").write_bytes(b"")
    data = SMALL_SHARD.read_bytes()
    (tmp_path / "truncated.parquet").write_bytes(data[: len(data) // 2])
    (tmp_path / "fake.json.gz").write_bytes(b"\x1f\x8b not really gzip")
    (tmp_path / "plainfile").write_text("a regular file\n")
    (tmp_path / "emptydata").mkdir()
    (tmp_path / "data").mkdir()
    shutil.copy(SMALL_SHARD, tmp_path / "data" / SMALL_SHARD.name)
    return tmp_path


def run_cli(home: Path, *args: str, env: dict | None = None):
    """The command's result, after checking that it changed no file under home."""
    before = digest(home)
    result = CliRunner().invoke(cli, list(args), env=env)
    assert digest(home) == before, f"{args} changed files on disk"
    return result


# -- every command: unknown names, bad option values, files that are not what they claim ------------------

USAGE = [  # exit 2: click refuses the value before any work starts
    ("devices", "--vendor", "intel"),
    ("collect", "--budget", "10x"),
    ("collect", "--preset", "huge"),
    ("collect", "--budget", "-5m"),
    ("collect", "--budget", "0"),
    ("collect", "-j", "0"),
    ("collect", "-j", "abc"),
    ("collect", "--samples", "0"),
    ("collect", "-t", "float64"),
    ("collect", "--timer", "wall"),
    ("repeat", "--fraction", "2"),
    ("repeat", "--fraction", "0"),
    ("repeat", "--fraction", "abc"),
    ("repeat", "-j", "0"),
    ("repeat", "--budget", "10x"),
    ("contribute", "--budget", "10x"),
    ("contribute", "--budget", "0"),
    ("run", "--collect", "10x"),
    ("run", "--data", "notes.txt"),
    ("run", "--data", "no-such-dir"),
    ("evaluate", "--split", "rows"),
    ("evaluate", "--split", "shapes", "--k", "0"),
    ("evaluate", "--split", "shapes", "--k", "-3"),
    ("evaluate", "--split", "shapes", "-j", "0"),
    ("evaluate",),
    ("train", "-j", "0"),
    ("report", "--out", "r", "--split", "rows"),
    ("report", "--out", "r", "--heatmaps", "11"),
    ("report",),
    ("publish",),
    ("lookup", "rmsnorm"),
    ("lookup", "rmsnorm", "--shape", "rows="),
    ("lookup", "rmsnorm", "--shape", "rows=1e99,cols=4096"),
    ("lookup", "rmsnorm", "--shape", "rows=abc,cols=4096"),
    ("lookup", "rmsnorm", "--shape", "rows=4096,rows=8,cols=4096"),
    ("lookup", "rmsnorm", "--shape", "rows=4096,4096"),
    ("lookup", "rmsnorm", "--shape", ","),
    ("lookup", "rmsnorm", "--shape", "rows=4096 cols=4096"),
    ("lookup", "rmsnorm", "--shape", "rows=4096,cols=4096", "-k", "0"),
    ("ingest",),
    ("ingest", "no-such-shard.parquet"),
    ("import", "no-such-cache.json"),
    ("import", "list.json", "--problem-size", "abc"),
    ("import", "list.json", "--device-map", "no-such-map.json"),
    ("export",),
    ("collect", "--budget", "nan"),
    ("collect", "--budget", "inf"),
    ("collect", "--budget", "1e400s"),
    ("collect", "--budget", ""),
    ("collect", "--warmup-ms", "nan"),
    ("repeat", "--fraction", "nan"),
    ("run", "--collect", "nan"),
    ("run", "--collect", ""),
    ("kernels", "-k", ""),
    ("kernels", "-k", ","),
    ("evaluate", "--split", "shapes", "-k", ""),
    ("train", "--device", ""),
    ("export", ""),
    ("publish", "--to", ""),
    ("report", "--out", ""),
    ("run", "--bundle-dir", ""),
    ("run", "--data", ""),
    ("train", "--models-dir", ""),
    ("summary", "--db", ""),
    # --shape and --problem-size take one documented form each, in ASCII digits
    ("lookup", "rmsnorm", "--shape", "4096x4096"),
    ("lookup", "rmsnorm", "--shape", "rows=4096,,cols=4096"),
    ("lookup", "rmsnorm", "--shape", "rows=+4096,cols=4096"),
    ("lookup", "rmsnorm", "--shape", "+4096,4096"),
    ("lookup", "rmsnorm", "--shape", "rows=\u0664\u0660\u0669\u0666,cols=4096"),
    ("lookup", "rmsnorm", "--shape", "\u0664\u0660\u0669\u0666,4096"),
    ("lookup", "rmsnorm", "--shape", "rows=4_096,cols=4096"),
    ("lookup", "rmsnorm", "--shape", "rows=4096,cols=4096,"),
    # a shape that does not fit the kernel's dims, or a dim below 1 or above an array's (test_option_usage_errors.py)
    ("lookup", "rmsnorm", "--shape", "rows=-1,cols=4096"),
    ("lookup", "rmsnorm", "--shape", "rows=0,cols=4096"),
    ("lookup", "rmsnorm", "--shape", "rows=99999999999999999999,cols=4096"),
    ("lookup", "rmsnorm", "--shape", "cols=4096"),
    ("lookup", "rmsnorm", "--shape", "rows=4096,cols=4096,depth=2"),
    ("lookup", "rmsnorm", "--shape", "4096,4096,4096"),
    ("import", "list.json", "--problem-size", "4096x4096"),
    ("import", "list.json", "--problem-size", "+4096"),
    ("import", "list.json", "--problem-size", "4096,,4096"),
    ("import", "list.json", "--problem-size", "\u0664\u0660\u0669\u0666"),
    ("import", "list.json", "--problem-size", '{"x": 1, "x": 2}'),
]


@pytest.mark.parametrize("args", USAGE, ids=[" ".join(a) for a in USAGE])
def test_a_bad_option_value_is_a_usage_error(home, args):
    assert_one_line_error(run_cli(home, *args), code=2)


ERRORS = [  # exit 1: the command refuses the input in one line that says why
    (("kernels", "-k", "rmsnrom"), "unknown kernel 'rmsnrom'"),
    (("kernels", "-k", "no_such_module_xyz:SPEC"), "cannot import 'no_such_module_xyz'"),
    (("kernels", "-k", "zmlx_pipeline:__version__"), "not a KernelSpec"),
    (("collect", "-k", "rmsnrom"), "unknown kernel 'rmsnrom'"),
    (("collect",), "no Metal or CUDA backend"),
    (("repeat", "-k", "rmsnrom"), "unknown kernel 'rmsnrom'"),
    (("contribute",), "no Metal or CUDA backend"),
    (("export", "plainfile/out.parquet"), "plainfile is a file"),
    (("export", "--device", "nvidia-h2000", "out.parquet"), "no measurements of device 'nvidia-h2000'"),
    (("export", "--db", "no-such.duckdb", "out.parquet"), "no store at no-such.duckdb"),
    (("ingest", "text.parquet"), "not a readable Parquet shard"),
    (("ingest", "truncated.parquet"), "not a readable Parquet shard"),
    (("ingest", "empty.parquet"), "not a readable Parquet shard"),
    (("ingest", "--db", "plainfile/store.duckdb", str(SMALL_SHARD)), "plainfile is a file"),
    (("import", "list.json", "--device", "nvidia-h100-sxm"), "not a JSON object"),
    (("import", "empty.json", "--device", "nvidia-h100-sxm"), "the file is empty"),
    (("import", "fake.json.gz", "--device", "nvidia-h100-sxm"), "corrupt gzip"),
    (("import", "notes.txt", "--device", "nvidia-h100-sxm"), "not valid JSON"),
    (("import", "list.json", "--device", "nvidia-h9000"), "'nvidia-h9000' is neither a catalog id"),
    (("import", "list.json", "--device-map", "list.json"), "--device-map list.json"),
    (("summary", "--device", "nvidia-h2000"), "no measurements of device 'nvidia-h2000'"),
    (("summary", "--kernel", "rmsnrom"), "no measurements of kernel 'rmsnrom'"),
    (("summary", "--db", "no-such.duckdb"), "no store at no-such.duckdb"),
    (("noise",), "no repeated timings"),
    (("noise", "--json"), "no repeated timings"),  # as the table says it, not an empty list with exit 0
    (("noise", "--device", "nvidia-h2000"), "no measurements of device 'nvidia-h2000'"),
    (("run", "--data", "emptydata"), "no .parquet shard"),
    (("run", "--data", "data", "--bundle-dir", "plainfile/bundles"), "plainfile is a file"),
    (("evaluate", "--split", "shapes", "--kernel", "rmsnrom"), "rmsnrom"),
    (("evaluate", "--split", "shapes", "--model", "no-such-model"), "unknown model 'no-such-model'"),
    (("evaluate", "--split", "shapes", "--db", "no-such.duckdb"), "no store at no-such.duckdb"),
    (("train", "--kernel", "rmsnrom"), "rmsnrom"),
    (("train", "--model", "no-such-model"), "unknown model 'no-such-model'"),
    (("train", "--device", "nvidia-h2000"), "nvidia-h2000"),
    (("train", "--device", "nvidia-h200", "--device", "nvidia-h2000"), "no measurements of device(s) nvidia-h2000"),
    (("train", "--models-dir", "plainfile/models"), "plainfile is a file"),
    (("models", "--kernel", "rmsnrom"), "no trained model for kernel 'rmsnrom'"),
    (("models", "--db", "no-such.duckdb"), "no store at no-such.duckdb"),
    (("publish", "--to", "bundles", "--model", "rmsnorm-no-such-id"), "no registered model 'rmsnorm-no-such-id'"),
    (("publish", "--to", "bundles", "--kernel", "rmsnrom"), "rmsnrom"),
    (("publish", "--to", "bundles", "--device", "nvidia-h2000"), "'nvidia-h2000'"),
    (("publish", "--to", "plainfile/bundles"), "plainfile is a file"),
    (("publish", "--to", "bundles", "--db", "no-such.duckdb"), "no store at no-such.duckdb"),
    (("report", "--out", "r", "--kernel", "rmsnrom"), "rmsnrom"),
    (("report", "--out", "plainfile/r"), "plainfile/r"),
    (("lookup", "rmsnrom", "--shape", "rows=4096,cols=4096"), "unknown kernel 'rmsnrom'"),
    (("lookup", "no_such_kernel", "--shape", "rows=4096,cols=4096"), "unknown kernel 'no_such_kernel'"),
    (("lookup", "rmsnorm", "--shape", "rows=4096,cols=4096", "--dtype", "float64"), "unknown dtype 'float64'"),
    (("lookup", "rmsnorm", "--shape", "rows=4096,cols=4096", "--dtype", "fp16x"), "unknown dtype 'fp16x'"),
    (("lookup", "rmsnorm", "--shape", "rows=4096,cols=4096", "--device", "nvidia-h2000"),
     "unknown device 'nvidia-h2000'"),
    (("lookup", "rmsnorm", "--shape", "rows=4096,cols=3", "--device", "nvidia-h100-sxm"),
     "no config of 'rmsnorm' is legal for rows=4096,cols=3"),
    (("lookup", "rmsnorm", "--shape", "rows=4096,cols=4096", "--bundle", "no-such-bundle"), "no such bundle"),
    (("lookup", "rmsnorm", "--shape", "rows=4096,cols=4096", "--bundle", "notes.txt"), "no manifest.json"),
    (("profiles", "--device", "nvidia-h2000"), "no device 'nvidia-h2000'"),
    (("profiles", "--bundle", "no-such-bundle"), "no such bundle"),
    # a module:attr kernel path is read, never called unless it is a function of that module
    (("kernels", "-k", "sys:exit"), "not a KernelSpec"),
    (("kernels", "-k", "os:abort"), "not a KernelSpec"),
    (("kernels", "-k", "builtins:input"), "not a KernelSpec"),
    (("kernels", "-k", "rmsnorm,sys:exit"), "not a KernelSpec"),
    (("kernels", "-k", "zmlx_pipeline.pipeline.cli:cli"), "not a KernelSpec"),
    (("kernels", "-k", ":"), "names no importable module"),
    (("kernels", "-k", "../x:y"), "names no importable module"),
    (("collect", "-k", "sys:exit"), "not a KernelSpec"),
    (("repeat", "-k", "sys:exit"), "not a KernelSpec"),
    # export never writes over what is not a shard
    (("export", "--force", "store.duckdb"), "that is the store itself"),
    (("export", "store.duckdb.wal"), "that is the store's write-ahead log"),
    (("export", "--force", "./store.duckdb.wal"), "that is the store's write-ahead log"),
    (("export", "--force", "notes.txt"), "not a Parquet shard"),
    (("export", "notes.txt"), "notes.txt exists: pass --force"),
    (("export", str(Path("data") / SMALL_SHARD.name)), "exists: pass --force"),
    (("export", "a" * 300 + ".parquet"), "File name too long"),
    # a typo or a missing GPU is refused before the store changes or is made
    (("run", "--data", "data", "-k", "rmsnrom"), "no kernel 'rmsnrom'"),
    (("run", "--data", "emptydata", "--db", "new.duckdb"), "no .parquet shard"),
    (("run", "--data", "data", "-k", "rmsnrom", "--db", "new/new.duckdb"), "no kernel 'rmsnrom'"),
    # a name the file system refuses, wherever it is given
    (("summary", "--db", "a" * 300 + ".duckdb"), "File name too long"),
    (("train", "--models-dir", "a" * 300), "File name too long"),
    (("report", "--out", "a" * 300), "File name too long"),
    (("publish", "--to", "a" * 300), "File name too long"),
    (("run", "--data", "data", "--collect", "10m", "--db", "new.duckdb"), "needs a Metal or CUDA GPU"),
    (("train", "--models-dir", "/proc/self/models"), "cannot save models in /proc/self/models"),
    (("train", "--model", ""), "unknown model ''"),
    (("report", "--out", "r", "--model", ""), "unknown model ''"),
]


@pytest.mark.parametrize("args, says", ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_a_bad_input_is_one_error_line(home, args, says):
    result = run_cli(home, *args)
    assert_one_line_error(result, progress=args[0] in PROGRESS)
    assert says in result.output.splitlines()[-1]


# -- the store: not a store, too new, locked, unwritable ----------------------------------------------------

STORE_COMMANDS = [("summary",), ("ingest", str(SMALL_SHARD)), ("export", "out.parquet"), ("models",),
                  ("train", "--kernel", "rmsnorm"), ("publish", "--to", "bundles"), ("evaluate", "--split", "shapes"),
                  ("noise",)]


@pytest.mark.parametrize("args", STORE_COMMANDS, ids=[a[0] for a in STORE_COMMANDS])
def test_a_store_that_is_a_text_file_is_refused(home, args):
    assert_one_line_error(run_cli(home, *args, "--db", "notes.txt"), progress=args[0] in PROGRESS)


@pytest.mark.parametrize("args", STORE_COMMANDS[:3], ids=[a[0] for a in STORE_COMMANDS[:3]])
def test_a_store_from_a_newer_schema_is_refused(home, args):
    import duckdb

    from zmlx_pipeline.data.store import default_db_path

    con = duckdb.connect(str(default_db_path()))
    con.execute("INSERT INTO _migrations (version, name, applied_at) VALUES (999, 'future', now())")
    con.close()
    result = run_cli(home, *args)
    assert_one_line_error(result)
    assert "newer" in result.output


HOLD = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def locked(home):
    """The store held writable by another process for the test's duration."""
    from zmlx_pipeline.data.store import default_db_path

    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(default_db_path())], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield home
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("args", STORE_COMMANDS[:4], ids=[a[0] for a in STORE_COMMANDS[:4]])
def test_a_store_locked_by_another_process_is_one_line(locked, args):
    result = run_cli(locked, *args)
    assert_one_line_error(result)
    assert "locked by another process" in result.output


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes through file permissions")
def test_a_store_in_a_read_only_directory_is_one_line(home):
    ro = home / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert_one_line_error(run_cli(home, "ingest", "--db", str(ro / "store.duckdb"), str(SMALL_SHARD)))
    finally:
        ro.chmod(0o700)


# -- a Kernel Tuner cache with a config missing a parameter ------------------------------------------------

def _kt_cache(entries: dict) -> dict:
    return {"device_name": "NVIDIA H100", "kernel_name": "vector_add", "problem_size": [4096],
            "tune_params_keys": ["block_size_x", "tile"], "tune_params": {"block_size_x": [64, 128], "tile": [1, 2]},
            "objective": "time", "cache": entries}


# (an infinite time is how old Kernel Tuner versions marked a failed config, and is kept as one)
@pytest.mark.parametrize("time_text, says", [("-0.02", "-0.02"), ("NaN", "nan")])
def test_a_kernel_tuner_cache_with_a_time_that_is_not_finite_and_positive_stores_nothing(home, time_text, says):
    good = {"64,1": {"block_size_x": 64, "tile": 1, "time": 0.01, "times": [0.01]}}
    text = json.dumps(_kt_cache({**good, "128,2": {"block_size_x": 128, "tile": 2, "time": "TIME"}}))
    (home / "vector_add.json").write_text(text.replace('"TIME"', time_text))
    result = run_cli(home, "import", "vector_add.json", "--device", "nvidia-h100-sxm")
    assert_one_line_error(result)
    assert says in result.output.lower()


def test_a_kernel_tuner_cache_with_a_config_missing_a_parameter_stores_nothing(home):
    cache = {
        "device_name": "NVIDIA H100", "kernel_name": "vector_add", "problem_size": [4096],
        "tune_params_keys": ["block_size_x", "tile"], "tune_params": {"block_size_x": [64, 128], "tile": [1, 2]},
        "objective": "time",
        "cache": {
            "64,1": {"block_size_x": 64, "tile": 1, "time": 0.01, "times": [0.01]},
            "128,2": {"block_size_x": 128, "time": 0.02, "times": [0.02]},
        },
    }
    (home / "vector_add.json").write_text(json.dumps(cache))
    result = run_cli(home, "import", "vector_add.json", "--device", "nvidia-h100-sxm")
    assert_one_line_error(result)
    assert "tile" in result.output


# -- bundles: tampered, no manifest, unknown schema, garbage in $ZMLX_PIPELINE_BUNDLE -----------------------

def _bundle_copy(home: Path, name: str) -> Path:
    dest = home / name
    shutil.copytree(DEFAULT_BUNDLE_DIR, dest)
    return dest


def _stored(bundle: Path, name: str) -> Path:
    """A bundle file as stored: NAME, or NAME.gz in a compact bundle."""
    return bundle / name if (bundle / name).exists() else bundle / f"{name}.gz"


def _tampered(home: Path) -> Path:
    b = _bundle_copy(home, "tampered")
    profiles = _stored(b, "profiles.json")
    data = bytearray(profiles.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte changed, the size kept
    profiles.write_bytes(bytes(data))
    return b


def _no_manifest(home: Path) -> Path:
    b = _bundle_copy(home, "no-manifest")
    (b / "manifest.json").unlink()
    return b


def _unknown_schema(home: Path) -> Path:
    b = _bundle_copy(home, "future")
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["schema_version"] = 99
    (b / "manifest.json").write_text(json.dumps(manifest))
    return b


def _truncated(home: Path) -> Path:
    b = _bundle_copy(home, "truncated")
    kernels = _stored(b, "kernels.json")
    kernels.write_bytes(kernels.read_bytes()[:100])
    return b


def _long_bundle_id(home: Path) -> Path:
    b = _bundle_copy(home, "long-id")
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["bundle_id"] = "x" * 100_000  # the manifest is not hashed: nothing else tells it was changed
    (b / "manifest.json").write_text(json.dumps(manifest))
    return b


BAD_BUNDLES = [_tampered, _no_manifest, _unknown_schema, _truncated, _long_bundle_id]


@pytest.mark.parametrize("make", BAD_BUNDLES, ids=[f.__name__.strip("_") for f in BAD_BUNDLES])
@pytest.mark.parametrize("command", ["lookup", "profiles"])
def test_a_bad_bundle_is_refused_in_one_line(home, make, command):
    bundle = make(home)
    args = ["lookup", "rmsnorm", "--shape", "rows=4096,cols=4096"] if command == "lookup" else ["profiles"]
    assert_one_line_error(run_cli(home, *args, "--bundle", str(bundle)))


@pytest.mark.parametrize("command", ["lookup", "profiles"])
def test_a_bundle_id_longer_than_publish_writes_is_refused_cut_short(home, command):
    """A manifest's bundle_id of 100,000 characters was printed whole in the lookup's table."""
    bundle = _long_bundle_id(home)
    args = ["lookup", "rmsnorm", "--shape", "rows=4096,cols=4096"] if command == "lookup" else ["profiles"]
    result = run_cli(home, *args, "--bundle", str(bundle))
    assert_one_line_error(result)
    line = result.output.splitlines()[-1]
    assert f"manifest's bundle_id {'x' * 60!r}... (100000 characters) is not a bundle id (at most 64" in line
    assert len(line) < 400


@pytest.mark.parametrize("command", ["lookup", "profiles"])
def test_garbage_in_the_bundle_variable_is_one_line(home, command):
    args = ["lookup", "rmsnorm", "--shape", "rows=4096,cols=4096"] if command == "lookup" else ["profiles"]
    result = run_cli(home, *args, env={"ZMLX_PIPELINE_BUNDLE": str(home / "notes.txt")})
    assert_one_line_error(result)
    assert "ZMLX_PIPELINE_BUNDLE" in result.output


# -- more files that are not what they claim ----------------------------------------------------------------

@pytest.fixture
def odd_files(home):
    """A Parquet file that is not a shard, and a registered model whose file is not a model."""
    from datetime import datetime, timezone

    import duckdb

    from zmlx_pipeline.data.store import Store, default_db_path

    duckdb.connect().execute(f"COPY (SELECT 1 AS x, 'a' AS y) TO '{home / 'other.parquet'}' (FORMAT parquet)")
    (home / "garbage.zip").write_bytes(b"PK\x03\x04 not a zip at all")
    with Store(default_db_path()) as store:
        for model_id in ("rmsnorm-garbage", "rmsnorm-garbage-2"):
            store.add_model({"model_id": model_id, "kernel_filter": "rmsnorm", "created_at": datetime.now(timezone.utc),
                             "data_fingerprint": "sha256:00", "params": {"model": "ensemble"}, "versions": {},
                             "scores": {}, "path": str(home / "garbage.zip")})
    (home / "published" / "latest").mkdir(parents=True)
    return home


MORE = [
    (("ingest", "other.parquet"), "missing shard columns"),
    (("ingest", "emptydata"), "no .parquet shard"),
    (("publish", "--to", "bundles", "--model", "rmsnorm-garbage"), "not a zip archive"),
    (("lookup", "rmsnorm", "--shape", "rows=8,cols=4096", "--bundle", "http://127.0.0.1:9/bundles"), "cannot fetch"),
    (("publish", "--to", "bundles", "--model", "rmsnorm-garbage", "--kernel", "softmax"),
     "model rmsnorm-garbage is for kernel rmsnorm, which the kernels asked for (softmax) leave out"),
    (("publish", "--to", "bundles", "--model", "rmsnorm-garbage", "--model", "rmsnorm-garbage-2"),
     "are both for kernel rmsnorm"),
    (("publish", "--to", "published"), "its latest is not a file"),
]


@pytest.mark.parametrize("args, says", MORE, ids=[" ".join(a) for a, _ in MORE])
def test_a_file_that_is_not_what_it_claims_is_one_error_line(odd_files, args, says):
    result = run_cli(odd_files, *args)
    assert_one_line_error(result, progress=args[0] in PROGRESS)
    assert says in result.output.splitlines()[-1]


def test_verify_checks_every_model_file_lists_each_verdict_and_fails_in_one_line(odd_files):
    """Like `sha256sum -c`: the table of every file's verdict is the result (stdout), the summary the error."""
    before = digest(odd_files)
    result = run_cli(odd_files, "models", "--verify")
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.output.splitlines()
    assert [line for line in lines if line.startswith("Error:")] == [lines[-1]]
    assert lines[-1].startswith("Error: 2 of 2 model files refused; rmsnorm-garbage") and "not a zip archive" in lines[-1]
    assert sum("not a zip archive" in line for line in result.stdout.splitlines()) == 2  # both checked
    assert digest(odd_files) == before


@pytest.mark.parametrize("kind, says", [("directory", "is a directory, not a model file"),
                                        ("fifo", "is a FIFO (named pipe), not a model file")])
def test_publish_says_what_a_model_path_is_that_is_no_file_as_verify_does(home, kind, says):
    """A registered model whose file is a directory was "no model file" to publish, while models --verify said what
    it is; both say it now, in the same words."""
    from datetime import datetime, timezone

    from zmlx_pipeline.data.store import Store, default_db_path

    path = home / "models" / "rmsnorm-odd.zmodel"
    path.parent.mkdir()
    path.mkdir() if kind == "directory" else os.mkfifo(path)
    with Store(default_db_path()) as store:
        store.add_model({"model_id": "rmsnorm-odd", "kernel_filter": "rmsnorm", "created_at": datetime.now(timezone.utc),
                         "data_fingerprint": "sha256:00", "params": {"model": "ensemble"}, "versions": {},
                         "scores": {}, "path": str(path)})
    wanted = f"model file {path} {says}: remove it and retrain with `zmlx-pipeline train`"
    for args in (("--model", "rmsnorm-odd"), ()):  # named, or the kernel's newest
        result = run_cli(home, "publish", "--to", "bundles", *args)
        assert_one_line_error(result, progress=True)
        assert result.output.splitlines()[-1] == f"Error: cannot load model rmsnorm-odd: {wanted}"
        assert not (home / "bundles").exists()
    verified = run_cli(home, "models", "--verify")
    assert verified.exit_code == 1 and verified.output.splitlines()[-1].endswith(f"rmsnorm-odd: {wanted}")


@pytest.mark.parametrize("args", [("export", "emptydata"), ("import", "list.json", "--problem-size", "4096,-1"),
                                  ("import", "list.json", "--problem-size", "[]")])
def test_more_bad_values_are_usage_errors(home, args):
    assert_one_line_error(run_cli(home, *args), code=2)


def test_a_command_duckdb_stopped_on_ctrl_c_is_aborted_not_a_traceback(home, monkeypatch):
    """DuckDB turns Ctrl-C or SIGTERM during a query into its own error; the command ends as click's "Aborted!"."""
    import duckdb

    from zmlx_pipeline.data.store import Store

    def interrupted(self, *args, **kwargs):
        raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

    monkeypatch.setattr(Store, "summary", interrupted)
    result = run_cli(home, "summary")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1] == "Aborted!"


def test_export_never_writes_over_a_pipe(home):
    os.mkfifo(home / "pipe.parquet")
    result = CliRunner().invoke(cli, ["export", "--force", "pipe.parquet"])
    assert_one_line_error(result)
    assert "not a regular file" in result.output and (home / "pipe.parquet").is_fifo()


def test_a_sqlite_file_as_the_store_is_refused_at_once(home):
    import sqlite3

    with sqlite3.connect(home / "lite.duckdb") as con:
        con.execute("CREATE TABLE t (x)")
    for args in (("summary", "--db", "lite.duckdb"), ("ingest", "--db", "lite.duckdb", str(SMALL_SHARD))):
        result = run_cli(home, *args)
        assert_one_line_error(result)
        assert "lite.duckdb is not a DuckDB database" in result.output


def test_a_store_missing_a_table_is_one_line_and_written_to_by_nothing(home):
    import duckdb

    from zmlx_pipeline.data.store import default_db_path

    with duckdb.connect(str(default_db_path())) as con:
        con.execute("DROP TABLE measurements")
    for args in (("summary",), ("export", "out.parquet"), ("ingest", str(SMALL_SHARD)), ("train",)):
        result = run_cli(home, *args)
        assert_one_line_error(result, progress=args[0] in PROGRESS)
        assert "has no table measurements" in result.output
    assert not (home / "out.parquet").exists()


# -- a killed writer ---------------------------------------------------------------------------------------

KILLED = """
import os, signal, sys
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.data.records import Measurement

store = Store(sys.argv[1])
con = store._conn
con.execute("BEGIN TRANSACTION")
con.execute("DELETE FROM measurements")
print("mid-transaction", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writer_killed_mid_transaction_loses_nothing_committed(home, subprocess_env):
    before = json.loads(run_cli(home, "summary", "--json").output)
    from zmlx_pipeline.data.store import default_db_path

    proc = subprocess.run([sys.executable, "-c", KILLED, str(default_db_path())], env=subprocess_env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9 and "mid-transaction" in proc.stdout
    result = CliRunner().invoke(cli, ["summary", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == before and before[0]["measurements"] == 4


@pytest.mark.parametrize("command", ["import", "ingest"])
def test_a_refused_file_leaves_no_new_store_behind(tmp_path, command):
    """A store the command would have created is not left behind empty when its one file is refused; a store
    that was there before stays, unchanged; a good file then creates the store."""
    bad = tmp_path / ("bad.json" if command == "import" else "bad.parquet")
    bad.write_text("this is not a tuning file\n")
    db = tmp_path / "new" / "store.duckdb"
    result = CliRunner().invoke(cli, [command, "--db", str(db), str(bad)])
    assert_one_line_error(result)
    assert not db.exists() and not db.with_name("store.duckdb.wal").exists()

    kept = tmp_path / "kept.duckdb"
    assert CliRunner().invoke(cli, ["ingest", "--db", str(kept), str(SMALL_SHARD)]).exit_code == 0
    before = hashlib.sha256(kept.read_bytes()).hexdigest()
    assert_one_line_error(CliRunner().invoke(cli, [command, "--db", str(kept), str(bad)]))
    assert kept.exists() and hashlib.sha256(kept.read_bytes()).hexdigest() == before

    good = CliRunner().invoke(cli, ["ingest", "--db", str(db), str(SMALL_SHARD)])
    assert good.exit_code == 0 and db.exists()


# -- a damaged store: cut short, or a block that reads back wrong ------------------------------------------

DAMAGE_COMMANDS = [("summary",), ("noise",), ("noise", "--device", "nvidia-h200"), ("models",),
                   ("evaluate", "--split", "shapes", "--kernel", "rmsnorm"), ("train", "-k", "rmsnorm", "-j", "1"),
                   ("publish", "--to", "bundles", "-k", "rmsnorm"), ("report", "--out", "rep", "-k", "rmsnorm"),
                   ("import", "vector_add.json"), ("export", "out.parquet"), ("ingest", str(SMALL_SHARD))]


@pytest.mark.parametrize("args", DAMAGE_COMMANDS, ids=[" ".join(a[:2]) for a in DAMAGE_COMMANDS])
def test_a_store_cut_short_is_one_line_for_every_command(home, args):
    from zmlx_pipeline.data.store import default_db_path

    path = default_db_path()
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    cache = _kt_cache({"64,1": {"block_size_x": 64, "tile": 1, "time": 0.01}})
    (home / "vector_add.json").write_text(json.dumps(cache))
    result = run_cli(home, *args)
    assert_one_line_error(result, progress=args[0] in PROGRESS)
    assert f"Error: store {path} is damaged (" in result.output
    assert result.output.rstrip().endswith("restore it from a copy or pass another --db")
    assert not (home / "out.parquet").exists() and not (home / "bundles").exists()


def test_damage_met_mid_command_is_the_stores_one_line(home, monkeypatch):
    """A block that fails to read back, however deep in a command, raw or wrapped in a library error."""
    import duckdb

    from zmlx_pipeline.data.store import Store, StoreError, default_db_path

    path = default_db_path()

    def cut(self, *args, **kwargs):
        raise duckdb.IOException(f'IO Error: Could not read enough bytes from file "{path}": attempted to read 9 bytes')

    def checksum(self, *args, **kwargs):
        try:
            raise duckdb.Error("Corrupt database file: computed checksum 1 does not match stored checksum 2 in block")
        except duckdb.Error as err:
            raise StoreError(f"cannot export a shard to out.parquet: {err}") from err

    for method, fails, args, says in (("summary", cut, ("summary",), "(IO Error: Could not read enough bytes"),
                                      ("export_shard", checksum, ("export", "out.parquet"),
                                       "(Corrupt database file: computed checksum 1")):
        real = getattr(Store, method)
        monkeypatch.setattr(Store, method, fails)
        result = run_cli(home, *args)
        monkeypatch.setattr(Store, method, real)
        assert_one_line_error(result)
        assert result.output.startswith(f"Error: store {path} is damaged {says}")

    def other_file(self, *args, **kwargs):
        raise duckdb.IOException('IO Error: Could not read enough bytes from file "/elsewhere/x.parquet"')

    monkeypatch.setattr(Store, "summary", other_file)  # not the store: not called damage
    result = CliRunner().invoke(cli, ["summary"])
    assert isinstance(result.exception, duckdb.IOException)


# -- paths that cannot be what they are given as --------------------------------------------------------------

@pytest.mark.parametrize("db", ["store.duckdb ", " store.duckdb", "store.duckdb\t"])
@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_store_file_name_with_white_space_at_an_end_is_refused(home, db, how):
    """$ZMLX_PIPELINE_DB="store.duckdb " made a second store beside store.duckdb, and no message showed the space."""
    args, env = (["--db", db], None) if how == "option" else ([], {"ZMLX_PIPELINE_DB": db})
    result = run_cli(home, "ingest", *args, str(SMALL_SHARD), env=env)
    assert_one_line_error(result)
    assert f"store path {db!r} has white space at the start or end of its file name" in result.output
    assert not (home / db).exists()


@pytest.mark.parametrize("db", ["emptydir/x/..", "emptydir/x/y/../.."])
def test_a_store_path_that_names_a_directory_by_dots_is_refused_before_anything_is_made(home, db):
    """x/.. is the folder holding x: opening it used to make x first, then call the folder a damaged store."""
    (home / "emptydir").mkdir()
    result = run_cli(home, "ingest", "--db", db, str(SMALL_SHARD))
    assert_one_line_error(result)
    assert f"store path {db} names a directory, not a store file: pass a file (e.g. " in result.output
    assert list((home / "emptydir").iterdir()) == []



def test_a_store_path_that_is_a_directory_or_a_symlink_loop_says_so(home):
    (home / "loop_a").symlink_to(home / "loop_b")
    (home / "loop_b").symlink_to(home / "loop_a")
    for db, says in (("emptydata", "is a directory, not a store file: pass a file in it"),
                     ("loop_a", "is a symlink loop: point the link at a store file")):
        for args in (("summary",), ("ingest", str(SMALL_SHARD))):
            result = run_cli(home, *args, env={"ZMLX_PIPELINE_DB": str(home / db)})
            assert_one_line_error(result)
            assert f"store path {home / db} {says}" in result.output


@pytest.mark.parametrize("target, says", [
    ("bun", "bun: it is a published bundle (it holds manifest.json), not a directory to publish into; pass its "
            "parent"),
    ("bun/devices", "it is inside the published bundle bun; pass the directory that holds that bundle"),
    ("loop_a", "loop_a is a symlink loop; fix or remove the link, or choose another --to"),
    ("loop_a/pub", "loop_a is a symlink loop"),
])
def test_publish_into_a_bundle_or_through_a_broken_link_is_refused_before_any_work(home, target, says):
    _bundle_copy(home, "bun")
    (home / "loop_a").symlink_to(home / "loop_b")
    (home / "loop_b").symlink_to(home / "loop_a")
    result = run_cli(home, "publish", "--to", target)
    assert_one_line_error(result, progress=True)
    assert says in result.output.splitlines()[-1]


# -- the forms --shape and --problem-size take -----------------------------------------------------------------

@pytest.mark.parametrize("option, text", [("--shape", "4096x4096"), ("--shape", "rows=4096,,cols=4096"),
                                          ("--shape", "rows=\u0664\u0660\u0669\u0666,cols=4096"),
                                          ("--problem-size", "4096x4096"), ("--problem-size", "+4096")])
def test_a_shape_in_another_form_is_refused_saying_the_form(home, option, text):
    args = ("lookup", "rmsnorm", "--shape", text) if option == "--shape" else ("import", "list.json", option, text)
    result = run_cli(home, *args)
    assert_one_line_error(result, code=2)
    last = result.output.splitlines()[-1]
    assert repr(text) in last
    assert ("DIM=N,DIM=N (e.g. rows=4096,cols=4096) or the dims' values in order (e.g. 4096,4096), N in digits 0-9"
            if option == "--shape" else "write whole numbers in ASCII digits, e.g. 4096,4096, or JSON") in last


def test_the_shape_forms_read_as_named_or_ordered_dims():
    from zmlx_pipeline.pipeline.cli_publish import parse_shape

    assert parse_shape("rows=4096,cols=512") == {"rows": 4096, "cols": 512}
    assert parse_shape("rows=4096, cols=512") == {"rows": 4096, "cols": 512}
    assert parse_shape("4096,512") == [4096, 512]
    assert parse_shape("rows=-1,cols=512") == {"rows": -1, "cols": 512}  # lookup refuses it by name (kernel_shape)


# -- ~ in a path: a shell's expansion, or one line naming the path ---------------------------------------------

NO_USER = "~zmlx-no-such-user"

TILDE_PATHS = [("summary", "--db", f"{NO_USER}/x.duckdb"),
               ("ingest", "--db", f"{NO_USER}/x.duckdb", str(SMALL_SHARD)),
               ("import", "--db", f"{NO_USER}/x.duckdb", "list.json"),
               ("import", "list.json", "--device-map", f"{NO_USER}/map.json"),
               ("export", f"{NO_USER}/x.parquet"),
               ("publish", "--to", f"{NO_USER}/b"),
               ("report", "--out", f"{NO_USER}/r"),
               ("train", "--models-dir", f"{NO_USER}/models"),
               ("run", "--bundle-dir", f"{NO_USER}/bundles"),
               ("collect", "--ray", "auto", "--shards", f"{NO_USER}/shards")]


@pytest.mark.parametrize("args", TILDE_PATHS, ids=[" ".join(a[:2]) for a in TILDE_PATHS])
def test_a_path_in_an_unknown_users_home_is_one_line_naming_it(home, args):
    result = run_cli(home, *args)  # nothing made: no ./~zmlx-no-such-user, no $HOME + "zmlx-no-such-user"
    assert_one_line_error(result, code=2)
    given = next(a for a in args if a.startswith(NO_USER))
    assert f"cannot expand {given!r}: no user 'zmlx-no-such-user' on this machine" in result.output.splitlines()[-1]
    assert not (home / NO_USER).exists()


@pytest.mark.parametrize("variable", ["ZMLX_PIPELINE_DB", "XDG_DATA_HOME"])
@pytest.mark.parametrize("args", [("summary",), ("ingest", str(SMALL_SHARD)), ("import", "list.json")])
def test_a_default_store_path_in_an_unknown_users_home_is_one_line_naming_the_variable(home, variable, args):
    env = {"ZMLX_PIPELINE_DB": None, variable: f"{NO_USER}/x"} if variable == "XDG_DATA_HOME" else \
        {variable: f"{NO_USER}/x.duckdb"}
    result = run_cli(home, *args, env=env)
    assert_one_line_error(result)
    assert result.output.startswith(f"Error: ${variable}: cannot expand '{NO_USER}/x")


def test_a_path_in_the_users_home_is_expanded_for_every_path_option(home):
    user_home = home / "user-home"
    user_home.mkdir()
    env = {"HOME": str(user_home)}
    result = CliRunner().invoke(cli, ["ingest", "--db", "~/new.duckdb", str(SMALL_SHARD)], env=env)
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["export", "--db", "~/new.duckdb", "~/out.parquet"], env=env)
    assert result.exit_code == 0, result.output
    assert (user_home / "new.duckdb").is_file() and (user_home / "out.parquet").is_file()
    assert not (home / "~").exists()
    result = CliRunner().invoke(cli, ["summary", "--json"], env={**env, "ZMLX_PIPELINE_DB": "~/new.duckdb"})
    assert result.exit_code == 0 and json.loads(result.output)[0]["device"].startswith("nvidia-h100-sxm")


# -- a refused command leaves no new store ---------------------------------------------------------------------

def test_collect_on_ray_refused_leaves_no_new_store_or_folder(home, monkeypatch):
    from zmlx_pipeline.pipeline import ray_collect

    def no_ray(*args, **kwargs):
        raise ray_collect.RayUnavailable("collect --ray needs Ray: pip install 'zmlx-pipeline[ray]'")

    monkeypatch.setattr(ray_collect, "collect_on_ray", no_ray)
    result = run_cli(home, "collect", "--ray", "auto", "--db", "new/sub/c.duckdb")
    assert_one_line_error(result)
    assert "needs Ray" in result.output and not (home / "new").exists()


# -- a path whose bytes this locale cannot decode (LC_ALL=C PYTHONUTF8=0), a blank $ZMLX_PIPELINE_DB -------------

#: "ünï" as Python holds it where the locale does not decode UTF-8 (LC_ALL=C PYTHONUTF8=0): surrogate escapes,
#: which DuckDB and the JSON written cannot take
NOT_UTF8 = b"\xc3\xbcn\xc3\xaf".decode("ascii", "surrogateescape")
NOT_UTF8_PATHS = [("publish", "--to", f"{NOT_UTF8}/pub"), ("ingest", "--db", f"{NOT_UTF8}.duckdb", str(SMALL_SHARD)),
                  ("summary", "--db", f"{NOT_UTF8}.duckdb"), ("export", f"{NOT_UTF8}.parquet"),
                  ("report", "--out", NOT_UTF8), ("train", "--models-dir", NOT_UTF8),
                  ("run", "--bundle-dir", NOT_UTF8), ("import", "--db", f"{NOT_UTF8}.duckdb", "list.json")]


@pytest.mark.parametrize("args", NOT_UTF8_PATHS, ids=[a[0] for a in NOT_UTF8_PATHS])
def test_a_path_that_is_not_utf8_in_this_locale_is_refused_before_any_work(home, args):
    result = run_cli(home, *args)  # publish wrote the bundle and `latest`, then failed to record it
    assert_one_line_error(result, code=2)
    last = result.output.splitlines()[-1]
    assert "ünï" in last and "cannot be encoded as UTF-8 in this locale: run with PYTHONUTF8=1" in last
    assert not [p for p in home.iterdir() if p.name.startswith(NOT_UTF8)]


def test_a_default_store_path_that_is_not_utf8_is_one_line_naming_the_variable(home):
    db = os.fsdecode(b"st\xffre.duckdb")  # not UTF-8 in any locale: the environment keeps it escaped
    result = run_cli(home, "summary", env={"ZMLX_PIPELINE_DB": db})
    assert_one_line_error(result)
    assert result.output.startswith("Error: $ZMLX_PIPELINE_DB: path st\\xffre.duckdb cannot be encoded as UTF-8 ")
    assert "PYTHONUTF8=1" in result.output and not os.path.exists(db)


@pytest.mark.skipif(os.name != "posix", reason="a locale that cannot decode UTF-8: POSIX")
def test_under_the_c_locale_publish_to_a_non_ascii_path_is_refused_in_one_line(home, subprocess_env):
    env = {**subprocess_env, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    done = subprocess.run([sys.executable, "-m", "zmlx_pipeline", "publish", "--to", b"\xc3\xbcn\xc3\xaf/pub"],
                          env=env, capture_output=True, timeout=120)
    assert done.returncode == 2 and done.stdout == b""
    last = done.stderr.splitlines()[-1]
    assert last.startswith(b"Error: Invalid value for '--to': path ") and done.stderr.count(b"Error:") == 1
    assert b"/pub cannot be encoded as UTF-8 in this locale: run with PYTHONUTF8=1" in last
    assert not (home / "\u00fcn\u00ef").exists()


@pytest.mark.parametrize("blank", [" ", "\t \n"])
@pytest.mark.parametrize("args", [("summary",), ("ingest", str(SMALL_SHARD))], ids=lambda a: a[0])
def test_a_blank_store_variable_is_refused_as_an_empty_db_is(home, blank, args):
    result = run_cli(home, *args, env={"ZMLX_PIPELINE_DB": blank})
    assert_one_line_error(result)
    assert result.output == f"Error: $ZMLX_PIPELINE_DB is {blank!r}, white space only: set it to a path, or unset it " \
                            "for the default store\n"
    assert not (home / blank).exists()
