"""The SQL of households and their API tokens on SQLite.

The caller makes the token and its digest (only the digest is stored) and
checks the name; these functions only store and read.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection
from typing import Any

from mealquest.clock import to_text, utc_now
from mealquest.db.driver import Reads, Transaction
from mealquest.model.households import (
    SYSTEM_HOUSEHOLD_ID,
    Household,
    HouseholdErased,
    HouseholdFigures,
    HouseholdState,
    TokenInfo,
    UnknownHousehold,
    UnknownToken,
)
from mealquest.model.jobs import FINAL_STATUSES


def insert_household(tx: Transaction, *, name: str) -> int:
    """A new household; its id."""
    row = tx.execute(
        "INSERT INTO households (name, created_at) VALUES (?, ?) RETURNING id",
        (name, to_text(utc_now())),
    ).fetchone()
    return int(row["id"])


def insert_token(
    tx: Transaction, *, household_id: int, token_sha256: str, name: str | None = None
) -> int:
    """Store a token's digest for a household; the token's id (`UnknownHousehold`,
    `HouseholdErased`: none is made)."""
    _live(tx, household_id)
    try:
        row = tx.execute(
            "INSERT INTO api_tokens (household_id, token_sha256, name, created_at) "
            "VALUES (?, ?, ?, ?) RETURNING id",
            (household_id, token_sha256, name, to_text(utc_now())),
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


def list_tokens(conn: Reads, household_id: int) -> list[TokenInfo]:
    """The household's tokens, live and revoked, oldest first."""
    rows = conn.execute(
        "SELECT id, name, created_at, last_used_at, revoked_at FROM api_tokens "
        "WHERE household_id = ? ORDER BY id",
        (household_id,),
    ).fetchall()
    return [
        TokenInfo(row["id"], row["name"], row["created_at"], row["last_used_at"], row["revoked_at"])
        for row in rows
    ]


def record_token_use(tx: Transaction, token_sha256: str) -> None:
    """Note that a live token (by its digest's unique index) was used now."""
    tx.execute(
        "UPDATE api_tokens SET last_used_at = ? WHERE token_sha256 = ? AND revoked_at IS NULL",
        (to_text(utc_now()), token_sha256),
    )


def list_households(conn: Reads) -> list[tuple[Household, int]]:
    """Every household with its number of live tokens."""
    rows = conn.execute(
        "SELECT h.id, h.name, h.suspended_at IS NOT NULL AS suspended, count(t.id) AS tokens "
        "FROM households h "
        "LEFT JOIN api_tokens t ON t.household_id = h.id AND t.revoked_at IS NULL "
        "GROUP BY h.id ORDER BY h.id"
    ).fetchall()
    return [
        (Household(row["id"], row["name"], bool(row["suspended"])), row["tokens"]) for row in rows
    ]


def household_for_token_digest(conn: Reads, token_sha256: str) -> Household | None:
    """The household a live token (by digest) belongs to, or None."""
    row = conn.execute(
        "SELECT h.id, h.name, h.suspended_at IS NOT NULL AS suspended "
        "FROM api_tokens t JOIN households h ON h.id = t.household_id "
        "WHERE t.token_sha256 = ? AND t.revoked_at IS NULL AND h.erased_at IS NULL",
        (token_sha256,),
    ).fetchone()
    return Household(row["id"], row["name"], bool(row["suspended"])) if row else None


def live_token_digests(conn: Reads, digests: Collection[str]) -> set[str]:
    """Those of `digests` whose tokens are live and whose households are
    neither suspended nor erased, in one statement (a probe of the digests'
    unique index each, and of the household's row)."""
    if not digests:
        return set()
    rows = conn.execute(
        "SELECT token_sha256 FROM api_tokens JOIN households ON households.id = household_id "
        "WHERE revoked_at IS NULL AND suspended_at IS NULL AND erased_at IS NULL "
        "AND token_sha256 IN (SELECT value FROM json_each(?))",
        (json.dumps(sorted(digests)),),
    ).fetchall()
    return {row["token_sha256"] for row in rows}


_STATE = "id, name, created_at, suspended_at, erased_at"


def _state(row: Any) -> HouseholdState:
    return HouseholdState(
        row["id"], row["name"], row["created_at"], row["suspended_at"], row["erased_at"]
    )


def get_household(conn: Reads, household_id: int) -> HouseholdState | None:
    row = conn.execute(f"SELECT {_STATE} FROM households WHERE id = ?", (household_id,)).fetchone()
    return _state(row) if row else None


def _live(tx: Reads, household_id: int) -> HouseholdState:
    """The household, unless there is none (`UnknownHousehold`) or it was erased."""
    found = get_household(tx, household_id)
    if found is None:
        raise UnknownHousehold()
    if found.erased_at is not None:
        raise HouseholdErased()
    return found


def suspend_household(tx: Transaction, household_id: int) -> bool:
    """Suspend a household now; False if it already was."""
    _live(tx, household_id)
    cursor = tx.execute(
        "UPDATE households SET suspended_at = ? WHERE id = ? AND suspended_at IS NULL",
        (to_text(utc_now()), household_id),
    )
    return cursor.rowcount == 1


def resume_household(tx: Transaction, household_id: int) -> bool:
    """Lift a household's suspension; False if there was none."""
    _live(tx, household_id)
    cursor = tx.execute(
        "UPDATE households SET suspended_at = NULL WHERE id = ? AND suspended_at IS NOT NULL",
        (household_id,),
    )
    return cursor.rowcount == 1


def mark_erased(tx: Transaction, household_id: int, *, name: str) -> None:
    """Make the household a tombstone (erased and suspended now, renamed); an
    erased one stays as it is."""
    now = to_text(utc_now())
    cursor = tx.execute(
        "UPDATE households SET name = CASE WHEN erased_at IS NULL THEN ? ELSE name END, "
        "suspended_at = coalesce(suspended_at, ?), erased_at = coalesce(erased_at, ?) "
        "WHERE id = ?",
        (name, now, now, household_id),
    )
    if cursor.rowcount != 1:
        raise UnknownHousehold()


def delete_tokens(tx: Transaction, household_id: int, *, limit: int) -> int:
    cursor = tx.execute(
        "DELETE FROM api_tokens WHERE id IN (SELECT id FROM api_tokens "
        "INDEXED BY api_tokens_household WHERE household_id = ? LIMIT ?)",
        (household_id, limit),
    )
    return cursor.rowcount


def household_figures(
    conn: Reads,
    *,
    after_id: int | None,
    limit: int,
    recent: int,
    household_id: int | None = None,
) -> list[HouseholdFigures]:
    """Households by id, each with its jobs by status: queued from its queue row
    (kept by the queue triggers), running through their partial index, and
    the final statuses among its latest `recent` jobs (the household's index,
    newest first, read as far as that): a page costs at most `limit` such
    walks, however many jobs the table or a household holds. The system
    household is left out."""
    where = "h.id = :household" if household_id is not None else "h.id > :after"
    rows = conn.execute(
        f"SELECT h.id, h.name, h.created_at, h.suspended_at, h.erased_at, "
        "coalesce((SELECT queued FROM household_queues WHERE household_id = h.id), 0) AS queued, "
        "(SELECT count(*) FROM jobs INDEXED BY jobs_running "
        "WHERE household_id = h.id AND status = 'running') AS running, "
        "(SELECT json_group_object(status, n) FROM (SELECT status, count(*) AS n FROM "
        "(SELECT status FROM jobs INDEXED BY jobs_household WHERE household_id = h.id "
        "ORDER BY seq DESC LIMIT :recent) GROUP BY status)) AS latest, "
        "(SELECT count(*) FROM api_tokens WHERE household_id = h.id AND revoked_at IS NULL) "
        f"AS tokens FROM households h WHERE {where} AND h.id <> :system ORDER BY h.id LIMIT :limit",
        {
            "household": household_id,
            "after": -1 if after_id is None else after_id,
            "system": SYSTEM_HOUSEHOLD_ID,
            "recent": recent,
            "limit": limit,
        },
    ).fetchall()
    return [_figures(row, json.loads(row["latest"] or "{}")) for row in rows]


def _figures(row: Any, latest: dict[str, int]) -> HouseholdFigures:
    jobs = {str(status): int(latest.get(str(status), 0)) for status in FINAL_STATUSES}
    jobs.update({"queued": int(row["queued"]), "running": int(row["running"])})
    return HouseholdFigures(_state(row), jobs, sum(latest.values()), int(row["tokens"]))


def erased_with_rows(conn: Reads, *, limit: int) -> list[int]:
    rows = conn.execute(
        "SELECT id FROM households INDEXED BY households_erased WHERE erased_at IS NOT NULL "
        "AND (EXISTS (SELECT 1 FROM jobs WHERE household_id = households.id) "
        "OR EXISTS (SELECT 1 FROM recipes WHERE household_id = households.id)) "
        "ORDER BY id LIMIT ?",
        (limit,),
    ).fetchall()
    return [int(row["id"]) for row in rows]
