"""Retention: deleting finished jobs, a small batch per transaction.

`prune` is what the built-in periodic kind `prune_jobs` runs every hour and
what `flask jobs prune` runs now. It deletes jobs in a final status (the
model's `FINAL_STATUSES`) that finished more than the given number of days
ago, and never a queued or running one; a job that finishes while a prune
runs is simply not old enough. Recipes stay: deleting a job only clears
their `job_id`.

Each batch is one short write transaction (see `BATCH_SIZE` and the
retention benchmark in `bench/`), so the write lock SQLite has one of is
never held for more than a few milliseconds, and other writes get in
between batches. Old periodic slots go too, once no scheduler could
consider them again, and the rate ledgers of partitions that started
nothing for longer than any rate's window; so do the operators' audit
entries older than the retention (`audit_days`), the job history the
dashboard's charts no longer show, and what an erasure had to leave to
running jobs: an erased household's jobs once they have ended, and its recipes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import gevent
from marshmallow import Schema, fields

from mealquest.db.driver import Store
from mealquest.jobs.registry import MAX_RATE_SECONDS, KindOptions, Registry

if TYPE_CHECKING:
    from mealquest.jobs.context import JobContext

PRUNE_KIND = "prune_jobs"
# Every hour, at a minute of its own (many crontabs use :00).
PRUNE_CRON = "17 * * * *"
# Rows per transaction: measured by `python -m bench.retention` (bench/README.md)
# to hold SQLite's write lock for one to two milliseconds (median) on a table of a
# million finished jobs: about 10-20 us a row.
BATCH_SIZE = 100
SECONDS_PER_DAY = 86_400.0
# Periodic slots are kept at least this many catch-up windows, so that no
# scheduler (whose window may differ) could still make a deleted slot again.
_SLOT_WINDOWS_KEPT = 2
# The charts' history, by its periods' width in minutes, is kept this long:
# twice what the charts show (an hour of minutes, a day of ten minutes).
HISTORY_KEPT_SECONDS = {1: 2 * 3600.0, 10: 2 * SECONDS_PER_DAY}
# Erased households whose leftovers one prune finishes, at most.
_ERASURES_PER_PRUNE = 100


@dataclass(frozen=True)
class Pruned:
    """What a prune deleted."""

    jobs: int = 0
    slots: int = 0
    rates: int = 0
    audit: int = 0
    history: int = 0
    erased: int = 0
    """Jobs and recipes of erased households (left by running jobs)."""


@dataclass(frozen=True)
class HouseholdRows:
    """What deleting a household's rows deleted."""

    tokens: int = 0
    jobs: int = 0
    recipes: int = 0

    @property
    def total(self) -> int:
        return self.tokens + self.jobs + self.recipes


def prune(
    store: Store,
    *,
    older_than_days: float,
    catchup_seconds: float,
    write: Callable[..., Any] | None = None,
    batch_size: int = BATCH_SIZE,
    now: datetime | None = None,
    audit_days: float | None = None,
) -> Pruned:
    """Delete finished jobs older than `older_than_days`, batch by batch, until
    none is left; `write` is the store's (the CLI) or a job's fenced one.
    Audit entries older than `audit_days` go too (None: none). `now` stands
    in for the database's clock (tests)."""
    if older_than_days < 0 or batch_size < 1:
        raise ValueError("older_than_days must be 0 or more and batch_size at least 1")
    write = write or store.write
    older_than = older_than_days * SECONDS_PER_DAY
    jobs = _in_batches(
        lambda: write(
            store.retention.delete_finished,
            older_than_seconds=older_than,
            limit=batch_size,
            now=now,
        ),
        batch_size,
    )
    slots = _in_batches(
        lambda: write(
            store.periodic.delete_slots,
            older_than_seconds=max(older_than, _SLOT_WINDOWS_KEPT * catchup_seconds),
            limit=batch_size,
            now=now,
        ),
        batch_size,
    )
    # A batch goes once nothing of it is kept: its members and its callback.
    _in_batches(lambda: write(store.batches.delete_empty_batches, limit=batch_size), batch_size)
    rates = _in_batches(
        lambda: write(
            store.flow.delete_stale_rates,
            older_than_seconds=MAX_RATE_SECONDS,
            limit=batch_size,
            now=now,
        ),
        batch_size,
    )
    audit = 0
    if audit_days:
        audit = _in_batches(
            lambda: write(
                store.audit.delete_entries,
                older_than_seconds=audit_days * SECONDS_PER_DAY,
                limit=batch_size,
                now=now,
            ),
            batch_size,
        )
    history = 0
    for width, kept in HISTORY_KEPT_SECONDS.items():

        def delete_history(width: int = width, kept: float = kept) -> int:
            deleted: int = write(
                store.history.delete_history,
                width=width,
                older_than_seconds=kept,
                limit=batch_size,
                now=now,
            )
            return deleted

        history += _in_batches(delete_history, batch_size)
    erased = 0
    for household_id in store.read(store.households.erased_with_rows, limit=_ERASURES_PER_PRUNE):
        left = delete_household_rows(store, household_id, write=write, batch_size=batch_size)
        erased += left.jobs + left.recipes
    return Pruned(jobs, slots, rates, audit, history, erased)


def delete_household_rows(
    store: Store,
    household_id: int,
    *,
    tokens: bool = False,
    jobs: bool = True,
    recipes: bool = True,
    write: Callable[..., Any] | None = None,
    batch_size: int = BATCH_SIZE,
    each_batch: Callable[[Any, int], None] | None = None,
) -> HouseholdRows:
    """Delete a household's tokens (if asked), its jobs that are not running
    (with their idempotency keys) and its recipes, batch by batch, until none
    is left. `each_batch(tx, deleted)` runs inside each batch's transaction
    (an erasure counts its audit entry up there)."""
    write = write or store.write

    def batches(delete: Callable[..., int]) -> int:
        def one(tx: Any) -> int:
            deleted = delete(tx, household_id, limit=batch_size)
            if each_batch is not None:
                each_batch(tx, deleted)
            return deleted

        return _in_batches(lambda: write(one), batch_size)

    rows = HouseholdRows(
        tokens=batches(store.households.delete_tokens) if tokens else 0,
        jobs=batches(store.jobs.delete_household_jobs) if jobs else 0,
        recipes=batches(store.recipes.delete_household_recipes) if recipes else 0,
    )
    if jobs:
        # What is left of its batches: a member still running keeps its job.
        _in_batches(
            lambda: write(store.batches.delete_household_batches, household_id, limit=batch_size),
            batch_size,
        )
    return rows


def _in_batches(delete_batch: Callable[[], int], batch_size: int) -> int:
    total = 0
    while True:
        deleted = delete_batch()
        total += deleted
        if deleted < batch_size:
            return total
        # Other greenlets' writes go first, between two batches.
        gevent.sleep(0)


class _EmptySchema(Schema):
    pass


class PruneResultSchema(Schema):
    deleted = fields.Integer(required=True, strict=True)
    slots_deleted = fields.Integer(required=True, strict=True)


def register(registry: Registry, *, retention_days: int, catchup_seconds: float) -> None:
    """Register `prune_jobs`: periodic unless retention is off (0 days), when
    it is still known, so that jobs of it queued before do nothing and end."""

    def prune_jobs(payload: dict[str, Any], ctx: JobContext) -> dict[str, int]:
        if not retention_days:
            return {"deleted": 0, "slots_deleted": 0}
        pruned = prune(
            ctx.store,
            older_than_days=retention_days,
            catchup_seconds=catchup_seconds,
            write=ctx.write,
            audit_days=retention_days,
        )
        return {"deleted": pruned.jobs, "slots_deleted": pruned.slots}

    registry.register(
        PRUNE_KIND,
        prune_jobs,
        payload=_EmptySchema,
        result=PruneResultSchema,
        options=KindOptions(
            max_attempts=3,
            timeout_seconds=1800.0,
            cron=PRUNE_CRON if retention_days else None,
        ),
    )
