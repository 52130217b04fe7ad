"""Idempotency keys through real gunicorn workers: concurrent repeats of one
request, landing on different worker processes, make one job."""

from __future__ import annotations

import threading

import pytest

from tests.support import sql
from tests.support.servers import final_jobs, http, wait_until

pytestmark = pytest.mark.both_databases

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
