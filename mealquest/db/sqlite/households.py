"""The SQL of households and their API tokens on SQLite.

The caller makes the token and its digest (only the digest is stored) and
checks the name; these functions only store and read.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection

from mealquest.clock import to_text, utc_now
from mealquest.db.driver import Reads, Transaction
from mealquest.model.households import Household, UnknownHousehold, UnknownToken


def insert_household(tx: Transaction, *, name: str) -> int:
    """A new household; its id."""
    row = tx.execute(
        "INSERT INTO households (name, created_at) VALUES (?, ?) RETURNING id",
        (name, to_text(utc_now())),
    ).fetchone()
    return int(row["id"])


def insert_token(tx: Transaction, *, household_id: int, token_sha256: str) -> int:
    """Store a token's digest for a household; the token's id."""
    try:
        row = tx.execute(
            "INSERT INTO api_tokens (household_id, token_sha256, created_at) VALUES (?, ?, ?) "
            "RETURNING id",
            (household_id, token_sha256, to_text(utc_now())),
        ).fetchone()
    except sqlite3.IntegrityError:
        raise UnknownHousehold() from None
    return int(row["id"])


def create_household(tx: Transaction, *, name: str, token_sha256: str) -> tuple[int, int]:
    """A household with its first token: (household id, token id)."""
    household_id = insert_household(tx, name=name)
    return household_id, insert_token(tx, household_id=household_id, token_sha256=token_sha256)


def revoke_token(tx: Transaction, token_id: int) -> None:
    """Revoke a live token at once; `UnknownToken` if none has that id or it is revoked."""
    cursor = tx.execute(
        "UPDATE api_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
        (to_text(utc_now()), token_id),
    )
    if cursor.rowcount != 1:
        raise UnknownToken()


def list_households(conn: Reads) -> list[tuple[Household, int]]:
    """Every household with its number of live tokens."""
    rows = conn.execute(
        "SELECT h.id, h.name, count(t.id) AS tokens FROM households h "
        "LEFT JOIN api_tokens t ON t.household_id = h.id AND t.revoked_at IS NULL "
        "GROUP BY h.id ORDER BY h.id"
    ).fetchall()
    return [(Household(row["id"], row["name"]), row["tokens"]) for row in rows]


def household_for_token_digest(conn: Reads, token_sha256: str) -> Household | None:
    """The household a live token (by digest) belongs to, or None."""
    row = conn.execute(
        "SELECT h.id, h.name FROM api_tokens t JOIN households h ON h.id = t.household_id "
        "WHERE t.token_sha256 = ? AND t.revoked_at IS NULL",
        (token_sha256,),
    ).fetchone()
    return Household(row["id"], row["name"]) if row else None


def live_token_digests(conn: Reads, digests: Collection[str]) -> set[str]:
    """Those of `digests` whose tokens are live, in one statement (a probe of
    the digests' unique index each)."""
    if not digests:
        return set()
    rows = conn.execute(
        "SELECT token_sha256 FROM api_tokens WHERE revoked_at IS NULL "
        "AND token_sha256 IN (SELECT value FROM json_each(?))",
        (json.dumps(sorted(digests)),),
    ).fetchall()
    return {row["token_sha256"] for row in rows}
