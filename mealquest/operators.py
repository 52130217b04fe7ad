"""Operators: the people who watch and steer the queue, and their tokens.

An operator is not a household. Operators live in a table of their own and
their tokens carry a prefix of their own (`mqop_`, against households'
`mq_`), so a household's token never reaches the operators' lookup nor the
reverse, whichever side it is shown to. As with households, a token is 32
random bytes shown once when it is made; the database keeps only its SHA-256
digest, and lookups go by digest, which leaves no secret-dependent
comparison to time. Each operator has one token: revoking the operator
revokes it, and ends the operator's dashboard sessions.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from mealquest import audit
from mealquest.db.driver import Store, Transaction
from mealquest.households import token_digest
from mealquest.model.operators import Operator, OperatorError, OperatorListing
from mealquest.storable import name_problem

TOKEN_PREFIX = "mqop_"  # noqa: S105 - a marker, not a secret


@dataclass(frozen=True)
class IssuedOperator:
    """An operator as made: `token` is the clear text, which is never stored."""

    operator_id: int
    token: str


def create_operator(store: Store, name: str, operator: Operator | None = None) -> IssuedOperator:
    """Create an operator with its token, audited (`operator`: who did; None: the CLI)."""
    name = name.strip()
    problem = name_problem(name)
    if problem is not None:
        raise OperatorError(f"an operator name {problem}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)

    def write(tx: Transaction) -> int:
        made = store.operators.insert_operator(tx, name=name, token_sha256=token_digest(token))
        audit.insert(tx, store, operator, "create", f"operator {made}")
        return made

    return IssuedOperator(store.write(write), token)


def revoke_operator(store: Store, operator_id: int, operator: Operator | None = None) -> None:
    """Revoke an operator (and so its token and its dashboard sessions) at once;
    `UnknownOperator` if none is live."""

    def revoke(tx: Transaction) -> None:
        store.operators.revoke_operator(tx, operator_id)
        store.sessions.delete_operator_sessions(tx, operator_id)
        audit.insert(tx, store, operator, "revoke", f"operator {operator_id}")

    store.write(revoke)


def list_operators(store: Store) -> list[OperatorListing]:
    return store.read(store.operators.list_operators)


def operator_for_token(store: Store, token: str) -> Operator | None:
    """The live operator a token belongs to, or None (a household's token included)."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    return store.read(store.operators.operator_for_token_digest, token_digest(token))
