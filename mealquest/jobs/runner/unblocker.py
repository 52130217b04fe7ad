"""The unblocker: makes jobs that wait for others due, or cancels them.

A job enqueued with `depends_on` (and a batch's callback) waits queued,
not due, while its dependency rows last. Deciding that it may run is kept
off the completer's path: a completion only nudges this greenlet (an event,
no database work), which then resolves, in a transaction of its own, the
dependencies whose jobs are final, however many completions it took in
meanwhile. That is what pg-boss's users measured completion slowing 50x
without (pg-boss#824): unblocking inside each completion.

A nudge names the jobs that ended here, and the pass it wakes looks only
at the dependencies on those, through their index: a pass costs what
ended, not every dependency still waiting (a pass over all of them at each
completion took a tenth of a batched drain's speed, measured). At least
every `interval_seconds`, whatever the nudges, and after an enqueue (a new
job may wait for jobs already final) or a failed pass, a pass looks at all
of them: so a job whose last dependency ended in another process (a member
cancelled while queued, an erasure) is seen within `interval_seconds`, also
while this process completes jobs steadily (a full pass only when no nudge
came for a whole interval kept a callback waiting 40 s). A cancellation
cascades one level a statement, in the same wake: the next pass sees the
jobs the last one cancelled. On PostgreSQL one pass at a time runs in the whole
deployment (the driver's advisory lock), so passes never race over one
job's last rows; a pass that found another under way keeps its jobs for
the next.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable

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
        # Jobs that ended here since the last pass; and whether the next pass
        # must look at every dependency.
        self._ended: set[str] = set()
        self._everything = True
        self._last_full_pass = time.monotonic()

    def nudge(self, ended: Iterable[str] | None = None) -> None:
        """Jobs ended here (`ended`: only what waits for them is looked at), or,
        with None, a job that waits was enqueued (every dependency is): look
        soon (greenlet code)."""
        if ended is None:
            self._everything = True
        else:
            self._ended.update(ended)
        self._nudged.set()

    def run(self) -> None:
        """Forever. A pass that fails is tried again at the next wake: a
        database away (a restart, a failover, PgBouncer gone) must not end the
        role, which would restart its whole process."""
        while True:
            self._nudged.wait(timeout=self._until_full_pass())
            self._nudged.clear()
            everything = self._everything or self._until_full_pass() == 0
            ended, self._ended, self._everything = self._ended, set(), False
            if everything:
                self._last_full_pass = time.monotonic()
            try:
                done = self.run_once(None if everything else ended)
            except StoreUnavailable:
                logger.warning("unblocking jobs: database unavailable; trying again")
                self._everything = True
            except Exception:
                logger.exception("unblocking jobs failed; trying again")
                self._everything = True
            else:
                if done.busy:
                    # Another process's pass held the lock: these jobs again.
                    self._ended.update(ended)
                    self._everything |= everything
                    self._nudged.set()
            gevent.sleep(self.min_gap_seconds)

    def _until_full_pass(self) -> float:
        """Seconds until a full pass is due (0: it is)."""
        return max(0.0, self._last_full_pass + self.interval_seconds - time.monotonic())

    def run_once(self, ended: Collection[str] | None = None) -> Unblocked:
        """Resolve every dependency whose job is final, or only those on the
        jobs of `ended` (up to `_MAX_PASSES` passes); what it did."""
        if ended is not None and not ended:
            return Unblocked()
        if not self.store.read(self.store.batches.has_dependencies):
            return Unblocked()
        due: list[str] = []
        cancelled: list[str] = []
        resolved = 0
        depends_on = None if ended is None else sorted(ended)
        for _ in range(_MAX_PASSES):
            done = self.store.write(
                self.store.batches.resolve_dependencies, limit=_PASS_LIMIT, depends_on=depends_on
            )
            if done.busy:
                return done
            due.extend(done.due)
            cancelled.extend(done.cancelled)
            resolved += done.resolved
            if done.cancelled:
                # A job cancelled here may be another's dependency: the next
                # pass sees those, one level a statement.
                if depends_on is not None:
                    depends_on = sorted(set(depends_on) | set(done.cancelled))
            elif done.resolved < _PASS_LIMIT:
                break
        else:
            # Passes left to run (a deeper cascade, a larger backlog): at the
            # next wake, over every dependency.
            self._everything = True
            self._nudged.set()
        for job_id in cancelled:
            logger.info(
                "cancelled a job: a job it depends on did not succeed", extra={"job_id": job_id}
            )
        if due:
            self.on_due()
        return Unblocked(tuple(due), tuple(cancelled), resolved)
