"""Erasing a household: everything of it deleted, for good, but its id.

In order: the household is marked erased (a tombstone: its name replaced,
suspended, so no claim takes its queued jobs) and the erasure recorded in
the audit log; its running jobs are cancelled through the job service (told
at once in this process, at their next heartbeat elsewhere, killed after
the kill grace); its tokens go, then its jobs that are not running (with
their idempotency keys); then, once the running jobs have ended (or
`wait_seconds` passed), those jobs and its recipes. Each deletion is a
small batch in a transaction of its own (SQLite's write lock is held a few
milliseconds at a time), counted up on the audit entry in that transaction.

A job still running when the wait ends ends cancelled shortly (or at its
lease's rescue, if its process died): the hourly prune job deletes it then,
with any recipe it stored, and so does erasing again. Last, the database's
files are cleared of the deleted rows (`Store.forget_deleted`: on SQLite,
whose connections run with `secure_delete`, the WAL is checkpointed and
truncated). The household row
stays (see the migration: its id is never reused, the audit log keeps
naming it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import gevent

from mealquest import audit
from mealquest.db.driver import Store, Transaction
from mealquest.jobs.service import JobService
from mealquest.jobs.service.retention import delete_household_rows
from mealquest.model.households import SYSTEM_HOUSEHOLD_ID, SystemHouseholdRefused
from mealquest.model.operators import Operator

ERASED_NAME = "erased household"
# How often an erasure looks again whether the household's running jobs ended.
_POLL_SECONDS = 0.2
# The least time given to clearing the database's files of what was deleted.
_FORGET_SECONDS = 5.0


@dataclass(frozen=True)
class Erasure:
    """What an erasure did, and the running jobs it had to leave (still ending)."""

    household_id: int
    cancelled: int
    tokens: int
    jobs: int
    recipes: int
    still_running: int
    # Whether no copy of what was deleted is left in the database's files
    # (`Store.forget_deleted`): False while a reader held SQLite's WAL.
    forgotten: bool = True


def erase(
    store: Store,
    jobs: JobService,
    household_id: int,
    operator: Operator | None,
    *,
    wait_seconds: float,
) -> Erasure:
    """Erase the household (see the module's docstring); waits up to
    `wait_seconds` for its running jobs to end. Erasing an erased household
    again deletes what was left (`UnknownHousehold`,
    `SystemHouseholdRefused` otherwise)."""
    if household_id == SYSTEM_HOUSEHOLD_ID:
        raise SystemHouseholdRefused()

    def start(tx: Transaction) -> int:
        store.households.mark_erased(tx, household_id, name=ERASED_NAME)
        return audit.insert(tx, store, operator, "erase", f"household {household_id}", 0)

    entry = store.write(start)

    def count_up(tx: Transaction, deleted: int) -> None:
        audit.add(tx, store, entry, deleted)

    running = store.read(store.jobs.running_job_ids, household_id)
    for job_id in running:
        jobs.cancel(job_id)
    first = delete_household_rows(
        store, household_id, tokens=True, recipes=False, each_batch=count_up
    )
    deadline = time.monotonic() + wait_seconds
    while store.read(store.jobs.running_job_ids, household_id):
        if time.monotonic() >= deadline:
            break
        gevent.sleep(_POLL_SECONDS)
    rest = delete_household_rows(store, household_id, each_batch=count_up)
    forgotten = store.forget_deleted(max(deadline - time.monotonic(), _FORGET_SECONDS))
    return Erasure(
        household_id=household_id,
        cancelled=len(running),
        tokens=first.tokens,
        jobs=first.jobs + rest.jobs,
        recipes=rest.recipes,
        still_running=len(store.read(store.jobs.running_job_ids, household_id)),
        forgotten=forgotten,
    )
