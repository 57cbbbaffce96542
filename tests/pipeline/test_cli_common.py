"""The CLI's one translation of library errors (cli_common.CommandGroup) and the shared options."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.pipeline.cli import cli
from zmlx_pipeline.pipeline.cli_common import CommandGroup, db_option, split_names, store_to_fill


def _group(exc: BaseException) -> click.Group:
    @click.group(cls=CommandGroup)
    def group() -> None:
        pass

    @group.command()
    def fails() -> None:
        raise exc

    return group


def test_a_library_error_is_its_first_line_and_exit_1():
    class StoreLike(ZmlxPipelineError, ValueError):
        pass

    result = CliRunner().invoke(_group(StoreLike("no store at x.duckdb\n  detail a wrapped library added")), ["fails"])
    assert result.exit_code == 1
    assert result.output == "Error: no store at x.duckdb\n"


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


def test_an_unknown_kernel_through_the_real_cli_is_one_line(tmp_path):
    result = CliRunner().invoke(cli, ["kernels", "-k", "rmsnrom"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and len(result.output.strip().splitlines()) == 1
    assert "rmsnrom" in result.output


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
