"""What every `zmlx-pipeline` command shares: the command group (which turns the library's errors into
one-line messages, in one place), the --db option and the store it opens, name lists, and output: every
listing command takes --json and tables render the same rows; progress goes to stderr, so stdout
holds only the result (what --json users parse).

The command modules (cli.py, cli_models.py, cli_publish.py, cli_report.py) import only this module
and register their commands on the group; none imports another.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import click

from zmlx_pipeline.core.errors import ZmlxPipelineError


def one_line(exc: BaseException) -> str:
    """An error's message as one line: its first line (a wrapped library's text may run on), else its type."""
    text = str(exc)
    return text.splitlines()[0] if text.strip() else type(exc).__name__


class CommandGroup(click.Group):
    """The `zmlx-pipeline` group: every error the library raises on purpose (a ZmlxPipelineError) and every
    error of the file system (a name too long, a full disk) becomes a one-line click error (exit 1), a store
    found damaged mid-command (DuckDB cannot read its file back) is the store's one CorruptStore line, and a stop
    (Ctrl-C, SIGTERM) that DuckDB turned into its own error is click's "Aborted!"; never a traceback. Anything
    else is a bug and propagates."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ZmlxPipelineError as exc:
            raise click.ClickException(one_line(_store_damage(ctx, exc.__cause__) or exc)) from None
        except OSError as exc:
            where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
            raise click.ClickException(f"{exc.strerror or one_line(exc)}{where}") from None
        except Exception as exc:  # noqa: BLE001 - only DuckDB's interruption and damage are handled here
            if _interrupted(exc):  # the transaction it stopped was rolled back; committed steps stay
                raise click.Abort() from None
            damage = _store_damage(ctx, exc)
            if damage is not None:
                raise click.ClickException(one_line(damage)) from None
            raise


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
    """Whether an error is DuckDB's report of a query stopped by Ctrl-C or SIGTERM."""
    interrupt = getattr(sys.modules.get("duckdb"), "InterruptException", None)
    return (interrupt is not None and isinstance(exc, interrupt)) or str(exc).strip() == "Query interrupted"


def db_option(fn: Callable) -> Callable:
    """Adds `--db` (the DuckDB store); the command receives `db` (None: the default path)."""
    return click.option(
        "--db", "db", type=GivenPath(dir_okay=False, path_type=Path), default=None,
        help="DuckDB store (default: $ZMLX_PIPELINE_DB or ~/.local/share/zmlx-pipeline/store.duckdb).",
    )(fn)


def open_store(db: Path | None, read_only: bool = False, must_exist: bool = False):
    """The store at --db (or the default), closed with the command. `must_exist`: a command that only works
    on stored measurements refuses a missing path instead of leaving an empty store there (a typo in --db)."""
    from zmlx_pipeline.data.store import Store, default_db_path

    path = db or default_db_path()
    ctx = click.get_current_context()
    ctx.meta[_STORE_PATH] = Path(path)
    store = Store(path, read_only=read_only, create=not must_exist)
    ctx.call_on_close(store.close)
    return store


def open_store_to_record(db: Path | None):
    """open_store(db, must_exist=True) for a command that records what it made when it can (evaluate's folds,
    publish's bundle): a store another process holds, or one this process cannot write, is read instead."""
    from zmlx_pipeline.data.store import StoreLocked, StoreNotWritable

    try:
        return open_store(db, must_exist=True)
    except (StoreLocked, StoreNotWritable):
        return open_store(db, read_only=True)


@contextmanager
def store_to_fill(db: Path | None) -> Iterator:
    """open_store(db) for a command that adds measurements; a store the command itself created is removed
    again when the command fails, so a refused import or ingest leaves no empty store behind."""
    from zmlx_pipeline.data.store import default_db_path

    path = Path(db or default_db_path())
    existed = path.exists()
    store = open_store(db)
    try:
        yield store
    except BaseException:
        if not existed:
            store.close()
            for leftover in (path, path.with_name(path.name + ".wal")):
                leftover.unlink(missing_ok=True)
        raise


class FiniteRange(click.FloatRange):
    """click.FloatRange that also refuses nan and inf (a range check alone lets nan through)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class GivenPath(click.Path):
    """click.Path that refuses an empty value, which would otherwise mean the current directory (a report or a
    bundle written among the user's files, the shards of wherever the command runs)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("is empty: name a path (write . for the current directory)", param, ctx)
        return super().convert(value, param, ctx)


def split_names(values: tuple[str, ...]) -> list[str]:
    """Accepts repeated options and comma-separated lists alike; an option given with no name in it (`-k ""`)
    is a usage error, not "all": leaving the option out is how to ask for all."""
    names = [v.strip() for item in values for v in item.split(",") if v.strip()]
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
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def render_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """A plain aligned text table of `rows` (dicts), columns in the given order."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    out = [line(columns), line(["-" * w for w in widths])]
    out += [line(row) for row in cells]
    return "\n".join(out)


def emit(data: Any, as_json: bool, columns: Sequence[str] | None = None, title: str | None = None) -> None:
    """Print `data` (a list of row dicts, or a dict) as JSON or as a table."""
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    if title:
        click.echo(title)
    if isinstance(data, dict):
        data = [{"key": k, "value": v} for k, v in data.items()]
    click.echo(render_table(data, columns))


def progress_line(message: str) -> None:
    """A progress line of a long command, on stderr ("... " first, so it reads apart from the result)."""
    click.echo(f"... {message}", err=True)
