"""One way to print results: every listing command takes --json, and tables render the same rows;
progress goes to stderr, so stdout holds only the result (what --json users parse)."""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, Sequence

import click


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
