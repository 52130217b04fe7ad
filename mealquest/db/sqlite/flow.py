"""Paused kinds and the partitions' state on SQLite.

A pause is a row of `paused_kinds`, which every claim statement reads: the
next claim of every process after the pause commits leaves the kind's jobs
queued, and its running jobs finish as they would.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from mealquest.clock import to_text, utc_now
from mealquest.db.driver import Reads, Transaction
from mealquest.model.jobs import PartitionState, PausedKind


def pause_kind(tx: Transaction, kind: str, *, operator_id: int | None) -> bool:
    """Pause `kind` for the whole deployment; False if it already was (the
    first pause's time and operator stay)."""
    cursor = tx.execute(
        "INSERT INTO paused_kinds (kind, paused_at, operator_id) VALUES (?, ?, ?) "
        "ON CONFLICT (kind) DO NOTHING",
        (kind, to_text(utc_now()), operator_id),
    )
    return cursor.rowcount == 1


def resume_kind(tx: Transaction, kind: str) -> bool:
    """Resume a paused kind; False if it was not paused."""
    return tx.execute("DELETE FROM paused_kinds WHERE kind = ?", (kind,)).rowcount == 1


def paused_kinds(conn: Reads) -> list[PausedKind]:
    rows = conn.execute(
        "SELECT kind, paused_at, operator_id FROM paused_kinds ORDER BY kind"
    ).fetchall()
    return [PausedKind(row["kind"], row["paused_at"], row["operator_id"]) for row in rows]


def partition_state(conn: Reads, kind: str, partition_key: str) -> PartitionState:
    """The partition's running jobs (its partial index) and, while its rate
    leaves it out, until when (its ledger's row)."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobs INDEXED BY jobs_partition_running "
        "WHERE status = 'running' AND partition_key IS NOT NULL AND kind = :kind "
        "AND partition_key = :key) AS running, "
        "(SELECT blocked_until FROM partition_rates WHERE kind = :kind AND partition_key = :key "
        "AND blocked_until > :now) AS blocked_until",
        {"kind": kind, "key": partition_key, "now": to_text(utc_now())},
    ).fetchone()
    return PartitionState(int(row["running"]), row["blocked_until"])


def delete_stale_rates(
    tx: Transaction, *, older_than_seconds: float, limit: int, now: datetime | None = None
) -> int:
    """Delete up to `limit` rate ledgers whose latest start is older than
    `older_than_seconds` (their index's oldest first); how many were."""
    before = (now or utc_now()) - timedelta(seconds=older_than_seconds)
    cursor = tx.execute(
        "DELETE FROM partition_rates WHERE (kind, partition_key) IN (SELECT kind, partition_key "
        "FROM partition_rates WHERE last_started_at < ? ORDER BY last_started_at LIMIT ?)",
        (to_text(before), limit),
    )
    return cursor.rowcount
