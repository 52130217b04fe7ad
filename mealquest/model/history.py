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


@dataclass(frozen=True, slots=True)
class HistoryPeriod:
    """One kind's period (`period`, its start, UTC): attempts that ended each
    way, jobs that started, and the duration buckets holding the p50 and p95
    of their waits and of their run times (None: none started, or none ran to
    an end). A percentile's bucket is the smallest in which at least that
    share of the period's durations fall (the nearest rank)."""

    period: datetime
    kind: str
    succeeded: int
    failed: int
    cancelled: int
    started: int
    wait_p50: int | None
    wait_p95: int | None
    run_p50: int | None
    run_p95: int | None


@dataclass(frozen=True)
class History:
    """The last `periods` periods of `width` minutes, the latest (the one `now`,
    the database's, is in) starting at `last_period`; only the kinds and
    periods with events (and only those asked for)."""

    width: int
    periods: int
    last_period: datetime
    rows: list[HistoryPeriod]
    now: datetime
