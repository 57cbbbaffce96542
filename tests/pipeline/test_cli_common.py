"""The CLI's one translation of library errors (cli_common.CommandGroup) and the shared options."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.pipeline.cli import cli
from zmlx_pipeline.pipeline.cli_common import CommandGroup, db_option, split_names, store_to_fill


REPO_ROOT = Path(__file__).resolve().parents[2]


def _group(exc: BaseException) -> click.Group:
    @click.group(cls=CommandGroup)
    def group() -> None:
        pass

    @group.command()
    def fails() -> None:
        raise exc

    return group


def test_a_library_error_is_one_line_with_its_newlines_escaped_and_exit_1():
    class StoreLike(ZmlxPipelineError, ValueError):
        pass

    result = CliRunner().invoke(_group(StoreLike("no store at x.duckdb\n  detail a wrapped library added")), ["fails"])
    assert result.exit_code == 1
    assert result.output == "Error: no store at x.duckdb\\n  detail a wrapped library added\n"


@pytest.mark.parametrize("exc", [ZmlxPipelineError("no store at r3/nl\ndir/s.duckdb: run a collect first"),
                                 click.ClickException("no store at r3/nl\ndir/s.duckdb: run a collect first"),
                                 FileNotFoundError(2, "No such file or directory", "r3/nl\ndir/s.duckdb")],
                         ids=["library", "click", "os"])
def test_a_newline_or_esc_in_an_error_is_escaped_never_cut(exc):
    """A newline in a path no longer cuts the message to "Error: r3/nl": the whole reason, the newline as \\n."""
    result = CliRunner().invoke(_group(exc), ["fails"])
    assert result.exit_code == 1
    if isinstance(exc, OSError):
        assert result.output == "Error: No such file or directory: r3/nl\\ndir/s.duckdb\n"
    else:
        assert result.output == "Error: no store at r3/nl\\ndir/s.duckdb: run a collect first\n"


def test_control_characters_are_escaped_and_ordinary_text_kept():
    from zmlx_pipeline.core.files import printable

    assert printable("r3/esc\x1b[2Jdir\tx\r\x7f\x85\u2028\u202e\udcff") == (
        "r3/esc\\x1b[2Jdir\\tx\\r\\x7f\\x85\\u2028\\u202e\\xff")
    for text in ("data/nvidia h200.parquet", "ünïcode · 4096×4096", "C:\\new\\dir", "it's \"quoted\""):
        assert printable(text) == text
    assert printable(printable("a\nb\x1b")) == printable("a\nb\x1b")


def test_a_path_with_a_newline_and_esc_through_the_real_cli_is_one_escaped_line(tmp_path):
    """export's own refusal and click's check of a path argument: one line each, the path's control characters
    escaped (piped, click would strip a raw ESC and name a path that looks like another)."""
    odd = tmp_path / "nl\ndir\x1b[2J"
    odd.mkdir()
    (odd / "x.parquet").write_bytes(b"kept")
    result = CliRunner().invoke(cli, ["export", "--db", str(tmp_path / "s.duckdb"), str(odd / "x.parquet")])
    assert (result.exit_code, result.output) == (
        1, f"Error: {tmp_path}/nl\\ndir\\x1b[2J/x.parquet exists: pass --force to replace it, or choose another path\n")
    result = CliRunner().invoke(cli, ["ingest", "--db", str(tmp_path / "s.duckdb"), str(odd / "gone.parquet")],
                                prog_name="zmlx-pipeline")
    assert (result.exit_code, result.output) == (
        2, f"Error: Invalid value for 'SOURCES...': Path '{tmp_path}/nl\\ndir\\x1b[2J/gone.parquet' does not exist. "
           "(zmlx-pipeline ingest --help)\n")
    assert not (tmp_path / "s.duckdb").exists() and sorted(p.name for p in odd.iterdir()) == ["x.parquet"]
    assert (odd / "x.parquet").read_bytes() == b"kept"


def test_a_success_line_naming_a_path_with_a_newline_stays_one_line(tmp_path):
    from zmlx_pipeline.data.store import Store

    with Store(tmp_path / "s.duckdb"):
        pass
    odd = tmp_path / "nl\ndir"
    odd.mkdir()
    result = CliRunner().invoke(cli, ["export", "--db", str(tmp_path / "s.duckdb"), str(odd / "x.parquet")])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote 0 measurements to {tmp_path}/nl\\ndir/x.parquet (")
    assert result.output.count("\n") == 1 and (odd / "x.parquet").is_file()


def test_a_table_cell_with_a_newline_stays_on_its_row():
    from zmlx_pipeline.pipeline.cli_common import render_table

    table = render_table([{"key": "path", "value": "pt/new\nline"}, {"key": "esc", "value": "a\x1b[2Jb"}])
    assert table.splitlines() == ["key   value", "----  ------------", "path  pt/new\\nline", "esc   a\\x1b[2Jb"]


@pytest.mark.parametrize("args, says", [
    (["devices", "--vendor", "nope"],
     "Invalid value for '--vendor': 'nope' is not one of 'apple', 'nvidia', 'amd'. (zmlx-pipeline devices --help)"),
    (["lookup", "rmsnorm", "--shape", "rows=1e3"],
     "Invalid value for --shape: 'rows=1e3': give the shape as DIM=N,DIM=N (e.g. rows=4096,cols=4096) or the dims' "
     "values in order (e.g. 4096,4096), N in digits 0-9 (zmlx-pipeline lookup --help)"),
    (["evaluate"], "Missing option '--split'. Choose from: shapes, devices, lodo (zmlx-pipeline evaluate --help)"),
    (["publish"], "Missing option '--to'. (zmlx-pipeline publish --help)"),
    (["nope"], "No such command 'nope'. Did you mean 'noise'? (zmlx-pipeline --help)"),
    (["devices", "--vendor", "a\nb"],
     "Invalid value for '--vendor': 'a\\nb' is not one of 'apple', 'nvidia', 'amd'. (zmlx-pipeline devices --help)"),
], ids=["choice", "shape", "missing-split", "missing-to", "command", "newline"])
def test_a_usage_error_is_one_line_naming_the_help_and_exit_2(args, says):
    result = CliRunner().invoke(cli, args, prog_name="zmlx-pipeline")
    assert (result.exit_code, result.stdout, result.output) == (2, "", f"Error: {says}\n")


@pytest.mark.parametrize("args, says", [
    (["collect", "-j", "2\n"], "Invalid value for '--jobs' / '-j': '2\\n' is not a whole number in digits 0-9"),
    (["evaluate", "--split", "shapes", "--k", "3\n"], "Invalid value for '--k': '3\\n' is not a whole number in "
                                                      "digits 0-9"),
    (["evaluate", "--split", "shapes", "-j", "\uff12"], "Invalid value for '--jobs' / '-j': '\uff12' is not a whole "
                                                        "number in digits 0-9"),
    (["report", "--out", "r", "--heatmaps", "1_0"], "Invalid value for '--heatmaps': '1_0' is not a whole number in "
                                                   "digits 0-9"),
    (["repeat", "--fraction", "\uff10.5"], "Invalid value for '--fraction': '\uff10.5' is not a number in digits 0-9 "
                                           "(such as 0.5)"),
    (["collect", "--budget", "\uff13\uff10m"], "Invalid value for --budget: cannot read duration '\uff13\uff10m': use e.g. "
                                               "90s, 10m or 1.5h: a number in digits 0-9 and right after it s, m "
                                               "or h in lower case (no unit: seconds)"),
    (["collect", "--budget", "10M"], "Invalid value for --budget: cannot read duration '10M': use e.g. 90s, 10m or "
                                     "1.5h: a number in digits 0-9 and right after it s, m or h in lower case (no "
                                     "unit: seconds)"),
    (["collect", "--gpus", "\uff13"], "Invalid value for --gpus: cannot read '\uff13': use all, a count such as 2, or "
                                      "indices such as 0,2,3"),
], ids=["newline-j", "newline-k", "fullwidth-j", "underscore", "fullwidth-fraction", "fullwidth-budget",
        "capital-M", "fullwidth-gpus"])
def test_numbers_take_digits_0_to_9_only(args, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    result = CliRunner().invoke(cli, args, prog_name="zmlx-pipeline")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.output == f"Error: {says} (zmlx-pipeline {args[0]} --help)\n"
    assert sorted(tmp_path.rglob("*")) == before  # no store, no report folder


def test_whole_numbers_with_ordinary_spaces_are_still_read():
    from zmlx_pipeline.pipeline.cli_common import FiniteRange, WholeRange
    from zmlx_pipeline.pipeline.collect import parse_duration

    assert WholeRange(1).convert(" 3 ", None, None) == 3 and WholeRange(1).convert(7, None, None) == 7
    assert FiniteRange(0, 1).convert(" 0.25", None, None) == 0.25 and FiniteRange(0, 1).convert("1e-1", None, None) == 0.1
    assert [parse_duration(t) for t in ("90", " 10m ", "1.5h", "2s ", ".5m")] == [90, 600, 5400, 2, 30]


def test_an_error_without_a_message_is_named_by_its_type():
    class Empty(ZmlxPipelineError):
        pass

    result = CliRunner().invoke(_group(Empty()), ["fails"])
    assert result.exit_code == 1 and result.output == "Error: Empty\n"


def test_any_other_error_is_a_bug_and_keeps_its_traceback():
    result = CliRunner().invoke(_group(KeyError("oops")), ["fails"])
    assert result.exit_code == 1 and isinstance(result.exception, KeyError)


def test_every_command_runs_under_the_translating_group():
    assert isinstance(cli, CommandGroup)
    assert {"collect", "train", "evaluate", "models", "publish", "lookup", "profiles", "report"} <= set(cli.commands)


def test_names_come_repeated_or_comma_separated():
    assert split_names(("a,b", " c ", ",")) == ["a", "b", "c"]


def test_a_name_given_twice_is_taken_once_in_the_order_first_given():
    """`evaluate --model robust --model robust` printed every row twice."""
    assert split_names(("robust", "robust,ensemble", " robust ")) == ["robust", "ensemble"]
    result = CliRunner().invoke(cli, ["kernels", "-k", "rmsnorm", "-k", "softmax,rmsnorm", "--json"])
    assert result.exit_code == 0, result.output
    assert [k["name"] for k in json.loads(result.output)] == ["rmsnorm", "softmax"]


def test_an_unknown_kernel_through_the_real_cli_is_one_line(tmp_path):
    result = CliRunner().invoke(cli, ["kernels", "-k", "rmsnrom"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and len(result.output.strip().splitlines()) == 1
    assert "rmsnrom" in result.output


@pytest.mark.parametrize("name, says", [("k" * 100_000, "unknown kernel 'kkk"),
                                         ("a" * 100_000 + ":SPEC", "cannot import 'aaa")], ids=["name", "path"])
def test_a_kernel_name_of_100000_characters_is_shortened_in_its_one_line(name, says):
    result = CliRunner().invoke(cli, ["kernels", "-k", name])
    assert result.exit_code == 1 and result.output.startswith(f"Error: {says}")
    assert len(result.output) < 1000 and "... (100" in result.output  # its start, then how long it is


def test_autotuning_a_kernel_no_registry_names_shortens_the_name_too():
    from zmlx_pipeline.runtime.errors import UnknownKernelError
    from zmlx_pipeline.runtime.tuner import tune

    with pytest.raises(UnknownKernelError) as err:  # the registry's message, as the tuner raises it
        tune("k" * 100_000, {"rows": 1}, "float16")
    assert len(str(err.value)) < 1000 and str(err.value).startswith("unknown kernel 'kkkk")


# -- an option that takes one value, given twice ---------------------------------------------------------------

def _single_value_options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params
            if isinstance(p, click.Option) and not (p.multiple or p.is_flag or p.count or p.hidden)]


def _repeated(command: click.Command, option: click.Option) -> list[str]:
    """Arguments giving `option` twice with different values, and a placeholder for each argument of the command
    (the repeat is refused while the parser reads, before any value is checked or any work starts)."""
    name = max(option.opts, key=len)
    arguments = ["placeholder" for p in command.params if isinstance(p, click.Argument)]
    return [name, "one", name, "two", *arguments]


EVERY_SINGLE_VALUE_OPTION = [(name, option) for name, command in sorted(cli.commands.items())
                             for option in _single_value_options(command)]


@pytest.mark.parametrize("name, option", EVERY_SINGLE_VALUE_OPTION,
                         ids=[f"{n} {max(o.opts, key=len)}" for n, o in EVERY_SINGLE_VALUE_OPTION])
def test_every_option_that_takes_one_value_given_twice_is_a_usage_error(tmp_path, name, option):
    result = CliRunner().invoke(cli, [name, *_repeated(cli.commands[name], option)])
    assert result.exit_code == 2, result.output
    last = result.output.splitlines()[-1]
    assert last.startswith("Error: ") and max(option.opts, key=len) in last
    assert "is given more than once; it takes one value: give it once" in last
    assert list(tmp_path.iterdir()) == [tmp_path / "home"]  # no store, no output made


def test_the_repeats_found_where_they_were_lost():
    for args in (["export", "x.parquet", "--device", "nvidia-h200", "--device", "nvidia-h100-sxm"],
                 ["summary", "--device", "a", "--device", "b"],
                 ["lookup", "rmsnorm", "--shape", "4096,4096", "--dtype", "float16", "--dtype", "float32",
                  "--bundle", "b1", "--bundle", "b2"],
                 ["summary", "--db", "same.duckdb", "--db=same.duckdb"]):  # the same value twice too, consistently
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2 and "is given more than once" in result.output.splitlines()[-1], result.output


def test_options_that_take_several_values_and_flags_may_repeat():
    result = CliRunner().invoke(cli, ["kernels", "-k", "rmsnorm", "-k", "softmax", "--json", "--json"])
    assert result.exit_code == 0, result.output
    assert [k["name"] for k in json.loads(result.output)] == ["rmsnorm", "softmax"]


def test_help_still_answers_with_an_option_repeated():
    result = CliRunner().invoke(cli, ["summary", "--device", "a", "--device", "b", "--help"])
    assert result.exit_code == 0 and result.output.startswith("Usage: ")


def test_a_command_that_would_let_a_repeat_through_cannot_join_the_group():
    group = _group(ValueError("unused"))
    with pytest.raises(TypeError, match="cls=OneValueCommand"):
        group.add_command(click.Command("plain", callback=lambda: None))


# -- a store the command made, when the command fails ----------------------------------------------------------

def _filler(measurement) -> click.Group:
    """A group whose one command fills a store with `measurement` (None: nothing), then fails."""
    @click.group(cls=CommandGroup)
    def group() -> None:
        pass

    @group.command()
    @db_option
    def fill(db) -> None:
        with store_to_fill(db, keep_filled=True) as store:
            if measurement is not None:
                store.upsert_device({"device_id": measurement.device_id, "name": "GPU", "vendor": "nvidia"})
                store.record([measurement])
            raise ZmlxPipelineError("stopped")

    return group


def test_a_store_made_by_a_failed_command_goes_with_its_folders_unless_it_holds_measurements(tmp_path,
                                                                                            make_measurement):
    db = tmp_path / "new" / "deeper" / "store.duckdb"
    result = CliRunner().invoke(_filler(None), ["fill", "--db", str(db)])
    assert result.output == "Error: stopped\n" and not (tmp_path / "new").exists()
    result = CliRunner().invoke(_filler(make_measurement()), ["fill", "--db", str(db)])
    assert result.output == "Error: stopped\n" and db.is_file()  # kept: what it measured is resumed from


# -- stdout: closed, or its reader gone (`| head -1`) -----------------------------------------------------------

def run_command(args, env: dict, stdout=subprocess.PIPE, cwd=None, preexec_fn=None,
                script: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m zmlx_pipeline ARGS` (or `python SCRIPT ARGS`) in a new process of its own session, with Python's
    usual Ctrl-C handler (a test runner may start children with SIGINT ignored), stdout as given (captured by
    default); stderr is captured."""
    def start() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if preexec_fn is not None:
            preexec_fn()

    command = [sys.executable, str(script)] if script is not None else [sys.executable, "-m", "zmlx_pipeline"]
    return subprocess.run([*command, *args], env=env, cwd=cwd, stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=300, start_new_session=True, preexec_fn=start)


LISTINGS = [("devices",), ("profiles", "--json"), ("--help",),
            ("lookup", "matmul", "--shape", "4096,4096,4096", "--device", "nvidia-h100-sxm", "-k", "500")]


@pytest.mark.skipif(os.name != "posix", reason="pipes and signals: POSIX")
@pytest.mark.parametrize("args", LISTINGS, ids=[a[0] for a in LISTINGS])
def test_a_reader_gone_before_the_output_ends_the_command_quietly_with_141_every_time(args, subprocess_env):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: every write meets a broken pipe
    try:
        done = run_command(args, subprocess_env, stdout=write)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")  # no "Error: Broken pipe", no "Exception ignored"


@pytest.mark.skipif(os.name != "posix", reason="closing fd 1 in the child: POSIX")
@pytest.mark.parametrize("args", [("devices",), ("summary", "--json"), ("models",), ("profiles",),
                                  ("lookup", "rmsnorm", "--shape", "4096,4096", "--device", "nvidia-h100-sxm"),
                                  ("ingest", "--db", "new.duckdb", str(REPO_ROOT / "data" / "nvidia-h200.parquet"))],
                         ids=lambda a: a[0])
def test_a_closed_stdout_is_refused_in_one_line_before_any_work(args, tmp_path, subprocess_env):
    done = run_command(args, subprocess_env, stdout=subprocess.DEVNULL, cwd=tmp_path, preexec_fn=lambda: os.close(1))
    assert done.returncode == 1
    assert done.stderr.startswith("Error: cannot write to stdout: it is closed") and done.stderr.count("\n") == 1
    assert not (tmp_path / "new.duckdb").exists()


# -- a stop (Ctrl-C, SIGTERM) once the work is committed -------------------------------------------------------

#: runs `zmlx-pipeline ARGS...` as its console script does, sending itself SIGNAL once, at WHEN: `start` (the
#: command's library call begins: before any commit), `latest` (publish's commit point: `latest` was just
#: replaced), `result` (the command prints its result) or `teardown` (the interpreter winds down after it ended)
STOP_AT = """
import os, signal, sys

import click

from zmlx_pipeline.data.store import Store
from zmlx_pipeline.pipeline import cli
from zmlx_pipeline.publish import writer

when, signum, args = sys.argv[1], getattr(signal, sys.argv[2]), sys.argv[3:]
sent = []


def stop():
    if not sent:
        sent.append(signum)
        os.kill(os.getpid(), signum)  # Python runs its handler at the next instruction: here


def stop_first(function):
    def stopped(*a, **k):
        stop()
        return function(*a, **k)
    return stopped


def stop_after(function):
    def stopped(*a, **k):
        result = function(*a, **k)
        stop()
        return result
    return stopped


class StopWhenCollected:
    def __del__(self):
        stop()


if when == "start":
    for name in ("ingest_shards", "export_shard"):
        setattr(Store, name, stop_first(getattr(Store, name)))
    writer.write_files = stop_first(writer.write_files)
elif when == "latest":
    writer.write_text_atomic = stop_after(writer.write_text_atomic)
elif when == "result":
    echo = click.echo
    click.echo = lambda *a, **k: (k.get("err") or stop(), echo(*a, **k))[1]
elif when == "teardown":
    collected_last = StopWhenCollected()
sys.argv = ["zmlx-pipeline", *args]
cli.main()
"""


@pytest.fixture
def toy(tmp_path, subprocess_env):
    """(store, a shard of it, the stopping script, the environment) for a subprocess: the toy kernel on two GPUs."""
    sys.path.insert(0, str(REPO_ROOT / "tests" / "runtime"))
    from bundle_fixtures import fill_toy

    from zmlx_pipeline.data.store import Store

    db, shard, script = tmp_path / "toy.duckdb", tmp_path / "toy.parquet", tmp_path / "stop_at.py"
    with Store(db) as store:
        fill_toy(store)
        store.export_shard(shard)
    script.write_text(STOP_AT)
    return db, shard, script, subprocess_env


def _rows(db: Path) -> int:
    from zmlx_pipeline.data.store import Store

    if not db.exists():
        return 0
    with Store(db, read_only=True) as store:
        return sum(r["measurements"] for r in store.summary())


posix_only = pytest.mark.skipif(os.name != "posix", reason="signals: POSIX")


@posix_only
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_an_ingest_stopped_once_committed_prints_its_result_and_exits_0(toy, tmp_path, signame):
    db, shard, script, env = toy
    new = tmp_path / "new.duckdb"
    done = run_command(["result", signame, "ingest", "--db", str(new), str(shard)], env, script=script)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "1 shard(s), 144 rows: 144 added, 0 already present\n"
    assert done.stderr == f"... {signame} came after the work was done; it was finished, not stopped\n"
    assert _rows(new) == 144


@posix_only
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_an_ingest_stopped_before_its_commit_is_aborted_and_stores_nothing(toy, tmp_path, signame):
    db, shard, script, env = toy
    new = tmp_path / "new.duckdb"
    done = run_command(["start", signame, "ingest", "--db", str(new), str(shard)], env, script=script)
    assert (done.returncode, done.stdout) == (1, "") and done.stderr.splitlines()[-1] == "Aborted!"
    assert _rows(new) == 0 and not new.exists()


@posix_only
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_an_export_stopped_as_the_process_winds_down_still_exits_0(toy, tmp_path, signame):
    db, shard, script, env = toy
    out = tmp_path / "out.parquet"
    out.write_bytes(shard.read_bytes())
    done = run_command(["teardown", signame, "export", "--db", str(db), "--force", str(out)], env, script=script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote 144 measurements to {out} (")


@posix_only
def test_a_publish_stopped_once_latest_names_the_bundle_finishes_and_records_it(toy, tmp_path):
    from zmlx_pipeline.data.store import Store

    db, shard, script, env = toy
    to = tmp_path / "pub"
    done = run_command(["latest", "SIGTERM", "publish", "--db", str(db), "--to", str(to), "--device", "nvidia-h200",
                        "--json"], env, script=script)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # the whole result, not half of it
    assert (to / "latest").read_text().strip() == Path(result["path"]).name and result["recorded"] is True
    assert done.stderr.splitlines()[-1] == "... SIGTERM came after the work was done; it was finished, not stopped"
    with Store(db, read_only=True) as store:
        assert [b["bundle_id"] for b in store.bundles()] == [result["bundle_id"]]


@posix_only
def test_a_publish_stopped_before_latest_is_aborted_and_publishes_nothing(toy, tmp_path):
    db, shard, script, env = toy
    to = tmp_path / "pub"
    done = run_command(["start", "SIGTERM", "publish", "--db", str(db), "--to", str(to), "--device", "nvidia-h200"],
                       env, script=script)
    assert (done.returncode, done.stdout) == (1, "") and done.stderr.splitlines()[-1] == "Aborted!"
    assert not to.exists() or not list(to.iterdir())  # no bundle, no `latest`, no temp directory


def test_an_error_raised_while_a_stop_unwinds_is_aborted_not_a_traceback(tmp_path, monkeypatch):
    """Native code (scikit-learn's fit) can turn Ctrl-C's KeyboardInterrupt into an error of its own: "Aborted!",
    exit 1, the store as it was; the same error without a stop stays a bug and propagates."""
    from zmlx_pipeline.core import commits
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.models import train as train_module

    db = tmp_path / "s.duckdb"
    Store(db).close()
    before = db.read_bytes()
    stop = {"now": True}

    def fit_met_by_a_stop(*args, **kwargs):
        if stop["now"]:
            assert not commits.stop_waits(signal.SIGINT)  # what the Ctrl-C handler asks, before KeyboardInterrupt
        raise ValueError("'T{=d:sum_gradients:d:sum_hessians:@I:count:}' is not a valid PEP 3118 buffer format string")

    monkeypatch.setattr(train_module, "train_models", fit_met_by_a_stop)
    result = CliRunner().invoke(cli, ["train", "--db", str(db), "-j", "1"])
    assert (result.exit_code, result.output) == (1, "Aborted!\n")
    assert db.read_bytes() == before
    stop["now"] = False
    result = CliRunner().invoke(cli, ["train", "--db", str(db), "-j", "1"])
    assert isinstance(result.exception, ValueError)
