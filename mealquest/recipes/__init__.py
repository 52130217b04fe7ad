"""Recipes: the `recipe_import` job kind and the routes that start imports and read recipes."""

from __future__ import annotations

from flask import Flask

from mealquest.extensions import get_jobs
from mealquest.recipes import kind
from mealquest.recipes.fetch import FetchPolicy


def init_app(app: Flask) -> None:
    """Register the `recipe_import` kind with the fetch and parse limits from the config.

    The routes are registered on the authenticated `/api/v1` blueprint (see
    `mealquest.api`), not here, so that they cannot skip authentication.
    """
    kind.register(
        get_jobs(app).registry,
        FetchPolicy.from_config(app.config),
        # A warm parser process for each job that may run at once here, and
        # one more ready for the next parse.
        kind.Parsing(
            seconds=float(app.config["RECIPE_PARSE_SECONDS"]),
            processes_kept=int(app.config["JOB_WORKERS"]) + 1,
        ),
        retry_base_seconds=float(app.config["RECIPE_IMPORT_RETRY_SECONDS"]),
    )
