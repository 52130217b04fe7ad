"""`/api/v1/recipe-imports` and `/api/v1/recipes`: a household imports and reads its own recipes."""

from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, request, url_for

from mealquest.auth import current_household
from mealquest.errors import not_found
from mealquest.extensions import get_store
from mealquest.jobs import JobRequest, enqueue_batch
from mealquest.jobs.errors import IdempotencyKeyReused
from mealquest.jobs.web import enqueue_route as jobs_http
from mealquest.openapi import operation
from mealquest.pagination import PageQuerySchema, decode_cursor, paginate
from mealquest.recipes import shopping_list
from mealquest.recipes.kind import KIND
from mealquest.recipes.schemas import (
    RECIPE_ID_PATTERN,
    RecipeImportBatchAnswerSchema,
    RecipeImportBatchSchema,
    RecipeImportSchema,
    RecipeListSchema,
    RecipePathSchema,
    RecipeSchema,
)

imports_bp = Blueprint("recipe_imports", __name__, url_prefix="/recipe-imports")
recipes_bp = Blueprint("recipes", __name__, url_prefix="/recipes")

_RECIPE_ID = re.compile(RECIPE_ID_PATTERN)
_path_schema = RecipePathSchema()
_import_schema = RecipeImportSchema()
_recipe_schema = RecipeSchema()
_list_schema = RecipeListSchema()
_query_schema = PageQuerySchema()
_batch_schema = RecipeImportBatchSchema()
_batch_answer_schema = RecipeImportBatchAnswerSchema()


@imports_bp.post("")
@jobs_http.enqueues(KIND, body=_import_schema)
def create_import(body: dict[str, Any]) -> dict[str, Any]:
    """Start importing a recipe from a web page; poll the job it answers."""
    return body


@imports_bp.post("/batch")
@operation(
    body=_batch_schema,
    response=_batch_answer_schema,
    status=202,
    also={200: "a repeat of an earlier request with the same `Idempotency-Key`: the batch it made"},
    errors=(422, 429),
    headers=(jobs_http.IDEMPOTENCY_HEADER_PARAMETER,),
    response_headers={
        "Location": {
            "description": "the batch's URL",
            "required": True,
            "schema": {"type": "string"},
        }
    },
)
def create_import_batch() -> tuple[dict[str, Any], int, dict[str, str]]:
    """Import several recipes as one batch, and a shopping list once they end.

    Each URL is checked as a single import checks it, and appears once; the
    household's quota counts each import (not the list). A bad item is `400`
    naming its index, and nothing is written. The body as a whole is bounded
    as every body is (`MEALQUEST_MAX_CONTENT_LENGTH`, `413`). Watch the batch at
    `GET /api/v1/batches/{batch_id}` (or its `/events`). With an
    `Idempotency-Key`, the same body again answers `200` with the batch it
    made, and the key with another body is `422`, as for a single import.
    """
    key = jobs_http.idempotency_key()
    body = _batch_schema.load(request.get_json())
    household_id = current_household().id
    try:
        batched = enqueue_batch(
            [JobRequest(KIND, {"url": url}, household_id) for url in body["urls"]],
            on_complete=(
                JobRequest(shopping_list.KIND, {"confirm": body["confirm"]}, household_id)
                if body["shopping_list"] or body["confirm"]
                else None
            ),
            unique_key=key,
        )
    except IdempotencyKeyReused:
        raise jobs_http.key_reused() from None
    answer = {
        "batch_id": batched.batch_id,
        "jobs": batched.job_ids,
        "shopping_list_job_id": batched.callback_job_id,
    }
    location = url_for("api.batches.get_batch", batch_id=batched.batch_id)
    return answer, 202 if batched.created else 200, {"Location": location}


@recipes_bp.get("/<recipe_id>")
@operation(path=_path_schema, response=_recipe_schema, summary="One of the household's recipes.")
def get_recipe(recipe_id: str) -> dict[str, Any]:
    # Malformed, unknown and another household's ids answer the same 404.
    recipe = None
    if _RECIPE_ID.match(recipe_id):
        store = get_store()
        recipe = store.read(store.recipes.get_recipe, recipe_id, current_household().id)
    if recipe is None:
        raise not_found("recipe not found")
    return _recipe_schema.dump(recipe)


@recipes_bp.get("")
@operation(
    query=_query_schema, response=_list_schema, summary="The household's recipes, newest first."
)
def list_recipes() -> dict[str, Any]:
    query = _query_schema.load(request.args)
    limit = query["limit"]
    before = decode_cursor(query["cursor"]) if query["cursor"] else None
    household_id = current_household().id
    store = get_store()
    recipes = store.read(
        lambda conn: store.recipes.list_recipes(
            conn, household_id=household_id, before_seq=before, limit=limit + 1
        )
    )
    page, cursor = paginate(recipes, limit, lambda recipe: recipe.seq, _recipe_schema.dump)
    return {"recipes": page, "next_cursor": cursor}
