"""Wall-clock time as the database stores it.

Times are fixed-width ISO-8601 UTC text with microseconds, so that comparing
the text compares the instants (leases, run-at, oldest first). They come from
the wall clock, never a monotonic one: they are compared across processes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def utc_now() -> datetime:
    return datetime.now(UTC)


def to_text(moment: datetime) -> str:
    # Not `strftime`: it writes a year before 1000 with fewer than four
    # digits ("5-01-01..."), which then sorts after every later year.
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def from_text(text: str) -> datetime:
    """A time as `to_text` wrote it."""
    return datetime.strptime(text, _FORMAT).replace(tzinfo=UTC)


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)
