"""The one error envelope, `{"error": {"code", "message"[, "fields"]}}`, for every error.

Registered at app level so routing 404s and 405s, Flask's 413 and 415, and
unexpected exceptions all answer in the same shape. A 500 never echoes the
exception: its text may quote a URL, a token or a dependency's answer.

The store's "try again later" errors are `503 unavailable` with `Retry-After`.
Only a busy database is logged per request: a storage fault or a dead writer
is logged by the store once, when it starts, and counted there.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, current_app, jsonify, request
from marshmallow import ValidationError
from werkzeug.exceptions import HTTPException

from mealquest.db.errors import StoreBusy, StoreUnavailable

logger = logging.getLogger(__name__)

# HTTP status -> (code, message) for errors raised by Flask and werkzeug.
_HTTP_CODES: dict[int, tuple[str, str]] = {
    400: ("validation_error", "the request is not valid"),
    401: ("unauthorized", "a valid bearer token is required"),
    404: ("not_found", "not found"),
    405: ("method_not_allowed", "method not allowed"),
    413: ("payload_too_large", "the request body is too large"),
    414: ("uri_too_long", "the request URI is too long"),
    415: ("unsupported_media_type", "the request body must be JSON"),
    503: ("unavailable", "the service is busy; try again shortly"),
}
# The 503 message when the store is unavailable for another reason than a lock.
_UNAVAILABLE_MESSAGE = "the service cannot use its storage now; try again shortly"


class APIError(Exception):
    """An error answered to the client as it is: its code and message are safe to show."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        fields: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields


def not_found(message: str) -> APIError:
    return APIError(404, "not_found", message)


def conflict(message: str) -> APIError:
    return APIError(409, "conflict", message)


def error_response(
    status: int, code: str, message: str, fields: dict[str, Any] | None = None
) -> tuple[Response, int]:
    body: dict[str, Any] = {"code": code, "message": message}
    if fields is not None:
        body["fields"] = fields
    return jsonify(error=body), status


def _api_error(error: APIError) -> tuple[Response, int]:
    return error_response(error.status, error.code, error.message, error.fields)


def _validation_error(error: ValidationError) -> tuple[Response, int]:
    messages = error.messages if isinstance(error.messages, dict) else {"_schema": error.messages}
    return error_response(400, "validation_error", "the request is not valid", messages)


def _http_error(error: HTTPException) -> tuple[Response, int] | Response:
    status = error.code or 500
    code, message = _HTTP_CODES.get(status, ("internal", "internal error"))
    if status == 400:
        # Flask's own 400s come from the request as a whole (mostly a body
        # that is not valid JSON), not from one field.
        return error_response(400, code, message, {"_body": ["the request body is not valid"]})
    response, status = error_response(status, code, message)
    allowed = error.get_response().headers.get("Allow") if status == 405 else None
    if allowed:
        response.headers["Allow"] = allowed
    return response, status


def unavailable_response(error: StoreUnavailable | None = None) -> tuple[Response, int]:
    """503 `unavailable` with the `Retry-After` the error asks for (1 s without one)."""
    if error is None or isinstance(error, StoreBusy):
        response, status = error_response(503, *_HTTP_CODES[503])
    else:
        response, status = error_response(503, "unavailable", _UNAVAILABLE_MESSAGE)
    retry_after = StoreUnavailable.retry_after if error is None else error.retry_after
    response.headers["Retry-After"] = str(retry_after)
    return response, status


def _unavailable(error: StoreUnavailable) -> tuple[Response, int]:
    if isinstance(error, StoreBusy):
        logger.warning("database busy past the deadline; answered 503")
    return unavailable_response(error)


def _internal(error: Exception) -> tuple[Response, int] | Response:
    if isinstance(error, HTTPException):
        return _http_error(error)
    logger.exception("unhandled error")
    return error_response(500, "internal", "internal error")


def _refuse_long_uri() -> tuple[Response, int] | None:
    # The app's own limit, below the server's (gunicorn's limit_request_line,
    # nginx's header buffers), so a long URI is answered in the envelope.
    environ = request.environ
    length = len(environ.get("PATH_INFO", "").encode("utf-8", "surrogateescape"))
    length += len(environ.get("QUERY_STRING", ""))
    if length > current_app.config["MAX_URI_LENGTH"]:
        return error_response(414, *_HTTP_CODES[414])
    return None


def init_app(app: Flask) -> None:
    """Registered first, so the URI limit applies before authentication."""
    app.before_request(_refuse_long_uri)
    app.register_error_handler(APIError, _api_error)
    app.register_error_handler(ValidationError, _validation_error)
    app.register_error_handler(StoreUnavailable, _unavailable)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _internal)
