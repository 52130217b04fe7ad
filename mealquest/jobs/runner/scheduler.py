"""The scheduler: enqueues one job of each periodic kind per scheduled time.

A kind is periodic when it is registered with `KindOptions(cron=...)`. Every
pool runs a scheduler; exactly one job is made per (kind, scheduled time)
across all of them, on every host, because the job is inserted in the same
transaction as the slot's row, whose primary key refuses a second one. No
scheduler checks first and inserts after: the database decides the race,
and a scheduler that dies before its commit leaves neither row nor job.

Which slot a run considers: only the latest scheduled time at or before
now (the database's clock), and only if it is at most `catchup_seconds` old
and not older than the moment a scheduler first saw the kind. So a process
that was down across a slot makes it when it comes back within the window,
slots missed together make one job (the latest), and a slot older than the
window, or from before the kind existed, makes none.

Periodic jobs belong to the system household (`SYSTEM_HOUSEHOLD_ID`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from mealquest.db.driver import Store, Transaction
from mealquest.db.errors import StoreUnavailable
from mealquest.jobs.cron import CronSchedule
from mealquest.jobs.registry import Kind, Registry
from mealquest.model.households import SYSTEM_HOUSEHOLD_ID

logger = logging.getLogger(__name__)

# The longest a scheduler sleeps between two looks, whatever its schedules:
# a clock that jumps, or a slot another scheduler failed to make, is seen
# within this.
MAX_WAIT_SECONDS = 60.0
# The shortest: a wake that comes a hair before its slot looks again at once,
# not in a busy loop.
MIN_WAIT_SECONDS = 0.01
# After a look that failed as a whole (the database unavailable): the slot is
# still due, and is tried again this soon.
RETRY_SECONDS = 1.0


class Enqueue(Protocol):
    """`JobService.enqueue`: validates the payload and inserts the job in `tx`."""

    def __call__(
        self,
        kind_name: str,
        payload: Mapping[str, Any],
        *,
        household_id: int,
        tx: Transaction | None = None,
    ) -> str: ...


@dataclass(frozen=True)
class ScheduledJob:
    """A job a scheduler made for one scheduled time of a periodic kind."""

    kind: str
    slot_at: datetime
    job_id: str


class Scheduler:
    """One process's scheduler; `run_once(now)` is one look at every periodic kind."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        enqueue: Enqueue,
        *,
        catchup_seconds: float,
    ) -> None:
        self.store = store
        self.registry = registry
        self.enqueue = enqueue
        self.catchup = timedelta(seconds=catchup_seconds)
        self._schedules: dict[str, CronSchedule] = {}
        # The database's time at the last look, from which the next wake is counted.
        self.last_moment: datetime | None = None

    def schedule_of(self, kind: Kind) -> CronSchedule:
        if kind.name not in self._schedules:
            self._schedules[kind.name] = CronSchedule(kind.options.cron or "")
        return self._schedules[kind.name]

    def run_once(self, now: datetime | None = None) -> list[ScheduledJob]:
        """Make the job of each periodic kind's due slot that no scheduler made yet.

        `now` stands in for the database's clock (tests). Each kind is one
        transaction, so one kind's failure (logged) does not hold the others
        back; the next look tries it again while its slot is in the window.
        """
        made = []
        for kind in self.registry.periodic():
            try:
                job = self.store.write(self._schedule, kind, now)
            except StoreUnavailable:
                raise
            except Exception:
                logger.exception("could not schedule periodic kind %s", kind.name)
                continue
            if job is not None:
                made.append(job)
                logger.info(
                    "enqueued periodic job for %s",
                    job.slot_at.isoformat(),
                    extra={"job_id": job.job_id, "kind": job.kind},
                )
        return made

    def _schedule(self, tx: Transaction, kind: Kind, now: datetime | None) -> ScheduledJob | None:
        periodic = self.store.periodic
        moment = periodic.current_time(tx, now)
        self.last_moment = moment
        # Recorded at the first look whatever is due, so that the kind is
        # watched from then on.
        first_seen = periodic.first_seen(tx, kind=kind.name, moment=moment)
        slot = self.schedule_of(kind).latest_at_or_before(moment)
        if slot is None or slot < first_seen or moment - slot > self.catchup:
            return None
        if not periodic.claim_slot(tx, kind=kind.name, slot_at=slot):
            return None  # another scheduler made it
        job_id = self.enqueue(
            kind.name, kind.options.cron_payload, household_id=SYSTEM_HOUSEHOLD_ID, tx=tx
        )
        periodic.record_job(tx, kind=kind.name, slot_at=slot, job_id=job_id)
        return ScheduledJob(kind.name, slot, job_id)

    def seconds_until_next(self, moment: datetime | None = None) -> float:
        """How long to sleep until the next scheduled time of any periodic kind,
        counted on the database's clock from the last look."""
        moment = moment or self.last_moment
        if moment is None:
            return MIN_WAIT_SECONDS
        upcoming = [
            at
            for kind in self.registry.periodic()
            if (at := self.schedule_of(kind).next_after(moment)) is not None
        ]
        if not upcoming:
            return MAX_WAIT_SECONDS
        wait = (min(upcoming) - moment).total_seconds()
        return min(MAX_WAIT_SECONDS, max(MIN_WAIT_SECONDS, wait))


def run_forever(scheduler: Scheduler, stopped: Callable[[float], bool]) -> None:
    """The scheduler's role in the pool: look now, then at each next scheduled
    time, until `stopped(timeout)` (an Event's `wait`) says the pool stops."""
    while True:
        wait = None
        try:
            scheduler.run_once()
        except StoreUnavailable:
            logger.warning("periodic jobs: database unavailable; looking again shortly")
            wait = RETRY_SECONDS
        except Exception:
            logger.exception("periodic jobs: the scheduler's look failed")
            wait = RETRY_SECONDS
        if stopped(wait if wait is not None else scheduler.seconds_until_next()):
            return
