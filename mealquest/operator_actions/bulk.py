"""Acting on every job a filter matches: retry, cancel or delete.

First a preview counts what the action would take (each status it applies
to, through an index, up to `MAX_COUNTED`) and notes the newest job's `seq`:
the action then takes only jobs up to that one, so jobs that arrive between
the confirmation and the action are left alone. The action runs in batches
of `BATCH_SIZE`, each one short transaction (SQLite's write lock is held
tens of milliseconds at most: `python -m bench.bulk`), other writes going between
batches, and stops at a batch's end once `seconds` have passed, saying so
(a page's request must end; running it again takes the rest). It is
recorded in the audit log before its first batch, and each batch counts its
jobs up on that entry in its own transaction.

A retry wakes this process's pool; a cancel tells the handlers that run here
at once, other processes at their next heartbeat (as a one-job cancel does).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import gevent

from mealquest import audit
from mealquest.db.driver import Store, Transaction
from mealquest.jobs.service import JobService
from mealquest.model.jobs import Status
from mealquest.model.operations import BulkAction, BulkBatch, JobFilter
from mealquest.model.operators import Operator

BATCH_SIZE = 100
MAX_COUNTED = 10_000
# How long one action may run (a page's request) before it stops at a batch's end.
DEFAULT_SECONDS = 10.0


def statuses_of(action: BulkAction, job_filter: JobFilter) -> tuple[Status, ...]:
    """The statuses the action takes of what the filter matches."""
    return tuple(s for s in action.statuses if job_filter.status in (None, s))


def describe(job_filter: JobFilter) -> str:
    """The filter as the audit log and the pages name it."""
    parts = [
        f"{name}={value}"
        for name, value in (
            ("status", job_filter.status),
            ("kind", job_filter.kind),
            ("household", job_filter.household_id),
        )
        if value is not None
    ]
    return " ".join(parts) or "every job"


@dataclass(frozen=True)
class Preview:
    """What an action would take: jobs by status, each counted up to `MAX_COUNTED`."""

    action: BulkAction
    job_filter: JobFilter
    upto_seq: int
    counts: dict[Status, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def at_least(self) -> bool:
        """Whether a count reached its bound (there may be more)."""
        return any(count >= MAX_COUNTED for count in self.counts.values())


@dataclass(frozen=True)
class Done:
    acted: int
    complete: bool
    """False: stopped when its time was up; what is left still matches."""


def preview(store: Store, action: BulkAction, job_filter: JobFilter) -> Preview:
    upto = store.read(store.operations.newest_seq)
    counts = {
        status: store.read(
            store.operations.count_matching,
            status,
            job_filter,
            upto_seq=upto,
            at_most=MAX_COUNTED,
        )
        for status in statuses_of(action, job_filter)
    }
    return Preview(action, job_filter, upto, counts)


def run(
    store: Store,
    jobs: JobService,
    action: BulkAction,
    job_filter: JobFilter,
    *,
    upto_seq: int,
    operator: Operator | None,
    seconds: float = DEFAULT_SECONDS,
    batch_size: int = BATCH_SIZE,
) -> Done:
    """Act on the jobs the filter matches up to `upto_seq` (see the module's docstring)."""
    entry = audit.record(store, operator, f"bulk {action}", describe(job_filter), 0)
    deadline = time.monotonic() + seconds
    acted = 0
    for status in statuses_of(action, job_filter):
        after = 0
        while True:
            if time.monotonic() >= deadline:
                return Done(acted, complete=False)

            def batch(tx: Transaction, status: Status = status, after: int = after) -> BulkBatch:
                done = store.operations.act_on_batch(
                    tx,
                    action,
                    status,
                    job_filter,
                    after_seq=after,
                    upto_seq=upto_seq,
                    limit=batch_size,
                )
                audit.add(tx, store, entry, len(done.acted))
                return done

            done = store.write(batch)
            acted += len(done.acted)
            _tell_pool(jobs, action, done)
            after = done.resume_after
            if done.picked < batch_size:
                break
            # Other greenlets' writes go first, between two batches.
            gevent.sleep(0)
    return Done(acted, complete=True)


def _tell_pool(jobs: JobService, action: BulkAction, done: BulkBatch) -> None:
    pool = jobs.pool
    if pool is None or not done.acted:
        return
    if action is BulkAction.RETRY:
        pool.wake()
    elif action is BulkAction.CANCEL:
        for job in done.acted:
            if job.status is Status.RUNNING:
                pool.cancel(job.id)
