"""The step that makes a command's work final, and the stops (Ctrl-C, SIGTERM) that come during or after it.

Once a command's store transaction is committed or its last rename is done, its work is done for good: a stop
then must not report a failure ("Aborted!", a death by signal) nor cut its result short. The library marks that
step (`commit_point`, around the COMMIT or the rename); the CLI decides which call's step is its command's last
(`final`, around that one library call, so that the ingest inside the main job, say, stays stoppable) and asks
`stop_waits` in its signal handlers (pipeline/cli.py). Outside a `final` block nothing changes. The state is the
process's: a command runs one at a time.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class _State:
    armed = 0  # depth of final() blocks: a commit point inside one is the command's last step
    holding = False  # inside an armed commit point: a stop waits for the step's outcome
    done = False  # the command's work is final: a stop no longer stops it
    waited: list[int] = []  # the stops that waited (signal numbers)
    stopped = False  # a stop raised KeyboardInterrupt: the command is unwinding


def reset() -> None:
    """A new command: nothing armed, nothing done, no stop waited."""
    _State.armed, _State.holding, _State.done, _State.waited, _State.stopped = 0, False, False, [], False


@contextmanager
def final() -> Iterator[None]:
    """Around the library call whose last step is the command's result: a commit point passed inside makes the
    work final, and so does the call returning."""
    _State.armed += 1
    try:
        yield
    finally:
        _State.armed -= 1
    _State.done = True


@contextmanager
def commit_point() -> Iterator[None]:
    """Around the step that makes the work final (a COMMIT, the last rename): inside a final() block, a stop that
    arrives during the step waits for it, and once the step succeeded the work is final; a step that fails ends
    as it would have (the stop that waited is dropped: the command fails anyway). Elsewhere nothing changes."""
    if not _State.armed or _State.done:
        yield
        return
    _State.holding = True
    try:
        yield
    finally:
        _State.holding = False
    _State.done = True


def is_final() -> bool:
    """Whether the running command's work is final (a final() call returned, or its commit point passed)."""
    return _State.done


def stop_waits(signum: int) -> bool:
    """For a signal handler: whether a stop that just arrived waits (during the commit point, or after it: the
    command then finishes) instead of stopping the command; a stop that waits is noted (waited_stops)."""
    if _State.holding or _State.done:
        _State.waited.append(signum)
        return True
    _State.stopped = True
    return False


def stopping() -> bool:
    """Whether a stop that did not wait arrived during the running command (it is unwinding as from Ctrl-C)."""
    return _State.stopped


def waited_stops() -> list[int]:
    """The signal numbers of the stops that came during or after the commit point, in order."""
    return list(_State.waited)


def mark_done() -> None:
    """The command's work is final (the CLI, once a command has finished: a stop while the process winds down
    no longer changes how it ended)."""
    _State.done = True
