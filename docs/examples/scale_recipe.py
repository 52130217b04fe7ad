"""A job kind in one file: a household's recipe scaled to a number of servings.

The guides show this file as it is (docs/guides/write-a-kind.md and
add-a-route.md), and tests/test_docs_examples.py registers it and runs it
through the real runner on both databases, so what they show works.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from flask import Blueprint, Flask
from marshmallow import Schema, fields, validate

from mealquest import jobs
from mealquest.jobs import Failure, JobContext, KindOptions
from mealquest.jobs.web import enqueue_route as jobs_http
from mealquest.recipes.schemas import RECIPE_ID_PATTERN

KIND = "scale_recipe"


# --8<-- [start:schemas]
# The payload: what the job needs, checked before anything is stored (an
# unknown field is refused too). Keep it small: it is stored with the job.
class ScaleRecipePayload(Schema):
    recipe_id = fields.String(required=True, validate=validate.Regexp(RECIPE_ID_PATTERN))
    servings = fields.Integer(required=True, validate=validate.Range(min=1, max=100))


# The result: what the household reads on the job when it has succeeded.
class ScaleRecipeResult(Schema):
    recipe_id = fields.String(required=True)
    servings = fields.Integer(required=True)
    ingredients = fields.List(fields.String(), required=True)


# --8<-- [end:schemas]

# "1 1/2 cups flour", "200 g sugar", "0.5 tsp salt": a quantity, then the rest.
_QUANTITY = re.compile(r"^\s*(\d+\s+\d+/\d+|\d+/\d+|\d+(?:\.\d+)?)(.*)$", re.DOTALL)


# --8<-- [start:handler]
def scale_recipe(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The handler: runs in a greenlet of a job pool, so it must not block.

    It reads the household's own recipe (`ctx.household_id`), and ends the
    job with its return value, or with a `Failure` whose message the
    household reads. Any other exception is retried while attempts last,
    and stored as `internal error` (its text never reaches the household).
    """
    recipe = ctx.store.read(ctx.store.recipes.get_recipe, payload["recipe_id"], ctx.household_id)
    if recipe is None:
        raise Failure("recipe not found")
    serves = _quantity(recipe.yields or "")
    if not serves:
        raise Failure("the recipe does not say how many it serves")
    factor = Fraction(payload["servings"]) / serves
    return {
        "recipe_id": recipe.id,
        "servings": payload["servings"],
        "ingredients": [_scaled(line, factor) for line in recipe.ingredients],
    }


# --8<-- [end:handler]


def _quantity(text: str) -> Fraction | None:
    match = _QUANTITY.match(text)
    if match is None:
        return None
    return sum((Fraction(part) for part in match.group(1).split()), Fraction(0))


def _scaled(line: str, factor: Fraction) -> str:
    match = _QUANTITY.match(line)
    amount = _quantity(line)
    if match is None or amount is None:
        return line  # "a pinch of salt" stays as written
    scaled = amount * factor
    shown = str(scaled.numerator) if scaled.denominator == 1 else f"{float(scaled):g}"
    return shown + match.group(2)


# --8<-- [start:register]
def register(app: Flask) -> None:
    """Make the kind known to the app's job pools (before they start)."""
    jobs.register(
        app,
        KIND,
        scale_recipe,
        payload=ScaleRecipePayload,
        result=ScaleRecipeResult,
        # One attempt: nothing here is transient (a missing recipe stays
        # missing); a few seconds is far more than it needs.
        options=KindOptions(max_attempts=1, timeout_seconds=10),
    )


# --8<-- [end:register]

# --8<-- [start:route]
# The route: POST /api/v1/recipe-scalings {"recipe_id": ..., "servings": 6}.
bp = Blueprint("recipe_scalings", __name__, url_prefix="/recipe-scalings")


@bp.post("")
@jobs_http.enqueues(KIND, body=ScaleRecipePayload())
def create_scaling(body: dict[str, Any]) -> dict[str, Any]:
    """Scale one of the household's recipes to a number of servings."""
    return body


# --8<-- [end:route]
