"""The SQL of the dashboard's server-side sessions on PostgreSQL.

The same operations as the SQLite side; times come from the database's clock.
"""

from __future__ import annotations

from mealquest.db.driver import Reads, Transaction
from mealquest.model.operators import Operator


def insert_session(
    tx: Transaction,
    *,
    id_sha256: str,
    operator_id: int,
    lifetime_seconds: float,
    keep: int,
) -> None:
    """A new session for the operator, lasting `lifetime_seconds`. Expired sessions
    (anyone's) go in the same write, and the operator's oldest beyond its newest
    `keep`, so the table stays as small as the live sign-ins."""
    tx.execute("DELETE FROM dashboard_sessions WHERE expires_at <= now()")
    tx.execute(
        "INSERT INTO dashboard_sessions (id_sha256, operator_id, created_at, expires_at) "
        "VALUES (%s, %s, now(), now() + make_interval(secs => %s))",
        (id_sha256, operator_id, float(lifetime_seconds)),
    )
    tx.execute(
        "DELETE FROM dashboard_sessions WHERE operator_id = %s AND id_sha256 NOT IN ("
        "SELECT id_sha256 FROM dashboard_sessions WHERE operator_id = %s "
        "ORDER BY created_at DESC, id_sha256 LIMIT %s)",
        (operator_id, operator_id, keep),
    )


def delete_session(tx: Transaction, id_sha256: str) -> None:
    tx.execute("DELETE FROM dashboard_sessions WHERE id_sha256 = %s", (id_sha256,))


def delete_operator_sessions(tx: Transaction, operator_id: int) -> None:
    tx.execute("DELETE FROM dashboard_sessions WHERE operator_id = %s", (operator_id,))


def session_operator(conn: Reads, id_sha256: str) -> Operator | None:
    """The live operator of an unexpired session, or None."""
    row = conn.execute(
        "SELECT o.id, o.name FROM dashboard_sessions AS s JOIN operators AS o "
        "ON o.id = s.operator_id "
        "WHERE s.id_sha256 = %s AND s.expires_at > now() AND o.revoked_at IS NULL",
        (id_sha256,),
    ).fetchone()
    return Operator(row["id"], row["name"]) if row else None
