"""The `shopping_list` job kind: a week's recipes, merged into one list.

It runs as the callback of a batch of recipe imports (`POST
/api/v1/recipe-imports/batch` with `"shopping_list": true`): once every
import is final, it reads the recipes of those that succeeded and merges
their ingredient lines (`mealquest.recipes.ingredients`): one row per food,
in the units a cook uses. Members that did not succeed are named in
`skipped`, each with the URL it was to import; with none succeeded there is
no list, and the job fails with a message the household may read.

With `"confirm": true` the household has its say before the list is final:
the merged list is kept (a step: never merged twice), then the job waits for
the signal `confirm` (`{"remove": [food, ...], "add": [text, ...]}`), its
result meanwhile the merged list with `"confirmed": false`. It ends with
the list as the household confirmed it (`"confirmed": true`), or, if no
answer came within `MEALQUEST_SHOPPING_LIST_CONFIRM_SECONDS`, with the list
as merged (`"confirmed": false`). A list nobody was asked about has
`"confirmed": null`.

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
from marshmallow import Schema, fields, validate

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


# What a household's confirmation may hold: rows to take out, rows to add.
MAX_CONFIRM_ITEMS = 200
MAX_CONFIRM_CHARS = 200


class ShoppingListPayloadSchema(Schema):
    """Whether to ask the household to confirm the list; the list itself is
    made from the batch the job completes."""

    confirm = fields.Boolean(load_default=False)


def _confirm_list(description: str) -> fields.List:
    return fields.List(
        fields.String(validate=validate.Length(1, MAX_CONFIRM_CHARS)),
        load_default=list,
        validate=validate.Length(max=MAX_CONFIRM_ITEMS),
        metadata={"description": f"{description}, at most {MAX_CONFIRM_ITEMS}"},
    )


# --8<-- [start:signal]
class ConfirmSchema(Schema):
    """The household's confirmation of its list (signal `confirm`)."""

    remove = _confirm_list("foods to take off the list, as its rows name them")
    add = _confirm_list("rows to add, as the household writes them")


# --8<-- [end:signal]


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
    confirmed = fields.Boolean(
        required=True,
        allow_none=True,
        metadata={
            "description": (
                "true: as the household confirmed it; false: as merged, waiting for (or past "
                "waiting for) their confirmation; null: they were not asked"
            )
        },
    )


# --8<-- [start:handler]
def make_list(
    payload: dict[str, Any], ctx: JobContext, *, seconds: float, confirm_seconds: float
) -> dict[str, Any]:
    merged = ctx.step("merge", _merged, ctx, seconds)
    if not payload["confirm"]:
        return {**merged, "confirmed": None}
    answer = ctx.wait_for(
        "confirm", timeout_seconds=confirm_seconds, prompt={**merged, "confirmed": False}
    )
    if answer is None:
        return {**merged, "confirmed": False}
    return {**_bounded(confirmed_list(merged, answer["remove"], answer["add"])), "confirmed": True}


# --8<-- [end:handler]


def confirmed_list(merged: dict[str, Any], remove: list[str], add: list[str]) -> dict[str, Any]:
    """The list with the rows whose food the household named taken out (in
    any case), and theirs added as they wrote them, each once."""
    removed = {food.strip().casefold() for food in remove}
    items = [item for item in merged["items"] if item["food"].casefold() not in removed]
    listed = {item["text"].casefold() for item in items}
    for text in dict.fromkeys(row.strip() for row in add):
        if text and text.casefold() not in listed:
            items.append(
                {
                    "food": text,
                    "quantity": None,
                    "unit": None,
                    "amounts": [],
                    "text": text,
                    "from": [],
                }
            )
    return {**merged, "items": items}


def _merged(ctx: JobContext, seconds: float) -> dict[str, Any]:
    """The batch's recipes merged into one list (the job's step `merge`)."""
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
    return _bounded({"recipes": len(recipes), "items": items, "skipped": skipped})


def _bounded(result: dict[str, Any]) -> dict[str, Any]:
    if len(json.dumps(result)) > MAX_RESULT_BYTES - 100:  # and its `confirmed`
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
    confirm_seconds = float(app.config["SHOPPING_LIST_CONFIRM_SECONDS"])

    def handler(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        return make_list(payload, ctx, seconds=seconds, confirm_seconds=confirm_seconds)

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
            # --8<-- [start:register]
            signals={"confirm": ConfirmSchema},
            # --8<-- [end:register]
        ),
    )
