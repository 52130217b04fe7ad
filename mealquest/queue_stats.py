"""Queue figures for operators (`GET /metrics`, the dashboard's overview), read
with one cheap query set per process at most every `MAX_AGE_SECONDS`.

A scrape storm, or several operators' dashboards refreshing every few
seconds, then costs the database one read per process per interval however
many requests come in, and no request waits for it but a process's first.
The figures are at most that old plus one read, which is fine for gauges
scraped every 15 s and a page refreshed every few seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import gevent
from gevent.greenlet import Greenlet
from gevent.lock import Semaphore

from mealquest.db.driver import Store
from mealquest.db.errors import StoreError
from mealquest.model.queue import QueueFigures

logger = logging.getLogger(__name__)

MAX_AGE_SECONDS = 1.5


class CachedFigures:
    """The figures of one store, read again once older than `max_age` seconds.

    Only the first call waits for a read. Later, figures past `max_age` are
    answered as they are while one greenlet reads them again (stale while
    revalidating), so a page or a scrape never waits for the count, and a
    burst of requests starts one read, not one each.
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
        self._first = Semaphore()
        self._refreshing: Greenlet | None = None

    def get(self) -> QueueFigures:
        figures = self._figures
        if figures is None:
            with self._first:
                if self._figures is None:
                    self._read()
            assert self._figures is not None
            return self._figures
        if self.clock() - self._read_at >= self.max_age and self._refreshing is None:
            self._refreshing = gevent.spawn(self._refresh)
        return figures

    def forget(self) -> None:
        """Drop the figures: the next call reads them (for the benchmark's worst case)."""
        self._figures = None

    def _read(self) -> None:
        self.store.write(self.store.operations.fold_counts)
        figures = self.store.read(self.store.operations.queue_figures)
        waiting, next_timeout = self.store.read(self.store.signals.waiting_summary)
        self._figures = dataclasses.replace(
            figures, waiting_for_household=waiting, next_wait_timeout_seconds=next_timeout
        )
        self._read_at = self.clock()

    def _refresh(self) -> None:
        try:
            self._read()
        except StoreError:
            logger.warning("could not read the queue figures; answering the last ones")
        finally:
            self._refreshing = None
