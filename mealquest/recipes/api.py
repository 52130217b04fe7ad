"""`/api/v1/recipe-imports` and `/api/v1/recipes`: a household imports and reads its own recipes."""

from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, request

from mealquest.auth import current_household
from mealquest.errors import not_found
from mealquest.extensions import get_store
from mealquest.jobs import http as jobs_http
from mealquest.openapi import operation
from mealquest.pagination import PageQuerySchema, decode_cursor, paginate
from mealquest.recipes.kind import KIND
from mealquest.recipes.schemas import (
    RECIPE_ID_PATTERN,
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


@imports_bp.post("")
@jobs_http.enqueues(KIND, body=_import_schema)
def create_import(body: dict[str, Any]) -> dict[str, Any]:
    """Start importing a recipe from a web page; poll the job it answers."""
    return body


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
