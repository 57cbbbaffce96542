"""When a tuner's file says a config was timed, read as a UTC time.

Kernel Tuner stamps each cache entry and T4 result with Python's `str(datetime.now(timezone.utc))`
("2023-12-22 09:54:05.502007+00:00"); KTT stamps its output, each result and its T4 files with the
date, the time and " UTC" ("2026-03-05 09:04:43 UTC", "2026-04-21 07:19:6 UTC": a second of one digit,
as its 2.2 release writes them). Other writers give ISO 8601 with "T" or "Z", an offset, or a count of
seconds (or milliseconds) since 1970. A time that names no zone is read as UTC, and said so.
"""

from __future__ import annotations

import functools
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from zmlx_pipeline.core.errors import shown_number

#: a date, a time (hours and minutes at least; fields of one digit as KTT writes them) and a zone
_STAMP = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{1,2}-[0-9]{1,2})"
    r"(?:[T ](?P<h>[0-9]{1,2}):(?P<m>[0-9]{1,2})(?::(?P<s>[0-9]{1,2})(?:[.,](?P<frac>[0-9]+))?)?)?"
    r" ?(?P<zone>Z|UTC|GMT|[+-][0-9]{2}(?::?[0-9]{2})?)?", re.ASCII | re.IGNORECASE)
#: the largest count of seconds since 1970 read as seconds (the year 5138); larger counts are milliseconds,
#: microseconds or nanoseconds, told apart by their size as the years they would give do not overlap
_EPOCH_UNITS = ((1e11, 1.0), (1e14, 1e3), (1e17, 1e6), (1e20, 1e9))
_FORMS = ("a date and time such as 2024-05-01 12:00:00+00:00, 2024-05-01T12:00:00Z or 2024-05-01 12:00:00 UTC, "
          "or seconds since 1970")


class Stamp(NamedTuple):
    """A time a file gives: naive UTC, and whether the file named its zone (else it was read as UTC)."""

    at: datetime
    zone_given: bool


def read_timestamp(value: Any) -> Stamp | None:
    """The UTC time a file's timestamp value gives; None when it gives none (absent, null or blank text);
    ValueError saying why for anything else (text that is no date and time, a boolean, a list)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _epoch(value)
    if isinstance(value, str):
        return _text(value.strip())
    raise ValueError(f"is {type(value).__name__} {value!r:.60}, not {_FORMS}")


def _epoch(value: float) -> Stamp:
    """A count of seconds (or milliseconds, microseconds, nanoseconds, by its size) since 1970, which is UTC."""
    if isinstance(value, int) and value >= _EPOCH_UNITS[-1][0]:  # 10**400 too: float() of it would raise
        raise ValueError(f"is {shown_number(str(value))}, too large to be a count of seconds or nanoseconds since "
                         "1970")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"is {value!r}, not {_FORMS}")
    per_second = next((per for bound, per in _EPOCH_UNITS if value < bound), None)
    if per_second is None:
        raise ValueError(f"is {value!r}, too large to be a count of seconds or nanoseconds since 1970")
    return Stamp(datetime(1970, 1, 1) + timedelta(seconds=value / per_second), True)


@functools.lru_cache(maxsize=4096)  # a file stamps many rows with one second (KTT), or repeats its own
def _text(text: str) -> Stamp:
    found = _STAMP.fullmatch(text)
    if found is None:
        raise ValueError(f"{text!r:.80} is not {_FORMS}")
    year, month, day = (int(p) for p in found["date"].split("-"))
    second = int(found["s"] or 0)
    micro = int((found["frac"] or "0")[:6].ljust(6, "0"))  # nanoseconds (KTT on Linux) are cut to microseconds
    clock = 59 if second == 60 else second  # 61 and past are no second, refused as a minute of 61 is
    try:
        at = datetime(year, month, day, int(found["h"] or 0), int(found["m"] or 0), clock, micro)
    except ValueError as err:
        raise ValueError(f"{text!r:.80} is no date and time ({err})") from None
    if second == 60:  # a leap second, as a UTC clock may write it: the next minute's start
        at = at.replace(microsecond=0) + timedelta(seconds=1)
    zone = (found["zone"] or "").upper()
    if zone in ("", "Z", "UTC", "GMT"):
        return Stamp(at, bool(zone))
    digits = zone[1:].replace(":", "")
    offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
    if offset >= timedelta(hours=24):
        raise ValueError(f"{text!r:.80} names an offset of {zone}, which no time zone has")
    at = at.replace(tzinfo=timezone(offset if zone[0] == "+" else -offset))
    return Stamp(at.astimezone(timezone.utc).replace(tzinfo=None), True)
