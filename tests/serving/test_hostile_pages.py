"""A page that parses for hours, through real gunicorn (a monkey-patched gevent worker).

One worker with two job slots: the hostile page's parse runs in a parser
process that the worker waits on cooperatively, so the worker keeps
answering, another household's import runs beside it, and at the parse
limit the process is killed and the job fails with its plain message.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mealquest.households import create_household
from tests.support.pages import PageServer, recipe_page
from tests.support.servers import children, http, job, process_state, wait_until

pytestmark = pytest.mark.both_databases

HOSTILE = b"<html><body>" + b"<a " * 100_000
PARSE_SECONDS = 3.0


@pytest.fixture
def pages() -> Iterator[PageServer]:
    server = PageServer().start()
    server.page("/hostile", HOSTILE)
    server.page("/soup", recipe_page())
    yield server
    server.stop()


def parser_processes(worker: int) -> dict[int, str]:
    """The worker's parser processes, with their state (`R` running, `S` waiting)."""
    found = {}
    for pid in children(worker):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        state = process_state(pid)
        if state is not None and b"parser_process" in command:
            found[pid] = state
    return found


def test_a_hostile_page_fails_at_its_limit_while_the_worker_serves_another_household(
    served, start_gunicorn, pages
):
    server = start_gunicorn(
        workers=1,
        config={
            "ALLOW_PRIVATE_URLS": True,
            "JOB_WORKERS": 2,
            "RECIPE_PARSE_SECONDS": PARSE_SECONDS,
            "RECIPE_FETCH_MAX_BYTES": 2 * len(HOSTILE),
        },
    )
    [worker] = server.worker_pids()
    other = create_household(served.store, "The Others").token

    def post(token: str, url: str) -> str:
        answer = http(
            "POST", f"{server.url}/api/v1/recipe-imports", token=token, json_body={"url": url}
        )
        assert answer.status == 202, answer
        return answer.json["id"]

    hostile = post(served.token, pages.url("/hostile"))
    running = wait_until(
        lambda: [pid for pid, state in parser_processes(worker).items() if state == "R"],
        60,
        "no parser process took the hostile page",
    )
    # The worker's event loop is free while its parser process burns CPU.
    assert http("GET", f"{server.url}/healthz", timeout=10).status == 200
    normal = post(other, pages.url("/soup", host="localhost"))  # resolved by gevent's resolver

    def final(job_id: str) -> dict | None:
        row = job(served.store, job_id)
        return row if row["status"] in ("succeeded", "failed") else None

    normal_row = wait_until(lambda: final(normal), 60, "the other household's import did not end")
    hostile_row = wait_until(lambda: final(hostile), 60, "the hostile import did not end")

    assert (normal_row["status"], normal_row["error"]) == ("succeeded", None)
    assert (hostile_row["status"], hostile_row["error"]) == ("failed", "the page could not be read")
    assert hostile_row["attempt"] == 1
    wait_until(lambda: not set(running) & set(parser_processes(worker)), 30, "the process lives on")
    assert server.worker_pids() == [worker]  # nothing killed the worker
    assert "recipe page could not be read: past its time limit (3 s)" in server.log()
