"""A web-only worker (`MEALQUEST_JOB_POOL_IN_WEB=false`) whose store can never
write again is replaced, as a pool's worker is: it does not answer 503 forever."""

from __future__ import annotations

import pytest

from tests.support import servers
from tests.support.servers import http, wait_until

pytestmark = pytest.mark.both_databases


@pytest.mark.sqlite_only("the writer thread is SQLite's")
def test_a_web_only_worker_whose_writer_died_is_replaced(served, start_gunicorn, monkeypatch):
    monkeypatch.setattr(servers, "APP", "tests.support.broken_writer_app:app")
    server = start_gunicorn(workers=1, config={"JOB_POOL_IN_WEB": False})
    (first,) = server.worker_pids()

    assert http("POST", f"{server.url}/test/break-writer").status == 200

    def replaced() -> bool:
        assert server.popen.poll() is None, f"gunicorn stopped:\n{server.log()}"
        pids = server.worker_pids()
        return len(pids) == 1 and pids[0] != first

    wait_until(replaced, 30, "the worker was not replaced")
    assert "the store can no longer write; restarting this web worker" in server.log()
    wait_until(
        lambda: http("GET", f"{server.url}/healthz").status == 200,
        30,
        "the new worker does not write",
    )
    posted = http(
        "POST",
        f"{server.url}/api/v1/recipe-imports",
        token=served.token,
        json_body={"url": "https://example.test/soup"},
    )
    assert posted.status == 202, posted
