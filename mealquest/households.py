"""Households and their API tokens.

A token is 32 random bytes shown once when it is made; the database keeps
only its SHA-256 digest, so a copy of the database grants nothing. The
tokens are high-entropy, so a fast hash is enough; lookups go by digest,
which leaves no secret-dependent comparison to time.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from mealquest import audit
from mealquest.db.driver import Store, Transaction
from mealquest.db.errors import StoreError
from mealquest.model.households import (
    SYSTEM_HOUSEHOLD_ID,
    Household,
    HouseholdError,
    HouseholdFigures,
    HouseholdState,
    TokenInfo,
    UnknownHousehold,
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


# A token's name: what its holder calls it ("kitchen tablet").
MAX_TOKEN_NAME = 100


def create_token(
    store: Store, household_id: int, operator: Operator | None = None, *, name: str | None = None
) -> IssuedToken:
    """Another token for the household, audited."""
    if household_id == SYSTEM_HOUSEHOLD_ID:
        raise HouseholdError("the system household (periodic jobs) has no tokens")
    if name is not None and not 1 <= len(name) <= MAX_TOKEN_NAME:
        raise HouseholdError(f"a token's name is 1 to {MAX_TOKEN_NAME} characters")
    token = _new_token()

    def write(tx: Transaction) -> int:
        made = store.households.insert_token(
            tx, household_id=household_id, token_sha256=token_digest(token), name=name
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


def list_tokens(store: Store, household_id: int) -> list[TokenInfo]:
    """The household's tokens, live and revoked (`UnknownHousehold` if there is none)."""
    if get_household(store, household_id) is None:
        raise UnknownHousehold()
    return store.read(store.households.list_tokens, household_id)


# How stale a token's `last_used_at` may be: each process writes it at most
# this often a token, so a request pays for the write about once a minute.
TOKEN_USE_SECONDS = 60.0
# Digests this process recorded a use of lately, the oldest dropped first:
# a bound on its memory however many tokens call.
_TOKENS_REMEMBERED = 10_000
_recorded: OrderedDict[str, float] = OrderedDict()
_log = logging.getLogger(__name__)


def note_token_use(store: Store, digest: str, *, now: float | None = None) -> None:
    """Record that the token of `digest` was used, unless this process did so
    within TOKEN_USE_SECONDS. A failed write is logged, never the request's
    failure: the token was good, and knowing when is only bookkeeping."""
    now = time.monotonic() if now is None else now
    last = _recorded.get(digest)
    if last is not None and now - last < TOKEN_USE_SECONDS:
        return
    _recorded[digest] = now
    _recorded.move_to_end(digest)
    while len(_recorded) > _TOKENS_REMEMBERED:
        _recorded.popitem(last=False)
    try:
        store.write(store.households.record_token_use, digest)
    except StoreError as error:
        _log.warning("a token's last use was not recorded: %s", type(error).__name__)


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
