"""The recipes' shapes at the edges: HTTP in and out, and the job's payload and results."""

from __future__ import annotations

from urllib.parse import urlsplit

from marshmallow import Schema, ValidationError, fields, validate

MAX_URL_LENGTH = 2048


def validate_web_url(value: str) -> None:
    """An absolute http(s) URL with a host. Where it points is checked when it
    is fetched (a name resolves differently over time); here only its form."""
    if any(ord(char) <= 0x20 or ord(char) == 0x7F for char in value):
        raise ValidationError("must not contain spaces or control characters")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValidationError("not a valid URL") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValidationError("must be an http or https URL")
    if not parts.hostname:
        raise ValidationError("must name a host")


class RecipeImportSchema(Schema):
    """`POST /api/v1/recipe-imports` body, and the `recipe_import` job's payload."""

    url = fields.String(
        required=True,
        validate=[validate.Length(1, MAX_URL_LENGTH), validate_web_url],
        metadata={"description": "the page to import (http or https)"},
    )


class ImportStageSchema(Schema):
    """A `recipe_import` job's partial result."""

    stage = fields.String(required=True, validate=validate.OneOf(["fetching", "parsing"]))


class RecipeSchema(Schema):
    id = fields.String(required=True)
    job_id = fields.String(
        allow_none=True, required=True, metadata={"description": "the import job that made it"}
    )
    title = fields.String(required=True)
    ingredients = fields.List(fields.String(), required=True)
    instructions = fields.List(fields.String(), required=True)
    yields = fields.String(allow_none=True, required=True, metadata={"example": "4 servings"})
    total_time_minutes = fields.Integer(allow_none=True, required=True, strict=True)
    image_url = fields.String(allow_none=True, required=True)
    source_url = fields.String(required=True)
    author = fields.String(allow_none=True, required=True)
    created_at = fields.String(required=True)


class RecipeImportResultSchema(Schema):
    """A `recipe_import` job's final result: the stored recipe."""

    recipe_id = fields.String(required=True)
    recipe = fields.Nested(RecipeSchema, required=True)


class RecipeListSchema(Schema):
    recipes = fields.List(fields.Nested(RecipeSchema), required=True)
    next_cursor = fields.String(allow_none=True, required=True)
