"""Reading JSON request bodies with a bound on how deeply they nest.

No body the API takes nests more than a few levels, but a client can send
64 KiB of `[`: Python's JSON parser gives up on it with a RecursionError,
which Flask does not take for a bad body (it expects a ValueError), so it
was a 500 with a traceback at ERROR. Flask parses every request body with
the app's JSON provider, so the bound is set there and holds for routes
added later too: a body nested deeper than `MAX_DEPTH` is `400
validation_error` naming `_body`, whether the parser gave up on it or not.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, Request
from flask.json.provider import DefaultJSONProvider
from marshmallow import ValidationError

# Containers inside containers: `{"url": …}` is one level.
MAX_DEPTH = 32


class NestedTooDeep(ValueError):
    """must not be nested deeper than 32 levels"""

    def __init__(self) -> None:
        super().__init__(self.__doc__)


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` (parsed JSON) has containers more than `limit` deep;
    without recursion, so no value can exhaust the stack here."""
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


class BoundedJSONProvider(DefaultJSONProvider):
    """The app's JSON, refusing text nested deeper than `MAX_DEPTH` with a
    ValueError, as any other text that is not the JSON wanted."""

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        try:
            value = super().loads(s, **kwargs)
        except RecursionError:
            raise NestedTooDeep() from None
        if nested_deeper_than(value, MAX_DEPTH):
            raise NestedTooDeep()
        return value


class BoundedRequest(Request):
    """Flask's request, saying why a body nested too deep was refused."""

    def on_json_loading_failed(self, e: ValueError | None) -> Any:
        if isinstance(e, NestedTooDeep):
            raise ValidationError({"_body": [str(e)]})
        return super().on_json_loading_failed(e)


def init_app(app: Flask) -> None:
    app.json = BoundedJSONProvider(app)
    app.request_class = BoundedRequest
