"""The watchdog: acts on handlers that outlive their timeout, or their lease."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from mealquest.jobs.errors import LeaseLost, PoolStopping
from mealquest.jobs.runner.running import DATABASE_AWAY, STOPPING, Running
from mealquest.jobs.runner.settings import PoolSettings
from mealquest.jobs.runner.slots import Slots

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
# Takes a job from its handler (the executor's `take`).
Take = Callable[[Running, str, type[LeaseLost | PoolStopping]], None]


class Watchdog:
    """Handlers that will not end. Past its timeout plus the kill grace, a
    handler that is still running (it caught the timeout, or loops) is given
    up on: its job is recorded `timed out` now, never re-queued (a second
    attempt would run beside the live one), and the pool asks for its process
    to be restarted, which is the only way to end the greenlet. A handler
    whose lease this process cannot renew is stopped before the lease
    expires, so no other process's rescuer re-queues a job whose handler
    still runs here; one that will not stop either is given up on too."""

    def __init__(
        self,
        settings: PoolSettings,
        slots: Slots,
        take: Take,
        on_hung: Callable[[Running, str], None],
        clock: Clock = time.monotonic,
        database_away: Callable[[], bool] = lambda: False,
    ) -> None:
        self.settings = settings
        self.slots = slots
        self.take = take
        self.on_hung = on_hung
        self.clock = clock
        # Whether the leases go unrenewed because the database is away (the
        # heartbeat's last renewal found it unavailable).
        self.database_away = database_away

    def run_once(self) -> list[Running]:
        """Returns the handlers given up on in this round."""
        now = self.clock()
        grace = self.settings.kill_grace_seconds
        # Stop a handler early enough that it has the grace to die before the
        # lease expires, counting the round this check may come late by.
        margin = min(
            grace + self.settings.watchdog_seconds,
            (self.settings.lease_seconds - self.settings.heartbeat_seconds) / 2,
        )
        hung = []
        for entry in list(self.slots.running.values()):
            if entry.abandoned or not entry.alive():
                continue
            if entry.taken == STOPPING:
                continue  # the stopping pool waits for it and records it
            if entry.cancel_killed_at is not None and not entry.recording:
                if now >= entry.cancel_killed_at + grace:
                    hung.append((entry, f"did not stop {grace:g}s after its job was cancelled"))
                continue
            if entry.taken is not None:
                if now >= entry.taken_at + grace:
                    hung.append((entry, f"did not stop {grace:g}s after its job was taken"))
                continue
            if entry.recording:
                continue
            if now >= entry.deadline + grace:
                hung.append((entry, f"still running {grace:g}s after its timeout"))
            elif now >= entry.lease_deadline - margin:
                away = self.database_away()
                logger.warning(
                    "job's lease could not be renewed%s; stopping its handler",
                    " (the database is unavailable)" if away else "",
                    extra=entry.extra,
                )
                self.take(entry, DATABASE_AWAY if away else "lease not renewed", LeaseLost)
        for entry, reason in hung:
            entry.abandoned = True
            logger.error("handler will not die: %s", reason, extra=entry.extra)
            self.on_hung(entry, reason)
        return [entry for entry, _ in hung]
