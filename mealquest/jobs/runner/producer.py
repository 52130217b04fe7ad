"""The producer: the one role that claims jobs, for the pool's free slots.

It claims as many due jobs of the registered kinds as there are free
slots, in one statement. The completer, which frees slots, asks it for the
next claim (`next_claim`) to make in the transaction that records the
outcomes, and hands what that claim took back to it (`hand_out`): every
claim's arguments and every claimed job's start are the producer's.

Idle, the producer wakes on an enqueue in this process, on a commit by
another process (`Store.data_version`, checked every few milliseconds, then
a cheap look for a due job), on a slot freed after a full claim, or on the
poll interval, which is the guarantee.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable

import gevent
from gevent.event import Event

from mealquest.db.driver import JobStatements, Store, Transaction
from mealquest.db.errors import StoreBroken, StoreUnavailable, WriteOutcomeUnknown
from mealquest.jobs.registry import Registry
from mealquest.jobs.runner.settings import PoolSettings
from mealquest.jobs.runner.slots import Slots
from mealquest.model.jobs import Attempt, ClaimRequest, Job, Status, Transition

logger = logging.getLogger(__name__)

# Starts claimed jobs, each in a slot of its own; the monotonic time their
# leases are known to last until (the executor's `start`).
Start = Callable[[list[Job], float], None]

# A lost claim's put-back, when the database refuses it for a while, is
# tried again after this, doubling.
_PUT_BACK_RETRY_FIRST_SECONDS = 0.1
_PUT_BACK_RETRY_MAX_SECONDS = 5.0


# How often an idle producer looks again while the database does not answer.
_UNAVAILABLE_PAUSE_SECONDS = 0.5

# The most of its thread's time an idle producer spends looking for a due
# job, and the longest it waits between looks to keep to that.
_LOOK_SHARE = 0.1
_LOOK_PAUSE_MAX_SECONDS = 0.1


def pause_after_look(look_seconds: float, change_check_seconds: float) -> float:
    """How long an idle producer waits before it checks for changes again,
    after a look that found no due job and cost it `look_seconds`.

    A look is an index probe, and then the pause is `change_check_seconds`.
    But a look may read more (the households not held, past the due jobs
    that partitions at their limits hold back: before households were held,
    each such job, 2.3 ms with 5,000 of one host's imports waiting on
    SQLite), and every enqueue's commit is a change that asks for one: a
    worker beside a busy web tier then spent most of a core looking. So a
    look that costs more waits long enough to
    take at most `_LOOK_SHARE` of the time, up to `_LOOK_PAUSE_MAX_SECONDS`
    (what a job enqueued by another process may wait longer for, only while
    such a backlog is held; the poll and this process's own enqueues wake
    the producer as before)."""
    stretched = look_seconds * (1 - _LOOK_SHARE) / _LOOK_SHARE
    return max(change_check_seconds, min(stretched, _LOOK_PAUSE_MAX_SECONDS))


class Producer:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        settings: PoolSettings,
        owner: str,
        slots: Slots,
        start: Start,
    ) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.owner = owner
        self.slots = slots
        self.start = start
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
        self.slots.freed.set()

    def run(self) -> None:
        while not self.stopping.is_set():
            free = self.slots.free()
            if free <= 0:
                self.slots.freed.wait()
                self.slots.freed.clear()
                continue
            self._wake.clear()
            try:
                jobs = self.claim(free)
            except StoreUnavailable:
                logger.warning("database unavailable; claiming again once a job is due")
                # Not a whole poll: once the database answers again, a due job
                # (or another process's enqueue heard) is claimed at once, so a
                # dropped connection stalls no start for longer than that.
                self._wait_for_work()
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
        request = self.claim_request(limit)
        with self.slots.reserving(limit, request.kind_limits):
            try:
                jobs = self.store.write(self.store.jobs.claim, request)
            except WriteOutcomeUnknown:
                self.claim_lost(request.owner)
                raise
            self.hand_out(jobs, claimed_at)
        return jobs

    def claim_request(self, limit: int, finishing: Counter[str] | None = None) -> ClaimRequest:
        """The claim for `limit` slots. `finishing`: jobs by kind whose outcomes the
        claiming transaction writes first (their places count as free)."""
        room = self.slots.kind_room(self.registry.per_process_caps(), finishing)
        return ClaimRequest(
            # Every claim fences its jobs with a token of its own, so an
            # attempt whose refund gave the next claim the same attempt number
            # still cannot be written by the earlier claim's handler.
            owner=f"{self.owner}.{next(self._claims)}",
            lease_seconds=self.settings.lease_seconds,
            limit=limit,
            kinds=self.registry.names(),
            kind_limits={kind: min(free, limit) for kind, free in room.items()},
            kind_caps=self.registry.deployment_caps(),
            partitions=self.registry.partition_limits(),
        )

    def next_claim(self, limit: int, finishing: Counter[str]) -> ClaimRequest | None:
        """What the completer's transaction claims for the slots it frees
        (nothing once stopping); its jobs come back through `hand_out`."""
        if self.stopping.is_set():
            return None
        return self.claim_request(limit, finishing)

    def claimable_kinds(self) -> tuple[str, ...]:
        """The kinds this process has handlers and room for now."""
        room = self.slots.kind_room(self.registry.per_process_caps())
        return tuple(kind for kind in self.registry.names() if room.get(kind, 1) > 0)

    def hand_out(self, jobs: list[Job], claimed_at: float) -> None:
        """Start the jobs a claim took (`claimed_at`: when it began, monotonic)."""
        if jobs and self.stopping.is_set():
            # Claimed by a write in flight when the stop began (the
            # completer's): the stop may already have counted what it waits
            # for, so these never start; they go back to the queue as they were.
            self._unclaim(jobs)
            return
        self.start(jobs, claimed_at + self.settings.lease_seconds)

    def claim_lost(self, owner: str) -> None:
        """A claim's write (by its fencing `owner`) may have committed without
        its answer reaching this process: whatever it claimed runs nowhere.
        Put it back now, as if never claimed, rather than leave it running
        until its lease expires (and its rescue counts an interruption)."""
        gevent.spawn(self._put_back, owner)

    def _put_back(self, owner: str) -> None:
        delay = _PUT_BACK_RETRY_FIRST_SECONDS
        while True:
            try:
                put = self.store.write(_put_back, self.store.jobs, owner)
            except StoreBroken:
                logger.error("could not put back a lost claim's jobs: the store is broken")
                return
            except StoreUnavailable:
                # Until the database answers again; the jobs' leases are the backstop.
                gevent.sleep(delay)
                delay = min(delay * 2, _PUT_BACK_RETRY_MAX_SECONDS)
                continue
            except Exception:
                logger.exception("could not put back a lost claim's jobs; leases will expire")
                return
            if put:
                logger.warning("put back %d jobs of a claim whose answer was lost", put)
                self.wake()
            return

    def _unclaim(self, jobs: list[Job]) -> None:
        changes = [Transition(job.lease, to=Status.QUEUED, attempt=Attempt.REFUND) for job in jobs]

        def unclaim(tx: Transaction) -> None:
            self.store.jobs.transition_many(tx, changes)

        try:
            self.store.write(unclaim)
        except Exception:
            logger.exception("could not put back jobs claimed while stopping; leases will expire")

    def _wait_for_work(self) -> None:
        """Idle until woken, another process commits something due, or the poll interval.

        While the database does not answer, it looks again every
        `_UNAVAILABLE_PAUSE_SECONDS`, never only at the poll: after a restart
        or a failover, the change that shows it back (a listener connected
        again, which may have missed enqueues meanwhile) is then seen at once,
        whatever the poll interval.
        """
        deadline = time.monotonic() + self.settings.poll_seconds
        try:
            self._look_until(deadline)
        except Exception:
            logger.exception("checking for new jobs failed; waiting for the poll")
            self._wake.wait(max(deadline - time.monotonic(), 0))

    def _look_until(self, deadline: float) -> None:
        version = self._data_version()
        pause = self.settings.change_check_seconds
        while not self.stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if version is None:
                pause = max(pause, _UNAVAILABLE_PAUSE_SECONDS)
            if self._wake.wait(min(pause, remaining)):
                return
            pause = self.settings.change_check_seconds
            current = self._data_version()
            if current is None or current == version:
                version = current
                continue
            version = current
            # Something committed (maybe only a heartbeat): claim only if a job is due.
            # Only kinds with room: a kind at its cap here waits for a slot
            # of its own, which wakes the producer when it frees.
            # Nor a paused kind, nor a partition at a limit: another
            # process's commits would each start a claim that takes nothing.
            try:
                # The lesser of the wall clock and the thread's CPU: a look on
                # PostgreSQL waits for the server (no cost to this process),
                # and meanwhile other greenlets may run on the thread.
                started, started_cpu = time.monotonic(), time.thread_time()
                if self.store.read(
                    self.store.jobs.has_due_job,
                    self.claimable_kinds(),
                    partitions=self.registry.partition_limits(),
                ):
                    return
                cost = min(time.monotonic() - started, time.thread_time() - started_cpu)
                pause = pause_after_look(cost, self.settings.change_check_seconds)
            except StoreUnavailable:
                version = None  # look again once it answers

    def _data_version(self) -> int | None:
        """The store's change counter; None while the database does not answer."""
        try:
            return self.store.data_version()
        except StoreUnavailable:
            return None


def _put_back(tx: Transaction, jobs: JobStatements, owner: str) -> int:
    """Queue again, attempt refunded, the running jobs of the claim `owner`."""
    changes = [
        Transition(lease, to=Status.QUEUED, attempt=Attempt.REFUND)
        for lease in jobs.leases_of(tx, owner)
    ]
    jobs.transition_many(tx, changes)
    return len(changes)
