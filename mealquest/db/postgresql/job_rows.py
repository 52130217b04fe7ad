"""A `jobs` row as every PostgreSQL statement of the runner reads and writes it:
its columns, its next version, the moment a statement acts at, and the `Job`
it becomes."""

from __future__ import annotations

from typing import Any

from mealquest.clock import to_text
from mealquest.model.jobs import Job

COLUMNS = (
    "id, seq, household_id, kind, payload, status, result, error, attempt, max_attempts, "
    "run_at, lease_owner, lease_expires_at, created_at, updated_at, started_at, finished_at, "
    "on_interrupt, interruptions, priority, unique_key, cancel_requested_at, snoozes, "
    "partition_key, version, waiting_signal"
)
# Every statement that changes what a household sees of a job sets its next
# version itself (the migration's trigger catches any other write).
NEXT_VERSION = "version = jobs.version + 1"
_TIMES = (
    "run_at",
    "lease_expires_at",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "cancel_requested_at",
)
# The moment a statement acts at: the transaction's start, or a test's.
NOW = "coalesce(%(now)s::timestamptz, now())"


def to_job(row: dict[str, Any]) -> Job:
    """A row as `Job` has it on every driver: times as fixed-width UTC text."""
    values = dict(row)
    for column in _TIMES:
        if values[column] is not None:
            values[column] = to_text(values[column])
    return Job.from_row(values)


def qualified(table: str) -> str:
    """The row's columns, each named with `table`."""
    return ", ".join(f"{table}.{column.strip()}" for column in COLUMNS.split(","))
