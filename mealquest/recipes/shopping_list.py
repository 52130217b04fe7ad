"""The `shopping_list` job kind: a week's recipes, merged into one list.

It runs as the callback of a batch of recipe imports (`POST
/api/v1/recipe-imports/batch` with `"shopping_list": true`): once every
import is final, it reads the recipes of those that succeeded and merges
their ingredient lines (`mealquest.recipes.ingredients`): one row per food,
in the units a cook uses. Members that did not succeed are named in
`skipped`, each with the URL it was to import; with none succeeded there is
no list, and the job fails with a message the household may read.

Reading the lines is CPU work (a model per line, about 2 ms, and a third of
a second to load it once per process) whose cost a stranger's line can
raise (`ingredients.MAX_LINE_TOKENS`): it runs in a parser process
(`mealquest.recipes.parser_pool`), as a page's parse does, so the service's
other greenlets go on meanwhile, and the process is killed at
`MEALQUEST_SHOPPING_LIST_SECONDS`, or when the job is cancelled or times
out. Never in gevent's thread pool: its threads cannot be stopped, and the
DNS resolver shares them, so lists running there made other households'
imports fail their name lookups.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from flask import Flask
from marshmallow import Schema, fields

from mealquest import jobs
from mealquest.jobs import Failure, JobContext, KindOptions
from mealquest.model.jobs import MAX_RESULT_BYTES
from mealquest.recipes import parser_pool
from mealquest.recipes.parser_pool import PageUnreadable

logger = logging.getLogger(__name__)

KIND = "shopping_list"
NOTHING_IMPORTED = "none of the batch's recipes could be imported"
NOT_A_BATCH = "a shopping list is made for a batch of recipe imports"
TOO_LONG = "the shopping list is too long to keep"
TOO_SLOW = "the shopping list took too long to make"
# Above the reading's own limit: the list's reads and its write of the result.
_START_AND_STORE_SECONDS = 30.0
# Titles as a list's items name them: a page's title may be long.
MAX_TITLE_CHARS = 120


class ShoppingListPayloadSchema(Schema):
    """Nothing: the list is made from the batch it completes."""


class AmountSchema(Schema):
    quantity = fields.Float(required=True)
    unit = fields.String(
        required=True,
        allow_none=True,
        metadata={"description": 'as a cook writes it ("g", "tsp", "cup", "oz"), or null: a count'},
    )


class ShoppingItemSchema(Schema):
    food = fields.String(required=True)
    quantity = fields.Float(
        required=True,
        allow_none=True,
        metadata={"description": "the first of `amounts`; null: listed as written"},
    )
    unit = fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "the first of `amounts`' unit (null: a count, or as written)"},
    )
    amounts = fields.List(
        fields.Nested(AmountSchema),
        required=True,
        metadata={
            "description": "one sum per kind of amount (mass, volume, count), the kind most "
            "of the food's lines used first; empty when every line is listed as written"
        },
    )
    text = fields.String(
        required=True,
        metadata={"description": 'the row as a cook reads it: "300 g + 1½ cups flour"'},
    )
    from_ = fields.List(
        fields.String(),
        required=True,
        data_key="from",
        metadata={"description": "the titles of the recipes it came from"},
    )


class SkippedSchema(Schema):
    job_id = fields.String(required=True)
    url = fields.String(
        required=True, allow_none=True, metadata={"description": "the page it was to import"}
    )


class ShoppingListSchema(Schema):
    recipes = fields.Integer(
        required=True, strict=True, metadata={"description": "the recipes merged"}
    )
    items = fields.List(fields.Nested(ShoppingItemSchema), required=True)
    skipped = fields.List(
        fields.Nested(SkippedSchema),
        required=True,
        metadata={"description": "the batch's imports that did not succeed"},
    )


def make_list(payload: dict[str, Any], ctx: JobContext, *, seconds: float) -> dict[str, Any]:
    outcome = ctx.batch()
    if outcome is None:
        raise Failure(NOT_A_BATCH)
    skipped = _skipped(ctx, [*outcome.failed, *outcome.cancelled])
    recipes = ctx.store.read(
        ctx.store.recipes.recipes_of_jobs, ctx.household_id, list(outcome.succeeded)
    )
    if not recipes:
        raise Failure(NOTHING_IMPORTED)
    lines = [(recipe.title[:MAX_TITLE_CHARS], recipe.ingredients) for recipe in recipes]
    try:
        items = parser_pool.shared().merge(lines, seconds=seconds)
    except PageUnreadable as error:
        logger.warning(
            "shopping list could not be made: %s",
            error.reason,
            extra={"job_id": ctx.job_id, "kind": ctx.kind, "attempt": ctx.attempt},
        )
        raise Failure(TOO_SLOW) from None
    result = {"recipes": len(recipes), "items": items, "skipped": skipped}
    if len(json.dumps(result)) > MAX_RESULT_BYTES:
        raise Failure(TOO_LONG)
    return result


def _skipped(ctx: JobContext, job_ids: list[str]) -> list[dict[str, Any]]:
    """Each member that did not succeed, with the URL it was to import (read
    from its payload, in one read; None for a job gone meanwhile)."""

    def read(conn: Any) -> list[dict[str, Any]]:
        skipped = []
        for job_id in job_ids:
            job = ctx.store.jobs.get_job(conn, job_id, ctx.household_id)
            url = json.loads(job.payload).get("url") if job is not None else None
            skipped.append({"job_id": job_id, "url": url if isinstance(url, str) else None})
        return skipped

    return ctx.store.read(read) if job_ids else []


def init_app(app: Flask) -> None:
    seconds = float(app.config["SHOPPING_LIST_SECONDS"])

    def handler(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        return make_list(payload, ctx, seconds=seconds)

    jobs.register(
        app,
        KIND,
        handler,
        payload=ShoppingListPayloadSchema,
        result=ShoppingListSchema,
        # A retry would only read the same lines again, so one attempt.
        options=KindOptions(
            max_attempts=1,
            timeout_seconds=seconds + _START_AND_STORE_SECONDS,
            # Each running list holds a parser process: the cap bounds their
            # memory however large the job pool is.
            max_running_per_process=min(
                int(app.config["SHOPPING_LISTS_PER_PROCESS"]), int(app.config["JOB_WORKERS"])
            ),
        ),
    )
