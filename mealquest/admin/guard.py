"""Who may use the dashboard: an operator signed in through the session
cookie, still live, within the session's lifetime; and a valid CSRF token on
every POST."""

from __future__ import annotations

import time

from flask import Response, current_app, g, redirect, render_template, request, session, url_for
from flask.typing import ResponseReturnValue
from flask_wtf.csrf import CSRFError, CSRFProtect

from mealquest.extensions import get_store
from mealquest.model.operators import Operator
from mealquest.operators import operator_by_id

csrf = CSRFProtect()

OPERATOR_KEY = "operator_id"
SIGNED_IN_AT_KEY = "signed_in_at"
# Pages anyone may fetch: the sign-in form (it still checks CSRF on POST).
PUBLIC_ENDPOINTS = frozenset({"admin.sign_in"})


def sign_in(operator: Operator) -> None:
    """A fresh session for the operator (any earlier session's values, the CSRF
    secret included, are dropped)."""
    session.clear()
    session[OPERATOR_KEY] = operator.id
    session[SIGNED_IN_AT_KEY] = int(time.time())


def sign_out() -> None:
    session.clear()


def session_operator() -> Operator | None:
    """The session's operator if still live and signed in within the lifetime."""
    operator_id = session.get(OPERATOR_KEY)
    signed_in_at = session.get(SIGNED_IN_AT_KEY)
    if not isinstance(operator_id, int) or not isinstance(signed_in_at, int):
        return None
    lifetime = current_app.permanent_session_lifetime.total_seconds()
    if not 0 <= time.time() - signed_in_at < lifetime:
        return None
    return operator_by_id(get_store(), operator_id)


def current_operator() -> Operator:
    operator = g.get("operator")
    if not isinstance(operator, Operator):  # only reachable if a view skips the guard
        raise RuntimeError("no signed-in operator")
    return operator


def refused(status: int, message: str) -> tuple[str, int]:
    return render_template("admin/refused.html", message=message), status


def require_operator() -> ResponseReturnValue | None:
    """The blueprint's first hook: a page without a signed-in operator goes to
    the sign-in form, any other request is refused; then every POST's CSRF
    token is checked (the sign-in form's too)."""
    if request.endpoint not in PUBLIC_ENDPOINTS:
        operator = session_operator()
        if operator is None:
            if session.get(OPERATOR_KEY) is not None:
                sign_out()  # revoked or expired: forget it
            if request.method in ("GET", "HEAD"):
                return redirect(url_for("admin.sign_in"))
            return refused(401, "Sign in first.")
        g.operator = operator
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        csrf.protect()
    return None


def csrf_refused(_error: CSRFError) -> tuple[str, int]:
    return refused(400, "The form expired or did not come from this dashboard; reload the page.")


def security_headers(response: Response) -> Response:
    """No framing, no caching of operators' pages, scripts from this site only."""
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    )
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response
