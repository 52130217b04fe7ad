"""The heartbeat: renews the leases of this process's jobs.

What it renews: the lease of every job whose handler is still within its
timeout plus the kill grace, and of every job whose outcome is being
written (a finished handler waiting on the database). Never a lease the
pool has taken back from its handler or given up on. So a job whose process
lives but whose handler hangs cannot hold its lease forever. A job whose
lease another process took is taken from its handler; a cancel made
anywhere reaches the handler here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from mealquest.db.driver import JobStatements, Store, Transaction
from mealquest.db.errors import StoreUnavailable
from mealquest.jobs.errors import LeaseLost, PoolStopping
from mealquest.jobs.runner.running import Running
from mealquest.jobs.runner.settings import PoolSettings
from mealquest.jobs.runner.slots import Slots
from mealquest.model.jobs import Lease

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
# Takes a job from its handler (the executor's `take`).
Take = Callable[[Running, str, type[LeaseLost | PoolStopping]], None]


class Heartbeat:
    """Renews this process's leases; takes the jobs whose lease another process
    took from their handlers, and tells handlers their job was cancelled."""

    def __init__(
        self,
        store: Store,
        settings: PoolSettings,
        slots: Slots,
        take: Take,
        cancel: Callable[[str], int],
        clock: Clock = time.monotonic,
    ) -> None:
        self.store = store
        self.settings = settings
        self.slots = slots
        self.take = take
        self.cancel = cancel
        self.clock = clock
        # Whether the last renewal found the database unavailable: a handler
        # the watchdog then stops lost its lease to the outage, not to its job.
        self.database_away = False

    def renewable(self, entry: Running, now: float) -> bool:
        if entry.abandoned or entry.taken is not None or not entry.alive():
            return False
        return entry.recording or now < entry.deadline + self.settings.kill_grace_seconds

    def run_once(self) -> int:
        """Renew this process's leases; take the jobs whose lease another process
        took from their handlers. Returns how many were taken."""
        started = self.clock()
        entries = [e for e in list(self.slots.running.values()) if self.renewable(e, started)]
        if not entries:
            return 0
        try:
            renewed, cancelled = self.store.write(
                _beat, self.store.jobs, [e.lease for e in entries], self.settings.lease_seconds
            )
        except StoreUnavailable:
            self.database_away = True
            raise
        self.database_away = False
        for job_id in cancelled:
            self.cancel(job_id)
        lost = 0
        for entry in entries:
            if (entry.lease.job_id, entry.lease.attempt) in renewed:
                entry.lease_deadline = started + self.settings.lease_seconds
            elif self.slots.running.get(entry.lease) is entry and not entry.recording:
                # (A handler that returned is only waiting for its write,
                # which the fence will refuse: nothing to stop.)
                lost += 1
                logger.warning("job lost its lease; stopping its handler", extra=entry.extra)
                self.take(entry, "lease lost", LeaseLost)
        return lost


def _beat(
    tx: Transaction, jobs: JobStatements, leases: list[Lease], lease_seconds: float
) -> tuple[set[tuple[str, int]], set[str]]:
    """One heartbeat's transaction: the leases renewed, and the jobs among them
    whose cancel was requested (by any process, or the operator)."""
    renewed = jobs.renew_leases(tx, leases, lease_seconds=lease_seconds)
    return renewed, jobs.cancel_requested(tx, leases)
