"""Option values a command cannot use are usage errors (exit 2, one `Error:` line naming the option and the command's
--help), and an option that only means something with another is refused without it; nothing is written:

- lookup --shape: every value it cannot use, its form or its fit to the kernel's dims (which the message names);
- collect --shards without --ray, and a --preset the chosen kernels lack (the message names their presets);
- publish --device of a core limit the store never measured (exit 1: publish cannot build its table; the reason and
  the chip's own id are in the line);
- a value of thousands of digits or characters, in every option that reads a number, a duration or --gpus: the line
  repeats its start and its length, not all of it; an import --problem-size of thousands of digits is larger than an
  array dimension can be (never "inf");
- white space: ordinary spaces around a value or an item of a list are left out, one inside a number, a duration or a
  --shape item is refused saying what to write.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))

from bundle_fixtures import fresh_runtime  # noqa: E402,F401 - autouse: no bundle loaded, no answer remembered
from zmlx_pipeline.pipeline.cli import cli  # noqa: E402


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def one_error_line(tmp_path: Path, args: list[str], code: int) -> str:
    """The command's one line of output (checked: exit `code`, nothing on stdout, no file under tmp_path changed)."""
    before = digest(tmp_path)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == code, (result.output, result.exception)
    assert result.stdout == "" and "Traceback" not in result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert digest(tmp_path) == before
    return lines[0]


# -- lookup --shape --------------------------------------------------------------------------------------------

SHAPES = [
    ("4096,4096,1", "kernel 'rmsnorm' has dims rows, cols; got 3 values"),
    ("4096", "kernel 'rmsnorm' has dims rows, cols; got 1 values"),
    ("cols=4096", "kernel 'rmsnorm' has dims rows, cols; got cols"),
    ("rows=4096,cols=4096,depth=2", "kernel 'rmsnorm' has dims rows, cols; got rows, cols, depth"),
    ("rows=0,cols=4096", "shape dimension rows=0 must be a positive integer"),
    ("rows=-1,cols=4096", "shape dimension rows=-1 must be a positive integer"),
    ("4096,0", "shape dimension cols=0 must be a positive integer"),
    ("rows=99999999999999999999,cols=4096", "shape dimension rows=99999999999999999999 is larger than an array "
                                            "dimension can be (2147483647)"),
    ("rows=4096,rows=8", "'rows=4096,rows=8': rows is given twice"),
    ("4096,", "'4096,': give the shape as DIM=N,DIM=N"),
    # more digits than Python turns into an int (4300): said before int() is tried, the typed value cut short
    (f"rows={'9' * 5000},cols=4096", "shape dimension rows=99999999999999999999... (5000 digits) is larger than an "
                                     "array dimension can be (2147483647)"),
    (f"4096,{'9' * 5000}", "shape value 2=99999999999999999999... (5000 digits) is larger than an array dimension "
                           "can be (2147483647)"),
]


@pytest.mark.parametrize("text, says", SHAPES, ids=[t for t, _ in SHAPES])
def test_every_shape_lookup_cannot_use_is_a_usage_error(tmp_path, monkeypatch, text, says):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(tmp_path, ["lookup", "rmsnorm", "--shape", text, "--device", "nvidia-h200"], code=2)
    assert line.startswith(f"Error: Invalid value for --shape: {says}") and line.endswith(" lookup --help)")


def test_the_dims_are_those_of_the_bundle_named_after_the_shape(tmp_path, monkeypatch):
    """--bundle given after --shape: the shape is still checked against that bundle's kernel."""
    from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR

    monkeypatch.chdir(tmp_path)
    line = one_error_line(tmp_path, ["lookup", "matmul", "--shape", "4096,4096", "--bundle", str(DEFAULT_BUNDLE_DIR)],
                          code=2)
    assert "kernel 'matmul' has dims M, N, K; got 2 values" in line


def test_a_shape_that_fits_still_answers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for text in ("4096,4096", "cols=4096, rows=4096"):
        result = CliRunner().invoke(cli, ["lookup", "rmsnorm", "--shape", text, "--device", "nvidia-h200", "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["shape"] == {"rows": 4096, "cols": 4096}


def test_an_unknown_kernel_is_still_exit_1_whatever_the_shape(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(tmp_path, ["lookup", "rmsnrom", "--shape", "1,2,3"], code=1)
    assert line.startswith("Error: unknown kernel 'rmsnrom'")


# -- collect --shards ------------------------------------------------------------------------------------------

def test_shards_without_ray_is_a_usage_error_naming_both(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shards").mkdir()
    line = one_error_line(tmp_path, ["collect", "--shards", str(tmp_path / "shards")], code=2)
    assert line == ("Error: --shards is only for --ray (the folder the Ray actors write their shards to): add "
                    "--ray ADDRESS, or leave --shards out (cli collect --help)")
    assert not (tmp_path / "store.duckdb").exists()  # $ZMLX_PIPELINE_DB (conftest): no store made


@pytest.mark.parametrize("kernels, says", [((), "the kernels have smoke, full, thin"),
                                           (("-k", "rmsnorm"), "kernel rmsnorm has smoke, full, thin")])
def test_an_unknown_preset_is_a_usage_error_naming_the_presets(tmp_path, monkeypatch, kernels, says):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(tmp_path, ["collect", "--db", str(tmp_path / "s.duckdb"), "--preset", "nope", *kernels],
                          code=2)
    assert line == f"Error: Invalid value for --preset: no shape preset 'nope'; {says} (cli collect --help)"
    assert not (tmp_path / "s.duckdb").exists()


def test_collect_help_says_shards_is_for_ray():
    result = CliRunner().invoke(cli, ["collect", "--help"])
    assert result.exit_code == 0 and "--shards" in result.output and "With --ray" in result.output


# -- publish --device of a core limit --------------------------------------------------------------------------

@pytest.fixture
def measured_limit_store(tmp_path, make_measurement):
    """The default store holding rmsnorm on nvidia-h100-sxm@32sm (a measured core limit) and nothing else."""
    from zmlx_pipeline.data.catalog import get_device
    from zmlx_pipeline.data.store import Store, default_db_path

    limit = get_device("nvidia-h100-sxm").with_core_limit(32)
    with Store(default_db_path()) as store:
        store.upsert_device({**limit.as_row(), "device_id": limit.id, "in_catalog": True})
        store.record([make_measurement(device_id=limit.id, kernel="rmsnorm", shape={"rows": r, "cols": 512},
                                       config={"TG": tg}, median_us=float(tg + r))
                      for r in (1, 8) for tg in (32, 64)])
    return default_db_path()


def test_publish_refuses_a_core_limit_it_never_measured_saying_why(tmp_path, monkeypatch, measured_limit_store):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(tmp_path, ["publish", "--to", "bundles", "--device", "nvidia-h100-sxm@20sm"], code=1)
    assert line == ("Error: device 'nvidia-h100-sxm@20sm' is a core limit of nvidia-h100-sxm that the store holds no "
                    "measurements of, which publish cannot build a table for (a lookup answers it from its chip's "
                    "table or nearest measured limit): give --device nvidia-h100-sxm")
    assert not (tmp_path / "bundles").exists()


def test_publish_says_why_a_core_limit_cannot_be(tmp_path, monkeypatch, measured_limit_store):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(tmp_path, ["publish", "--to", "bundles", "--device", "nvidia-h100-sxm@200sm"], code=1)
    assert "limits nvidia-h100-sxm to 200 SMs, but it has 132" in line and "neither a catalog id" not in line


def test_a_measured_core_limit_and_its_chip_are_publish_devices(measured_limit_store):
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.publish.build import resolve_devices

    with Store(measured_limit_store) as store:
        assert resolve_devices(store, ["nvidia-h100-sxm@32sm", "nvidia-h100-sxm"]) == ["nvidia-h100-sxm@32sm",
                                                                                        "nvidia-h100-sxm"]


# -- train / evaluate --jobs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["train"], ["evaluate", "--split", "shapes"]])
@pytest.mark.parametrize("jobs", ["65", "9223372036854775807", "99999999999999999999", "0"])
def test_a_worker_count_past_what_a_pool_can_start_is_a_usage_error(tmp_path, monkeypatch, command, jobs):
    """A count C cannot hold overflowed in the pool (a traceback), and any other started that many processes."""
    monkeypatch.chdir(tmp_path)
    line = one_error_line(tmp_path, [*command, "--db", str(tmp_path / "s.duckdb"), "-j", jobs], code=2)
    assert "Invalid value for '--jobs' / '-j'" in line and "1<=x<=64" in line
    assert not (tmp_path / "s.duckdb").exists()


@pytest.mark.parametrize("device", ["", " ", "\t"])
def test_a_blank_lookup_device_is_a_usage_error_as_other_commands_device_is(tmp_path, monkeypatch, device):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(tmp_path, ["lookup", "rmsnorm", "--shape", "4096,4096", "--device", device], code=2)
    assert line.startswith("Error: Invalid value for '--device': ") and "names no device" in line
    assert line.endswith("(cli lookup --help)")


@pytest.mark.parametrize(("device", "reason"), [
    ("", "'' names no device: give a device id such as nvidia-h200, or leave --device out for every device"),
    (" ", "' ' names no device: give a device id such as nvidia-h200, or leave --device out for every device"),
    ("nvidia-h100-sxm@32sm\n", "'nvidia-h100-sxm@32sm\\n' holds a control or format character (U+000A); write the "
                              "name or id without it"),
    ("\tnvidia-h100-sxm@32sm", "'\\tnvidia-h100-sxm@32sm' holds a control or format character (U+0009); write the "
                              "name or id without it"),
    ("nvidia-h100-sxm\x1b@32sm", "'nvidia-h100-sxm\\x1b@32sm' holds a control or format character (U+001B); write "
                                "the name or id without it"),
    ("nvidia-h100-sxm@32sm\u3000", "'nvidia-h100-sxm@32sm\\u3000' holds characters Unicode writes otherwise (as "
                                  "'nvidia-h100-sxm@32sm '); write it in plain characters"),
])
@pytest.mark.parametrize("command", ["summary", "export"])
def test_a_summary_or_export_device_that_is_empty_or_not_plain_is_a_usage_error(
        tmp_path, monkeypatch, measured_limit_store, command, device, reason):
    """`nvidia-h100-sxm@32sm\\n` from a script was read as the stored id, and an empty one exited 1."""
    monkeypatch.chdir(tmp_path)
    args = [command, "--device", device] + (["out.parquet"] if command == "export" else [])
    line = one_error_line(tmp_path, args, code=2)
    assert line == f"Error: Invalid value for '--device': {reason} (cli {command} --help)"
    assert not (tmp_path / "out.parquet").exists()
    plain = [command, "--device", " nvidia-h100-sxm@32sm ", *(["out.parquet"] if command == "export" else [])]
    assert CliRunner().invoke(cli, plain).exit_code == 0  # ordinary spaces around it are left out, as in any option


@pytest.fixture(scope="module")
def smoke_store(tmp_path_factory):
    """The committed 32-SM H100 shard: built-in kernels measured on one NVIDIA device."""
    from bundle_fixtures import SMOKE_SHARD

    from zmlx_pipeline.data.shards import ingest_shards
    from zmlx_pipeline.data.store import Store

    db = tmp_path_factory.mktemp("smoke") / "s.duckdb"
    with Store(db) as store:
        ingest_shards(store, [SMOKE_SHARD])
    return db


@pytest.mark.parametrize("device, chip", [
    ("amd-mi300x", "amd-mi300x (rocm gfx942"), ("AMD Instinct MI250X", "amd-mi250x (rocm gfx90a"),
    ("amd-radeon-rx-7900-xtx", "amd-radeon-rx-7900-xtx (rocm gfx1100"),
    ("Tesla V100-SXM2-32GB", "nvidia-v100-sxm2-32gb (cuda sm_70"), ("GTX 1080 Ti", "nvidia-gtx-1080-ti (cuda sm_61")])
def test_publish_refuses_a_chip_mlx_does_not_run_on_that_no_kernel_measured(tmp_path, monkeypatch, smoke_store,
                                                                           device, chip):
    """Built-in kernels get tables on the chips MLX runs on (Metal; CUDA at sm_75 or newer) and measured devices
    only: such a --device got none, and the command exited 0 without a word. (An imported kernel's tables go to any
    chip asked for.)"""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["publish", "--db", str(smoke_store), "--to", "bundles", "-k", "rmsnorm",
                                      "--device", "nvidia-h100-sxm", "--device", device])
    assert result.exit_code == 1 and "Traceback" not in result.output
    last = result.output.splitlines()[-1]
    assert last.startswith(f"Error: MLX does not run on device {chip}; MLX runs on metal and cuda at sm_75 or "
                           "newer) and no kernel of this publish measured it, so no lookup table is built for it")
    assert not (tmp_path / "bundles").exists()


@pytest.mark.parametrize("kernel", ["", " "])
def test_a_blank_models_kernel_is_a_usage_error(tmp_path, monkeypatch, kernel):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(tmp_path, ["models", "--db", str(tmp_path / "s.duckdb"), "--kernel", kernel], code=2)
    assert "names nothing: give a kernel, or leave --kernel out for all" in line


# -- a long value is echoed cut short ----------------------------------------------------------------------------

LONG = "9" * 5000
DATA = Path(__file__).resolve().parents[2] / "data"  # the committed shards, which run reads first
LONG_VALUES = [
    (["lookup", "rmsnorm", "--shape", "4096,4096", "-k", LONG], "has more than the 19 digits a count here can have"),
    (["evaluate", "--split", "shapes", "--k", LONG], "is not in the range 1<=x<=4096."),
    (["evaluate", "--split", "shapes", "-j", LONG], "is not in the range 1<=x<=64."),
    (["train", "-j", "-" + LONG], "is not in the range 1<=x<=64."),
    (["report", "--out", "r", "--heatmaps", LONG], "is not in the range 0<=x<=10."),
    (["collect", "--max-shapes", "0" * 5000 + "1" + "0" * 30], "has more than the 19 digits a count here can have"),
    (["repeat", "--fraction", LONG], "is not in the range 0<x<=1."),
    (["collect", "--warmup-ms", LONG], "is not in the range 0<=x<=1000."),
]


@pytest.mark.parametrize("args, says", LONG_VALUES, ids=[" ".join(a[:-1]) for a, _ in LONG_VALUES])
def test_a_number_of_thousands_of_digits_is_echoed_by_its_start_and_length(tmp_path, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(tmp_path, args, code=2)
    typed = args[-1]
    assert f"{typed[:20]}... ({len(typed)} digits) {says}" in line and len(line) < 200, line[:300]


LONG_TEXTS = [["collect", "--budget", LONG + "m"], ["repeat", "--budget", LONG], ["contribute", "--budget", "1" + LONG],
              ["run", "--data", str(DATA), "--collect", LONG + "h"], ["collect", "--gpus", "x" * 5000],
              ["lookup", "rmsnorm", "--shape", "4,4", "-k", "x" * 5000]]


@pytest.mark.parametrize("args", LONG_TEXTS, ids=[" ".join(a[:-1]).replace(str(DATA), "data") for a in LONG_TEXTS])
def test_a_long_duration_or_name_is_echoed_by_its_start_and_length(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(tmp_path, args, code=2)
    assert f"{args[-1][:60]!r}... ({len(args[-1])} characters)" in line and len(line) < 300, line[:300]
    assert not (tmp_path / "store.duckdb").exists()


def test_a_long_number_under_leading_zeros_is_read_as_its_value(tmp_path, monkeypatch):
    """int() refuses text of over 4300 digits, zeros too: the zeros go before it reads the number."""
    monkeypatch.chdir(tmp_path)
    line = one_error_line(tmp_path, ["train", "-j", "0" * 5000 + "99"], code=2)
    assert line.startswith("Error: Invalid value for '--jobs' / '-j': 99 is not in the range 1<=x<=64.")


# -- import --problem-size of thousands of digits ------------------------------------------------------------

@pytest.mark.parametrize("text, says", [
    (LONG, f"problem size {LONG[:20]}... (5000 digits): x={LONG[:20]}... (5000 digits) is larger than an array "
           "dimension can be (2147483647)"),
    (f"4096, {LONG}", f"problem size [4096, {LONG[:20]}... (5000 digits)]: y={LONG[:20]}... (5000 digits) is larger"),
    (f'{{"n": {LONG}}}', f"problem size {{'n': {LONG[:20]}... (5000 digits)}}: n={LONG[:20]}... (5000 digits) is "
                         "larger"),
    ("1" + "0" * 400 + ".0", "problem size 10000000000000000000... (403 digits): x=10000000000000000000... (403 "
                             "digits) is larger than an array dimension can be (2147483647)"),
    ("9" * 300, f"x={'9' * 20}... (300 digits) is larger than an array dimension can be (2147483647)"),
], ids=["5000 digits", "a list", "an object", "a whole float", "300 digits"])
def test_a_problem_size_past_an_array_dimension_is_said_so_cut_short(tmp_path, monkeypatch, text, says):
    """A size of 5,000 digits read as a float was said to be "problem size inf"; one of 300 was echoed whole."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cache.json").write_text("{}\n")
    line = one_error_line(tmp_path, ["import", "cache.json", "--problem-size", text], code=2)
    assert line.startswith("Error: Invalid value for '--problem-size': ") and says in line and len(line) < 250, line
    assert not (tmp_path / "store.duckdb").exists()


# -- white space: ordinary spaces around a value or an item, none inside one -----------------------------------

INNER_SPACES = [
    (["lookup", "rmsnorm", "--shape", "4096,4096", "-k", "1 0"],
     "Invalid value for '-k': '1 0' is not a whole number in digits 0-9: write 10, with no space inside the number"),
    (["lookup", "rmsnorm", "--shape", "4096,4096", "-k", "+3"],
     "Invalid value for '-k': '+3' is not a whole number in digits 0-9: write 3, without the + sign"),
    (["evaluate", "--split", "shapes", "--k", " 1 0 "],
     "Invalid value for '--k': ' 1 0 ' is not a whole number in digits 0-9: write 10, with no space inside the number"),
    (["repeat", "--fraction", "0. 5"], "Invalid value for '--fraction': '0. 5' is not a number in digits 0-9 (such as "
                                       "0.5): write 0.5, with no space inside the number"),
    (["repeat", "--budget", "10 m"], "Invalid value for --budget: cannot read duration '10 m': use e.g. 90s, 10m or "
                                     "1.5h: a number in digits 0-9 and right after it s, m or h in lower case (no "
                                     "unit: seconds) (write '10m', with no space inside)"),
    (["collect", "--budget", " 1.5 h "], "Invalid value for --budget: cannot read duration ' 1.5 h ': use e.g. 90s"),
    (["collect", "--budget", "1 0m"], "Invalid value for --budget: cannot read duration '1 0m': use e.g. 90s"),
    (["lookup", "rmsnorm", "--shape", "rows= 5,cols=4096"],
     "Invalid value for --shape: 'rows= 5,cols=4096': a space inside 'rows= 5'; write 'rows=5' (spaces may stand "
     "around an item, not inside one)"),
    (["lookup", "rmsnorm", "--shape", "rows=5, cols =4096"],
     "Invalid value for --shape: 'rows=5, cols =4096': a space inside 'cols =4096'; write 'cols=4096'"),
    (["lookup", "rmsnorm", "--shape", "40 96,4096"],
     "Invalid value for --shape: '40 96,4096': a space inside '40 96'; write '4096'"),
]


@pytest.mark.parametrize("args, says", INNER_SPACES, ids=[" ".join(a[-2:]) for a, _ in INNER_SPACES])
def test_a_space_inside_a_number_duration_or_shape_item_is_refused_saying_what_to_write(tmp_path, monkeypatch, args,
                                                                                          says):
    """`--budget '10 m'` was read as 10m and `-k ' 3'` as 3, while `--shape 'rows= 5'` was refused: now every value
    takes ordinary spaces around it (and around each item of a list), none inside."""
    monkeypatch.chdir(tmp_path)
    line = one_error_line(tmp_path, args, code=2)
    assert line.startswith(f"Error: {says}"), line
    assert not (tmp_path / "store.duckdb").exists()


@pytest.mark.parametrize("args", [["-k", " 3 "], ["--shape", " rows=5 , cols=4096 "], ["--shape", "5 ,4096"]],
                         ids=lambda a: " ".join(a))
def test_spaces_around_a_value_or_an_item_are_left_out(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    shape = [] if "--shape" in args else ["--shape", "rows=5,cols=4096"]
    result = CliRunner().invoke(cli, ["lookup", "rmsnorm", *shape, *args, "--device", "nvidia-h200", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["shape"] == {"rows": 5, "cols": 4096}
    assert "-k" not in args or len(answer["candidates"]) == 3


def test_a_duration_takes_spaces_around_it_only():
    from zmlx_pipeline.pipeline.collect import parse_duration

    assert [parse_duration(t) for t in ("10m ", " 10m", " 90 ", "1.5h")] == [600, 600, 90, 5400]
    for text in ("10 m", "1.5 h", "90 s", "10m\n", "\t10m"):
        with pytest.raises(ValueError, match="cannot read duration"):
            parse_duration(text)
