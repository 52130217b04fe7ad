"""The SQL of operators and their token digests on SQLite.

The caller makes the token and its digest (only the digest is stored) and
checks the name; these functions only store and read.
"""

from __future__ import annotations

from mealquest.clock import to_text, utc_now
from mealquest.db.driver import Reads, Transaction
from mealquest.model.operators import Operator, OperatorListing, UnknownOperator


def insert_operator(tx: Transaction, *, name: str, token_sha256: str) -> int:
    """A new operator; its id."""
    row = tx.execute(
        "INSERT INTO operators (name, token_sha256, created_at) VALUES (?, ?, ?) RETURNING id",
        (name, token_sha256, to_text(utc_now())),
    ).fetchone()
    return int(row["id"])


def revoke_operator(tx: Transaction, operator_id: int) -> None:
    """Revoke a live operator; `UnknownOperator` if none has that id or it is revoked."""
    cursor = tx.execute(
        "UPDATE operators SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
        (to_text(utc_now()), operator_id),
    )
    if cursor.rowcount != 1:
        raise UnknownOperator()


def list_operators(conn: Reads) -> list[OperatorListing]:
    rows = conn.execute(
        "SELECT id, name, created_at, revoked_at FROM operators ORDER BY id"
    ).fetchall()
    return [OperatorListing(**dict(row)) for row in rows]


def operator_for_token_digest(conn: Reads, token_sha256: str) -> Operator | None:
    """The live operator whose token has this digest, or None."""
    row = conn.execute(
        "SELECT id, name FROM operators WHERE token_sha256 = ? AND revoked_at IS NULL",
        (token_sha256,),
    ).fetchone()
    return Operator(row["id"], row["name"]) if row else None
