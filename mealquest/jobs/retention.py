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
nothing for longer than any rate's window.
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


@dataclass(frozen=True)
class Pruned:
    """What a prune deleted."""

    jobs: int = 0
    slots: int = 0
    rates: int = 0


def prune(
    store: Store,
    *,
    older_than_days: float,
    catchup_seconds: float,
    write: Callable[..., Any] | None = None,
    batch_size: int = BATCH_SIZE,
    now: datetime | None = None,
) -> Pruned:
    """Delete finished jobs older than `older_than_days`, batch by batch, until
    none is left; `write` is the store's (the CLI) or a job's fenced one.
    `now` stands in for the database's clock (tests)."""
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
    rates = _in_batches(
        lambda: write(
            store.flow.delete_stale_rates,
            older_than_seconds=MAX_RATE_SECONDS,
            limit=batch_size,
            now=now,
        ),
        batch_size,
    )
    return Pruned(jobs, slots, rates)


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
