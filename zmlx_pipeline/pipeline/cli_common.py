"""What every `zmlx-pipeline` command shares: the command group (which turns the library's errors into
one-line messages, in one place), the --db option and the store it opens, name lists, and output: every
listing command takes --json and tables render the same rows; progress goes to stderr, so stdout
holds only the result (what --json users parse).

The command modules (cli.py, cli_models.py, cli_publish.py, cli_report.py) import only this module
and register their commands on the group; none imports another.

Why one long module: the one-line error formatting, the option types that refuse bad values and the table
rendering are what makes every command behave alike; each command module reads them from this one place.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import re
import select
import signal
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import click

from zmlx_pipeline.core import commits
from zmlx_pipeline.core.errors import ZmlxPipelineError, shown, shown_number
from zmlx_pipeline.core.files import printable, url_problem, utf8_problem


def one_line(exc: BaseException) -> str:
    """An error's message as one line, all of it: a newline, ESC or other control character in it (a path's, or a
    wrapped library's text that runs on over lines) written as an escape (\\n, \\x1b: core.files.printable), so
    the reason after it is never cut off and nothing reaches the terminal raw; its type when it says nothing."""
    text = str(exc)
    return printable(text) if text.strip() else type(exc).__name__


class OneLineError(ZmlxPipelineError, click.ClickException):
    """What every click error of the CLI is shown as (CommandGroup turns each into one, outside the commands, so it
    is never translated twice): one `Error:` line on stderr, control characters escaped (one_line), with the exit
    status of the error it stands for (2 for a usage error, which names the command's --help in place of click's
    usage text and blank line). A ZmlxPipelineError as every error class of the package is (tests/core)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(printable(message))
        self.exit_code = exit_code

    @classmethod
    def of(cls, exc: click.ClickException) -> "OneLineError":
        message = exc.format_message()
        if isinstance(exc, click.MissingParameter):  # click lists a choice's values one a line, each after a tab
            message = re.sub(r":?\n\t", lambda m: ": " if m.group(0).startswith(":") else " ", message)
        ctx = getattr(exc, "ctx", None)
        if isinstance(exc, click.UsageError) and ctx is not None and ctx.command.get_help_option(ctx) is not None:
            message = f"{message} ({ctx.command_path} {max(ctx.command.get_help_option_names(ctx), key=len)})"
        return cls(message, exc.exit_code)

    def show(self, file=None) -> None:
        click.echo(f"Error: {self.format_message()}", file=file, err=True)


@contextmanager
def _one_line_errors() -> Iterator[None]:
    """Every click error raised inside (a usage error of any command, a command's own ClickException) re-raised as
    its OneLineError; `zmlx-pipeline` alone still shows the help (click's NoArgsIsHelpError)."""
    try:
        yield
    except (OneLineError, click.exceptions.NoArgsIsHelpError):
        raise
    except click.ClickException as exc:
        raise OneLineError.of(exc) from None


class OneValueCommand(click.Command):
    """A command whose options that take one value refuse being given twice (click would keep the last and drop
    the rest unsaid); options declared multiple=True, flags and counts may repeat."""

    def make_parser(self, ctx: click.Context):
        parser = super().make_parser(ctx)
        parse = parser.parse_args

        def parse_args(args: list[str]):
            opts, rest, order = parse(args=args)
            if not ctx.resilient_parsing and not any(p.is_eager for p in order):  # --help answers as ever
                refuse_repeated_options(ctx, order)
            return opts, rest, order

        parser.parse_args = parse_args
        return parser


class OneValueGroup(OneValueCommand, click.Group):
    """A command of subcommands (`devices`, `devices add`), each refusing an option given twice as every command
    does (OneValueCommand)."""

    command_class = OneValueCommand


def refuse_repeated_options(ctx: click.Context, order: Sequence[click.Parameter]) -> None:
    """A usage error naming the first option that takes one value and appears more than once in `order` (the
    parameters in the order the parser met them, once per occurrence)."""
    counts: dict[str, int] = {}
    for param in order:
        if isinstance(param, click.Option) and not (param.multiple or param.is_flag or param.count):
            counts[param.name] = counts.get(param.name, 0) + 1
            if counts[param.name] == 2:
                raise click.UsageError(f"{param.get_error_hint(ctx)} is given more than once; it takes one value: "
                                       "give it once", ctx)


class CommandGroup(click.Group):
    """The `zmlx-pipeline` group: every error the library raises on purpose (a ZmlxPipelineError) and every
    error of the file system (a name too long, a full disk) becomes a one-line click error (exit 1), a store
    found damaged mid-command (DuckDB cannot read its file back) is the store's one CorruptStore line, and a stop
    (Ctrl-C, SIGTERM) that DuckDB turned into its own error is click's "Aborted!"; never a traceback. Anything
    else is a bug and propagates. Every command is a OneValueCommand (an option given twice is a usage error).
    Every error, a usage error too, is one `Error:` line with its control characters escaped (OneLineError): a
    usage error names the command's --help where click would print its usage text, and keeps exit status 2.

    stdout: a closed one is refused before any work ("cannot write to stdout", exit 1: the result would be lost
    unsaid); a reader that went away early (`zmlx-pipeline devices | head -1`) ends the command without a message
    and with exit status 141 (128 + SIGPIPE, what a shell reports for a tool SIGPIPE stopped), every time,
    whichever write met the closed pipe; the rest of the output goes to /dev/null, so Python says nothing about
    it at exit."""

    command_class = OneValueCommand

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if not isinstance(cmd, OneValueCommand):
            raise TypeError(f"command {cmd.name!r} must be made with cls=OneValueCommand (cli_common), so that an "
                            "option given twice is refused")
        super().add_command(cmd, name)

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        with _one_line_errors():
            check_stdout()  # before --help, --version or any command
            with _reader_may_go():  # the group's own --help and --version
                return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line_errors():  # a subcommand's usage errors are raised in here too (its make_context)
            return self._invoke(ctx)

    def _invoke(self, ctx: click.Context) -> Any:
        commits.reset()
        try:
            with _reader_may_go():
                result = super().invoke(ctx)
            waited = commits.waited_stops()
            if waited:  # the stop came once the work was final (final_step): it finished instead
                names = " and ".join(dict.fromkeys(_signal_name(s) for s in waited))
                click.echo(f"... {names} came after the work was done; it was finished, not stopped", err=True)
            return result
        except ZmlxPipelineError as exc:
            raise OneLineError(one_line(_store_damage(ctx, exc.__cause__) or exc)) from None
        except OSError as exc:
            where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
            raise OneLineError(f"{exc.strerror or one_line(exc)}{where}") from None
        except Exception as exc:  # noqa: BLE001 - only DuckDB's interruption and damage are handled here
            if _interrupted(exc):  # the transaction it stopped was rolled back; committed steps stay
                raise click.Abort() from None
            damage = _store_damage(ctx, exc)
            if damage is not None:
                raise OneLineError(one_line(damage)) from None
            raise


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def final_step():
    """Around the one library call whose result the command reports (an ingest, an export, a publish): once that
    call's commit or last rename is done (core.commits.commit_point inside it), or once it returned, a Ctrl-C or
    SIGTERM no longer ends the command as "Aborted!" with the work done: the command prints its result and exits 0
    (pipeline/cli.py's handlers). Before that point a stop aborts as ever, with nothing stored."""
    return commits.final()


#: exit status of a command whose stdout's reader went away before it finished writing: 128 + SIGPIPE
READER_GONE_EXIT = 141


_STDOUT_CLOSED = ("cannot write to stdout: it is closed; run the command with stdout open (redirect it to /dev/null "
                  "to discard the output)")


def check_stdout() -> None:
    """Refuse to run with stdout closed (`>&-`) or open only for reading: every result and table would be lost
    while the command exits 0; one line on stderr instead."""
    if sys.stdout is None:  # what Python makes of a closed fd 1
        raise click.ClickException(_STDOUT_CLOSED)
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # a stream in memory (click's test runner): writable
        return
    try:
        import fcntl

        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except ImportError:  # no fcntl (Windows): fstat tells a closed fd at least
        flags = None
        try:
            os.fstat(fd)
        except OSError:
            raise click.ClickException(_STDOUT_CLOSED) from None
    except OSError:
        raise click.ClickException(_STDOUT_CLOSED) from None
    if flags is not None and flags & os.O_ACCMODE == os.O_RDONLY:
        raise click.ClickException("cannot write to stdout: it is open for reading only; redirect it to a file "
                                   "or /dev/null")


def _stdout_reader_gone(exc: OSError) -> bool:
    """Whether `exc` is a write to stdout whose reader went away (EPIPE, and stdout's pipe has no reader), not a
    pipe of the library's own (a worker's)."""
    if exc.errno != errno.EPIPE:
        return False
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
    except (AttributeError, ValueError, OSError):  # cannot ask (a stream in memory, no poll): an EPIPE is stdout's
        return True
    poller.register(fd, select.POLLOUT)
    return any(event & (select.POLLERR | select.POLLHUP) for _fd, event in poller.poll(0))  # a pipe with no reader


@contextmanager
def _reader_may_go() -> Iterator[None]:
    """A write to stdout that found its reader gone ends the command as `head` expects: no message, exit
    READER_GONE_EXIT; what is left to write goes to /dev/null (as the Python docs on SIGPIPE advise), so the
    interpreter's last flush finds no broken pipe either."""
    try:
        yield
    except OSError as exc:
        if not _stdout_reader_gone(exc):
            raise
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (AttributeError, ValueError, OSError):  # a stream in memory: nothing to flush at exit
            pass
        raise click.exceptions.Exit(READER_GONE_EXIT) from None


#: ctx.meta key of the store path the command opened (open_store), for errors met after it was opened
_STORE_PATH = "zmlx_pipeline.store_path"


def _store_damage(ctx: click.Context, exc: BaseException | None) -> Exception | None:
    """The store's CorruptStore when `exc` (or what it wraps) is DuckDB failing to read the command's store back,
    else None: one place, however deep in the library the damaged block was met."""
    path = ctx.meta.get(_STORE_PATH)
    if path is None:
        return None
    from zmlx_pipeline.data.store import damaged

    while exc is not None:
        damage = damaged(path, exc)
        if damage is not None:
            return damage
        exc = exc.__cause__
    return None


def _interrupted(exc: BaseException) -> bool:
    """Whether an error is DuckDB's report of a query stopped by Ctrl-C or SIGTERM, or any error raised while a stop
    unwinds (native code, scikit-learn's, can turn the KeyboardInterrupt into an error of its own)."""
    interrupt = getattr(sys.modules.get("duckdb"), "InterruptException", None)
    return (interrupt is not None and isinstance(exc, interrupt)) or str(exc).strip() == "Query interrupted" \
        or commits.stopping()


def db_option(fn: Callable) -> Callable:
    """Adds `--db` (the DuckDB store); the command receives `db` (None: the default path)."""
    return click.option(
        "--db", "db", type=GivenPath(dir_okay=False, path_type=Path), default=None,
        help="DuckDB store (default: $ZMLX_PIPELINE_DB or ~/.local/share/zmlx-pipeline/store.duckdb).",
    )(fn)


def store_path(db: Path | None) -> Path:
    """The store's path: --db as given (GivenPath checked it), else the default (default_db_path), whose `~` in
    $ZMLX_PIPELINE_DB or $XDG_DATA_HOME naming no user's home, white space only or a path that is not UTF-8 in this
    locale is a one-line error naming the variable."""
    if db is not None:
        return Path(db)
    from zmlx_pipeline.data.store import default_db_path

    for variable in ("ZMLX_PIPELINE_DB", "XDG_DATA_HOME"):
        value = os.environ.get(variable)
        if not value:  # unset or empty: the default
            continue
        if not value.strip():  # as --db '' is refused: it would make a store named " " wherever the command runs
            raise click.ClickException(f"${variable} is {value!r}, white space only: set it to a path, or unset it "
                                       "for the default store")
        try:
            expand_home(value)
        except ValueError as exc:
            raise click.ClickException(f"${variable}: {exc}") from None
        problem = utf8_problem(value) or url_problem(value)
        if problem is not None:
            raise click.ClickException(f"${variable}: {problem}")
        if variable == "ZMLX_PIPELINE_DB":
            break
    path = default_db_path()
    problem = utf8_problem(path, "store path")  # $HOME's
    if problem is not None:
        raise click.ClickException(problem)
    return path


def open_store(db: Path | None, read_only: bool = False, must_exist: bool = False):
    """The store at --db (or the default), closed with the command. `must_exist`: a command that only works
    on stored measurements refuses a missing path instead of leaving an empty store there (a typo in --db)."""
    from zmlx_pipeline.data.store import Store

    path = store_path(db)
    ctx = click.get_current_context()
    ctx.meta[_STORE_PATH] = path
    store = Store(path, read_only=read_only, create=not must_exist)
    ctx.call_on_close(store.close)
    return store


def existing_store(db: Path | None):
    """open_store(db, read_only=True) for a command that also works without a store: None where --db is not given
    and the default store does not exist (nothing is made) or another process holds it (said in one warning)."""
    from zmlx_pipeline.data.store import StoreLocked

    if db is None and not os.path.lexists(store_path(None)):
        return None
    try:
        return open_store(db, read_only=True)
    except StoreLocked as exc:
        if db is not None:
            raise
        warnings.warn(f"{exc}; what it holds is left out", stacklevel=2)
        return None


def open_store_to_record(db: Path | None):
    """open_store(db, must_exist=True) for a command that records what it made when it can (evaluate's folds,
    publish's bundle): a store another process holds, or one this process cannot write, is read instead."""
    from zmlx_pipeline.data.store import StoreLocked, StoreNotWritable

    try:
        return open_store(db, must_exist=True)
    except (StoreLocked, StoreNotWritable):
        return open_store(db, read_only=True)


@contextmanager
def store_to_fill(db: Path | None, keep_filled: bool = False) -> Iterator:
    """open_store(db) for a command that adds measurements; a store the command itself created (and the folders
    made for it) is removed again when the command fails, so a refused command leaves no empty store behind.
    `keep_filled`: a created store that already holds measurements is kept (what a long collect or the main job
    committed before it stopped, which its next run resumes from)."""
    path = store_path(db)
    real = Path(os.path.realpath(path))  # a link to no file yet: the file made is its target
    existed = real.exists()
    made_dirs = [d for d in real.parents if not d.exists()]  # nearest first, the order to remove them in
    store = None
    try:
        store = open_store(path)
        yield store
    except BaseException:
        if not existed and not (keep_filled and store is not None and _holds_measurements(store)):
            if store is not None:
                store.close()
            for leftover in (real, real.with_name(real.name + ".wal"), path.with_name(path.name + ".wal")):
                try:
                    leftover.unlink()
                except OSError:  # not made (the path could not hold a file), or gone
                    pass
            for directory in made_dirs:
                try:
                    directory.rmdir()
                except OSError:
                    break
        raise


def _holds_measurements(store) -> bool:
    """Whether the store holds any measurement (one that cannot be read is taken to hold some: it is kept)."""
    try:
        return bool(store.summary())
    except Exception:  # noqa: BLE001 - keeping a store is the safe side
        return True


def device_filter_option(ctx, param, value: str | None) -> str | None:
    """A --device filter as typed: an empty one, or one holding a control or format character (`nvidia-h200\\n` from
    a script, a tab) or other white space than ordinary spaces, is a usage error naming the option, never read as
    the id it holds; ordinary spaces around it are left out, as around every option's value."""
    if value is None:
        return None
    if not value.strip():
        raise click.BadParameter(f"{shown(value)} names no device: give a device id such as nvidia-h200, or leave "
                                 "--device out for every device")
    from zmlx_pipeline.data.catalog import hidden_character_problem

    problem = hidden_character_problem(value)
    if problem is not None:
        raise click.BadParameter(problem)
    return value


def check_filters(store, **filters: str | None) -> dict[str, str | None]:
    """The filters as stored names: a --device written as people write it (`NVIDIA-H200@32sm`, `NVIDIA H200`) is the
    stored id it names, as lookup reads it; one that matches nothing stored is a mistake (a typo), said in one line,
    not an empty answer."""
    stored = store.summary()
    out: dict[str, str | None] = {}
    for name, value in filters.items():
        have = sorted({r[name] for r in stored})
        if value is not None and value not in have and name == "device":
            value = _stored_device(value, have, store.registered_devices()) or value
        if value is not None and value not in have:
            raise click.ClickException(f"no measurements of {name} {value!r} in {store.path}; it has "
                                       f"{', '.join(have) or 'none'} (see zmlx-pipeline summary)")
        out[name] = value
    return out


def _stored_device(value: str, have: list[str], registered: tuple = ()) -> str | None:
    """The stored device id a --device names other than by its id: in other case or with spaces for hyphens, or as
    resolve_device reads a name everywhere else (a catalog name with or without a core limit, `NVIDIA H200@32sm`, or
    the name of a device `registered` in the store); None when it names none of them."""
    from zmlx_pipeline.data.catalog import AmbiguousDevice, UnknownDevice, resolve_device

    plain = "-".join(value.strip().split()).casefold()
    if plain in have:
        return plain
    try:
        wanted = resolve_device(value.strip(), registered).id
    except (AmbiguousDevice, UnknownDevice, ValueError):
        return None
    return wanted if wanted in have else None


#: a whole number as the integer options take it: digits 0-9, a "-" the only sign (Python's int() would also take
#: other scripts' digits, "1_000", a "+" and white space such as a newline around it)
_WHOLE = re.compile(r"-?[0-9]+", re.ASCII)
#: a number as the float options take it: digits 0-9 with a decimal point and an exponent, a "-" the only sign
_DECIMAL = re.compile(r"-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", re.ASCII)
#: most significant digits of a whole number an option takes (an int64 holds 19): a longer one is past every range,
#: and past 4300 digits int() refuses it; it is refused before int(), its echo cut short (shown_number)
_MOST_DIGITS = 19


def significant_digits(typed: str) -> int:
    """How many digits a typed whole number has past its sign and leading zeros: what a bound on its size (an option's,
    a --shape dim's) is checked on before int() reads it, which refuses text of over 4300 digits."""
    return len(typed.lstrip("-").lstrip("0"))


def _plain(value: str) -> str:
    """A typed number with the ordinary spaces around it left out: the one rule of every option that reads a number
    (README, Commands), --shape's and --gpus' items and a duration too. Nothing else: a space inside it, a tab or a
    newline stays and is refused."""
    return value.strip(" ")


def _number_hint(typed: str, form: re.Pattern) -> str:
    """What to write in place of a refused number when a "+" or a space inside it is all that is wrong; else ""."""
    if typed.startswith("+") and form.fullmatch(typed[1:]):
        return f": write {shown_number(typed[1:])}, without the + sign"
    if " " in typed and form.fullmatch(typed.replace(" ", "")):
        return f": write {shown_number(typed.replace(' ', ''))}, with no space inside the number"
    return ""


class WholeRange(click.IntRange):
    """click.IntRange of whole numbers written in digits 0-9 only (a "-" the only sign, ordinary spaces around it
    allowed): `-j $'2\\n'`, `--k ３` (fullwidth) and `-j 1_0` are usage errors, as in --shape; a value is echoed cut
    short (its start and length) when long."""

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            if not _WHOLE.fullmatch(_plain(value)):
                self.fail(f"{shown(value)} is not a whole number in digits 0-9{_number_hint(_plain(value), _WHOLE)}",
                          param, ctx)
            typed = _plain(value)
            sign, digits = ("-", typed[1:]) if typed.startswith("-") else ("", typed)
            if significant_digits(digits) > _MOST_DIGITS:
                bounded = self.min is not None if sign else self.max is not None
                self.fail(f"{shown_number(typed)} is not in the range {self._describe_range()}." if bounded else
                          f"{shown_number(typed)} has more than the {_MOST_DIGITS} digits a count here can have",
                          param, ctx)
            value = sign + (digits.lstrip("0") or "0")
        return super().convert(value, param, ctx)


class FiniteRange(click.FloatRange):
    """click.FloatRange that also refuses nan and inf (a range check alone lets nan through) and a number not
    written in digits 0-9 (as WholeRange); one too large for a float is echoed as typed, cut short when long."""

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            if not _DECIMAL.fullmatch(_plain(value)):
                self.fail(f"{shown(value)} is not a number in digits 0-9 (such as 0.5)"
                          f"{_number_hint(_plain(value), _DECIMAL)}", param, ctx)
            value = _plain(value)
            if not math.isfinite(float(value)):  # digits past a float's range: said as typed, not as "inf"
                bounded = self.min is not None if value.startswith("-") else self.max is not None
                self.fail(f"{shown_number(value)} is not in the range {self._describe_range()}." if bounded else
                          f"{shown_number(value)} is larger than a number can be", param, ctx)
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def expand_home(text: str) -> str:
    """core.files.expand_home with the CLI's message: ValueError naming the path when there is no such home."""
    from zmlx_pipeline.core.files import expand_home as expanded

    try:
        return expanded(text)
    except ValueError as exc:
        raise ValueError(f"cannot expand {text!r}: {exc}; write the path without ~ or with an existing user's") from None


class GivenPath(click.Path):
    """click.Path that expands a leading `~` or `~user` (the one place a path option is read, so every one does it
    alike) and refuses an empty value, which would otherwise mean the current directory (a report or a bundle
    written among the user's files, the shards of wherever the command runs), and a path that cannot be handed on
    as UTF-8 (to DuckDB, into a manifest: core.files.utf8_problem), before any work rather than after it."""

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            if not value.strip():
                self.fail("is empty: name a path (write . for the current directory)", param, ctx)
            if url_problem(value) is not None:
                self.fail(url_problem(value), param, ctx)
            try:
                value = expand_home(value)
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
            problem = utf8_problem(value)
            if problem is not None:
                self.fail(problem, param, ctx)
        return super().convert(value, param, ctx)


def split_names(values: tuple[str, ...]) -> list[str]:
    """Accepts repeated options and comma-separated lists alike, each name once in the order first given (a model
    named twice is scored once); an option given with no name in it (`-k ""`) is a usage error, not "all": leaving
    the option out is how to ask for all."""
    names = list(dict.fromkeys(v.strip() for item in values for v in item.split(",") if v.strip()))
    if values and not names:
        raise click.UsageError(f"{', '.join(map(repr, values))} names nothing: give a name, or leave the option out "
                               "for all")
    return names


def output_options(fn: Callable) -> Callable:
    """Adds `--json` to a command; the command receives `as_json`."""

    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


def _cell(value: Any) -> str:
    """A value as a table cell: one line, a newline or ESC in it (a path's) escaped (core.files.printable)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return printable(" ".join(f"{k}={v}" for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return printable(",".join(str(v) for v in value))
    return printable(str(value))


def render_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """A plain aligned text table of `rows` (dicts), columns in the given order; one line a row, whatever a cell
    holds (_cell escapes its control characters)."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    heads = [_cell(c) for c in columns]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(heads)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    out = [line(heads), line(["-" * w for w in widths])]
    out += [line(row) for row in cells]
    return "\n".join(out)


def emit(data: Any, as_json: bool, columns: Sequence[str] | None = None, title: str | None = None) -> None:
    """Print `data` (a list of row dicts, or a dict) as JSON or as a table."""
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    if title:
        click.echo(printable(title))
    if isinstance(data, dict):
        data = [{"key": k, "value": v} for k, v in data.items()]
    click.echo(render_table(data, columns))


def progress_line(message: str) -> None:
    """A progress line of a long command, on stderr ("... " first, so it reads apart from the result)."""
    click.echo(f"... {printable(message)}", err=True)
