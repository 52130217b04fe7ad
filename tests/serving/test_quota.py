"""The per-household quota under concurrent posts, through real gunicorn on both
databases: the check and the insert are one transaction, so exactly the
quota's worth of 20 simultaneous posts is accepted, whichever worker and
connection each lands on."""

from __future__ import annotations

import threading

import pytest

from tests.support import sql
from tests.support.servers import Answer, http

# Also through PgBouncer in transaction mode (see tests/conftest.py).
pytestmark = [pytest.mark.both_databases, pytest.mark.through_pgbouncer]

QUOTA = 5
POSTS = 20


def test_twenty_concurrent_posts_against_a_quota_of_five_make_exactly_five_jobs(
    served, start_gunicorn
):
    # Web-only workers: every job stays queued, so the quota is all posts can fill.
    server = start_gunicorn(
        workers=2, config={"JOB_MAX_PENDING_PER_HOUSEHOLD": QUOTA, "JOB_POOL_IN_WEB": False}
    )
    start = threading.Barrier(POSTS)
    answers: list[Answer] = []

    def post(number: int) -> None:
        start.wait(timeout=60)
        answers.append(
            http(
                "POST",
                f"{server.url}/api/v1/recipe-imports",
                token=served.token,
                json_body={"url": f"https://www.example.com/soup-{number}"},
                timeout=60,
            )
        )

    threads = [threading.Thread(target=post, args=(number,)) for number in range(POSTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)

    statuses = sorted(answer.status for answer in answers)
    assert statuses == [202] * QUOTA + [429] * (POSTS - QUOTA), statuses
    for answer in answers:
        if answer.status == 429:
            assert answer.json["error"]["code"] == "too_many_jobs"
            assert int(answer.headers["Retry-After"]) >= 1
    accepted = {answer.json["id"] for answer in answers if answer.status == 202}
    stored = {row["id"] for row in sql.rows(served.store, "SELECT id FROM jobs")}
    assert stored == accepted
