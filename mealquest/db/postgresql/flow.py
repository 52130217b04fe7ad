"""Paused kinds and the partitions' state on PostgreSQL.

A pause is a row of `paused_kinds`, which every claim statement reads: the
next claim of every process after the pause commits leaves the kind's jobs
queued, and its running jobs finish as they would. A resume notifies the
listening processes as an enqueue does, so idle pools claim at once (the
others at their poll).
"""

from __future__ import annotations

from datetime import datetime

from mealquest.clock import to_text
from mealquest.db.driver import Reads, Transaction
from mealquest.db.postgresql.transaction import postgres_transaction
from mealquest.model.jobs import PartitionState, PausedKind


def pause_kind(tx: Transaction, kind: str, *, operator_id: int | None) -> bool:
    """Pause `kind` for the whole deployment; False if it already was (the
    first pause's time and operator stay)."""
    cursor = tx.execute(
        "INSERT INTO paused_kinds (kind, operator_id) VALUES (%s, %s) "
        "ON CONFLICT (kind) DO NOTHING",
        (kind, operator_id),
    )
    return cursor.rowcount == 1


def resume_kind(tx: Transaction, kind: str) -> bool:
    """Resume a paused kind; False if it was not paused."""
    if tx.execute("DELETE FROM paused_kinds WHERE kind = %s", (kind,)).rowcount != 1:
        return False
    postgres_transaction(tx).notify_enqueued()
    return True


def paused_kinds(conn: Reads) -> list[PausedKind]:
    rows = conn.execute(
        "SELECT kind, paused_at, operator_id FROM paused_kinds ORDER BY kind"
    ).fetchall()
    return [PausedKind(row["kind"], to_text(row["paused_at"]), row["operator_id"]) for row in rows]


def partition_state(conn: Reads, kind: str, partition_key: str) -> PartitionState:
    """The partition's running jobs (its partial index) and, while its rate
    leaves it out, until when (its ledger's row)."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobs WHERE status = 'running' "
        "AND partition_key IS NOT NULL AND kind = %(kind)s AND partition_key = %(key)s) "
        "AS running, (SELECT blocked_until FROM partition_rates WHERE kind = %(kind)s "
        "AND partition_key = %(key)s AND blocked_until > now()) AS blocked_until",
        {"kind": kind, "key": partition_key},
    ).fetchone()
    blocked = row["blocked_until"]
    return PartitionState(int(row["running"]), None if blocked is None else to_text(blocked))


def delete_stale_rates(
    tx: Transaction, *, older_than_seconds: float, limit: int, now: datetime | None = None
) -> int:
    """Delete up to `limit` rate ledgers whose latest start is older than
    `older_than_seconds` (their index's oldest first), leaving alone any row
    a claim holds; how many were."""
    cursor = tx.execute(
        "WITH batch AS MATERIALIZED (SELECT kind, partition_key FROM partition_rates "
        "WHERE last_started_at < coalesce(%(now)s::timestamptz, now()) "
        "- make_interval(secs => %(seconds)s) ORDER BY last_started_at LIMIT %(limit)s "
        "FOR UPDATE SKIP LOCKED) "
        "DELETE FROM partition_rates WHERE (kind, partition_key) IN (SELECT * FROM batch)",
        {"now": now, "seconds": float(older_than_seconds), "limit": limit},
    )
    return cursor.rowcount
