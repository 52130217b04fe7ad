"""The service through real nginx (deploy/nginx.conf as shipped, its ports and
paths replaced) in front of real gunicorn: over TLS with a self-signed
certificate the test made, and its plain HTTP side that only redirects."""

from __future__ import annotations

import re
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import pytest

from mealquest.config import DEFAULTS
from mealquest.operators import create_operator
from tests.support.events import EventStream
from tests.support.servers import REPO, Answer, enqueue, free_port, http, wait_until
from tests.support.tls import TEST_HOST

pytestmark = pytest.mark.sqlite_only(
    "what nginx passes on is the same whatever the database behind the service"
)

SECRET_KEY = "nginx-test-secret-key-" + "k" * 32
# The longest `?wait=` a long poll may ask for.
MAX_WAIT_SECONDS = 30
HSTS = "Strict-Transport-Security"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def cookie_of(answer: Answer, name: str):
    """The `Set-Cookie` of `name` in an answer, parsed (flags included)."""
    for header, value in answer.pairs:
        if header.lower() == "set-cookie":
            parsed = SimpleCookie()
            parsed.load(value)
            if name in parsed:
                return parsed[name]
    raise AssertionError(f"no {name} cookie set: {answer.pairs}")


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
    assert answer.headers[HSTS].startswith("max-age=")

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
    assert HSTS in too_large.headers  # nginx's own answers carry it too

    # A long URI: the app's own 414 below nginx's header buffers, nginx's above.
    for length in (5_000, 20_000):
        too_long = http("GET", f"{api}/jobs?kind={'k' * length}", token=served.token)
        assert too_long.status == 414, length
        assert too_long.headers["Content-Type"] == "application/json"
        assert too_long.json["error"]["code"] == "uri_too_long"


def test_a_jobs_event_stream_passes_nginx_as_it_comes(served, start_gunicorn, start_nginx, gates):
    """Each event and heartbeat reaches the client while the stream is open
    (nginx buffering it would hold them until it ended), over TLS."""
    server = start_gunicorn(
        workers=1, config={"PROXY_FIX_HOPS": 1, "STREAM_HEARTBEAT_SECONDS": 0.3}
    )
    nginx = start_nginx(server.port)
    job_id = enqueue(server.url, served.token, "pid_gate", {"url": gates.url("g")})

    url = f"{nginx.url}/api/v1/jobs/{job_id}/events"
    # A buffered stream would hold the first event: the read times out instead.
    with EventStream(url, served.token, timeout=30) as stream:
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert stream.next().name == "job"  # while the job is held: not buffered
        # Its claim and its published pid may come first, as events of the
        # held job; then the heartbeat.
        seen = stream.next(comments=True)
        while seen.comment is None:
            assert seen.name == "job", seen
            assert seen.json["status"] in ("queued", "running"), seen
            seen = stream.next(comments=True)
        assert seen.comment == "keep-alive"
        gates.open("g")
        events = stream.events_until_closed()
    assert events[-1].name == "end"
    assert events[-2].json["status"] == "succeeded"


def test_nginx_waits_longer_than_a_long_poll_and_a_streams_heartbeat():
    """Its read timeout is above the longest `?wait=` and the stream's
    heartbeat, or it would cut either with a 504."""
    config = (REPO / "deploy" / "nginx.conf").read_text()
    [timeout] = re.findall(r"proxy_read_timeout (\d+)s;", config)
    assert int(timeout) > max(MAX_WAIT_SECONDS, DEFAULTS["STREAM_HEARTBEAT_SECONDS"])


def test_nginx_drops_a_stalled_client_or_upstream_write_before_a_graceful_restart_ends():
    """A client that stops reading, or a body that stops coming, must not hold
    a stopping worker past its graceful timeout."""
    config = (REPO / "deploy" / "nginx.conf").read_text()
    gunicorn_conf = (REPO / "gunicorn.conf.py").read_text()
    graceful = int(re.search(r"^graceful_timeout = (\d+)$", gunicorn_conf, re.M).group(1))
    for setting in ("send_timeout", "proxy_send_timeout"):
        [timeout] = re.findall(rf"^\s*{setting} (\d+)s;", config, re.M)
        assert int(timeout) < graceful, setting


def test_nginx_answers_json_when_gunicorn_is_down(start_nginx):
    nginx = start_nginx(free_port())  # nothing listens there
    answer = http("GET", f"{nginx.url}/api/v1/jobs")
    assert answer.status == 502
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.json["error"]["code"] == "unavailable"
    assert answer.headers["X-Request-ID"]


def test_over_tls_the_dashboard_cookie_is_secure_sign_out_ends_it_and_http_redirects(
    served, start_gunicorn, start_nginx
):
    operator = create_operator(served.store, "Ada")
    server = start_gunicorn(
        workers=1, config={"PROXY_FIX_HOPS": 1, "DASHBOARD": True, "SECRET_KEY": SECRET_KEY}
    )
    nginx = start_nginx(server.port)
    # As a browser on the default port sends it: the name alone, no port.
    browser = {"Host": TEST_HOST}

    form = http("GET", f"{nginx.url}/admin/sign-in", headers=browser)
    assert form.status == 200, form
    assert form.headers[HSTS] == "max-age=31536000"
    session = cookie_of(form, "mealquest_admin")  # the CSRF secret's session
    assert session["secure"]
    token = _CSRF.search(form.body.decode()).group(1)

    signed_in = http(
        "POST",
        f"{nginx.url}/admin/sign-in",
        body=urlencode({"token": operator.token, "csrf_token": token}).encode(),
        headers={
            **browser,
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"mealquest_admin={session.value}",
            # Flask-WTF checks it over HTTPS: the page the form came from.
            "Referer": f"https://{TEST_HOST}/admin/sign-in",
        },
    )
    assert signed_in.status == 303, signed_in.body
    assert signed_in.headers["Location"] == "/admin/"
    cookie = cookie_of(signed_in, "mealquest_admin")
    assert cookie["secure"]
    assert cookie["httponly"]
    assert (cookie["samesite"], cookie["path"]) == ("Strict", "/admin")
    assert HSTS in signed_in.headers

    overview = http(
        "GET",
        f"{nginx.url}/admin/",
        headers={**browser, "Cookie": f"mealquest_admin={cookie.value}"},
    )
    assert overview.status == 200
    assert b"Queue overview" in overview.body

    # Signing out ends the session on the server: the cookie, copied before,
    # opens nothing after (from any worker). The page's form came with the
    # CSRF secret in a new cookie, which the browser keeps in place of the first.
    first, cookie = cookie, cookie_of(overview, "mealquest_admin")
    signed_out = http(
        "POST",
        f"{nginx.url}/admin/sign-out",
        body=urlencode({"csrf_token": _CSRF.search(overview.body.decode()).group(1)}).encode(),
        headers={
            **browser,
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"mealquest_admin={cookie.value}",
            "Referer": f"https://{TEST_HOST}/admin/",
        },
    )
    assert signed_out.status == 303, signed_out.body
    for copy in (first, cookie):
        replayed = http(
            "GET",
            f"{nginx.url}/admin/",
            headers={**browser, "Cookie": f"mealquest_admin={copy.value}"},
        )
        assert replayed.status == 302
        assert replayed.headers["Location"] == "/admin/sign-in"

    # Plain HTTP answers only a redirect to the same place over HTTPS (port 443
    # as shipped), for any method, and reaches no worker.
    requests_before = server.log().count("/admin/?from=http")
    for method in ("GET", "POST"):
        moved = http(method, f"{nginx.http_url}/admin/?from=http", headers=browser)
        assert moved.status == 301, moved
        assert moved.headers["Location"] == f"https://{TEST_HOST}/admin/?from=http"
        assert "Set-Cookie" not in moved.headers
    api = http("GET", f"{nginx.http_url}/api/v1/jobs", token=served.token)
    assert api.status == 301
    assert api.headers["Location"] == "https://127.0.0.1/api/v1/jobs"
    assert server.log().count("/admin/?from=http") == requests_before
