"""The job history behind the dashboard's charts, as the drivers read it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime


class Series(enum.StrEnum):
    """What a history row counts. Each but `WAIT` is an attempt that ended, by
    the status its job left `running` for (`RETRIED`: back to the queue)."""

    WAIT = "wait"
    """Jobs that started, by how long they waited: from their due time to the start."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    """Also queued jobs cancelled before they ran (in bucket `NEVER_RAN`)."""
    RETRIED = "retried"


# The bucket of an event with no duration: a queued job cancelled never ran.
NEVER_RAN = -1


@dataclass(frozen=True)
class HistoryCount:
    """How many events of a kind and series fell in one period (`period`, its
    start, UTC; `width` minutes long) and one duration bucket."""

    period: datetime
    kind: str
    series: str
    bucket: int
    count: int


@dataclass(frozen=True)
class History:
    """The counts of the last `periods` periods of `width` minutes, the latest
    (the one now is in) starting at `last_period`."""

    width: int
    periods: int
    last_period: datetime
    counts: list[HistoryCount]
