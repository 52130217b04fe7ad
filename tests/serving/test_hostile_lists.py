"""Shopping lists whose lines are slow to read, through real gunicorn (a
monkey-patched gevent worker): another household's import and reads go on.

A list's lines are read in parser processes, never in gevent's thread pool,
whose threads the DNS resolver shares: twelve lists there held every thread,
and another household's import, whose page's name had to be looked up,
failed "the page took too long to answer". Cancelled, a list's process is
killed at once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mealquest.households import create_household
from tests.serving.test_hostile_pages import parser_processes
from tests.support import sql
from tests.support.pages import PageServer, recipe_page
from tests.support.servers import cpu_seconds, http, job, wait_until
from tests.test_shopping_list import SLOW_LINES

pytestmark = pytest.mark.both_databases

# More lists than gevent's thread pool has threads (10): there, they held them all.
LISTS = 12
# Four pages a list: 1,200 lines, about 18 s of the model's CPU.
PAGES = 4
# CPU a parser process has used past which it is reading a list: more than a
# start (about 1.3 s) and the pages' parses (a tenth of a second each) take.
READING_CPU_SECONDS = 3.0
PER_PAGE = 300


@pytest.fixture
def pages() -> Iterator[PageServer]:
    server = PageServer().start()
    for index in range(PAGES):
        lines = SLOW_LINES[index * PER_PAGE : (index + 1) * PER_PAGE]
        server.page(f"/slow/{index}", recipe_page(f"Salted {index}", recipeIngredient=lines))
    server.page("/soup", recipe_page())
    yield server
    server.stop()


def test_slow_lists_leave_another_households_import_and_reads_alone(served, start_gunicorn, pages):
    server = start_gunicorn(
        workers=1,
        config={
            "ALLOW_PRIVATE_URLS": True,
            "JOB_WORKERS": 32,
            "RECIPE_FETCH_MAX_PER_HOST": 0,
            "RECIPE_FETCH_PER_HOST_PER_MINUTE": 0,
            "RECIPE_FETCH_MAX_BYTES": 1024 * 1024,
        },
    )
    [worker] = server.worker_pids()
    other = create_household(served.store, "The Others").token
    urls = [pages.url(f"/slow/{index}") for index in range(PAGES)]
    lists = []
    for _ in range(LISTS):
        answer = http(
            "POST",
            f"{server.url}/api/v1/recipe-imports/batch",
            token=served.token,
            json_body={"urls": urls, "shopping_list": True},
        )
        assert answer.status == 202, answer
        lists.append(answer.json["shopping_list_job_id"])
    # Every page is parsed, and the lists run (as many as a process runs at
    # once): the parser processes at work now read lists.
    wait_until(
        lambda: (
            not sql.scalar(
                served.store,
                "SELECT count(*) FROM jobs WHERE kind = 'recipe_import'"
                " AND status NOT IN ('succeeded', 'failed')",
            )
        ),
        120,
        "the pages were not all imported",
    )
    wait_until(
        lambda: any(job(served.store, job_id)["status"] == "running" for job_id in lists),
        60,
        "no list started",
    )

    def reading() -> list[int]:
        """The parser processes reading a list now: at work, and past what a
        start or the pages' parses cost (a spare starting is at work too)."""
        return [
            pid
            for pid, state in parser_processes(worker).items()
            if state == "R" and (cpu_seconds(pid) or 0.0) > READING_CPU_SECONDS
        ]

    answer = http(
        "POST",
        f"{server.url}/api/v1/recipe-imports",
        token=other,
        json_body={"url": pages.url("/soup", host="localhost")},  # gevent's resolver
    )
    assert answer.status == 202, answer
    imported = wait_until(
        lambda: (
            (row := job(served.store, answer.json["id"]))["status"] in ("succeeded", "failed")
            and row
        ),
        120,
        "the other household's import did not end",
    )
    assert (imported["status"], imported["error"]) == ("succeeded", None)
    read = http("GET", f"{server.url}/api/v1/jobs/{answer.json['id']}", token=other, timeout=10)
    assert read.status == 200
    assert [job(served.store, job_id)["status"] for job_id in lists].count("running") >= 1

    lists_read_by = wait_until(reading, 60, "no parser process reads a list")
    for job_id in lists:
        cancel = http("POST", f"{server.url}/api/v1/jobs/{job_id}/cancel", token=served.token)
        assert cancel.status in (200, 202), cancel
    wait_until(
        lambda: all(job(served.store, job_id)["status"] == "cancelled" for job_id in lists),
        60,
        "the lists were not cancelled",
    )
    # Their processes are killed, not left reading.
    wait_until(
        lambda: not set(lists_read_by) & set(parser_processes(worker)), 30, "a list reads on"
    )
    assert server.worker_pids() == [worker]
