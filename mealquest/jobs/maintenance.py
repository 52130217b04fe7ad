"""The pool's maintenance services, each with a `run_once` that tests call directly.

* `Rescuer`: interrupts running jobs whose lease expired, in any process.
* `Heartbeat`: renews the leases of this process's jobs, takes a job from
  its handler when another process took its lease, and tells a handler its
  job was cancelled (wherever the cancel was made).
* `Watchdog`: acts on handlers that outlive their timeout, or their lease,
  by more than the kill grace.
* `UnhandledKinds`: says in the log which queued jobs no handler here runs.

What the heartbeat renews: the lease of every job whose handler is still
within its timeout plus the kill grace, and of every job whose outcome is
being written (a finished handler waiting on the database). Never a lease
the pool has taken back from its handler or given up on. So a job whose
process lives but whose handler hangs cannot hold its lease forever.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from types import ModuleType

from mealquest.jobs.errors import LeaseLost
from mealquest.jobs.executor import CANCELLED, STOPPING, Executor, Running, failed
from mealquest.jobs.model import MESSAGE_TIMED_OUT, Lease, Recovered
from mealquest.jobs.registry import Registry
from mealquest.jobs.settings import PoolSettings
from mealquest.metrics import runs as job_metrics
from mealquest.store import Store, Transaction

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


class Rescuer:
    """Takes back running jobs whose lease expired: a lease expires only if its
    process stopped renewing it (killed, frozen, or cut off from the database).
    Each is interrupted: re-queued with its attempt refunded or failed
    `interrupted by restart`, as its `on_interrupt` says."""

    def __init__(self, store: Store, executor: Executor | None = None) -> None:
        self.store = store
        # This process's own live handlers are never rescued from under them.
        self.executor = executor

    def run_once(self, now: datetime | None = None) -> Recovered:
        """`now` moves the database's clock (tests); None is the database's own."""
        keep = []
        if self.executor is not None:
            keep = [e.lease for e in self.executor.running.values() if e.alive()]
        recovered = self.store.write(self.store.jobs.rescue_expired, keep=keep, now=now)
        job_metrics.rescued(self.store, recovered)
        for job_id in recovered.requeued:
            logger.warning("re-queued a job whose lease expired", extra={"job_id": job_id})
        for job_id in recovered.failed:
            logger.error(
                "failed a job whose lease expired: interrupted by restart",
                extra={"job_id": job_id},
            )
        for job_id in recovered.cancelled:
            logger.info("cancelled a job whose lease expired", extra={"job_id": job_id})
        return recovered


class Heartbeat:
    def __init__(
        self,
        store: Store,
        executor: Executor,
        settings: PoolSettings,
        clock: Clock = time.monotonic,
    ) -> None:
        self.store = store
        self.executor = executor
        self.settings = settings
        self.clock = clock

    def renewable(self, entry: Running, now: float) -> bool:
        if entry.abandoned or entry.taken is not None or not entry.alive():
            return False
        return entry.recording or now < entry.deadline + self.settings.kill_grace_seconds

    def run_once(self) -> int:
        """Renew this process's leases; take the jobs whose lease another process
        took from their handlers. Returns how many were taken."""
        started = self.clock()
        entries = [e for e in self.executor.running.values() if self.renewable(e, started)]
        if not entries:
            return 0
        renewed, cancelled = self.store.write(
            _beat, self.store.jobs, [e.lease for e in entries], self.settings.lease_seconds
        )
        for job_id in cancelled:
            self.executor.cancel(job_id)
        lost = 0
        for entry in entries:
            if (entry.lease.job_id, entry.lease.attempt) in renewed:
                entry.lease_deadline = started + self.settings.lease_seconds
            elif self.executor.running.get(entry.lease) is entry and not entry.recording:
                # (A handler that returned is only waiting for its write,
                # which the fence will refuse: nothing to stop.)
                lost += 1
                logger.warning("job lost its lease; stopping its handler", extra=entry.extra)
                self.executor.take(entry, "lease lost", LeaseLost)
        return lost


def _beat(
    tx: Transaction, jobs: ModuleType, leases: list[Lease], lease_seconds: float
) -> tuple[set[tuple[str, int]], set[str]]:
    """One heartbeat's transaction: the leases renewed, and the jobs among them
    whose cancel was requested (by any process, or the operator)."""
    renewed = jobs.renew_leases(tx, leases, lease_seconds=lease_seconds)
    return renewed, jobs.cancel_requested(tx, leases)


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
        executor: Executor,
        settings: PoolSettings,
        on_hung: Callable[[Running, str], None],
        clock: Clock = time.monotonic,
    ) -> None:
        self.executor = executor
        self.settings = settings
        self.on_hung = on_hung
        self.clock = clock

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
        for entry in list(self.executor.running.values()):
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
                logger.warning(
                    "job's lease could not be renewed; stopping its handler", extra=entry.extra
                )
                self.executor.take(entry, "lease not renewed", LeaseLost)
        for entry, reason in hung:
            entry.abandoned = True
            logger.error("handler will not die: %s", reason, extra=entry.extra)
            self.on_hung(entry, reason)
        return [entry for entry, _ in hung]


def record_hung(executor: Executor, entry: Running) -> bool:
    """Record a job whose handler was given up on while its lease is still ours:
    cancelled if it was, else failed `timed out` (final: re-queued, it would
    run beside the live handler)."""
    if entry.taken is not None or executor.completer is None:
        return False  # taken: its lease is lost or its stop records it
    outcome = CANCELLED if entry.cancelled_at is not None else failed(MESSAGE_TIMED_OUT)
    recorded = executor.completer.record(entry.lease, outcome, entry.extra)
    if recorded:
        job_metrics.given_up(entry.job.kind, outcome)
    return recorded


class UnhandledKinds:
    """Queued jobs of kinds this process has no handler for stay queued (a newer
    process may know them); this says how many wait, and of which kinds."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry

    def run_once(self) -> dict[str, int]:
        waiting = self.store.read(self.store.jobs.queued_of_other_kinds, self.registry.names())
        if waiting:
            listed = ", ".join(f"{kind} ({count})" for kind, count in waiting.items())
            logger.warning(
                "%d queued jobs wait for kinds no handler here runs: %s",
                sum(waiting.values()),
                listed,
            )
        return waiting
