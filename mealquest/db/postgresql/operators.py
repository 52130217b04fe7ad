"""The SQL of operators and their token digests on PostgreSQL.

The same operations as the SQLite side: the caller makes the token and its
digest (only the digest is stored) and checks the name; these functions
only store and read. Times come from the database's clock.
"""

from __future__ import annotations

from mealquest.clock import to_text
from mealquest.db.driver import Reads, Transaction
from mealquest.model.operators import Operator, OperatorListing, UnknownOperator


def insert_operator(tx: Transaction, *, name: str, token_sha256: str) -> int:
    """A new operator; its id."""
    row = tx.execute(
        "INSERT INTO operators (name, token_sha256, created_at) VALUES (%s, %s, now()) "
        "RETURNING id",
        (name, token_sha256),
    ).fetchone()
    return int(row["id"])


def revoke_operator(tx: Transaction, operator_id: int) -> None:
    """Revoke a live operator; `UnknownOperator` if none has that id or it is revoked."""
    cursor = tx.execute(
        "UPDATE operators SET revoked_at = now() WHERE id = %s AND revoked_at IS NULL",
        (operator_id,),
    )
    if cursor.rowcount != 1:
        raise UnknownOperator()


def list_operators(conn: Reads) -> list[OperatorListing]:
    rows = conn.execute(
        "SELECT id, name, created_at, revoked_at FROM operators ORDER BY id"
    ).fetchall()
    return [
        OperatorListing(
            row["id"],
            row["name"],
            to_text(row["created_at"]),
            to_text(row["revoked_at"]) if row["revoked_at"] is not None else None,
        )
        for row in rows
    ]


def operator_for_token_digest(conn: Reads, token_sha256: str) -> Operator | None:
    """The live operator whose token has this digest, or None."""
    row = conn.execute(
        "SELECT id, name FROM operators WHERE token_sha256 = %s AND revoked_at IS NULL",
        (token_sha256,),
    ).fetchone()
    return Operator(row["id"], row["name"]) if row else None
