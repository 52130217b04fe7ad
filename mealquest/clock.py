"""Wall-clock time as the database stores it.

Times are fixed-width ISO-8601 UTC text with microseconds, so that comparing
the text compares the instants (leases, run-at, oldest first). They come from
the wall clock, never a monotonic one: they are compared across processes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_UTC_TEXT = "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ"


def utc_now() -> datetime:
    return datetime.now(UTC)


def to_text(moment: datetime) -> str:
    # Not `strftime`: it writes a year before 1000 with fewer than four
    # digits ("5-01-01..."), which then sorts after every later year.
    if moment.tzinfo is UTC:
        # Every time of a PostgreSQL row (its sessions are in UTC) and of
        # `utc_now`: five a claimed job. Formatted at once, about half the
        # time of the conversion below.
        return _UTC_TEXT % (
            moment.year,
            moment.month,
            moment.day,
            moment.hour,
            moment.minute,
            moment.second,
            moment.microsecond,
        )
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def from_text(text: str) -> datetime:
    """A time as `to_text` wrote it.

    Read by `fromisoformat`, which takes the trailing `Z` as UTC, in about
    0.4 µs against `strptime`'s 16: a claim that starts a rated partition's
    jobs reads one for each start in the partition's window, and every
    answer about a queued job one for its estimated start."""
    return datetime.fromisoformat(text)


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)
