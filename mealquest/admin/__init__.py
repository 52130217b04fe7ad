"""The operators' dashboard at `/admin/`: server-rendered pages to watch and
steer the queue, behind an operator's sign-in.

On only with `MEALQUEST_DASHBOARD` (`check_config` then requires
`MEALQUEST_SECRET_KEY`, which signs the session cookie and the CSRF tokens).
The session cookie carries only the id of a session the server holds
(`sessions`); it is scoped to `/admin`, HttpOnly, SameSite=Strict, and
Secure whenever the request came over TLS (directly, or through a proxy the
app trusts: `MEALQUEST_PROXY_FIX_HOPS`). Every form carries a CSRF token
(Flask-WTF), checked on the dashboard's POSTs only: the bearer-token API
sends no cookie and needs none.
"""

from __future__ import annotations

from datetime import timedelta

from flask import Flask, request
from flask.sessions import SecureCookieSessionInterface

from mealquest.admin import (
    audit_page,
    batch_pages,
    bulk_pages,
    household_pages,
    household_waits_page,
    processes_page,
)
from mealquest.admin.guard import csrf
from mealquest.admin.views import bp

# The pages beside the views' own, on the same blueprint.
PAGES = (
    audit_page,
    batch_pages,
    bulk_pages,
    household_pages,
    household_waits_page,
    processes_page,
)


class _SessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions, Secure whenever this request is HTTPS."""

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"]) or request.is_secure


def init_app(app: Flask) -> None:
    if not app.config["DASHBOARD"]:
        return
    app.config.update(
        SESSION_COOKIE_NAME="mealquest_admin",
        SESSION_COOKIE_PATH="/admin",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        PERMANENT_SESSION_LIFETIME=timedelta(hours=app.config["DASHBOARD_SESSION_HOURS"]),
        # Checked by the dashboard's own hook, after the sign-in check, and
        # nowhere else (the API has no cookie session to protect).
        WTF_CSRF_CHECK_DEFAULT=False,
        WTF_CSRF_TIME_LIMIT=None,
    )
    app.session_interface = _SessionInterface()
    csrf.init_app(app)
    app.register_blueprint(bp)
