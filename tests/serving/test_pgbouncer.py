"""Recipe imports through real gunicorn on PostgreSQL behind a real PgBouncer in
transaction mode, with `MEALQUEST_PG_POOLER=transaction` (the `pgbouncer`
database sets it, and with it LISTEN off): many at once, from posts and
polls to the stored recipes, with no error on the way.

Without the setting, psycopg's prepared statements meet other server
connections: `prepared statement "_pg3_0" does not exist`, `... already
exists`, another statement run with these parameters; in the service, 500s.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.support import sql
from tests.support.pages import PageServer, recipe_page
from tests.support.servers import Answer, http, wait_until

IMPORTS = 60


@pytest.fixture
def pages() -> Iterator[PageServer]:
    server = PageServer().start()
    yield server
    server.stop()


@pytest.mark.parametrize("database", ["pgbouncer"], indirect=True)
def test_sixty_concurrent_imports_through_pgbouncer_all_succeed(served, start_gunicorn, pages):
    for number in range(IMPORTS):
        pages.page(f"/soup-{number}", recipe_page(title=f"Soup {number}"))
    server = start_gunicorn(workers=2, config={"ALLOW_PRIVATE_URLS": True})
    start = threading.Barrier(IMPORTS)
    posted: dict[int, Answer] = {}
    polled: dict[int, Answer] = {}

    def import_and_poll(number: int) -> None:
        start.wait(timeout=60)
        answer = http(
            "POST",
            f"{server.url}/api/v1/recipe-imports",
            token=served.token,
            json_body={"url": pages.url(f"/soup-{number}")},
        )
        posted[number] = answer
        if answer.status != 202:
            return

        def final() -> Answer | None:
            poll = http("GET", f"{server.url}{answer.headers['Location']}", token=served.token)
            done = poll.status != 200 or poll.json["status"] not in ("queued", "running")
            return poll if done else None

        polled[number] = wait_until(final, 90, f"import {number} did not finish", interval=0.1)

    threads = [threading.Thread(target=import_and_poll, args=(n,)) for n in range(IMPORTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    assert sorted({answer.status for answer in posted.values()}) == [202], posted
    assert len(posted) == IMPORTS
    outcomes = {n: (poll.status, poll.json.get("status")) for n, poll in polled.items()}
    assert set(outcomes.values()) == {(200, "succeeded")}, outcomes
    assert len(outcomes) == IMPORTS
    titles = {row["title"] for row in sql.rows(served.store, "SELECT title FROM recipes")}
    assert titles == {f"Soup {number}" for number in range(IMPORTS)}
    log = server.log()
    for sign in ("prepared statement", "Traceback", " ERROR ", " 500 ", " 503 "):
        assert sign not in log, log
