"""The service through real nginx (deploy/nginx.conf's server block) in front of real gunicorn."""

from __future__ import annotations

from tests.support.servers import free_port, http, wait_until


def test_enqueue_poll_result_and_errors_through_nginx(served, start_gunicorn, start_nginx):
    server = start_gunicorn(workers=2, config={"PROXY_FIX_HOPS": 1})
    nginx = start_nginx(server.port)
    api = f"{nginx.url}/api/v1"

    answer = http(
        "POST",
        f"{api}/test-jobs",
        token=served.token,
        json_body={"kind": "publish_then_finish", "payload": {"steps": 2, "pause": 0.05}},
    )
    assert answer.status == 202, answer
    job_id = answer.json["id"]
    assert answer.headers["Location"] == f"/api/v1/jobs/{job_id}"
    request_id = answer.headers["X-Request-ID"]
    assert len(request_id) == 32  # nginx's $request_id, echoed by the app

    def finished() -> dict | None:
        polled = http("GET", f"{api}/jobs/{job_id}", token=served.token)
        assert polled.status == 200, polled
        return polled.json if polled.json["status"] == "succeeded" else None

    body = wait_until(finished, 60, "the job did not succeed (polled through nginx)")
    assert {key: body[key] for key in ("id", "kind", "status", "result", "error")} == {
        "id": job_id,
        "kind": "publish_then_finish",
        "status": "succeeded",
        "result": {"step": 2, "done": True},
        "error": None,
    }
    # The same request id is in gunicorn's access log line for that request.
    assert f"rid={request_id}" in server.log()

    bad = http("GET", f"{api}/jobs?limit=1000", token=served.token)
    assert bad.status == 400
    assert bad.headers["Content-Type"] == "application/json"
    assert bad.json["error"]["code"] == "validation_error"
    assert "limit" in bad.json["error"]["fields"]

    unauthorized = http("GET", f"{api}/jobs/{job_id}")
    assert unauthorized.status == 401
    assert unauthorized.json["error"]["code"] == "unauthorized"

    # nginx's own limit equals the app's, and answers with the same envelope.
    too_large = http(
        "POST",
        f"{api}/test-jobs",
        token=served.token,
        body=b"x" * (64 * 1024 + 1),
        headers={"Content-Type": "application/json"},
    )
    assert too_large.status == 413
    assert too_large.headers["Content-Type"] == "application/json"
    assert too_large.json == {
        "error": {"code": "payload_too_large", "message": "the request body is too large"}
    }

    # A long URI: the app's own 414 below nginx's header buffers, nginx's above.
    for length in (5_000, 20_000):
        too_long = http("GET", f"{api}/jobs?kind={'k' * length}", token=served.token)
        assert too_long.status == 414, length
        assert too_long.headers["Content-Type"] == "application/json"
        assert too_long.json["error"]["code"] == "uri_too_long"


def test_nginx_answers_json_when_gunicorn_is_down(start_nginx):
    nginx = start_nginx(free_port())  # nothing listens there
    answer = http("GET", f"{nginx.url}/api/v1/jobs")
    assert answer.status == 502
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.json["error"]["code"] == "unavailable"
    assert answer.headers["X-Request-ID"]
