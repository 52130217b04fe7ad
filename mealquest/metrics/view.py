"""`GET /metrics`: the Prometheus scrape, for operators' bearer tokens only."""

from __future__ import annotations

from flask import Blueprint, Flask, Response, current_app

from mealquest.extensions import get_store
from mealquest.metrics.registry import CONTENT_TYPE, render
from mealquest.operator_auth import require_operator_token
from mealquest.queue_stats import CachedFigures

bp = Blueprint("metrics", __name__)
bp.before_request(require_operator_token)

FIGURES_KEY = "mealquest.queue_figures"


def cached_figures(app: Flask | None = None) -> CachedFigures:
    """This process's cached queue figures (shared with the dashboard)."""
    return (app or current_app).extensions[FIGURES_KEY]


@bp.get("/metrics")
def metrics() -> Response:
    return Response(render(cached_figures().get()), mimetype=None, content_type=CONTENT_TYPE)


def init_app(app: Flask) -> None:
    app.extensions[FIGURES_KEY] = CachedFigures(get_store(app))
    app.register_blueprint(bp)
