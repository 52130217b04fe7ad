"""The OpenAPI document, built from the marshmallow schemas the views really use.

A view declares its shapes with `@operation(...)`, passing the very schema
objects it loads and dumps with, so the document and the code cannot drift.
`build_document` walks the app's `url_map`; `undocumented_rules` names any
rule whose view has no declaration, and a test fails while one exists.
Error answers all reference one envelope schema; which statuses an operation
can answer follows from what it declares (a path parameter can miss: 404; a
query or body can be invalid: 400; under /api/v1: 401, 403 for a suspended
household, and 503 when the database stays locked; any: 414 for a URI over
the app's limit).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from apispec_webframeworks.flask import FlaskPlugin
from flask import Blueprint, Flask, current_app
from marshmallow import Schema, fields, validate
from werkzeug.routing import Rule

F = TypeVar("F", bound=Callable[..., Any])

OPENAPI_VERSION = "3.0.3"
API_PREFIX = "/api/v1"
SECURITY_SCHEME = "bearerAuth"
EXTENSION_KEY = "mealquest.openapi"

# Every `code` the error envelope can carry (docs/api/index.md lists what each means).
ERROR_CODES = (
    "validation_error",
    "unauthorized",
    "not_found",
    "method_not_allowed",
    "payload_too_large",
    "uri_too_long",
    "unsupported_media_type",
    "unavailable",
    "too_many_jobs",
    "too_many_streams",
    "internal",
    "conflict",
    "idempotency_key_reused",
    "household_suspended",
)

_ERROR_DESCRIPTIONS = {
    400: "the request is not valid: `validation_error`, with `fields` naming each bad field",
    401: "no valid bearer token: `unauthorized`",
    403: "an operator suspended the token's household: `household_suspended`",
    404: "`not_found`",
    413: "the request body is too large: `payload_too_large`",
    414: "the path and query are longer than the service accepts: `uri_too_long`",
    409: "the resource is not in a state that allows this: `conflict`",
    415: "the request body is not JSON: `unsupported_media_type`",
    422: ("the `Idempotency-Key` was already used with another request: `idempotency_key_reused`"),
    429: (
        "the household is at a limit (retry after `Retry-After` seconds): as many jobs "
        "queued or running as its quota allows, `too_many_jobs`; as many event streams "
        "open as it may hold, `too_many_streams`"
    ),
    503: (
        "the database is busy, unreachable or its storage failed "
        "(retry after `Retry-After` seconds): `unavailable`"
    ),
}


class ErrorBodySchema(Schema):
    code = fields.String(required=True, validate=validate.OneOf(ERROR_CODES))
    message = fields.String(required=True, metadata={"description": "safe to show"})
    fields_ = fields.Dict(
        data_key="fields",
        keys=fields.String(),
        values=fields.Raw(),
        metadata={"description": "each bad field and what is wrong with it (400 only)"},
    )


class ErrorSchema(Schema):
    """The one error envelope every error answers with, whatever raised it."""

    error = fields.Nested(ErrorBodySchema, required=True)


@dataclass(frozen=True)
class Operation:
    """What one view takes and answers, as the same schema objects the view uses."""

    response: Schema
    status: int = 200
    # Other success statuses answered with the same schema and headers: {status: meaning}.
    also: dict[int, str] = field(default_factory=dict)
    path: Schema | None = None
    query: Schema | None = None
    body: Schema | None = None
    errors: frozenset[int] = frozenset()
    response_headers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Request headers the view reads, as OpenAPI parameter objects (without `in`).
    headers: tuple[dict[str, Any], ...] = ()
    authenticated: bool = True
    summary: str | None = None
    # What the success answer's body is: JSON of `response`, or a stream of
    # another type (text/event-stream) whose events carry it.
    media_type: str = "application/json"
    # A stream's event that carries `response` (the last is always `end`).
    event: str = "job"
    # Whether the operation answers 304 to a conditional request.
    not_modified: bool = False

    def error_statuses(self) -> list[int]:
        statuses = set(self.errors) | {414}
        if self.authenticated:
            statuses |= {401, 403, 503}
        if self.path is not None:
            statuses.add(404)
        if self.query is not None or self.body is not None or self.headers:
            statuses.add(400)
        if self.body is not None:
            statuses |= {413, 415}
        return sorted(statuses)


def operation(
    *,
    response: Schema,
    status: int = 200,
    also: dict[int, str] | None = None,
    path: Schema | None = None,
    query: Schema | None = None,
    body: Schema | None = None,
    errors: Iterable[int] = (),
    response_headers: dict[str, dict[str, Any]] | None = None,
    headers: Iterable[dict[str, Any]] = (),
    authenticated: bool = True,
    summary: str | None = None,
    media_type: str = "application/json",
    event: str = "job",
    not_modified: bool = False,
) -> Callable[[F], F]:
    """Declare a view's contract; `build_document` reads it from the view function.

    The summary is the view's docstring's first line unless given.
    """

    def decorate(view: F) -> F:
        view.__openapi__ = Operation(  # type: ignore[attr-defined]
            response=response,
            status=status,
            also=dict(also or {}),
            path=path,
            query=query,
            body=body,
            errors=frozenset(errors),
            response_headers=dict(response_headers or {}),
            headers=tuple(headers),
            authenticated=authenticated,
            summary=summary,
            media_type=media_type,
            event=event,
            not_modified=not_modified,
        )
        return view

    return decorate


def _schema_name(schema: Schema | type[Schema]) -> str:
    cls = schema if isinstance(schema, type) else type(schema)
    name = cls.__name__
    return name.removesuffix("Schema") or name


def _version() -> str:
    try:
        return importlib.metadata.version("mealquest")
    except importlib.metadata.PackageNotFoundError:  # running from a tree never installed
        return "0"


def _operation_dict(endpoint: str, view: Callable[..., Any], op: Operation) -> dict[str, Any]:
    doc = (view.__doc__ or "").strip()
    first_line, _, description = doc.partition("\n")
    body: dict[str, Any] = {
        "operationId": endpoint,
        "summary": op.summary or first_line.strip() or endpoint,
        "responses": _success_responses(op),
    }
    if description.strip():
        body["description"] = description.strip()
    parameters = [
        *([{"in": "path", "schema": op.path}] if op.path is not None else []),
        *([{"in": "query", "schema": op.query}] if op.query is not None else []),
        *({"in": "header", **header} for header in op.headers),
    ]
    if parameters:
        body["parameters"] = parameters
    if op.body is not None:
        body["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": op.body}},
        }
    for status in op.error_statuses():
        body["responses"][str(status)] = _error_response(status)
    body["security"] = [{SECURITY_SCHEME: []}] if op.authenticated else []
    return body


def _success_responses(op: Operation) -> dict[str, Any]:
    """The operation's answers that are not errors: its status, those it
    also answers with, and `304` for a conditional read."""
    headers = {"headers": op.response_headers} if op.response_headers else {}
    content = _content(op)
    responses: dict[str, Any] = {
        str(op.status): {"description": "success", "content": content, **headers}
    }
    for status, meaning in op.also.items():
        responses[str(status)] = {"description": meaning, "content": content, **headers}
    if op.not_modified:
        responses["304"] = {
            "description": "it has not changed from the version `If-None-Match` names",
            **headers,
        }
    return responses


def _content(op: Operation) -> dict[str, Any]:
    if op.media_type == "application/json":
        return {"application/json": {"schema": op.response}}
    return {
        op.media_type: {
            # Before OpenAPI 3.2 a stream's schema describes each of its
            # events (the comment lines between them are not events).
            "schema": {
                "type": "object",
                "description": (
                    f"one event: `{op.event}`, whose data is a "
                    f"`{_schema_name(op.response)}`, "
                    "or the last, `end`, whose data is the final `id` and `status`"
                ),
                "required": ["event", "id", "data"],
                "properties": {
                    "event": {"type": "string", "enum": [op.event, "end"]},
                    "id": {"type": "string", "pattern": "^[0-9]+$"},
                    "data": {"type": "string", "description": "JSON"},
                },
            }
        }
    }


def _error_response(status: int) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "description": _ERROR_DESCRIPTIONS.get(status, "error"),
        "content": {"application/json": {"schema": "Error"}},
    }
    if status == 401:
        answer["headers"] = {
            "WWW-Authenticate": {
                "description": "the scheme to authenticate with",
                "required": True,
                "schema": {"type": "string"},
            }
        }
    if status in (429, 503):
        answer["headers"] = {
            "Retry-After": {
                "description": "seconds to wait before trying again",
                "required": True,
                "schema": {"type": "integer", "minimum": 0},
            }
        }
    return answer


# The operators' routes (the Prometheus scrape, the dashboard's pages) take an
# operator's token or session, never a household's: they are not part of the
# households' API this document describes (the docs document them).
_OPERATORS_BLUEPRINTS = ("metrics.", "admin.")


def is_operators_route(endpoint: str) -> bool:
    return endpoint.startswith(_OPERATORS_BLUEPRINTS)


def _documented_rules(app: Flask) -> Iterator[tuple[Rule, Operation | None]]:
    for rule in sorted(app.url_map.iter_rules(), key=lambda rule: rule.rule):
        if rule.endpoint != "static" and not is_operators_route(rule.endpoint):
            view = app.view_functions[rule.endpoint]
            yield rule, getattr(view, "__openapi__", None)


def undocumented_rules(app: Flask) -> list[str]:
    """Routes of `app` whose view declares no `@operation`: the document misses them."""
    return [rule.rule for rule, op in _documented_rules(app) if op is None]


def build_document(app: Flask) -> dict[str, Any]:
    """The OpenAPI document of every declared route of `app`."""
    spec = APISpec(
        title="MealQuest API",
        version=_version(),
        openapi_version=OPENAPI_VERSION,
        plugins=[FlaskPlugin(), MarshmallowPlugin(schema_name_resolver=_schema_name)],
        info={"description": "Households' meal planning; long work runs as polled jobs."},
    )
    spec.components.schema("Error", schema=ErrorSchema)
    spec.components.security_scheme(
        SECURITY_SCHEME, {"type": "http", "scheme": "bearer", "description": "a household token"}
    )
    for rule, op in _documented_rules(app):
        if op is None:
            continue
        view = app.view_functions[rule.endpoint]
        methods = sorted((rule.methods or set()) - {"HEAD", "OPTIONS"})
        operations = {
            method.lower(): _operation_dict(rule.endpoint, view, op) for method in methods
        }
        spec.path(view=view, app=app, operations=operations)
    return spec.to_dict()


def get_document(app: Flask | None = None) -> dict[str, Any]:
    """The app's document, built on first use: routes are all registered by then."""
    app = app or current_app
    document = app.extensions.get(EXTENSION_KEY)
    if document is None:
        document = app.extensions[EXTENSION_KEY] = build_document(app)
    return document


class OpenAPIDocumentSchema(Schema):
    """The document itself, as far as this route promises its shape."""

    openapi = fields.String(required=True)
    info = fields.Dict(required=True)
    paths = fields.Dict(required=True)
    components = fields.Dict(required=True)


_document_schema = OpenAPIDocumentSchema()

bp = Blueprint("openapi", __name__)


@bp.get("/openapi.json")
@operation(response=_document_schema)
def openapi_document() -> dict[str, Any]:
    """This API's OpenAPI 3 document, generated from the schemas the views use."""
    return _document_schema.dump(get_document())
