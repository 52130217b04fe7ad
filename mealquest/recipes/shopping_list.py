"""The `shopping_list` job kind: a week's recipes, merged into one list.

It runs as the callback of a batch of recipe imports (`POST
/api/v1/recipe-imports/batch` with `"shopping_list": true`): once every
import is final, it reads the recipes of those that succeeded and merges
their ingredient lines (`mealquest.recipes.ingredients`). Members that did
not succeed are named in `skipped`; with none succeeded there is no list,
and the job fails with a message the household may read.

Reading the lines is CPU work (a model per line, about 2 ms, and a third of
a second to load it once per process): it runs in gevent's thread pool, so
the process's other greenlets go on meanwhile. The lines are bounded
(`ingredients.MAX_LINES`), so the thread ends in seconds even when the job's
timeout stopped waiting for it.
"""

from __future__ import annotations

import json
from typing import Any

import gevent
from flask import Flask
from marshmallow import Schema, fields

from mealquest import jobs
from mealquest.jobs import Failure, JobContext, KindOptions
from mealquest.model.jobs import MAX_RESULT_BYTES
from mealquest.recipes import ingredients

KIND = "shopping_list"
NOTHING_IMPORTED = "none of the batch's recipes could be imported"
NOT_A_BATCH = "a shopping list is made for a batch of recipe imports"
TOO_LONG = "the shopping list is too long to keep"
# Titles as a list's items name them: a page's title may be long.
MAX_TITLE_CHARS = 120


class ShoppingListPayloadSchema(Schema):
    """Nothing: the list is made from the batch it completes."""


class ShoppingItemSchema(Schema):
    food = fields.String(required=True)
    quantity = fields.Float(
        required=True, allow_none=True, metadata={"description": "null: listed as written"}
    )
    unit = fields.String(
        required=True,
        allow_none=True,
        metadata={"description": '"g", "ml", or null (a count, or listed as written)'},
    )
    text = fields.String(required=True)
    from_ = fields.List(
        fields.String(),
        required=True,
        data_key="from",
        metadata={"description": "the titles of the recipes it came from"},
    )


class ShoppingListSchema(Schema):
    recipes = fields.Integer(
        required=True, strict=True, metadata={"description": "the recipes merged"}
    )
    items = fields.List(fields.Nested(ShoppingItemSchema), required=True)
    skipped = fields.List(
        fields.String(),
        required=True,
        metadata={"description": "the batch's jobs that did not succeed"},
    )


def make_list(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    outcome = ctx.batch()
    if outcome is None:
        raise Failure(NOT_A_BATCH)
    skipped = [*outcome.failed, *outcome.cancelled]
    recipes = ctx.store.read(
        ctx.store.recipes.recipes_of_jobs, ctx.household_id, list(outcome.succeeded)
    )
    if not recipes:
        raise Failure(NOTHING_IMPORTED)
    lines = [(recipe.title[:MAX_TITLE_CHARS], recipe.ingredients) for recipe in recipes]
    items = gevent.get_hub().threadpool.apply(ingredients.merge, (lines,))
    result = {
        "recipes": len(recipes),
        "items": [item.as_dict() for item in items],
        "skipped": skipped,
    }
    if len(json.dumps(result)) > MAX_RESULT_BYTES:
        raise Failure(TOO_LONG)
    return result


def init_app(app: Flask) -> None:
    jobs.register(
        app,
        KIND,
        make_list,
        payload=ShoppingListPayloadSchema,
        result=ShoppingListSchema,
        # Reading a hundred recipes' lines takes seconds; a retry would only
        # read them again, so one attempt, and a timeout far above that.
        options=KindOptions(max_attempts=1, timeout_seconds=120.0),
    )
