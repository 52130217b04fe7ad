"""The app, put together: `create_app` wires every part into one Flask app.

The one module that imports every part of the service (the entry layer):
the parts themselves import none of it, so a kind's author, a driver or a
test loads only what it uses.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from flask import Flask

from mealquest import admin, cli, errors, health, json_bodies, tracing
from mealquest.api import bp as api_bp
from mealquest.config import DEFAULTS, ConfigError, check_config, unknown_variables
from mealquest.extensions import init_store
from mealquest.jobs import service as jobs_service
from mealquest.jobs.cli import jobs_cli
from mealquest.jobs.service import live as jobs_live
from mealquest.logs import configure_logging
from mealquest.metrics import http as http_metrics
from mealquest.metrics import view as metrics_view
from mealquest.recipes import kind as recipe_import
from mealquest.recipes import shopping_list
from mealquest.serving import middleware
from mealquest.serving.work import jobs_work


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    """Build the app: defaults, then `MEALQUEST_*` environment, then `test_config`.

    Checks every value first (ConfigError, naming the variable), then opens
    nothing and starts nothing: the store connects on first use in the
    process that uses it, and the job pool is started by the gunicorn worker
    hooks or `flask jobs work`.
    """
    app = Flask(__name__, instance_relative_config=True)
    app.config.from_mapping(DEFAULTS)
    app.config.from_prefixed_env("MEALQUEST")
    if test_config is not None:
        app.config.from_mapping(test_config)
    check_config(app.config)
    if not app.config["DATABASE"]:
        app.config["DATABASE"] = os.path.join(app.instance_path, "mealquest.sqlite3")

    configure_logging(app.config["LOG_LEVEL"], app.config["LOG_FORMAT"])
    _warn_of_unknown_variables()
    # First: every other hook's log lines name the request's id.
    middleware.init_app(app)
    tracing.init_app(app)
    init_store(app)
    jobs_service.init_app(app)
    jobs_live.init_app(app)
    recipe_import.init_app(app)
    shopping_list.init_app(app)
    errors.init_app(app)
    json_bodies.init_app(app)
    cli.init_app(app)
    jobs_cli.add_command(jobs_work)
    app.cli.add_command(jobs_cli)
    health.init_app(app)
    app.register_blueprint(api_bp)
    metrics_view.init_app(app)
    admin.init_app(app)
    http_metrics.init_app(app)
    return app


logger = logging.getLogger(__name__)
# The unknown variables this process has warned of: each once, whatever
# number of apps it makes.
_warned: set[str] = set()


def _warn_of_unknown_variables() -> None:
    for line in unknown_variables(os.environ):
        if line not in _warned:
            _warned.add(line)
            logger.warning("%s", line)


def create_app_or_exit() -> Flask:
    """`create_app()` for the modules that Flask's CLI and gunicorn import
    (`wsgi.py`, `app.py`): a bad configuration value ends the process with
    its one line on stderr and status 1, not a traceback, whatever command
    was starting."""
    try:
        return create_app()
    except ConfigError as error:
        raise SystemExit(f"mealquest: {error}") from None
