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
    """A row as `Job` has it on every driver: times as fixed-width UTC text.
    A time comes as a `datetime`, or as the server's text where the
    statement read it so (`as_text`)."""
    values = dict(row)
    for column in _TIMES:
        value = values[column]
        if value is None:
            continue
        values[column] = from_server_text(value) if isinstance(value, str) else to_text(value)
    return Job.from_row(values)


def qualified(table: str) -> str:
    """The row's columns, each named with `table`."""
    return ", ".join(f"{table}.{column.strip()}" for column in COLUMNS.split(","))


def as_text(table: str) -> str:
    """The row's columns for a `RETURNING` list, each named with `table`, its
    times as the server writes them in text (never in a `SELECT` list, whose
    `ORDER BY` would then sort the text).

    A claim's rows are the runner's hottest read: psycopg parsed each of a
    row's seven times into a `datetime` for `to_text` to format again; the
    server's own text, reshaped by `from_server_text`, skips both (the
    measurement: bench/NOTES.md, round 5, eighth session)."""
    columns = (column.strip() for column in COLUMNS.split(","))
    return ", ".join(
        f"{table}.{column}::text AS {column}" if column in _TIMES else f"{table}.{column}"
        for column in columns
    )


def from_server_text(value: str) -> str:
    """A time as the server writes it in text in the store's sessions (ISO
    style, UTC: `2026-12-07 02:51:00.1234+00`, the fraction's trailing
    zeros left out) as `to_text` writes it (`2026-12-07T02:51:00.123400Z`)."""
    if value[10:11] == " " and value.endswith("+00"):
        if len(value) == 22:
            return f"{value[:10]}T{value[11:19]}.000000Z"
        if 24 <= len(value) <= 29 and value[19] == ".":
            return f"{value[:10]}T{value[11:19]}.{value[20:-3]:0<6}Z"
    raise ValueError(f"not a time in the ISO style and UTC: {value!r}")
