"""The dashboard's sign-ins, kept on the server.

The session cookie (signed, scoped to /admin) carries a random session id
and nothing about the operator; the database keeps only the id's SHA-256
digest, with its operator and when it ends. Every request looks the digest
up, so deleting the row ends the session everywhere at once, whatever copies
of the cookie exist: sign-out deletes its row, revoking the operator all of
its rows. A sign-in also deletes expired rows and the operator's oldest
beyond `MAX_SESSIONS_PER_OPERATOR`, so the table holds no more than the live
sign-ins, however often an operator signs in.
"""

from __future__ import annotations

import secrets

from mealquest.db.driver import Store
from mealquest.households import token_digest
from mealquest.model.operators import Operator

# Browsers (or machines) one operator may be signed in on at once; a sign-in
# beyond that ends the operator's oldest session.
MAX_SESSIONS_PER_OPERATOR = 20
# Longer than any id `start_session` makes: a cookie with more is not ours.
_MAX_ID_LENGTH = 100


def start_session(store: Store, operator_id: int, lifetime_seconds: float) -> str:
    """A new session for the operator; its id, for the cookie only."""
    session_id = secrets.token_urlsafe(32)
    store.write(
        store.sessions.insert_session,
        id_sha256=token_digest(session_id),
        operator_id=operator_id,
        lifetime_seconds=lifetime_seconds,
        keep=MAX_SESSIONS_PER_OPERATOR,
    )
    return session_id


def end_session(store: Store, session_id: str) -> None:
    store.write(store.sessions.delete_session, token_digest(session_id))


def session_operator(store: Store, session_id: object) -> Operator | None:
    """The live operator of an unexpired session with this id, or None."""
    if not isinstance(session_id, str) or not 0 < len(session_id) <= _MAX_ID_LENGTH:
        return None
    return store.read(store.sessions.session_operator, token_digest(session_id))
