"""The SQL of operators and their token digests on SQLite.

The caller makes the token and its digest (only the digest is stored) and
checks the name; these functions only store and read.
"""

from __future__ import annotations

import sqlite3

from mealquest.clock import to_text, utc_now
from mealquest.operators import Operator, OperatorListing, UnknownOperator
from mealquest.store import Transaction


def insert_operator(tx: Transaction, *, name: str, token_sha256: str) -> int:
    """A new operator; its id."""
    cursor = tx.execute(
        "INSERT INTO operators (name, token_sha256, created_at) VALUES (?, ?, ?)",
        (name, token_sha256, to_text(utc_now())),
    )
    return int(cursor.lastrowid or 0)


def revoke_operator(tx: Transaction, operator_id: int) -> None:
    """Revoke a live operator; `UnknownOperator` if none has that id or it is revoked."""
    cursor = tx.execute(
        "UPDATE operators SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
        (to_text(utc_now()), operator_id),
    )
    if cursor.rowcount != 1:
        raise UnknownOperator(UnknownOperator.__doc__)


def list_operators(conn: sqlite3.Connection) -> list[OperatorListing]:
    rows = conn.execute(
        "SELECT id, name, created_at, revoked_at FROM operators ORDER BY id"
    ).fetchall()
    return [OperatorListing(**dict(row)) for row in rows]


def operator_for_token_digest(conn: sqlite3.Connection, token_sha256: str) -> Operator | None:
    """The live operator whose token has this digest, or None."""
    row = conn.execute(
        "SELECT id, name FROM operators WHERE token_sha256 = ? AND revoked_at IS NULL",
        (token_sha256,),
    ).fetchone()
    return Operator(row["id"], row["name"]) if row else None
