"""Bearer-token authentication for everything under /api/v1.

A live token of a suspended household is refused with `403
household_suspended` (a 401 would tell a client to get a new token, which
would not help): the token check reads the household's state in the same
statement, so a suspension shows on the very next request.
"""

from __future__ import annotations

from flask import Response, g
from flask.typing import ResponseReturnValue
from flask_httpauth import HTTPTokenAuth

from mealquest.errors import error_response
from mealquest.extensions import get_store
from mealquest.households import household_for_token, note_token_use, token_digest
from mealquest.model.households import Household

token_auth = HTTPTokenAuth(scheme="Bearer")


@token_auth.verify_token
def _verify_token(token: str) -> Household | None:
    if not token:
        return None
    return household_for_token(get_store(), token)


@token_auth.error_handler
def _auth_error(status: int) -> tuple[Response, int]:
    # flask-httpauth sends a bare body as 200: the status must be returned too.
    return error_response(status, "unauthorized", "a valid bearer token is required")


def require_token() -> ResponseReturnValue | None:
    """The 401 answer unless the request carries a live token; None lets it through.

    The steps of flask-httpauth's `login_required`, for every method: that
    decorator lets OPTIONS through unchecked (for browsers' CORS preflights,
    which this API does not serve), and an OPTIONS answer still tells a
    stranger which methods a path has.
    """
    auth = token_auth.get_auth()
    household = token_auth.authenticate(auth, token_auth.get_auth_password(auth))
    if not isinstance(household, Household):
        return token_auth.auth_error_callback(401)
    if household.suspended:
        return refuse_suspended()
    # Where `login_required` keeps the user for `token_auth.current_user()`.
    g.flask_httpauth_user = household
    note_token_use(get_store(), token_digest(bearer_token()))
    return None


def refuse_suspended() -> tuple[Response, int]:
    """403 `household_suspended`: an operator suspended the token's household."""
    return error_response(
        403, "household_suspended", "the household is suspended; ask the service's operators"
    )


def bearer_token() -> str:
    """The request's bearer token as flask-httpauth parses it ("" if none)."""
    return getattr(token_auth.get_auth(), "token", None) or ""


def refuse_token() -> ResponseReturnValue:
    """The same 401 answer `require_token` gives."""
    return token_auth.auth_error_callback(401)


def authenticated_as(household: Household) -> None:
    """Record the household a route authenticated itself (see `SELF_AUTHENTICATED`)."""
    g.flask_httpauth_user = household


def current_household() -> Household:
    household = token_auth.current_user()
    if not isinstance(household, Household):  # only reachable if a route skips auth
        raise RuntimeError("no authenticated household")
    return household
