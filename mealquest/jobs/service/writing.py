"""Writing new jobs: one transaction with their dependencies, batch and quota,
tried again on a new connection when the database dropped the one it had.

Every enqueue path of the service (`JobService.enqueue`, `enqueue_many`,
`enqueue_batch`) ends here once its rows are checked and made.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import gevent
from marshmallow import ValidationError

from mealquest.db.driver import Store, Transaction
from mealquest.db.errors import (
    StorageFault,
    StoreBroken,
    StoreBusy,
    StoreUnavailable,
    WriteOutcomeUnknown,
)
from mealquest.jobs import enqueueing
from mealquest.jobs.enqueueing import Enqueued
from mealquest.jobs.errors import TooManyJobs
from mealquest.jobs.service import quota
from mealquest.model.batches import NewBatch
from mealquest.model.jobs import NewJob

logger = logging.getLogger(__name__)

# An enqueue whose connection the database dropped is tried again on a new one
# for this long (a PostgreSQL restart or failover takes a few seconds), the
# pauses between tries doubling from the first to the last.
_REENQUEUE_SECONDS = 10.0
_REENQUEUE_FIRST_DELAY_SECONDS = 0.05
_REENQUEUE_MAX_DELAY_SECONDS = 1.0


class _AtQuota(Exception):
    """Raised inside the enqueue's transaction to roll it back."""


class BatchRepeated(Exception):
    """Raised inside a batch's transaction to roll it back: its key's holder
    (the job named) is the first member of the batch the same request made."""


class JobWriter:
    """The write of checked jobs (see the module)."""

    def __init__(
        self, store: Store, *, max_pending_per_household: int, wake: Callable[[], None]
    ) -> None:
        self.store = store
        # A household's quota: jobs it may have queued or running at once.
        self.max_pending_per_household = max_pending_per_household
        self._wake = wake

    def write(
        self,
        jobs: list[NewJob],
        tx: Transaction | None,
        *,
        within_quota: bool = True,
        batch: NewBatch | None = None,
    ) -> list[Enqueued]:
        """Insert the jobs in one transaction (with what they depend on, and
        their batch), then hold each household that got a new job to its
        quota in that same transaction: a repeat that an idempotency key
        answers makes nothing and so is never refused. `wake` is called once
        the jobs are committed. `BatchRepeated` when the batch's key names a
        batch made already."""

        def insert(tx: Transaction) -> list[Enqueued]:
            done = enqueueing.insert_all(tx, self.store.jobs, jobs)
            if batch is not None and not done[0].created:
                # Its first member's key is held: the batch was made already.
                raise BatchRepeated(done[0].job_id)
            created = [job for job, e in zip(jobs, done, strict=True) if e.created]
            waiting = [job for job in created if job.depends_on]
            if waiting:
                self._add_dependencies(tx, jobs, waiting)
            if batch is not None:
                self.store.batches.insert_batch(tx, batch)
            if within_quota:
                # A batch's callback is the service's own job.
                spared = int(batch is not None and batch.callback_job_id is not None)
                for household_id in sorted({job.household_id for job in created}):
                    # Sorted: one lock order for every writer.
                    self._check_quota(tx, household_id, spared)
            if created:
                tx.after_commit(self._wake)
            return done

        try:
            return insert(tx) if tx is not None else self._write_again_if_dropped(insert, jobs)
        except _AtQuota as error:
            raise TooManyJobs(self.quota_retry_after(error.args[0])) from None

    def quota_retry_after(self, household_id: int) -> int:
        """Seconds after which a household at its quota may find a place free (an estimate)."""
        running, mean = self.store.read(self.store.jobs.household_load, household_id)
        return quota.retry_after(running, mean)

    def _write_again_if_dropped(
        self, insert: Callable[[Transaction], list[Enqueued]], jobs: list[NewJob]
    ) -> list[Enqueued]:
        """The enqueue's transaction, tried again on a new connection when
        the database dropped the one it had (a killed backend, a restart, a
        failover), for `_REENQUEUE_SECONDS` at most; then StoreUnavailable
        goes to the caller (`503`).

        Safe because the job ids are made before the insert: a transaction
        that failed before its COMMIT wrote nothing, and one whose COMMIT's
        answer was lost (WriteOutcomeUnknown) is looked for by its ids: found,
        it is answered as it committed, never inserted twice. A lock that
        stayed taken (StoreBusy: its wait is already spent), a storage fault
        and a store that can no longer write are not tried again."""
        deadline = time.monotonic() + _REENQUEUE_SECONDS
        delay = _REENQUEUE_FIRST_DELAY_SECONDS
        unsure = False  # a COMMIT's answer was lost: look for the jobs first
        while True:
            try:
                if unsure:
                    committed = self.committed(jobs)
                    if committed is not None:
                        return committed
                if len(jobs) == 1:
                    # A single enqueue, what a request waits for: at once where
                    # the driver can (SQLite: on the hub, the lock free).
                    return self.store.write_now(insert)
                return self.store.write(insert)
            except (StoreBusy, StorageFault, StoreBroken):
                raise
            except WriteOutcomeUnknown:
                unsure, why = True, "its commit's answer was lost"
            except StoreUnavailable:
                why = "the database dropped its connection"
            if time.monotonic() + delay > deadline:
                raise StoreUnavailable()
            logger.warning("an enqueue of %d jobs: %s; trying again", len(jobs), why)
            gevent.sleep(delay)
            delay = min(delay * 2, _REENQUEUE_MAX_DELAY_SECONDS)

    def committed(self, jobs: list[NewJob]) -> list[Enqueued] | None:
        """What an enqueue whose COMMIT's answer was lost did, if it committed:
        None if none of its new jobs exists (then it wrote nothing that a
        second try could repeat: a job with an idempotency key that a holder
        answered makes no row, and answers the same again)."""
        found = self.store.read(self.store.jobs.changed_jobs, {job.job_id: 0 for job in jobs})
        present = {job_id for job_id, job in found.items() if job is not None}
        if not present:
            return None

        def holders(tx: Transaction) -> list[Enqueued]:
            answers = []
            for job in jobs:
                if job.job_id in present or job.unique_key is None:
                    answers.append(Enqueued(job.job_id))
                    continue
                holder = self.store.jobs.holder_of_key(
                    tx, household_id=job.household_id, unique_key=job.unique_key
                )
                answers.append(
                    Enqueued(job.job_id) if holder is None else Enqueued(holder[0], created=False)
                )
            return answers

        return self.store.write(holders)

    def _add_dependencies(self, tx: Transaction, jobs: list[NewJob], waiting: list[NewJob]) -> None:
        """Record what the waiting jobs depend on, once each of those is found
        to be a job of their household (ValidationError under the item's
        index otherwise, which rolls the whole enqueue back)."""
        errors: dict[int, Any] = {}
        index = {job.job_id: position for position, job in enumerate(jobs)}
        for job in waiting:
            missing = self.store.batches.missing_jobs(tx, job.household_id, job.depends_on)
            if missing:
                errors[index[job.job_id]] = {
                    "depends_on": [
                        f"no job {job_id} in this household" for job_id in sorted(missing)
                    ]
                }
        if errors:
            raise ValidationError(errors)
        self.store.batches.insert_dependencies(tx, waiting)

    def _check_quota(self, tx: Transaction, household_id: int, spared: int = 0) -> None:
        """Refuse (rolling the transaction back) a household past its quota,
        not counting `spared` of its jobs (the service's own follow-ups).

        Counted after the household's new jobs were inserted, in their
        transaction, once the driver has made the count hold until it
        commits (see `count_pending`)."""
        allowed = self.max_pending_per_household + spared
        pending = self.store.jobs.count_pending(tx, household_id, allowed + 1)
        if pending > allowed:
            raise _AtQuota(household_id)
