"""The producer: claims due jobs for the executor's free slots.

It claims as many due jobs of the registered kinds as there are free slots,
in one `UPDATE ... RETURNING` statement. An enqueue in this process claims
for the free slots itself where it can (`claiming_along`). Idle, the
producer wakes on an enqueue in this process that did not, on a commit by
another process (`PRAGMA data_version`, checked
every few milliseconds, then a cheap look for a due job), on a slot freed
after a full claim, or on the poll interval, which is the guarantee.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import gevent
from gevent.event import Event

from mealquest.jobs.completer import NextClaim
from mealquest.jobs.executor import Executor
from mealquest.jobs.model import Attempt, Job, Status
from mealquest.jobs.registry import Registry
from mealquest.jobs.settings import PoolSettings
from mealquest.store import Store, StoreUnavailable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClaimAlong:
    """A claim made inside another write's transaction (`Producer.claiming_along`)."""

    producer: Producer
    claim: NextClaim
    limit: int

    def run(self, tx: Any) -> list[Job] | None:
        """Claim in the open transaction `tx`, in a savepoint of its own: a
        claim that fails is rolled back alone and logged, and None says the
        producer is to claim instead (the write it rides on is not failed by
        a fault of the pool's)."""
        tx.execute("SAVEPOINT claim_along")
        try:
            jobs = self.producer.store.jobs.claim(tx, **self.claim.values)
        except Exception as error:
            # Should this fail too, the whole write fails, as it would have alone.
            tx.execute("ROLLBACK TO SAVEPOINT claim_along")
            tx.execute("RELEASE SAVEPOINT claim_along")
            logger.error("claiming along an enqueue failed (%s)", type(error).__name__)
            return None
        tx.execute("RELEASE SAVEPOINT claim_along")
        return jobs

    def hand_out(self, jobs: list[Job], claimed_at: float) -> None:
        self.claim.hand_out(jobs, claimed_at)

    def lost(self) -> None:
        """The write ended without its answer reaching its caller (which gave
        up, or was killed): it may still have committed this claim, whose
        jobs then run nowhere. A write queued after it puts them back."""
        gevent.spawn(self.producer.put_back, self.claim.values["owner"])


class Producer:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        settings: PoolSettings,
        owner: str,
        executor: Executor,
    ) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.owner = owner
        self.executor = executor
        self.stopping = Event()
        self._wake = Event()
        self._claims = itertools.count(1)

    def wake(self) -> None:
        """Tell an idle producer that this process enqueued a job (greenlet code only)."""
        self._wake.set()

    def stop(self) -> None:
        """Claim nothing more; jobs a claim in flight returns go back to the queue."""
        self.stopping.set()
        self._wake.set()
        self.executor.slot_freed.set()

    def run(self) -> None:
        while not self.stopping.is_set():
            free = self.executor.free_slots()
            if free <= 0:
                self.executor.slot_freed.wait()
                self.executor.slot_freed.clear()
                continue
            self._wake.clear()
            try:
                jobs = self.claim(free)
            except StoreUnavailable:
                logger.warning("database unavailable; claiming again after the poll interval")
                self.stopping.wait(self.settings.poll_seconds)
                continue
            except Exception:
                logger.exception("claiming jobs failed; trying again after the poll interval")
                self.stopping.wait(self.settings.poll_seconds)
                continue
            if len(jobs) < free:
                self._wait_for_work()

    def claim(self, limit: int) -> list[Job]:
        """Claim up to `limit` due jobs and start running them."""
        claimed_at = time.monotonic()
        values = self.claim_values(limit)
        with self.executor.reserving(limit, values["kind_limits"]):
            jobs = self.store.write(self.store.jobs.claim, **values)
            self.hand_out(jobs, claimed_at)
        return jobs

    def claim_values(self, limit: int, finishing: Counter[str] | None = None) -> dict[str, Any]:
        """The claim's arguments. `finishing`: jobs by kind whose outcomes the
        claiming transaction writes first (their places count as free)."""
        room = self.executor.kind_room(self.registry.per_process_caps(), finishing)
        return {
            # Every claim fences its jobs with a token of its own, so an
            # attempt whose refund gave the next claim the same attempt number
            # still cannot be written by the earlier claim's handler.
            "owner": f"{self.owner}.{next(self._claims)}",
            "lease_seconds": self.settings.lease_seconds,
            "limit": limit,
            "kinds": self.registry.names(),
            "kind_limits": {kind: min(free, limit) for kind, free in room.items()},
            "kind_caps": self.registry.deployment_caps(),
        }

    def claimable_kinds(self) -> tuple[str, ...]:
        """The kinds this process has handlers and room for now."""
        room = self.executor.kind_room(self.registry.per_process_caps())
        return tuple(kind for kind in self.registry.names() if room.get(kind, 1) > 0)

    def next_claim(self, limit: int, finishing: Counter[str] | None = None) -> NextClaim | None:
        """What the completer claims for the slots a batch frees (nothing once stopping)."""
        if self.stopping.is_set():
            return None
        return NextClaim(self.claim_values(limit, finishing), self.hand_out)

    @contextmanager
    def claiming_along(self) -> Iterator[ClaimAlong | None]:
        """A claim for this process's free slots that another write of this
        process (an enqueue) makes at the end of its own transaction, so the
        job it makes is claimed without a second transaction and commit:
        its slots stay reserved until the jobs are handed out (with
        `claimed_at`) inside the block. None when no slot is free or the
        pool is stopping; the write then only wakes the producer."""
        free = self.executor.free_slots()
        claim = self.next_claim(free) if free > 0 else None
        if claim is None:
            yield None
            return
        with self.executor.reserving(free, claim.values["kind_limits"]):
            yield ClaimAlong(self, claim, free)

    def put_back(self, owner: str) -> None:
        """Queue again, as if never claimed, the jobs a claim (by its fencing
        `owner`) left running with nobody to run them (see `ClaimAlong.lost`)."""

        def put_back(tx: Any) -> int:
            leases = self.store.jobs.leases_of(tx, owner)
            for lease in leases:
                self.store.jobs.transition(tx, lease, to=Status.QUEUED, attempt=Attempt.REFUND)
            return len(leases)

        try:
            if self.store.write(put_back):
                logger.warning("jobs claimed for an enqueue that gave up were put back")
                self.wake()
        except Exception:
            logger.exception("could not put back jobs claimed for an enqueue; leases will expire")

    def hand_out(self, jobs: list[Job], claimed_at: float) -> None:
        if jobs and self.stopping.is_set():
            # Claimed by a write in flight when the stop began (the
            # completer's, or an enqueue's): the stop may already have counted what it waits
            # for, so these never start; they go back to the queue as they were.
            self._unclaim(jobs)
            return
        self.executor.start(jobs, lease_deadline=claimed_at + self.settings.lease_seconds)

    def _unclaim(self, jobs: list[Job]) -> None:
        leases = [job.lease for job in jobs]

        def unclaim(tx: Any) -> None:
            for lease in leases:
                self.store.jobs.transition(tx, lease, to=Status.QUEUED, attempt=Attempt.REFUND)

        try:
            self.store.write(unclaim)
        except Exception:
            logger.exception("could not put back jobs claimed while stopping; leases will expire")

    def _wait_for_work(self) -> None:
        """Idle until woken, another process commits something due, or the poll interval."""
        deadline = time.monotonic() + self.settings.poll_seconds
        try:
            version = self.store.data_version()
            while not self.stopping.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                if self._wake.wait(min(self.settings.change_check_seconds, remaining)):
                    return
                current = self.store.data_version()
                if current == version:
                    continue
                version = current
                # Something committed (maybe only a heartbeat): claim only if a job is due.
                # Only kinds with room: a kind at its cap here waits for a slot
                # of its own, which wakes the producer when it frees.
                if self.store.read(self.store.jobs.has_due_job, self.claimable_kinds()):
                    return
        except StoreUnavailable:
            self._wake.wait(max(deadline - time.monotonic(), 0))
        except Exception:
            logger.exception("checking for new jobs failed; waiting for the poll")
            self._wake.wait(max(deadline - time.monotonic(), 0))
