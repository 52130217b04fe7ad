"""`/api/v1`: the authenticated API. Every route below it needs a bearer token.

Authentication is one app-wide `before_request` on the path prefix rather
than a decorator on each view, so a route added later cannot forget it, and
a path no route matches (404), a method no route allows (405) and OPTIONS
under the prefix are refused without a token too (a blueprint's own hook
never runs for the first two).
"""

from __future__ import annotations

from flask import Blueprint, request
from flask.typing import ResponseReturnValue

from mealquest.auth import require_token
from mealquest.jobs.web.api import bp as jobs_bp
from mealquest.jobs.web.batch_api import bp as batches_bp
from mealquest.openapi import bp as openapi_bp
from mealquest.recipes.api import imports_bp as recipe_imports_bp
from mealquest.recipes.api import recipes_bp

PREFIX = "/api/v1"

bp = Blueprint("api", __name__, url_prefix=PREFIX)

# Routes that check the token in their own statement, with what they read
# (the hottest one: one database read per request instead of two). Only for
# the methods their view serves: OPTIONS still goes through the hook.
SELF_AUTHENTICATED = {"api.jobs.get_job": ("GET", "HEAD")}


@bp.before_app_request
def _require_token() -> ResponseReturnValue | None:
    path = request.path
    if path == PREFIX or path.startswith(PREFIX + "/"):
        if request.method in SELF_AUTHENTICATED.get(request.endpoint or "", ()):
            return None
        return require_token()
    return None


bp.register_blueprint(openapi_bp)
bp.register_blueprint(jobs_bp)
bp.register_blueprint(batches_bp)
bp.register_blueprint(recipe_imports_bp)
bp.register_blueprint(recipes_bp)
