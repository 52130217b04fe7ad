"""Bearer-token authentication of operators (for `GET /metrics`).

A separate flask-httpauth instance from the households' one: its lookup
reads only the operators' table, so a household's token is refused here as
an operator's token is refused under /api/v1.
"""

from __future__ import annotations

from flask import Response, g
from flask.typing import ResponseReturnValue
from flask_httpauth import HTTPTokenAuth

from mealquest.errors import error_response
from mealquest.extensions import get_store
from mealquest.model.operators import Operator
from mealquest.operators import operator_for_token

operator_token_auth = HTTPTokenAuth(scheme="Bearer")


@operator_token_auth.verify_token
def _verify_token(token: str) -> Operator | None:
    if not token:
        return None
    return operator_for_token(get_store(), token)


@operator_token_auth.error_handler
def _auth_error(status: int) -> tuple[Response, int]:
    # flask-httpauth sends a bare body as 200: the status must be returned too.
    return error_response(status, "unauthorized", "a valid operator token is required")


def require_operator_token() -> ResponseReturnValue | None:
    """The 401 answer unless the request carries a live operator's token; None
    lets it through. For every method: `login_required` lets OPTIONS through."""
    auth = operator_token_auth.get_auth()
    operator = operator_token_auth.authenticate(auth, operator_token_auth.get_auth_password(auth))
    if not isinstance(operator, Operator):
        return operator_token_auth.auth_error_callback(401)
    g.flask_httpauth_user = operator
    return None
