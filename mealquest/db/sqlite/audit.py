"""The SQL of the operators' audit log on SQLite."""

from __future__ import annotations

from datetime import datetime, timedelta

from mealquest.clock import to_text, utc_now
from mealquest.db.driver import Reads, Transaction
from mealquest.db.sqlite.periodic import current_time
from mealquest.model.audit import AuditEntry

_COLUMNS = "seq, at, operator_id, actor, action, target, count"


def insert_entry(
    tx: Transaction,
    *,
    operator_id: int | None,
    actor: str,
    action: str,
    target: str,
    count: int,
) -> int:
    row = tx.execute(
        "INSERT INTO audit_log (at, operator_id, actor, action, target, count) "
        "VALUES (?, ?, ?, ?, ?, ?) RETURNING seq",
        (to_text(utc_now()), operator_id, actor, action, target, count),
    ).fetchone()
    return int(row["seq"])


def add_to_count(tx: Transaction, seq: int, amount: int) -> None:
    tx.execute("UPDATE audit_log SET count = count + ? WHERE seq = ?", (amount, seq))


def list_entries(conn: Reads, *, before_seq: int | None, limit: int) -> list[AuditEntry]:
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM audit_log WHERE seq < ? ORDER BY seq DESC LIMIT ?",
        (2**63 - 1 if before_seq is None else before_seq, limit),
    ).fetchall()
    return [AuditEntry(**dict(row)) for row in rows]


def delete_entries(
    tx: Transaction, *, older_than_seconds: float, limit: int, now: datetime | None = None
) -> int:
    """Delete up to `limit` entries older than that, oldest first (by `audit_log_at`)."""
    before = current_time(tx, now) - timedelta(seconds=older_than_seconds)
    cursor = tx.execute(
        "DELETE FROM audit_log WHERE seq IN (SELECT seq FROM audit_log WHERE at < ? "
        "ORDER BY at LIMIT ?)",
        (to_text(before), limit),
    )
    return cursor.rowcount
