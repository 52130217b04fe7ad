"""The `recipe_import` job kind: fetch the page, parse its recipe, store it.

Retries: a transient fetch failure (a 5xx, a timeout, a refused or reset
connection) raises `TransientImportError`, which the runner retries with
backoff while attempts last. On the last attempt the same failure is raised
as a `Failure` instead, so the job ends with the plain reason (`the page
could not be fetched (HTTP 503)`) rather than `internal error`. Everything
another attempt cannot fix (4xx, no recipe, a refused address, a page too
large) is a `Failure` at once.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

import gevent
from flask import Flask

from mealquest.jobs.context import JobContext
from mealquest.jobs.registry import Backoff, KindOptions, Registry
from mealquest.jobs.service import get_jobs
from mealquest.model.jobs import Failure
from mealquest.model.recipes import ParsedRecipe
from mealquest.recipes.fetch import FetchError, FetchPolicy, Page, fetch
from mealquest.recipes.parse import ParserFailed, parse_page
from mealquest.recipes.schemas import (
    ImportStageSchema,
    RecipeImportResultSchema,
    RecipeImportSchema,
    RecipeSchema,
)

logger = logging.getLogger(__name__)

KIND = "recipe_import"
MAX_ATTEMPTS = 3
NO_RECIPE = "no recipe found on the page"
# Time for everything after the fetch (parsing, storing) before the runner's
# own timeout stops the job.
_PARSE_AND_STORE_SECONDS = 60.0

_recipe_schema = RecipeSchema()


class TransientImportError(Exception):
    """A fetch failure another attempt may fix. Its message is a safe one;
    the runner only logs the type below ERROR anyway."""


def import_recipe(payload: dict[str, Any], ctx: JobContext, policy: FetchPolicy) -> dict[str, Any]:
    url = payload["url"]
    ctx.publish({"stage": "fetching"})
    try:
        page = fetch(url, policy)
    except FetchError as error:
        if error.transient and ctx.attempt < ctx.max_attempts:
            raise TransientImportError(error.message) from None
        raise Failure(error.message) from None
    ctx.publish({"stage": "parsing"})
    parsed = _parse(page, ctx)
    recipe = ctx.write(
        ctx.store.recipes.upsert_for_job,
        household_id=ctx.household_id,
        job_id=ctx.job_id,
        source_url=public_source_url(url),
        parsed=parsed,
    )
    return {"recipe_id": recipe.id, "recipe": _recipe_schema.dump(recipe)}


def public_source_url(url: str) -> str:
    """The page's address as the API shows it: without query or fragment, which
    may carry a token (an API answer never echoes a URL's query)."""
    return urlsplit(url)._replace(query="", fragment="").geturl()


def _parse(page: Page, ctx: JobContext) -> ParsedRecipe:
    # Parsing a large page is seconds of CPU: in the hub's native thread pool
    # it cannot freeze the other greenlets (HTTP requests, heartbeats).
    try:
        parsed = gevent.get_hub().threadpool.apply(parse_page, (page,))
    except ParserFailed as error:
        logger.warning(
            "recipe parser failed (%s)",
            error,
            extra={"job_id": ctx.job_id, "kind": ctx.kind, "attempt": ctx.attempt},
        )
        raise Failure(NO_RECIPE) from None
    if parsed is None:
        raise Failure(NO_RECIPE)
    return parsed


def register(registry: Registry, policy: FetchPolicy, *, retry_base_seconds: float) -> None:
    def handler(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        return import_recipe(payload, ctx, policy)

    registry.register(
        KIND,
        handler,
        payload=RecipeImportSchema,
        result=RecipeImportResultSchema,
        partial=ImportStageSchema,
        options=KindOptions(
            max_attempts=MAX_ATTEMPTS,
            backoff=Backoff(base_seconds=retry_base_seconds, factor=2.0, max_seconds=600.0),
            timeout_seconds=policy.total_timeout_seconds + _PARSE_AND_STORE_SECONDS,
        ),
    )


def init_app(app: Flask) -> None:
    """Register the `recipe_import` kind with the fetch limits from the config.

    The routes are registered on the authenticated `/api/v1` blueprint (see
    `mealquest.api`), not here, so that they cannot skip authentication.
    """
    register(
        get_jobs(app).registry,
        FetchPolicy.from_config(app.config),
        retry_base_seconds=float(app.config["RECIPE_IMPORT_RETRY_SECONDS"]),
    )
