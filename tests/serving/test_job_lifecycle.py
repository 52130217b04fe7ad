"""The job lifecycle through real gunicorn workers: concurrent repeats of one
keyed request, landing on different worker processes, make one job; a cancel
answered by any worker stops a job wherever it runs."""

from __future__ import annotations

import json
import threading

import pytest

from tests.support import sql, transitions
from tests.support.servers import enqueue, final_jobs, http, wait_until

# Also through PgBouncer in transaction mode (see tests/conftest.py).
pytestmark = [pytest.mark.both_databases, pytest.mark.through_pgbouncer]

REPEATS = 24


def test_concurrent_repeats_through_gunicorn_make_one_job(served, start_gunicorn):
    server = start_gunicorn()
    barrier = threading.Barrier(REPEATS)
    answers = []

    def post() -> None:
        barrier.wait()
        answers.append(
            http(
                "POST",
                f"{server.url}/api/v1/test-jobs",
                token=served.token,
                json_body={"kind": "succeed", "payload": {"value": 7}},
                headers={"Idempotency-Key": "order-7"},
            )
        )

    threads = [threading.Thread(target=post) for _ in range(REPEATS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    statuses = sorted(answer.status for answer in answers)
    assert statuses == [200] * (REPEATS - 1) + [202], statuses
    [job_id] = {answer.json["id"] for answer in answers}
    assert {answer.headers["Location"] for answer in answers} == {f"/api/v1/jobs/{job_id}"}
    assert sql.scalar(served.store, "SELECT count(*) AS n FROM jobs") == 1
    rows = wait_until(lambda: final_jobs(served.store, [job_id]), 60, "the job did not end")
    assert (rows[job_id]["status"], rows[job_id]["attempt"]) == ("succeeded", 1)

    # Another body with the key is refused, whichever worker answers.
    reused = http(
        "POST",
        f"{server.url}/api/v1/test-jobs",
        token=served.token,
        json_body={"kind": "succeed", "payload": {"value": 8}},
        headers={"Idempotency-Key": "order-7"},
    )
    assert (reused.status, reused.json["error"]["code"]) == (422, "idempotency_key_reused")


def test_a_cancel_answered_by_any_worker_stops_the_job_where_it_runs(served, start_gunicorn, gates):
    transitions.install(served.store, served.database)
    server = start_gunicorn(config={"JOB_KILL_GRACE_SECONDS": 0.3})
    payload = {"url": gates.url("held"), "log": None}
    ids = [enqueue(server.url, served.token, "pid_gate", payload) for _ in range(4)]
    wait_until(lambda: gates.arrivals("held") == len(ids), 60, "jobs did not start")

    for job_id in ids:
        answer = http("POST", f"{server.url}/api/v1/jobs/{job_id}/cancel", token=served.token)
        assert (answer.status, answer.json["status"]) == (202, "running"), answer

    rows = wait_until(lambda: final_jobs(served.store, ids), 60, "jobs were not cancelled")
    for row in rows.values():
        assert (row["status"], row["error"]) == ("cancelled", None)
        # Its last partial result stays: the worker that ran it.
        assert json.loads(row["result"])["pid"] in server.worker_pids()
    transitions.assert_one_final_state_each(served.store, ids)
    assert gates.arrivals("held") == len(ids)  # none ran again
    again = http("POST", f"{server.url}/api/v1/jobs/{ids[0]}/cancel", token=served.token)
    assert (again.status, again.json["status"]) == (200, "cancelled")
