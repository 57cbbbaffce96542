"""How the CLI takes a stop (Ctrl-C, SIGTERM): before a command's work is final it unwinds like Ctrl-C, after it
the command finishes (core.commits marks the moment)."""

from __future__ import annotations

import atexit
import signal
import threading

from zmlx_pipeline.core import commits


def terminate_as_interrupt() -> None:
    """SIGTERM (a scheduler's or `kill`'s stop) unwinds like Ctrl-C, where Python's default would end the
    process on the spot: open store transactions roll back, worker processes are stopped, temporary files
    are removed, and click prints "Aborted!" (exit 1). A second SIGTERM ends the process at once. Once the
    command's work is final (core.commits: its commit or last rename done), a stop waits instead: see
    stops_wait_once_final."""

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if not commits.stop_waits(signum):
            raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def stops_wait_once_final() -> None:
    """Ctrl-C (where Python's own handler takes it) raises KeyboardInterrupt as ever, until the command's work is
    final; from then on it, like SIGTERM, waits: the command prints its result and exits 0, saying on stderr that
    a stop came after the work was done (cli_common.CommandGroup); a second one ends the process at once. When
    the process winds down after the work was final (or after any command that succeeded), both are ignored,
    since Python would otherwise let the signal end it during its teardown (-2, -15) with the result printed."""

    def handler(signum, frame):
        if not commits.stop_waits(signum):
            raise KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends the process at once

    def ignore_stops_if_final() -> None:
        if commits.is_final():
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)

    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not one ignored (a background job)
            signal.signal(signal.SIGINT, handler)
        atexit.register(ignore_stops_if_final)
