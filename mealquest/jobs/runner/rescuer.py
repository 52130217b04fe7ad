"""The rescuer: takes back running jobs whose process stopped renewing their lease.

A lease is rescued only when two clocks agree it is dead: the database's
(the lease's expiry is past) and the rescuer's own monotonic clock (it has
read the same expiry, unrenewed, for a whole lease, with no look between
that failed: while the database is away nobody can renew, so after an
outage every owner has a whole lease to renew before its jobs are taken).
The database's clock is a host's wall clock on SQLite, which NTP may
step: after a step forward every lease looks expired at once, while their
owners still renew them; a renewal changes the expiry, so a rescuer that
waits to see a lease go unrenewed for a whole lease takes none of those.
The database's clock guards the other way round: a process of a
deployment whose lease is longer than this one's (during a rolling change
of the setting) is not rescued early.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

from mealquest.db.driver import Store
from mealquest.jobs.runner import metrics
from mealquest.model.jobs import HeldLease, Lease, Recovered

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


class Rescuer:
    """Takes back running jobs whose lease nobody renews any more: its process
    was killed, froze, or lost the database. Each is interrupted: re-queued
    with its attempt refunded or failed `interrupted by restart`, as its
    `on_interrupt` says."""

    def __init__(
        self,
        store: Store,
        lease_seconds: float,
        keep: Callable[[], list[Lease]] = list,
        clock: Clock = time.monotonic,
    ) -> None:
        self.store = store
        self.lease_seconds = lease_seconds
        # This process's own live handlers are never rescued from under them.
        self.keep = keep
        self.clock = clock
        # Each running job's lease as last read, and since when (this clock)
        # it has read that same expiry.
        self._watched: dict[Lease, tuple[str, float]] = {}

    def run_once(self, now: datetime | None = None) -> Recovered:
        """One look at every running job's lease, and the rescue of those watched
        unrenewed for a whole lease. `now` stands in for the database's clock
        (tests); None is the database's own."""
        try:
            held = self.store.read(self.store.jobs.running_leases)
            dead = self._watch(held, set(self.keep()))
            if not dead:
                return Recovered()
            recovered = self.store.write(self.store.jobs.rescue_unrenewed, dead, now=now)
        except Exception:
            # What kept this look from the database (a restart, a lock, a
            # full disk) kept the leases' owners from renewing them too: that
            # time is no proof of a dead owner. Each lease is watched a whole
            # lease again from the next look that reads it.
            self._watched = {}
            raise
        metrics.rescued(self.store, recovered)
        # Each line names the claim whose lease expired: the run under it
        # may still end, and its fenced write will then be refused; a run
        # of the job again is explained by this line alone.
        claims = {entry.lease.job_id: entry.lease.owner for entry in dead}
        for job_id in recovered.requeued:
            logger.warning(
                "re-queued a job whose lease expired",
                extra={"job_id": job_id, "claim": claims.get(job_id)},
            )
        for job_id in recovered.failed:
            logger.error(
                "failed a job whose lease expired: interrupted by restart",
                extra={"job_id": job_id, "claim": claims.get(job_id)},
            )
        for job_id in recovered.cancelled:
            logger.info(
                "cancelled a job whose lease expired",
                extra={"job_id": job_id, "claim": claims.get(job_id)},
            )
        return recovered

    def _watch(self, held: list[HeldLease], keep: set[Lease]) -> list[HeldLease]:
        """Note when each lease was first read with its current expiry; the
        leases read so for a whole lease (those no longer running are forgotten)."""
        at = self.clock()
        watched: dict[Lease, tuple[str, float]] = {}
        dead = []
        for entry in held:
            if entry.lease in keep:
                continue
            seen = self._watched.get(entry.lease)
            since = seen[1] if seen is not None and seen[0] == entry.expires_at else at
            watched[entry.lease] = (entry.expires_at, since)
            if at - since >= self.lease_seconds:
                dead.append(entry)
        self._watched = watched
        return dead
