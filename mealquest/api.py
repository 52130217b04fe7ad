"""`/api/v1`: the authenticated API. Every route below it needs a bearer token.

Authentication is a `before_request` of this parent blueprint rather than a
decorator on each view, so a route added later cannot forget it.
"""

from __future__ import annotations

from flask import Blueprint

from mealquest.auth import token_auth
from mealquest.jobs.api import bp as jobs_bp
from mealquest.openapi import bp as openapi_bp
from mealquest.recipes.api import imports_bp as recipe_imports_bp
from mealquest.recipes.api import recipes_bp

bp = Blueprint("api", __name__, url_prefix="/api/v1")


@bp.before_request
@token_auth.login_required
def _require_token() -> None:
    """Returns None to let an authenticated request through."""


bp.register_blueprint(openapi_bp)
bp.register_blueprint(jobs_bp)
bp.register_blueprint(recipe_imports_bp)
bp.register_blueprint(recipes_bp)
