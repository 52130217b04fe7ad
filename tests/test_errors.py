"""One error envelope for every error code, from our routes and from Flask itself."""

from __future__ import annotations

import pytest
from flask import request

from mealquest.db.sqlite.store import SqliteStore
from mealquest.errors import APIError
from mealquest.extensions import get_store
from mealquest.health import MAX_AGE_SECONDS, health_check
from tests.support.kinds import SECRET
from tests.support.ticks import Ticks

pytestmark = pytest.mark.both_databases

LIMIT = 1024


@pytest.fixture
def error_app(make_app, tmp_path):
    """The app with a small body limit, a short lock deadline and test-only routes."""
    app = make_app(
        MAX_CONTENT_LENGTH=LIMIT, DB_BUSY_TIMEOUT_SECONDS=0.3, JOB_MAX_PENDING_PER_HOUSEHOLD=1
    )

    def echo():
        return {"echo": request.get_json()}

    def explode():
        raise RuntimeError(f"upstream said no for https://api.example/?token={SECRET}")

    def write_something():
        get_store().write(lambda tx: tx.execute("SELECT 1"))
        return {}

    def refuse():
        raise APIError(409, "conflict_for_test", "a safe message")

    def storage_fault():
        # A store whose file cannot be opened: its directory does not exist.
        store = SqliteStore(str(tmp_path / "missing" / "mealquest.sqlite3"))
        try:
            store.write(lambda tx: tx.execute("SELECT 1"))
        finally:
            store.close()
        return {}

    app.add_url_rule("/test/echo", "test_echo", echo, methods=["POST"])
    app.add_url_rule("/test/explode", "test_explode", explode)
    app.add_url_rule("/test/write", "test_write", write_something)
    app.add_url_rule("/test/refuse", "test_refuse", refuse)
    app.add_url_rule("/test/storage-fault", "test_storage_fault", storage_fault)
    return app


@pytest.fixture
def error_client(error_app):
    return error_app.test_client()


def _limit_zero(client, auth, holder):
    return client.get("/api/v1/jobs?limit=0", headers=auth)


def _unknown_parameter(client, auth, holder):
    return client.get("/api/v1/jobs?colour=blue", headers=auth)


def _bad_status(client, auth, holder):
    return client.get("/api/v1/jobs?status=pending", headers=auth)


def _bad_json(client, auth, holder):
    return client.post("/test/echo", data="{not json", content_type="application/json")


def _no_token(client, auth, holder):
    return client.get("/api/v1/jobs")


def _unknown_route(client, auth, holder):
    return client.get("/api/v1/no-such-thing", headers=auth)


def _unknown_job(client, auth, holder):
    return client.get("/api/v1/jobs/" + "0" * 32, headers=auth)


def _wrong_method(client, auth, holder):
    return client.delete("/api/v1/jobs", headers=auth)


def _too_large(client, auth, holder):
    return client.post("/test/echo", json={"text": "x" * (LIMIT + 1)})


def _not_json(client, auth, holder):
    return client.post(
        "/test/echo", data="text=1", content_type="application/x-www-form-urlencoded"
    )


def _healthz_locked(client, auth, holder):
    holder.hold()
    return client.get("/healthz")


def _route_locked(client, auth, holder):
    holder.hold()
    return client.get("/test/write")


def _storage_fault(client, auth, holder):
    return client.get("/test/storage-fault")


def _too_many_jobs(client, auth, holder):
    for page in ("a", "b"):
        response = client.post(
            "/api/v1/recipe-imports", json={"url": f"https://example.com/{page}"}, headers=auth
        )
    return response


def _exception(client, auth, holder):
    return client.get("/test/explode")


CASES = {
    "validation_error-limit": (_limit_zero, 400, "validation_error", "limit"),
    "validation_error-unknown-parameter": (_unknown_parameter, 400, "validation_error", "colour"),
    "validation_error-bad-status": (_bad_status, 400, "validation_error", "status"),
    "validation_error-bad-json": (_bad_json, 400, "validation_error", "_body"),
    "unauthorized": (_no_token, 401, "unauthorized", None),
    "not_found-route": (_unknown_route, 404, "not_found", None),
    "not_found-job": (_unknown_job, 404, "not_found", None),
    "method_not_allowed": (_wrong_method, 405, "method_not_allowed", None),
    "payload_too_large": (_too_large, 413, "payload_too_large", None),
    "unsupported_media_type": (_not_json, 415, "unsupported_media_type", None),
    "unavailable-healthz": (_healthz_locked, 503, "unavailable", None),
    "unavailable-route": (_route_locked, 503, "unavailable", None),
    "unavailable-storage": (_storage_fault, 503, "unavailable", None),
    "too_many_jobs": (_too_many_jobs, 429, "too_many_jobs", None),
    "internal": (_exception, 500, "internal", None),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_every_error_code_answers_the_envelope(error_client, auth, lock_holder, case):
    make_request, status, code, field = CASES[case]

    response = make_request(error_client, auth, lock_holder)

    assert response.status_code == status
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert set(body) == {"error"}
    error = body["error"]
    assert error["code"] == code
    assert isinstance(error["message"], str)
    assert error["message"]
    if code == "validation_error":
        assert set(error) == {"code", "message", "fields"}
        assert field in error["fields"]
        assert all(isinstance(messages, list) for messages in error["fields"].values())
    else:
        assert set(error) == {"code", "message"}
    if code == "method_not_allowed":
        assert set(response.headers["Allow"].replace(" ", "").split(",")) >= {"GET"}
        assert "DELETE" not in response.headers["Allow"]
    if code == "unauthorized":
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    if code == "unavailable":
        assert 1 <= int(response.headers["Retry-After"]) <= 60
    if code == "too_many_jobs":
        assert 1 <= int(response.headers["Retry-After"]) <= 3600
    assert SECRET not in response.get_data(as_text=True)


def test_a_500_never_echoes_the_exception(error_client):
    response = error_client.get("/test/explode")
    assert response.status_code == 500
    text = response.get_data(as_text=True)
    assert SECRET not in text
    assert "upstream" not in text
    assert "RuntimeError" not in text
    assert response.get_json() == {"error": {"code": "internal", "message": "internal error"}}


def test_healthz_answers_503_while_locked_and_200_once_free(error_app, error_client, lock_holder):
    health_check(error_app).clock = ticks = Ticks()
    assert error_client.get("/healthz").status_code == 200
    lock_holder.hold()
    # Answered from the check of less than a second ago, without the database.
    assert error_client.get("/healthz").status_code == 200
    ticks.advance(MAX_AGE_SECONDS)
    response = error_client.get("/healthz")
    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "unavailable"
    lock_holder.release()
    # The failed check is the answer for its second too; then a new one.
    assert error_client.get("/healthz").status_code == 503
    ticks.advance(MAX_AGE_SECONDS)
    response = error_client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}


def test_an_api_error_answers_its_own_status_and_code(error_client):
    response = error_client.get("/test/refuse")
    assert response.status_code == 409
    assert response.get_json() == {
        "error": {"code": "conflict_for_test", "message": "a safe message"}
    }


def test_a_body_within_the_limit_is_read(error_client):
    response = error_client.post("/test/echo", json={"text": "short"})
    assert response.status_code == 200
    assert response.get_json() == {"echo": {"text": "short"}}


def test_a_body_nested_too_deep_is_a_validation_error_on_any_route(error_client):
    # Any route reading JSON, not only ours: the limit is the request's own.
    for data in ("[" * 500 + "]" * 500, "[" * 1000):  # within the 1 KiB limit
        response = error_client.post("/test/echo", data=data, content_type="application/json")
        assert response.status_code == 400
        assert response.get_json()["error"]["code"] == "validation_error"
        assert list(response.get_json()["error"]["fields"]) == ["_body"]


def test_a_uri_over_the_limit_is_414_in_the_envelope_before_auth(make_app):
    client = make_app(MAX_URI_LENGTH=100).test_client()
    answer = client.get("/api/v1/jobs?kind=" + "k" * 100)
    assert answer.status_code == 414
    assert answer.json == {
        "error": {"code": "uri_too_long", "message": "the request URI is too long"}
    }
    assert client.get("/api/v1/jobs?kind=k").status_code == 401
