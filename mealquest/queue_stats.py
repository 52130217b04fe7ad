"""Queue figures for operators (`GET /metrics`, the dashboard's overview), read
with one cheap query set per process at most every `MAX_AGE_SECONDS`.

A scrape storm, or several operators' dashboards refreshing every few
seconds, then costs the database one read per process per interval however
many requests come in. The figures are at most that old, which is fine for
gauges scraped every 15 s and a page refreshed every few seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gevent.lock import Semaphore

from mealquest.db.driver import Store

MAX_AGE_SECONDS = 1.5


@dataclass(frozen=True)
class DueJob:
    """The oldest queued job of a kind whose time has come, and how long it has waited."""

    job_id: str
    kind: str
    age_seconds: float


@dataclass(frozen=True)
class QueueFigures:
    """`counts` by (kind, status); `oldest_due` by kind; jobs finished in the last hour."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    oldest_due: dict[str, DueJob] = field(default_factory=dict)
    finished_last_hour: int = 0

    def by_status(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for (_kind, status), count in self.counts.items():
            totals[status] = totals.get(status, 0) + count
        return totals

    def kinds(self) -> list[str]:
        return sorted({kind for kind, _status in self.counts})

    def oldest(self) -> DueJob | None:
        """The oldest due job of any kind."""
        return max(self.oldest_due.values(), key=lambda due: due.age_seconds, default=None)


class CachedFigures:
    """The figures of one store, read again once older than `max_age` seconds.

    One greenlet reads while the others wait for its answer (a semaphore),
    so a burst of requests makes one query, not one each.
    """

    def __init__(
        self,
        store: Store,
        max_age: float = MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.max_age = max_age
        self.clock = clock
        self._figures: QueueFigures | None = None
        self._read_at = 0.0
        self._lock = Semaphore()

    def get(self) -> QueueFigures:
        if self._fresh():
            assert self._figures is not None
            return self._figures
        with self._lock:
            if not self._fresh():
                self._figures = self.store.read(self.store.operations.queue_figures)
                self._read_at = self.clock()
            assert self._figures is not None
            return self._figures

    def _fresh(self) -> bool:
        return self._figures is not None and self.clock() - self._read_at < self.max_age
