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

Each site is asked politely: jobs are partitioned by the URL's host (lower
case, `www.` and a final dot left out), and at most `max_per_host` of a
host's imports run at once, and `per_host_per_minute` start in any minute,
across the deployment. A site that answers `429` or `503` with a
`Retry-After` gets what it asked for: the job is snoozed that long (at most
`MAX_SNOOZE_SECONDS`), spending no attempt, instead of failing or retrying
sooner. Without `Retry-After`, those answers are what they were (a `503` is
retried with backoff, a `429` fails as any 4xx does).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from flask import Flask

from mealquest import jobs
from mealquest.jobs import Backoff, Failure, JobContext, KindOptions, Snooze
from mealquest.model.recipes import ParsedRecipe
from mealquest.recipes import parser_pool
from mealquest.recipes.fetch import FetchError, FetchPolicy, HTTPStatusError, Page, fetch
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
# The longest a site's `Retry-After` puts an import off.
MAX_SNOOZE_SECONDS = 600.0

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
        # The operator's line names the cause (and the setting that decides
        # it); the household reads `error.message`. Neither quotes the URL.
        extra = {"job_id": ctx.job_id, "kind": ctx.kind, "attempt": ctx.attempt}
        logger.warning("recipe page could not be fetched: %s", error.detail, extra=extra)
        ctx.log.warning("fetch failed: %s", error.detail)
        if isinstance(error, HTTPStatusError) and error.retry_after_seconds is not None:
            # The site said when to come back: no attempt is spent on its say-so.
            raise Snooze(min(error.retry_after_seconds, MAX_SNOOZE_SECONDS)) from None
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


def host_of(payload: Mapping[str, Any]) -> str | None:
    """The partition of an import: its URL's host, lower case, without a
    leading `www.` or a final dot (so `WWW.Example.com.` and `example.com`
    are one site)."""
    try:
        host = urlsplit(str(payload.get("url", ""))).hostname
    except ValueError:
        return None
    if not host:
        return None
    host = host.lower().rstrip(".")
    return host.removeprefix("www.") or None


def public_source_url(url: str) -> str:
    """The page's address as the API shows it: without query or fragment, which
    may carry a token (an API answer never echoes a URL's query)."""
    return urlsplit(url)._replace(query="", fragment="").geturl()


@dataclass(frozen=True)
class Parsing:
    """How pages are parsed: the time each parse may take (wall clock and
    CPU), and how many imports each service process runs at once."""

    seconds: float
    imports_per_process: int

    @property
    def processes_kept(self) -> int:
        """Warm parser processes kept per service process: one for each
        import that may run at once, and one more ready for the next parse,
        so that an import which gets a slot while hostile pages hold the
        others does not wait for a start."""
        return self.imports_per_process + 1


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


@dataclass(frozen=True)
class HostLimits:
    """What one site may be asked: imports running at once, and starting per
    minute, across the deployment (0: no such limit)."""

    running: int = 2
    per_minute: int = 30


def register(
    app: Flask,
    policy: FetchPolicy,
    parsing: Parsing,
    *,
    retry_base_seconds: float,
    per_host: HostLimits | None = None,
) -> None:
    per_host = per_host or HostLimits()

    def handler(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        return import_recipe(payload, ctx, policy, parsing)

    jobs.register(
        app,
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
            # Each running import may hold a parser process: the cap bounds
            # their memory however large the job pool is.
            max_running_per_process=parsing.imports_per_process,
            partition=host_of,
            max_running_per_partition=per_host.running or None,
            rate=(per_host.per_minute, 60.0) if per_host.per_minute else None,
        ),
    )


def init_app(app: Flask) -> None:
    """Register the `recipe_import` kind with the fetch and parse limits from the config.

    The routes are registered on the authenticated `/api/v1` blueprint (see
    `mealquest.api`), not here, so that they cannot skip authentication.
    """
    register(
        app,
        FetchPolicy.from_config(app.config),
        Parsing(
            seconds=float(app.config["RECIPE_PARSE_SECONDS"]),
            # A pool of fewer slots never runs more at once.
            imports_per_process=min(
                int(app.config["RECIPE_IMPORTS_PER_PROCESS"]), int(app.config["JOB_WORKERS"])
            ),
        ),
        retry_base_seconds=float(app.config["RECIPE_IMPORT_RETRY_SECONDS"]),
        per_host=HostLimits(
            running=int(app.config["RECIPE_FETCH_MAX_PER_HOST"]),
            per_minute=int(app.config["RECIPE_FETCH_PER_HOST_PER_MINUTE"]),
        ),
    )
