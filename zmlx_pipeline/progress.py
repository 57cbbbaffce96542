"""Progress lines of a long stage: what finished, time elapsed and an estimate of the time left.

A stage that knows its work up front (kernels, folds, devices) counts it in weights (rows, say) and
calls `done` as each part finishes; the estimate is the elapsed time scaled by the weight still to
do. Lines go to a callback (the CLI prints them on stderr), so library code never prints itself.
"""

from __future__ import annotations

import time
from typing import Callable

Say = Callable[[str], None]


def clock_text(seconds: float) -> str:
    """Seconds as `m:ss` (or `h:mm:ss`), rounded to whole seconds."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Steps:
    """Counts the finished share of a stage's work and says, per finished part, elapsed and time left.

    `total` is the whole stage's weight; `done(what, weight)` adds a part's weight and says
    "<label>: <what> (i/n), 0:42 elapsed, about 1:10 left" (no estimate before any weight is done,
    "done" once all of it is).
    """

    def __init__(self, say: Say | None, label: str, total: float, parts: int | None = None,
                 clock: Callable[[], float] = time.monotonic, started: float | None = None) -> None:
        """`started`: when the whole command began (its clock's time), for the elapsed time said when this
        is one phase of several; the estimate uses this phase's own pace."""
        self.say = say
        self.label = label
        self.total = float(total)
        self.parts = parts
        self.count = 0
        self.weight = 0.0
        self._clock = clock
        self.start = clock()
        self.started = self.start if started is None else started

    def elapsed(self) -> float:
        """Seconds since the command began."""
        return self._clock() - self.started

    def remaining(self) -> float | None:
        """Seconds left at this phase's pace so far (None before any weight is done)."""
        if self.weight <= 0 or self.total <= 0:
            return None
        return (self._clock() - self.start) * max(0.0, self.total - self.weight) / self.weight

    def note(self, what: str) -> None:
        """A line about the stage that finishes no part (a step starting, say), with the time so far."""
        if self.say is not None:
            self.say(f"{self.label}: {what}, {clock_text(self.elapsed())} elapsed")

    def done(self, what: str, weight: float = 1.0) -> None:
        """One part finished: count it and say so, with the estimate of the time left."""
        self.count += 1
        self.weight += weight
        if self.say is None:
            return
        of = f" ({self.count}/{self.parts})" if self.parts else ""
        left = self.remaining()
        if self.weight >= self.total:
            tail = "done"
        elif left is None:
            tail = "estimating the time left"
        else:
            tail = f"about {clock_text(left)} left"
        self.say(f"{self.label}: {what}{of}, {clock_text(self.elapsed())} elapsed, {tail}")
