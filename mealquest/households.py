"""Households and their API tokens.

A token is 32 random bytes shown once when it is made; the database keeps
only its SHA-256 digest, so a copy of the database grants nothing. The
tokens are high-entropy, so a fast hash is enough; lookups go by digest,
which leaves no secret-dependent comparison to time.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from mealquest import audit
from mealquest.db.driver import Store, Transaction
from mealquest.model.households import (
    SYSTEM_HOUSEHOLD_ID,
    Household,
    HouseholdError,
    HouseholdFigures,
    HouseholdState,
)
from mealquest.model.operators import Operator
from mealquest.storable import name_problem

TOKEN_PREFIX = "mq_"  # noqa: S105 - a marker, not a secret


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


def create_household(store: Store, name: str, operator: Operator | None = None) -> IssuedToken:
    """Create a household with its first token, audited (`operator` None: the CLI)."""
    name = name.strip()
    problem = name_problem(name)
    if problem is not None:
        raise HouseholdError(f"a household name {problem}")
    token = _new_token()

    def write(tx: Transaction) -> tuple[int, int]:
        made = store.households.create_household(tx, name=name, token_sha256=token_digest(token))
        audit.insert(tx, store, operator, "create", f"household {made[0]}")
        return made

    household_id, token_id = store.write(write)
    return IssuedToken(household_id, token_id, token)


def create_token(store: Store, household_id: int, operator: Operator | None = None) -> IssuedToken:
    """Another token for the household, audited."""
    if household_id == SYSTEM_HOUSEHOLD_ID:
        raise HouseholdError("the system household (periodic jobs) has no tokens")
    token = _new_token()

    def write(tx: Transaction) -> int:
        made = store.households.insert_token(
            tx, household_id=household_id, token_sha256=token_digest(token)
        )
        audit.insert(tx, store, operator, "create", f"token {made} of household {household_id}")
        return made

    return IssuedToken(household_id, store.write(write), token)


def revoke_token(store: Store, token_id: int, operator: Operator | None = None) -> None:
    """Revoke a token at once, audited."""

    def write(tx: Transaction) -> None:
        store.households.revoke_token(tx, token_id)
        audit.insert(tx, store, operator, "revoke", f"token {token_id}")

    store.write(write)


def list_households(store: Store) -> list[tuple[Household, int]]:
    """Every household with its number of live tokens (not the system household,
    which is no one's)."""
    listed = store.read(store.households.list_households)
    return [
        (household, tokens) for household, tokens in listed if household.id != SYSTEM_HOUSEHOLD_ID
    ]


def digest_of_wellformed(token: str) -> str | None:
    """The digest to look `token` up by, or None when it cannot be one of ours
    (no lookup is needed to refuse it)."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    return token_digest(token)


def household_for_token(store: Store, token: str) -> Household | None:
    """The household a live token belongs to, or None."""
    digest = digest_of_wellformed(token)
    if digest is None:
        return None
    return store.read(store.households.household_for_token_digest, digest)


# A household's final jobs are counted among this many of its latest (a
# page of households must not walk their whole histories).
RECENT_JOBS_COUNTED = 500


def get_household(store: Store, household_id: int) -> HouseholdState | None:
    return store.read(store.households.get_household, household_id)


def household_figures(
    store: Store,
    *,
    after_id: int | None = None,
    limit: int = 50,
    household_id: int | None = None,
) -> list[HouseholdFigures]:
    """Households by id with their jobs by status and quota use (see
    `HouseholdFigures`): a page after `after_id`, or the one `household_id`."""
    return store.read(
        store.households.household_figures,
        after_id=after_id,
        limit=limit,
        recent=RECENT_JOBS_COUNTED,
        household_id=household_id,
    )
