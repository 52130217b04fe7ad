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
from collections.abc import Callable, Iterator

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


def at_once(count: int, request: Callable[[int], Answer]) -> dict[int, Answer]:
    """`request(n)` for n in range(count), each from a thread of its own, all
    let go together; the answers by n."""
    start = threading.Barrier(count)
    answers: dict[int, Answer] = {}

    def send(number: int) -> None:
        start.wait(timeout=60)
        answers[number] = request(number)

    threads = [threading.Thread(target=send, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return answers


@pytest.mark.parametrize("database", ["pgbouncer"], indirect=True)
def test_sixty_concurrent_imports_through_pgbouncer_all_succeed(served, start_gunicorn, pages):
    for number in range(IMPORTS):
        pages.page(f"/soup-{number}", recipe_page(title=f"Soup {number}"))
    server = start_gunicorn(workers=2, config={"ALLOW_PRIVATE_URLS": True})

    posted = at_once(
        IMPORTS,
        lambda n: http(
            "POST",
            f"{server.url}/api/v1/recipe-imports",
            token=served.token,
            json_body={"url": pages.url(f"/soup-{n}")},
        ),
    )
    assert sorted({answer.status for answer in posted.values()}) == [202], posted
    assert len(posted) == IMPORTS

    def all_final() -> bool:
        statuses = sql.rows(served.store, "SELECT status FROM jobs")
        return all(row["status"] not in ("queued", "running") for row in statuses)

    wait_until(all_final, 120, "the imports did not all finish", interval=0.2)
    polled = at_once(
        IMPORTS,
        lambda n: http("GET", f"{server.url}{posted[n].headers['Location']}", token=served.token),
    )
    outcomes = {n: (poll.status, poll.json.get("status")) for n, poll in polled.items()}
    assert outcomes == {n: (200, "succeeded") for n in range(IMPORTS)}
    titles = {row["title"] for row in sql.rows(served.store, "SELECT title FROM recipes")}
    assert titles == {f"Soup {number}" for number in range(IMPORTS)}
    log = server.log()
    for sign in ("prepared statement", "Traceback", " ERROR ", " 500 ", " 503 "):
        assert sign not in log, log
