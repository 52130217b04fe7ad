"""Who may use the dashboard: an operator signed in through a session the
server still holds (see `sessions`: not signed out, not expired, its operator
not revoked); and a valid CSRF token on every POST."""

from __future__ import annotations

from flask import Response, current_app, g, redirect, render_template, request, session, url_for
from flask.typing import ResponseReturnValue
from flask_wtf.csrf import CSRFError, CSRFProtect

from mealquest.admin import sessions
from mealquest.extensions import get_store
from mealquest.model.operators import Operator

csrf = CSRFProtect()

# The signed cookie's only value of ours (Flask-WTF keeps its CSRF secret there too).
SESSION_ID_KEY = "session_id"
# Pages anyone may fetch: the sign-in form (it still checks CSRF on POST).
PUBLIC_ENDPOINTS = frozenset({"admin.sign_in"})


def sign_in(operator: Operator) -> None:
    """A fresh session for the operator (the cookie's earlier session ends, and its
    values, the CSRF secret included, are dropped)."""
    sign_out()
    lifetime = current_app.permanent_session_lifetime.total_seconds()
    session[SESSION_ID_KEY] = sessions.start_session(get_store(), operator.id, lifetime)


def sign_out() -> None:
    """End the cookie's session on the server (every copy of the cookie with it)."""
    session_id = session.get(SESSION_ID_KEY)
    if isinstance(session_id, str):
        sessions.end_session(get_store(), session_id)
    session.clear()


def session_operator() -> Operator | None:
    """The live operator of the cookie's session, if the server still holds it."""
    return sessions.session_operator(get_store(), session.get(SESSION_ID_KEY))


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
            if session.get(SESSION_ID_KEY) is not None:
                session.clear()  # ended, expired or revoked: forget it
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
