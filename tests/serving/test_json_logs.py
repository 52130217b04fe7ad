"""`MEALQUEST_LOG_FORMAT=json` through real gunicorn: every line its processes
write (gunicorn's own, its access log, the service's) is one JSON object,
under concurrent requests and jobs; a job's lines carry its id, kind and
attempt, an access line its request id; a client's forged header comes back
whole as one field; and no secret is in a line below ERROR, as in text."""

from __future__ import annotations

import json
import threading
import uuid

import pytest

from tests.serving.test_access_log import FORGERIES, send, status_of
from tests.support.kinds import SECRET
from tests.support.servers import enqueue, final_jobs, http, wait_until

pytestmark = pytest.mark.sqlite_only("the log lines' shape is the same whatever the database")

LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


def records(log: str) -> list[dict]:
    """Every line of the log as JSON (failing on the first that is not)."""
    parsed = []
    for line in log.splitlines():
        try:
            parsed.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    return parsed


def test_every_line_is_one_json_object_under_load(served, start_gunicorn):
    server = start_gunicorn(workers=2, config={"LOG_FORMAT": "json"})

    enqueued: list[str] = []

    def load() -> None:
        for _ in range(25):
            http("GET", f"{server.url}/healthz")
            enqueued.append(enqueue(server.url, served.token, "succeed", {"value": 1}))

    clients = [threading.Thread(target=load) for _ in range(4)]
    for client in clients:
        client.start()
    forged = {}
    for value in FORGERIES.values():
        request_id = uuid.uuid4().hex
        answer = send(
            server.port,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + f"X-Request-ID: {request_id}\r\nUser-Agent: ".encode()
            + value
            + b"\r\n\r\n",
        )
        if status_of(answer) != 400:  # gunicorn refuses control characters itself
            forged[request_id] = value
    secret_job = enqueue(server.url, served.token, "raise_secret_error", {"secret": SECRET})
    for client in clients:
        client.join(120)
    wait_until(
        lambda: final_jobs(served.store, [*enqueued, secret_job]), 60, "the jobs did not end"
    )
    # A job's line is written once its outcome is: wait for the last ones too.
    wait_until(
        lambda: server.log().count('"message": "job succeeded"') >= 100,
        60,
        "a job's success was not logged",
    )
    wait_until(
        lambda: all(request_id in server.log() for request_id in forged),
        30,
        "a request has no access line",
    )

    lines = records(server.log())
    assert {line["level"] for line in lines} <= LEVELS
    assert all({"time", "level", "logger", "message", "pid"} <= set(line) for line in lines)
    access = {line["request_id"]: line for line in lines if line["logger"] == "gunicorn.access"}
    assert len(access) >= 200  # 100 health checks, 100 enqueues and the forged ones
    for request_id, value in forged.items():
        # WSGI hands header bytes on as latin-1: the field is exactly what was sent.
        assert access[request_id]["user_agent"] == value.decode("latin-1")
        assert access[request_id]["message"] == "GET /healthz HTTP/1.1"
    succeeded = [line for line in lines if line["message"] == "job succeeded"]
    assert len(succeeded) == 100
    assert all({"job_id", "kind", "attempt"} <= set(line) for line in succeeded)
    assert any(line.get("job_id") == secret_job for line in lines)
    below_error = [line for line in lines if line["level"] in {"DEBUG", "INFO", "WARNING"}]
    assert not [line for line in below_error if SECRET in json.dumps(line)]
    assert any(
        line["logger"].startswith("gunicorn") and "Booting" in line["message"] for line in lines
    )
