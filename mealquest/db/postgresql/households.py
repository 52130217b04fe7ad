"""The SQL of households and their API tokens on PostgreSQL.

The same operations as the SQLite side: the caller makes the token and its
digest (only the digest is stored) and checks the name; these functions
only store and read. Times come from the database's clock.
"""

from __future__ import annotations

from collections.abc import Collection

from mealquest.db.driver import Reads, Transaction
from mealquest.model.households import Household, UnknownHousehold, UnknownToken


def insert_household(tx: Transaction, *, name: str) -> int:
    """A new household; its id."""
    row = tx.execute(
        "INSERT INTO households (name, created_at) VALUES (%s, now()) RETURNING id", (name,)
    ).fetchone()
    return int(row["id"])


def insert_token(tx: Transaction, *, household_id: int, token_sha256: str) -> int:
    """Store a token's digest for a household; the token's id.

    Inserts only if the household exists, so an unknown one is
    `UnknownHousehold` without a failed statement (which would abort the
    caller's transaction).
    """
    row = tx.execute(
        "INSERT INTO api_tokens (household_id, token_sha256, created_at) "
        "SELECT id, %s, now() FROM households WHERE id = %s RETURNING id",
        (token_sha256, household_id),
    ).fetchone()
    if row is None:
        raise UnknownHousehold()
    return int(row["id"])


def create_household(tx: Transaction, *, name: str, token_sha256: str) -> tuple[int, int]:
    """A household with its first token: (household id, token id)."""
    household_id = insert_household(tx, name=name)
    return household_id, insert_token(tx, household_id=household_id, token_sha256=token_sha256)


def revoke_token(tx: Transaction, token_id: int) -> None:
    """Revoke a live token at once; `UnknownToken` if none has that id or it is revoked."""
    cursor = tx.execute(
        "UPDATE api_tokens SET revoked_at = now() WHERE id = %s AND revoked_at IS NULL",
        (token_id,),
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
    """The household a live token (by its digest) belongs to, or None."""
    row = conn.execute(
        "SELECT h.id, h.name FROM api_tokens t JOIN households h ON h.id = t.household_id "
        "WHERE t.token_sha256 = %s AND t.revoked_at IS NULL",
        (token_sha256,),
    ).fetchone()
    return Household(row["id"], row["name"]) if row else None


def live_token_digests(conn: Reads, digests: Collection[str]) -> set[str]:
    """Those of `digests` whose tokens are live, in one statement."""
    if not digests:
        return set()
    rows = conn.execute(
        "SELECT token_sha256 FROM api_tokens WHERE revoked_at IS NULL "
        "AND token_sha256 = ANY(%s::text[])",
        (sorted(digests),),
    ).fetchall()
    return {row["token_sha256"] for row in rows}
