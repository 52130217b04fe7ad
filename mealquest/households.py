"""Households and their API tokens.

A token is 32 random bytes shown once when it is made; the database keeps
only its SHA-256 digest, so a copy of the database grants nothing. The
tokens are high-entropy, so a fast hash is enough; lookups go by digest,
which leaves no secret-dependent comparison to time.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import unicodedata
from dataclasses import dataclass

from mealquest.clock import to_text, utc_now
from mealquest.store import Store, Transaction

TOKEN_PREFIX = "mq_"  # noqa: S105 - a marker, not a secret
# Unicode control, format (e.g. bidi overrides), line and paragraph separators.
_CONTROL = {"Cc", "Cf", "Zl", "Zp"}


class HouseholdError(Exception):
    """A household or token operation was refused."""


class UnknownHousehold(HouseholdError):
    """No household has that id."""


class UnknownToken(HouseholdError):
    """No token has that id, or it is already revoked."""


@dataclass(frozen=True)
class Household:
    id: int
    name: str


@dataclass(frozen=True)
class IssuedToken:
    """A token as made: `token` is the clear text, which is never stored."""

    household_id: int
    token_id: int
    token: str


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _insert_token(tx: Transaction, household_id: int) -> IssuedToken:
    token = _new_token()
    try:
        cursor = tx.execute(
            "INSERT INTO api_tokens (household_id, token_sha256, created_at) VALUES (?, ?, ?)",
            (household_id, token_digest(token), to_text(utc_now())),
        )
    except sqlite3.IntegrityError:
        raise UnknownHousehold(UnknownHousehold.__doc__) from None
    return IssuedToken(household_id, int(cursor.lastrowid or 0), token)


def create_household(store: Store, name: str) -> IssuedToken:
    """Create a household with its first token."""
    name = name.strip()
    if not 1 <= len(name) <= 200:
        raise HouseholdError("a household name has 1 to 200 characters")
    if any(unicodedata.category(char) in _CONTROL for char in name):
        # A newline would forge lines of `flask households list` and of logs.
        raise HouseholdError("a household name has no control characters")

    def insert(tx: Transaction) -> IssuedToken:
        cursor = tx.execute(
            "INSERT INTO households (name, created_at) VALUES (?, ?)",
            (name, to_text(utc_now())),
        )
        return _insert_token(tx, int(cursor.lastrowid or 0))

    return store.write(insert)


def create_token(store: Store, household_id: int) -> IssuedToken:
    return store.write(_insert_token, household_id)


def revoke_token(store: Store, token_id: int) -> None:
    def revoke(tx: Transaction) -> None:
        cursor = tx.execute(
            "UPDATE api_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
            (to_text(utc_now()), token_id),
        )
        if cursor.rowcount != 1:
            raise UnknownToken(UnknownToken.__doc__)

    store.write(revoke)


def list_households(store: Store) -> list[tuple[Household, int]]:
    """Every household with its number of live tokens."""
    rows = store.read(
        lambda conn: conn.execute(
            "SELECT h.id, h.name, count(t.id) AS tokens FROM households h "
            "LEFT JOIN api_tokens t ON t.household_id = h.id AND t.revoked_at IS NULL "
            "GROUP BY h.id ORDER BY h.id"
        ).fetchall()
    )
    return [(Household(row["id"], row["name"]), row["tokens"]) for row in rows]


def household_for_token(store: Store, token: str) -> Household | None:
    """The household a live token belongs to, or None."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = store.read(
        lambda conn: conn.execute(
            "SELECT h.id, h.name FROM api_tokens t JOIN households h ON h.id = t.household_id "
            "WHERE t.token_sha256 = ? AND t.revoked_at IS NULL",
            (token_digest(token),),
        ).fetchone()
    )
    return Household(row["id"], row["name"]) if row else None
