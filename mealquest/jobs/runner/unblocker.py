"""The unblocker: makes jobs that wait for others due, or cancels them.

A job enqueued with `depends_on` (and a batch's callback) waits queued,
not due, while its dependency rows last. Deciding that it may run is kept
off the completer's path: a completion only nudges this greenlet (an event,
no database work), which then resolves, in a transaction of its own, the
dependencies whose jobs are final, however many completions it took in
meanwhile. That is what pg-boss's users measured completion slowing 50x
without (pg-boss#824): unblocking inside each completion.

Every process runs one, so a job whose last dependency ended anywhere is
seen within `interval_seconds` even if no nudge reached this process; on
PostgreSQL one pass at a time runs in the whole deployment (the driver's
advisory lock), so passes never race over one job's last rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import gevent
from gevent.event import Event

from mealquest.db.driver import Store
from mealquest.db.errors import StoreUnavailable
from mealquest.model.batches import Unblocked

logger = logging.getLogger(__name__)

# The most passes one wake runs back to back: a long cascade (a chain of
# jobs cancelled one after another) or a large backlog goes on at the next.
_MAX_PASSES = 20
# The dependencies one pass resolves at most (its transaction's size).
_PASS_LIMIT = 1_000


class Unblocker:
    def __init__(
        self,
        store: Store,
        *,
        interval_seconds: float = 1.0,
        min_gap_seconds: float = 0.05,
        on_due: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        # The longest a resolved dependency waits when no nudge came.
        self.interval_seconds = interval_seconds
        # The shortest time between two looks: many completions, one pass.
        self.min_gap_seconds = min_gap_seconds
        # Tells this process's producer that jobs became due.
        self.on_due = on_due
        self._nudged = Event()

    def nudge(self) -> None:
        """A job ended, or one that waits was enqueued: look soon (greenlet code)."""
        self._nudged.set()

    def run(self) -> None:
        """Forever. A pass that fails is tried again at the next wake: a
        database away (a restart, a failover, PgBouncer gone) must not end the
        role, which would restart its whole process."""
        while True:
            self._nudged.wait(timeout=self.interval_seconds)
            self._nudged.clear()
            try:
                self.run_once()
            except StoreUnavailable:
                logger.warning("unblocking jobs: database unavailable; trying again")
            except Exception:
                logger.exception("unblocking jobs failed; trying again")
            gevent.sleep(self.min_gap_seconds)

    def run_once(self) -> Unblocked:
        """Resolve every dependency whose job is final (up to `_MAX_PASSES`
        passes); what it did."""
        if not self.store.read(self.store.batches.has_dependencies):
            return Unblocked()
        due: list[str] = []
        cancelled: list[str] = []
        resolved = 0
        for _ in range(_MAX_PASSES):
            done = self.store.write(self.store.batches.resolve_dependencies, limit=_PASS_LIMIT)
            due.extend(done.due)
            cancelled.extend(done.cancelled)
            resolved += done.resolved
            if done.resolved < _PASS_LIMIT and not done.cancelled:
                break
        for job_id in cancelled:
            logger.info(
                "cancelled a job: a job it depends on did not succeed", extra={"job_id": job_id}
            )
        if due:
            self.on_due()
        return Unblocked(tuple(due), tuple(cancelled), resolved)
