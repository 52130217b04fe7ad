"""The SQL of the operators' audit log on PostgreSQL."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from mealquest.clock import to_text
from mealquest.db.driver import Reads, Transaction
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
        "VALUES (now(), %s, %s, %s, %s, %s) RETURNING seq",
        (operator_id, actor, action, target, count),
    ).fetchone()
    return int(row["seq"])


def add_to_count(tx: Transaction, seq: int, amount: int) -> None:
    tx.execute("UPDATE audit_log SET count = count + %s WHERE seq = %s", (amount, seq))


def _entry(row: Any) -> AuditEntry:
    values = dict(row)
    values["at"] = to_text(values["at"])
    return AuditEntry(**values)


def list_entries(conn: Reads, *, before_seq: int | None, limit: int) -> list[AuditEntry]:
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM audit_log WHERE seq < %s ORDER BY seq DESC LIMIT %s",
        (2**63 - 1 if before_seq is None else before_seq, limit),
    ).fetchall()
    return [_entry(row) for row in rows]


def delete_entries(
    tx: Transaction, *, older_than_seconds: float, limit: int, now: datetime | None = None
) -> int:
    """Delete up to `limit` entries older than that, oldest first (the batch
    chosen once: see `retention.delete_finished`)."""
    cursor = tx.execute(
        "WITH batch AS MATERIALIZED (SELECT seq FROM audit_log WHERE at < "
        "coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(seconds)s) "
        "ORDER BY at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) "
        "DELETE FROM audit_log WHERE seq IN (SELECT seq FROM batch)",
        {"now": now, "seconds": float(older_than_seconds), "limit": limit},
    )
    return cursor.rowcount
