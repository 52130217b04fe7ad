"""The `recipe_import` job kind: fetch the page, parse its recipe, store it.

Parsing runs in a parser process (`mealquest.recipes.parser_pool`), killed
when it passes `parse_seconds`: such a page fails its job `the page could
not be read` at once (another attempt would only spend as long again).

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
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from flask import Flask

from mealquest.jobs.context import JobContext
from mealquest.jobs.registry import Backoff, KindOptions, Registry
from mealquest.jobs.service import get_jobs
from mealquest.model.jobs import Failure
from mealquest.model.recipes import ParsedRecipe
from mealquest.recipes import parser_pool
from mealquest.recipes.fetch import FetchError, FetchPolicy, Page, fetch
from mealquest.recipes.parse import ParserFailed, fit_recipe
from mealquest.recipes.parser_pool import PageUnreadable
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
UNREADABLE = "the page could not be read"
# Time for what comes after the fetch besides the parse itself (starting a
# parser process, storing the recipe) before the runner's own timeout stops
# the job.
_START_AND_STORE_SECONDS = 60.0

_recipe_schema = RecipeSchema()


class TransientImportError(Exception):
    """A fetch failure another attempt may fix. Its message is a safe one;
    the runner only logs the type below ERROR anyway."""


def import_recipe(
    payload: dict[str, Any], ctx: JobContext, policy: FetchPolicy, parsing: Parsing
) -> dict[str, Any]:
    url = payload["url"]
    ctx.publish({"stage": "fetching"})
    try:
        page = fetch(url, policy)
    except FetchError as error:
        if error.transient and ctx.attempt < ctx.max_attempts:
            raise TransientImportError(error.message) from None
        raise Failure(error.message) from None
    ctx.publish({"stage": "parsing"})
    source_url = public_source_url(url)
    parsed = fit_recipe(_parse(page, ctx, parsing), source_url)
    recipe = ctx.write(
        ctx.store.recipes.upsert_for_job,
        household_id=ctx.household_id,
        job_id=ctx.job_id,
        source_url=source_url,
        parsed=parsed,
    )
    return {"recipe_id": recipe.id, "recipe": _recipe_schema.dump(recipe)}


def public_source_url(url: str) -> str:
    """The page's address as the API shows it: without query or fragment, which
    may carry a token (an API answer never echoes a URL's query)."""
    return urlsplit(url)._replace(query="", fragment="").geturl()


@dataclass(frozen=True)
class Parsing:
    """How pages are parsed: the time each parse may take (wall clock and
    CPU), and how many parser processes each service process keeps warm."""

    seconds: float
    processes_kept: int


def _parse(page: Page, ctx: JobContext, parsing: Parsing) -> ParsedRecipe:
    extra = {"job_id": ctx.job_id, "kind": ctx.kind, "attempt": ctx.attempt}
    try:
        parsed = parser_pool.shared(parsing.processes_kept).parse(page, seconds=parsing.seconds)
    except PageUnreadable as error:
        logger.warning("recipe page could not be read: %s", error.reason, extra=extra)
        raise Failure(UNREADABLE) from None
    except ParserFailed as error:
        logger.warning("recipe parser failed (%s)", error, extra=extra)
        raise Failure(NO_RECIPE) from None
    if parsed is None:
        raise Failure(NO_RECIPE)
    return parsed


def register(
    registry: Registry, policy: FetchPolicy, parsing: Parsing, *, retry_base_seconds: float
) -> None:
    def handler(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        return import_recipe(payload, ctx, policy, parsing)

    registry.register(
        KIND,
        handler,
        payload=RecipeImportSchema,
        result=RecipeImportResultSchema,
        partial=ImportStageSchema,
        options=KindOptions(
            max_attempts=MAX_ATTEMPTS,
            backoff=Backoff(base_seconds=retry_base_seconds, factor=2.0, max_seconds=600.0),
            timeout_seconds=(
                policy.total_timeout_seconds + parsing.seconds + _START_AND_STORE_SECONDS
            ),
        ),
    )


def init_app(app: Flask) -> None:
    """Register the `recipe_import` kind with the fetch and parse limits from the config.

    The routes are registered on the authenticated `/api/v1` blueprint (see
    `mealquest.api`), not here, so that they cannot skip authentication.
    """
    register(
        get_jobs(app).registry,
        FetchPolicy.from_config(app.config),
        # A warm parser process for each job that may run at once here, and
        # one more ready for the next parse.
        Parsing(
            seconds=float(app.config["RECIPE_PARSE_SECONDS"]),
            processes_kept=int(app.config["JOB_WORKERS"]) + 1,
        ),
        retry_base_seconds=float(app.config["RECIPE_IMPORT_RETRY_SECONDS"]),
    )
