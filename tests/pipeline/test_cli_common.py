"""The CLI's one translation of library errors (cli_common.CommandGroup) and the shared options."""

from __future__ import annotations

import click
from click.testing import CliRunner

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.pipeline.cli import cli
from zmlx_pipeline.pipeline.cli_common import CommandGroup, split_names


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
