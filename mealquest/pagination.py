"""Newest-first pages: `limit`, and an opaque cursor that continues after the last item."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import TypeVar

from marshmallow import Schema, ValidationError, fields, validate

T = TypeVar("T")

DEFAULT_LIMIT = 50
MAX_LIMIT = 100


def encode_cursor(seq: int) -> str:
    raw = json.dumps({"before": seq}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        before = json.loads(raw)["before"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise ValidationError({"cursor": ["not a cursor from a previous page"]}) from None
    if not isinstance(before, int) or isinstance(before, bool) or before < 1:
        raise ValidationError({"cursor": ["not a cursor from a previous page"]})
    return before


class PageQuerySchema(Schema):
    """Query parameters of every list route."""

    limit = fields.Integer(
        load_default=DEFAULT_LIMIT,
        validate=validate.Range(1, MAX_LIMIT),
        metadata={"description": f"items per page (1 to {MAX_LIMIT})"},
    )
    cursor = fields.String(
        load_default=None,
        validate=validate.Length(1, 200),
        metadata={"description": "`next_cursor` of the previous page"},
    )


def paginate(items: list[T], limit: int, seq_of: Callable[[T], int]) -> tuple[list[T], str | None]:
    """Cut a `limit + 1` fetch to a page; the cursor is set only if more items follow."""
    if len(items) <= limit:
        return items, None
    page = items[:limit]
    return page, encode_cursor(seq_of(page[-1]))
