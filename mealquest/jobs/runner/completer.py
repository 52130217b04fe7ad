"""The completer: writes the outcomes of jobs that finish together in one transaction.

Each outcome is still fenced on its own lease. The same transaction makes
the producer's next claim for the slots those outcomes free (measured: a
separate claim after each batch was a second hop to the writer thread and a
second commit for the same handful of jobs); the producer says what to
claim and starts what was claimed. A worker waits until its outcome is
committed, so its slot frees only once the outcome is stored.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import gevent
from gevent.event import AsyncResult, Event

from mealquest.db.driver import JobStatements, Store, Transaction
from mealquest.db.errors import StoreBroken, StoreUnavailable, WriteOutcomeUnknown
from mealquest.jobs.errors import JobCancelled, LeaseLost, PoolStopping
from mealquest.jobs.runner.outcome import Outcome
from mealquest.jobs.runner.running import Running
from mealquest.jobs.runner.slots import Slots
from mealquest.model.jobs import ClaimRequest, Job, Lease

logger = logging.getLogger(__name__)

T = TypeVar("T")

# An outcome the database refused for a while is tried again after this, doubling.
_RETRY_FIRST_SECONDS = 0.1
_RETRY_MAX_SECONDS = 5.0

# Given the slots a batch frees and the kinds of its finishing jobs, the
# claim to make for them (None: none); and what becomes of the jobs it took
# (the producer's `next_claim` and `hand_out`).
NextClaim = Callable[[int, Counter[str]], ClaimRequest | None]
HandOut = Callable[[list[Job], float], None]


@dataclass
class _Pending:
    """An outcome waiting for the completer; `recorded` gets whether the fenced
    write matched the job (or the write's exception)."""

    lease: Lease
    outcome: Outcome
    recorded: AsyncResult = field(default_factory=AsyncResult)


def _write_batch(
    tx: Transaction, jobs: JobStatements, batch: list[_Pending], claim: ClaimRequest | None
) -> tuple[list[bool], list[Job]]:
    """The completer's transaction (through `jobs`, the driver's job statements).
    May run in the SQLite writer thread: no gevent objects."""
    # The state changes first, in one statement where the driver can (a round
    # trip per outcome was most of a PostgreSQL batch), then the follow-ups of
    # the successes that matched.
    recorded = jobs.transition_many(
        tx, [pending.outcome.transition(pending.lease) for pending in batch]
    )
    for pending, matched in zip(batch, recorded, strict=True):
        if matched:
            pending.outcome.write_after(jobs, tx, pending.lease)
    return recorded, jobs.claim(tx, claim) if claim else []


def _despite_late_kills(wait: Callable[[], T], done: Callable[[], bool]) -> T:
    """`wait()`, again if one of the pool's kills interrupts it. A kill the
    pool sent a handler just before it returned lands in the recording of its
    outcome, which is already on its way, fenced on its lease: letting it
    through would end the greenlet with a traceback, and skip the outcome's
    log line and metrics. `done()` says the answer is in: `wait()` then
    returns it (or raises what it holds) without waiting."""
    while True:
        try:
            return wait()
        except (LeaseLost, PoolStopping, JobCancelled):
            if done():
                return wait()


def _household_of(running: Mapping[Lease, Running], lease: Lease) -> int:
    entry = running.get(lease)
    return entry.job.household_id if entry is not None else -1


class Completer:
    def __init__(
        self,
        store: Store,
        slots: Slots,
        next_claim: NextClaim,
        hand_out: HandOut,
        claim_lost: Callable[[str], None],
        wake: Callable[[], None],
        ended: Callable[[list[str]], None] = lambda job_ids: None,
    ) -> None:
        self.store = store
        self.slots = slots
        self._next_claim = next_claim
        self._hand_out = hand_out
        # The producer puts back what a claim of unknown outcome took.
        self._claim_lost = claim_lost
        # Tells the producer that follow-up jobs were enqueued.
        self._wake = wake
        # Tells the unblocker that jobs ended (others may wait for them).
        self._ended = ended
        self._pending: list[_Pending] = []
        self._waiting = Event()

    def record(self, lease: Lease, outcome: Outcome, extra: dict[str, Any]) -> bool:
        """Write a final (fenced) outcome and wait for its commit; whether it matched.

        A database that stays unavailable past the deadline (a long lock, a
        full disk) does not cost a finished job its outcome: the write is
        tried again with backoff while the job stays running here, so the
        heartbeat keeps its lease, and the fence makes a repeated write
        harmless. A write that matches no row means the job is no longer
        ours: logged, not retried.
        """
        delay = _RETRY_FIRST_SECONDS
        tries = 0
        while True:
            pending = _Pending(lease, outcome)
            self._pending.append(pending)
            self._waiting.set()
            try:
                recorded: bool = _despite_late_kills(pending.recorded.get, pending.recorded.ready)
            except StoreBroken:
                # No write will ever get through: the pool restarts the process.
                logger.error("could not record the job's outcome: the store is broken", extra=extra)
                return False
            except StoreUnavailable:
                tries += 1
                # Once per outcome at WARNING: an outage would otherwise log
                # a line per job per round.
                logger.log(
                    logging.WARNING if tries == 1 else logging.DEBUG,
                    "database unavailable while recording the job's outcome; trying again in %.1fs",
                    delay,
                    extra=extra,
                )
                _despite_late_kills(partial(gevent.sleep, delay), lambda: False)
                delay = min(delay * 2, _RETRY_MAX_SECONDS)
                continue
            except Exception:
                logger.exception(
                    "recording the job's outcome failed; its lease will expire", extra=extra
                )
                return False
            if not recorded:
                logger.warning("job was no longer ours when its outcome was recorded", extra=extra)
            return recorded

    def run(self) -> None:
        """Records every waiting outcome in one write, then the next batch; forever."""
        while True:
            self._waiting.wait()
            self._waiting.clear()
            batch, self._pending = self._pending, []
            if batch:
                self._record_batch(batch)

    def _record_batch(self, batch: list[_Pending], *, claim_next: bool = True) -> None:
        running = self.slots.running
        # In household order: a re-queued job (or its follow-ups) locks its
        # household's queue row on PostgreSQL, and two batches that lock rows
        # in one order cannot deadlock on them.
        batch = sorted(batch, key=lambda pending: _household_of(running, pending.lease))
        finishing = Counter(
            entry.job.kind
            for pending in batch
            if (entry := running.get(pending.lease)) is not None and entry.recording
        )
        limit = max(0, self.slots.free() + finishing.total()) if claim_next else 0
        claim = self._next_claim(limit, finishing) if limit else None
        claimed_at = time.monotonic()
        with self.slots.reserving(limit if claim else 0, claim.kind_limits if claim else None):
            try:
                recorded, jobs = self.store.write(_write_batch, self.store.jobs, batch, claim)
            except StoreUnavailable as error:
                if claim is not None and isinstance(error, WriteOutcomeUnknown):
                    self._claim_lost(claim.owner)
                # The database, not one outcome: splitting would only wait again per job.
                for pending in batch:
                    pending.recorded.set_exception(error)
                return
            except Exception as error:
                if len(batch) == 1 and claim is None:
                    batch[0].recorded.set_exception(error)
                    return
                # One outcome's failure must not cost the others theirs: one by one.
                # Without the claim, which may be what failed.
                for pending in batch:
                    self._record_batch([pending], claim_next=False)
                return
            for pending, matched in zip(batch, recorded, strict=True):
                pending.recorded.set(matched)
            if any(
                matched and (pending.outcome.follow_ups or pending.outcome.waiting)
                for pending, matched in zip(batch, recorded, strict=True)
            ):
                self._wake()
            if any(recorded):
                self._ended(
                    [
                        pending.lease.job_id
                        for pending, matched in zip(batch, recorded, strict=True)
                        if matched
                    ]
                )
            # Still reserved: starting may wait for the finishing greenlets to
            # leave their slots, and the producer must not claim these meanwhile.
            if claim is not None:
                self._hand_out(jobs, claimed_at)
