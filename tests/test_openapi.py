"""`GET /api/v1/openapi.json`: complete, valid, built from the views' own schemas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate

from mealquest import errors
from mealquest.openapi import ERROR_CODES, get_document, is_operators_route, undocumented_rules
from mealquest.pagination import CURSOR_PATTERN, decode_cursor
from mealquest.recipes.schemas import MAX_URL_LENGTH, WEB_URL_PATTERN, validate_web_url

pytestmark = pytest.mark.both_databases

# Generated strings from a pattern: Python's `$` also matches before a final
# newline, which the document's (ECMA) `$` does not.
_no_final_newline = lambda value: not value.endswith("\n")  # noqa: E731


def test_the_document_is_valid_openapi(client, auth):
    answer = client.get("/api/v1/openapi.json", headers=auth)
    assert answer.status_code == 200
    assert answer.mimetype == "application/json"
    validate(answer.json)
    assert answer.json["openapi"].startswith("3.")


def test_the_document_needs_a_token(client):
    answer = client.get("/api/v1/openapi.json")
    assert answer.status_code == 401
    assert answer.json["error"]["code"] == "unauthorized"


def test_every_route_is_documented(app):
    assert undocumented_rules(app) == []
    paths = get_document(app)["paths"]
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or is_operators_route(rule.endpoint):
            continue
        path = rule.rule.replace("<", "{").replace(">", "}")
        assert path in paths, rule.rule
        methods = {m.lower() for m in rule.methods} - {"head", "options"}
        assert methods == set(paths[path]), rule.rule


def test_the_routes_that_exist_are_all_there(app):
    documented = {
        (path, method) for path, item in get_document(app)["paths"].items() for method in item
    }
    assert documented >= {
        ("/healthz", "get"),
        ("/api/v1/openapi.json", "get"),
        ("/api/v1/jobs", "get"),
        ("/api/v1/jobs/{job_id}", "get"),
        ("/api/v1/recipe-imports", "post"),
        ("/api/v1/recipes", "get"),
        ("/api/v1/recipes/{recipe_id}", "get"),
    }


def test_every_error_answer_is_the_envelope_and_api_routes_need_the_bearer_token(app):
    document = get_document(app)
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "a household token",
    }
    for path, item in document["paths"].items():
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            under_api = path.startswith("/api/v1/")
            assert op["security"] == ([{"bearerAuth": []}] if under_api else []), where
            statuses = {int(status) for status in op["responses"]}
            assert any(200 <= status < 300 for status in statuses), where
            if under_api:
                assert {401, 503} <= statuses, where
            if "{" in path:
                assert 404 in statuses, where
            if any(p["in"] == "query" for p in op.get("parameters", ())) or "requestBody" in op:
                assert 400 in statuses, where
            if "requestBody" in op:
                assert {413, 415} <= statuses, where
            for status in statuses - {s for s in statuses if s < 400}:
                schema = op["responses"][str(status)]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}, (where, status)


def test_the_envelope_schema_names_every_code_the_service_answers():
    emitted = {code for code, _message in errors._HTTP_CODES.values()} | {"internal", "not_found"}
    assert emitted <= set(ERROR_CODES)


def test_the_document_is_built_once_per_app(app, client, auth):
    first = client.get("/api/v1/openapi.json", headers=auth).json
    assert get_document(app) is get_document(app)
    assert client.get("/api/v1/openapi.json", headers=auth).json == first


def test_documented_shapes_come_from_the_view_schemas(app):
    """Spot checks that the view's marshmallow fields are what is published."""
    document = get_document(app)
    schemas = document["components"]["schemas"]
    assert schemas["Job"]["required"] == sorted(
        {"error", "id", "kind", "result", "status", "attempt", "max_attempts"}
        | {"created_at", "run_at", "started_at", "finished_at", "version", "queue"}
    )
    assert schemas["Queue"]["required"] == sorted(
        {"position", "ahead_in_household", "estimated_start_at", "waiting_for", "signal"}
    )
    assert schemas["Queue"]["properties"]["waiting_for"]["enum"] == [
        "paused",
        "no_worker",
        "dependencies",
        "scheduled",
        "retry",
        "rate_limit",
        "kind_cap",
        "household",
        "turn",
    ]
    assert schemas["Job"]["properties"]["started_at"]["format"] == "date-time"
    assert schemas["Job"]["properties"]["status"]["enum"] == [
        "queued",
        "running",
        "succeeded",
        "failed",
        "cancelled",
    ]
    params = {p["name"]: p for p in document["paths"]["/api/v1/jobs"]["get"]["parameters"]}
    assert set(params) == {"limit", "cursor", "status", "kind"}
    assert params["limit"]["schema"]["maximum"] == 100
    assert params["cursor"]["schema"]["pattern"] == CURSOR_PATTERN
    body = document["paths"]["/api/v1/recipe-imports"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RecipeImport"
    }
    assert schemas["RecipeImport"]["properties"]["url"]["pattern"] == WEB_URL_PATTERN
    imports = document["paths"]["/api/v1/recipe-imports"]["post"]
    for status in ("202", "200"):
        assert "Location" in imports["responses"][status]["headers"]
    assert imports["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"
    }
    [key] = [p for p in imports["parameters"] if p["in"] == "header"]
    assert (key["name"], key["schema"]["maxLength"]) == ("Idempotency-Key", 255)
    cancel = document["paths"]["/api/v1/jobs/{job_id}/cancel"]["post"]
    assert {"200", "202", "404", "409"} <= set(cancel["responses"])


@settings(max_examples=300, database=None, derandomize=True)
@given(st.from_regex(CURSOR_PATTERN).filter(_no_final_newline))
def test_every_cursor_the_document_admits_is_accepted(cursor):
    assert 0 <= decode_cursor(cursor) < 2**63


@settings(max_examples=300, database=None, derandomize=True)
@given(st.from_regex(WEB_URL_PATTERN).filter(_no_final_newline))
def test_every_url_the_document_admits_is_accepted(url):
    if len(url) <= MAX_URL_LENGTH:
        validate_web_url(url)


@pytest.mark.parametrize("cursor", ["0", "1", "7fffffffffffffff", "00000000000000ff"])
def test_cursor_bounds(cursor):
    assert decode_cursor(cursor) == int(cursor, 16)


@pytest.mark.parametrize("cursor", ["8000000000000000", "1" * 17, "-1", "A", "0x1", "1\n"])
def test_cursors_outside_the_pattern_are_400_never_500(client, auth, cursor):
    # Before cursors had a pattern, a decodable cursor past SQLite's integers was a 500.
    answer = client.get("/api/v1/jobs", headers=auth, query_string={"cursor": cursor})
    assert answer.status_code == 400
    assert "cursor" in answer.json["error"]["fields"]
