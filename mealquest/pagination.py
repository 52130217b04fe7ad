"""Newest-first pages: `limit`, and an opaque cursor that continues after the last item.

A page also stops early at `MAX_PAGE_BYTES` of JSON (its cursor then
continues after the last item it holds): each item is bounded (a job's
result, a recipe), but a hundred of them would still make an answer of tens
of megabytes, held in a worker's memory while it is sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

from marshmallow import Schema, ValidationError, fields, validate

from mealquest.ascii_numbers import WholeField

T = TypeVar("T")

DEFAULT_LIMIT = 50
MAX_LIMIT = 100
MAX_PAGE_BYTES = 4 * 1024 * 1024


# A cursor is the last item's `seq` in lowercase hex. The pattern is exact:
# every string it admits decodes to a sequence number SQLite can hold, so the
# published document promises no cursor the server would refuse.
CURSOR_PATTERN = r"^[0-7]?[0-9a-f]{1,15}$"
_CURSOR = re.compile(CURSOR_PATTERN)
_BAD_CURSOR = "not a cursor from a previous page"


def encode_cursor(seq: int) -> str:
    return format(seq, "x")


def decode_cursor(cursor: str) -> int:
    """The `seq` that the next page continues below."""
    if not _CURSOR.fullmatch(cursor):
        raise ValidationError({"cursor": [_BAD_CURSOR]})
    return int(cursor, 16)


class PageQuerySchema(Schema):
    """Query parameters of every list route."""

    limit = WholeField(
        load_default=DEFAULT_LIMIT,
        validate=validate.Range(1, MAX_LIMIT),
        metadata={"description": f"items per page (1 to {MAX_LIMIT})"},
    )
    cursor = fields.String(
        load_default=None,
        validate=validate.Regexp(CURSOR_PATTERN, error=_BAD_CURSOR),
        metadata={"description": "`next_cursor` of the previous page"},
    )


def paginate(
    items: list[T],
    limit: int,
    seq_of: Callable[[T], int],
    dump: Callable[[T], dict[str, Any]],
    max_bytes: int = MAX_PAGE_BYTES,
) -> tuple[list[dict[str, Any]], str | None]:
    """Cut a `limit + 1` fetch to a page of dumped items, of at most
    `max_bytes` of JSON (the first item whatever its size); the cursor is
    set only if more items follow."""
    page: list[dict[str, Any]] = []
    size = 0
    for item in items[:limit]:
        dumped = dump(item)
        size += len(json.dumps(dumped, separators=(",", ":")))
        if page and size > max_bytes:
            return page, encode_cursor(seq_of(items[len(page) - 1]))
        page.append(dumped)
    if len(items) <= limit:
        return page, None
    return page, encode_cursor(seq_of(items[limit - 1]))
