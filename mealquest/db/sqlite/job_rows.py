"""A `jobs` row as every SQLite statement of the runner reads and writes it:
its columns, its next version, and the moment a statement acts at."""

from __future__ import annotations

from datetime import datetime

from mealquest.clock import to_text, utc_now

COLUMNS = (
    "id, seq, household_id, kind, payload, status, result, error, attempt, max_attempts, "
    "run_at, lease_owner, lease_expires_at, created_at, updated_at, started_at, finished_at, "
    "on_interrupt, interruptions, priority, unique_key, cancel_requested_at, snoozes, "
    "partition_key, version, waiting_signal"
)
# Every statement that changes what a household sees of a job sets its next
# version itself (the migration's trigger catches any other write, at the
# cost of a second write of the row).
NEXT_VERSION = "version = jobs.version + 1"
# The running jobs, read from their partial index: through a kind's index
# SQLite read every queued job of the kind as well (4,000 of a kind at its
# cap, at every claim).
RUNNING_JOBS = "jobs INDEXED BY jobs_running"


def moment_of(now: datetime | None) -> datetime:
    """The database's "now": on SQLite, one machine's wall clock (`now` overrides
    it for tests that move time past a lease)."""
    return now if now is not None else utc_now()


def moment_text(now: datetime | None) -> str:
    return to_text(moment_of(now))
