"""A worker whose job pool cannot go on stops gracefully and gunicorn replaces it.

The `give_up` kind's handler makes its pool give up, as the pool does itself
when, say, a handler will not die: the pool logs why, once, and calls the
`on_fatal` the worker gave it.
"""

from __future__ import annotations

import json

import pytest

from tests.support import servers
from tests.support.give_up import REASON
from tests.support.servers import enqueue, final_jobs, http, wait_until

# Also through PgBouncer in transaction mode (see tests/conftest.py).
pytestmark = [pytest.mark.both_databases, pytest.mark.through_pgbouncer]


def test_a_worker_whose_pool_cannot_go_on_is_drained_and_replaced(
    served, start_gunicorn, monkeypatch
):
    monkeypatch.setattr(servers, "APP", "tests.support.give_up_app:app")
    server = start_gunicorn(workers=1)
    (first,) = server.worker_pids()
    job_id = enqueue(server.url, served.token, "give_up", {})

    def replaced() -> bool:
        assert server.popen.poll() is None, f"gunicorn stopped:\n{server.log()}"
        pids = server.worker_pids()
        return len(pids) == 1 and pids[0] != first

    wait_until(replaced, 30, "the worker was not replaced")
    row = wait_until(lambda: final_jobs(served.store, [job_id]), 10, "the job did not finish")
    assert (row[job_id]["status"], json.loads(row[job_id]["result"])) == ("succeeded", {})
    # Stopped like a SIGTERMed worker: its pool drained, then it exited.
    log = server.log()
    assert f" {first} INFO mealquest.serving.worker: worker stopping: " in log
    assert f" {first} INFO mealquest.serving.worker: worker exit: " in log
    assert log.count(f"job pool cannot continue ({REASON})") == 1
    wait_until(
        lambda: server.log().count("job pool started") == 2, 30, "the new worker has no pool"
    )
    answer = http("GET", f"{server.url}/api/v1/jobs", token=served.token)
    assert answer.status == 200, answer
