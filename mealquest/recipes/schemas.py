"""The recipes' shapes at the edges: HTTP in and out, and the job's payload and results."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from marshmallow import Schema, ValidationError, fields, validate, validates

MAX_URL_LENGTH = 2048

# A pattern for the URLs `validate_web_url` accepts, which the OpenAPI document
# publishes: http(s); a host name, an IPv4 address or a bracketed IPv6 address;
# an optional port (0 to 65535); then anything but spaces and control
# characters. Every string it admits passes `validate_web_url`, so the document
# promises nothing the server refuses. (No user info, no IPv6 zone ids.)
_H16 = "[0-9A-Fa-f]{1,4}"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_LS32 = rf"(?:{_H16}:{_H16}|{_OCTET}(?:\.{_OCTET}){{3}})"


def _ipv6_pattern() -> str:
    """RFC 3986's IPv6address: eight groups, or fewer around one `::`."""
    after = [rf"(?:{_H16}:){{{n}}}{_LS32}" for n in (5, 4, 3, 2, 1)] + [_LS32, _H16, ""]
    forms = [rf"(?:{_H16}:){{6}}{_LS32}"]
    for before, tail in enumerate(after):
        head = rf"(?:(?:{_H16}:){{0,{before - 1}}}{_H16})?" if before else ""
        forms.append(f"{head}::{tail}")
    return "(?:" + "|".join(forms) + ")"


_PORT = "(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})"
_HOST = rf"(?:[A-Za-z0-9.-]+|\[{_ipv6_pattern()}\])"
WEB_URL_PATTERN = (
    rf"^[Hh][Tt][Tt][Pp][Ss]?://{_HOST}(?::{_PORT})?(?:[/?#][^\u0000-\u0020\u007f]*)?$"
)


_SPACE_OR_CONTROL = re.compile("[\x00-\x20\x7f]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def validate_web_url(value: str) -> None:
    """An absolute http(s) URL with a host. Where it points is checked when it
    is fetched (a name resolves differently over time); here only its form."""
    # Searched by `re`, not a generator over the characters: every import's
    # URL is checked twice (the request's body, the job's payload), and up
    # to 2,048 characters a step each in Python was most of the validation.
    if _SPACE_OR_CONTROL.search(value):
        raise ValidationError("must not contain spaces or control characters")
    if _LONE_SURROGATE.search(value):
        # A lone surrogate (a JSON "\udcff"): no request line can carry it.
        raise ValidationError("must be Unicode text, without lone surrogates")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValidationError("not a valid URL") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValidationError("must be an http or https URL")
    if not parts.hostname:
        raise ValidationError("must name a host")


class WebUrl(validate.Regexp):
    """`WEB_URL_PATTERN` (which the OpenAPI document shows as the field's
    pattern), refused with the one reason `validate_web_url` finds first: as
    two validators, a bad URL was told both "must be an http or https URL
    with a host" and "must be an http or https URL"."""

    def __call__(self, value: str) -> str:  # type: ignore[override]
        validate_web_url(value)
        return super().__call__(value)


class RecipeImportSchema(Schema):
    """`POST /api/v1/recipe-imports` body, and the `recipe_import` job's payload."""

    url = fields.String(
        required=True,
        validate=[
            validate.Length(1, MAX_URL_LENGTH),
            WebUrl(WEB_URL_PATTERN, error="must be an http or https URL with a host"),
        ],
        metadata={"description": "the page to import (http or https)"},
    )


class StrictBoolean(fields.Boolean):
    """JSON's `true` or `false`, and nothing else (marshmallow's own takes
    `0`, `"yes"`, ..., which the document, saying boolean, does not)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


# The most pages one batch imports.
MAX_BATCH_URLS = 100


class RecipeImportBatchSchema(Schema):
    """`POST /api/v1/recipe-imports/batch` body."""

    urls = fields.List(
        RecipeImportSchema().fields["url"],
        required=True,
        validate=validate.Length(1, MAX_BATCH_URLS),
        metadata={
            "description": f"the pages to import, 1 to {MAX_BATCH_URLS}, each once",
            "uniqueItems": True,
        },
    )
    shopping_list = StrictBoolean(
        load_default=False,
        metadata={"description": "also make one shopping list once every import is final"},
    )
    confirm = StrictBoolean(
        load_default=False,
        metadata={
            "description": (
                "make the shopping list (as `shopping_list` does) and have its job wait for "
                "the household to confirm it (signal `confirm`): it ends with the list as "
                "confirmed"
            )
        },
    )

    @validates("urls")
    def _each_once(self, urls: list[str], **_: Any) -> None:
        seen: dict[str, int] = {}
        repeated: dict[int, list[str]] = {}
        for index, url in enumerate(urls):
            if url in seen:
                repeated[index] = [f"the same URL as item {seen[url]}"]
            seen.setdefault(url, index)
        if repeated:
            raise ValidationError(repeated)


class RecipeImportBatchAnswerSchema(Schema):
    """What `POST /api/v1/recipe-imports/batch` answers (`202`)."""

    batch_id = fields.String(required=True)
    jobs = fields.List(
        fields.String(), required=True, metadata={"description": "the imports' job ids, in order"}
    )
    shopping_list_job_id = fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "the shopping list's job (null: none asked for)"},
    )


class ImportStageSchema(Schema):
    """A `recipe_import` job's partial result."""

    stage = fields.String(required=True, validate=validate.OneOf(["fetching", "parsing"]))


RECIPE_ID_PATTERN = r"^[0-9a-f]{32}$"


class RecipePathSchema(Schema):
    """A recipe id in a path (documentation: anything else is the same 404 as an unknown one)."""

    recipe_id = fields.String(required=True, validate=validate.Regexp(RECIPE_ID_PATTERN))


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
