"""Recipe pages parse in processes of their own: a page holds no thread, slot or resolver.

The hostile page is the one that made parsing endless in gevent's thread
pool: a run of unclosed tags, on which Python's `html.parser` is quadratic
(6.1 s of CPU at 24 KB; the pages here would take hours). Each test finds
the parser process that runs its page and checks it is gone once the
job's attempt ended, however it ended.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gevent
import pytest
from flask import Flask

from mealquest.households import create_household
from mealquest.jobs.service import get_jobs
from mealquest.model.recipes import ParsedRecipe
from mealquest.recipes import parser_pool
from mealquest.recipes.fetch import Page
from mealquest.recipes.parser_pool import PageUnreadable, ParserPool
from mealquest.recipes.parser_process import NICENESS
from tests.conftest import wait_for
from tests.support.kinds import SECRET
from tests.support.pages import PageServer, recipe_page
from tests.test_recipe_import import FETCH_CONFIG, finished, get_job, import_url

pytestmark = pytest.mark.both_databases

UNREADABLE = "the page could not be read"
# 300 KB of `<a ` never closed.
HOSTILE = b"<html><body>" + b"<a " * 100_000
# A limit no test waits out: the test ends the parse itself.
FOREVER = 600.0


@pytest.fixture
def pages() -> Iterator[PageServer]:
    server = PageServer().start()
    server.page("/hostile", HOSTILE)
    server.page("/soup", recipe_page())
    yield server
    server.stop()


@pytest.fixture
def start(make_app: Callable[..., Flask]) -> Callable[..., Flask]:
    def start(**config: Any) -> Flask:
        app = make_app(
            **{
                "ALLOW_PRIVATE_URLS": True,
                **FETCH_CONFIG,
                "RECIPE_FETCH_MAX_BYTES": 2 * len(HOSTILE),
                **config,
            }
        )
        get_jobs(app).start_pool()
        return app

    return start


def pool_of(app: Flask) -> ParserPool:
    """The test process's parser pool, which the app's jobs use."""
    return parser_pool.shared()


def parsing_process(app: Flask) -> int:
    """The pid of the one parser process at work now (waits for it)."""
    return wait_for(lambda: (pids := pool_of(app).busy_pids()) and len(pids) == 1 and pids[0])


def gone(pid: int) -> bool:
    """Killed and reaped: not even a zombie is left."""
    return not Path(f"/proc/{pid}").exists()


def soft_limits(pid: int) -> dict[str, str]:
    """A process's soft resource limits, by name, as /proc shows them."""
    lines = Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]
    return {line[:26].strip(): line[26:].split()[0] for line in lines}


def free_slots(app: Flask) -> int:
    pool = get_jobs(app).pool
    assert pool is not None
    return pool.slots.free()


def test_a_page_past_the_parse_limit_fails_its_job_and_its_process_is_killed(
    start, pages, auth, logs
):
    app = start(RECIPE_PARSE_SECONDS=1.0, JOB_WORKERS=2)
    client = app.test_client()

    job_id = import_url(client, auth, pages.url(f"/hostile?token={SECRET}"))
    pid = parsing_process(app)
    job = finished(client, auth, job_id)

    assert (job["status"], job["error"]) == ("failed", UNREADABLE)
    assert get_jobs(app).get(job_id).attempt == 1  # not retried: it would only take as long
    wait_for(lambda: gone(pid))
    wait_for(lambda: free_slots(app) == 2)
    assert not pool_of(app).busy_pids()
    [warning] = [
        r.getMessage()
        for r in logs.records
        if getattr(r, "job_id", None) == job_id and r.getMessage().startswith("recipe page")
    ]
    assert warning == "recipe page could not be read: past its time limit (1 s)"
    assert SECRET not in logs.text


def test_another_households_import_succeeds_while_a_hostile_page_parses(start, pages, auth, store):
    app = start(RECIPE_PARSE_SECONDS=FOREVER, JOB_WORKERS=2, JOB_KILL_GRACE_SECONDS=0.2)
    client = app.test_client()
    other = {"Authorization": f"Bearer {create_household(store, 'The Others').token}"}

    hostile = import_url(client, auth, pages.url("/hostile"))
    pid = parsing_process(app)
    normal = finished(client, other, import_url(client, other, pages.url("/soup")))

    assert normal["status"] == "succeeded", normal
    assert normal["result"]["recipe"]["title"] == "Tomato Soup"
    assert get_job(client, auth, hostile)["status"] == "running"
    # Cancelled, the hostile job's handler is killed after the grace, and its process with it.
    assert client.post(f"/api/v1/jobs/{hostile}/cancel", headers=auth).status_code == 202
    wait_for(lambda: get_job(client, auth, hostile)["status"] == "cancelled")
    wait_for(lambda: gone(pid))
    wait_for(lambda: free_slots(app) == 2)


def test_imports_past_their_cap_per_process_stay_queued_while_other_kinds_run(
    start, pages, auth, household
):
    # Each running import may hold a parser process: the cap, not the pool's
    # size, bounds how many this process keeps.
    app = start(
        RECIPE_PARSE_SECONDS=FOREVER,
        JOB_WORKERS=4,
        RECIPE_IMPORTS_PER_PROCESS=2,
        RECIPE_FETCH_MAX_PER_HOST=0,
        RECIPE_FETCH_PER_HOST_PER_MINUTE=0,
        JOB_KILL_GRACE_SECONDS=0.2,
    )
    client, jobs = app.test_client(), get_jobs(app)
    hostile = [import_url(client, auth, pages.url(f"/hostile?n={n}")) for n in range(3)]
    wait_for(lambda: len(pool_of(app).busy_pids()) == 2)
    [waiting] = [
        job_id for job_id in hostile if get_job(client, auth, job_id)["status"] == "queued"
    ]

    # The pool's other slots take other kinds meanwhile.
    other = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    assert finished(client, auth, other)["status"] == "succeeded"
    assert get_job(client, auth, waiting)["status"] == "queued"
    assert len(pool_of(app).busy_pids()) == 2

    # An import that ends gives its place to the one that waited.
    first = next(job_id for job_id in hostile if job_id != waiting)
    assert client.post(f"/api/v1/jobs/{first}/cancel", headers=auth).status_code == 202
    wait_for(lambda: get_job(client, auth, waiting)["status"] == "running")
    for job_id in hostile:
        client.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth)
    wait_for(lambda: all(get_job(client, auth, j)["status"] == "cancelled" for j in hostile))
    wait_for(lambda: not pool_of(app).busy_pids())


def test_a_crashed_parser_process_fails_its_job_the_same_plain_way(start, pages, auth):
    app = start(RECIPE_PARSE_SECONDS=FOREVER)
    client = app.test_client()

    job_id = import_url(client, auth, pages.url("/hostile"))
    pid = parsing_process(app)
    os.kill(pid, signal.SIGSEGV)
    job = finished(client, auth, job_id)

    assert (job["status"], job["error"]) == ("failed", UNREADABLE)
    wait_for(lambda: gone(pid))


def test_a_stopping_pool_kills_the_parse(start, pages, auth):
    app = start(RECIPE_PARSE_SECONDS=FOREVER)
    client = app.test_client()

    job_id = import_url(client, auth, pages.url("/hostile"))
    pid = parsing_process(app)
    pool = get_jobs(app).pool
    assert pool is not None
    pool.stop(timeout=0)

    wait_for(lambda: gone(pid))
    # Interrupted, not failed: the page was never given its time.
    assert get_job(client, auth, job_id)["status"] == "queued"


def test_a_normal_page_is_parsed_by_a_warm_process(start, pages, auth):
    app = start(JOB_WORKERS=1)
    client = app.test_client()

    first = finished(client, auth, import_url(client, auth, pages.url("/soup")))
    # One process for the job slot, and one more ready: both warm once started.
    wait_for(lambda: len(pool_of(app).idle_pids()) == 2 and not pool_of(app).spare_starting)
    started = pool_of(app).started
    second = finished(client, auth, import_url(client, auth, pages.url("/soup")))

    assert (first["status"], second["status"]) == ("succeeded", "succeeded")
    assert pool_of(app).started == started  # no process was started for it
    assert len(pool_of(app).idle_pids()) == 2


def test_while_every_slot_parses_a_warm_process_is_ready_for_the_next(start, pages, auth):
    app = start(RECIPE_PARSE_SECONDS=FOREVER, JOB_WORKERS=1)
    client = app.test_client()
    hostile = import_url(client, auth, pages.url("/hostile"))
    busy = parsing_process(app)

    # The one slot parses; one more process is started beside it, and waits.
    wait_for(lambda: not pool_of(app).spare_starting and pool_of(app).idle_pids())
    assert busy not in pool_of(app).idle_pids()
    assert client.post(f"/api/v1/jobs/{hostile}/cancel", headers=auth).status_code == 202
    wait_for(lambda: gone(busy))
    job = finished(client, auth, import_url(client, auth, pages.url("/soup")))

    assert job["status"] == "succeeded"


def test_a_parser_process_holds_none_of_the_services_descriptors_or_secrets(start, pages, auth):
    app = start(SECRET_KEY="s" * 40, JOB_WORKERS=1)
    client = app.test_client()
    assert finished(client, auth, import_url(client, auth, pages.url("/soup")))["status"] == (
        "succeeded"
    )
    pid = pool_of(app).idle_pids()[0]

    assert sorted(os.listdir(f"/proc/{pid}/fd")) == ["0", "1", "2"]
    environment = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"MEALQUEST" not in environment
    assert b"PROMETHEUS" not in environment
    assert os.getsid(pid) == pid  # its own session: a terminal's Ctrl-C is not for it
    limits = soft_limits(pid)
    assert limits["Max core file size"] == "0"
    assert limits["Max address space"] != "unlimited"
    # Below the service's CPU priority: a page's CPU never delays its heartbeats.
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(ours + NICENESS, 19)


# -- the pool on its own ----------------------------------------------------------------------


@pytest.fixture
def own_pool() -> Iterator[Callable[..., ParserPool]]:
    pools: list[ParserPool] = []

    def make(**options: Any) -> ParserPool:
        pool = ParserPool(keep=1, **options)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.stop()


def hostile_page() -> Page:
    return Page(url="http://recipes.example/hostile", content_type="text/html", body=HOSTILE)


def test_a_parse_past_its_cpu_limit_is_unreadable(own_pool):
    pool = own_pool()
    with pytest.raises(PageUnreadable) as raised:
        pool.parse(hostile_page(), seconds=FOREVER, cpu_seconds=1)
    assert raised.value.reason == "its parser process past its CPU time limit"
    assert not pool.busy_pids()


def cpu_seconds_used(pid: int) -> float:
    """A process's CPU time so far (user and system), as /proc counts it."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_parse_meets_its_wall_clock_limit_before_its_cpu_limit(own_pool):
    # The process's own CPU limit is a backstop for a parent that cannot see
    # to it: at least a second past the wall-clock limit, so that a parent
    # whose timer fires a little late under load still ends the parse itself
    # (whole seconds of CPU from what the process had used made the two race).
    pool = own_pool()
    soup = Page(url="http://recipes.example/soup", content_type="text/html", body=recipe_page())
    assert pool.parse(soup, seconds=FOREVER) is not None
    [pid] = pool.idle_pids()
    used = cpu_seconds_used(pid)
    soup_limit = soft_limits(pid)["Max cpu time"]  # FOREVER's: past what this test waits
    waiter = gevent.spawn(pool.parse, hostile_page(), seconds=5)
    limit = wait_for(lambda: (soft := soft_limits(pid)["Max cpu time"]) != soup_limit and soft)
    waiter.kill(gevent.Timeout)
    wait_for(lambda: gone(pid))
    assert int(limit) >= used + 5 + 1


def test_a_parse_past_its_memory_limit_is_unreadable(own_pool):
    # Room for little more than the libraries: 1 MB of tags makes a far larger tree.
    pool = own_pool(memory_headroom=32 * 1024 * 1024)
    page = Page(
        url="http://recipes.example/big", content_type="text/html", body=b"<b>x</b>" * 125_000
    )
    with pytest.raises(PageUnreadable) as raised:
        pool.parse(page, seconds=FOREVER)
    # Always the parent's kill, never an allocation failing at a cap: at one
    # in about ten such parses CPython's unwinding of the MemoryError spun.
    assert raised.value.reason == "its parser process past its memory limit"
    assert not pool.busy_pids()
    # The next page gets a new process, and parses.
    soup = Page(url="http://recipes.example/soup", content_type="text/html", body=recipe_page())
    assert pool.parse(soup, seconds=FOREVER) == ParsedRecipe(
        title="Tomato Soup",
        ingredients=["4 tomatoes", "1 onion", "500 ml stock"],
        instructions=["Chop the tomatoes and the onion.", "Simmer in the stock for an hour."],
        yields="4 servings",
        total_time_minutes=65,
        image_url="http://recipes.example/images/soup.jpg",
        author="Ann Cook",
    )


def test_a_waiter_stopped_from_outside_kills_the_process(own_pool):
    # As the job's own timeout or a cancel would: any exception in the waiting greenlet.
    pool = own_pool()
    waiter = gevent.spawn(pool.parse, hostile_page(), seconds=FOREVER)
    pid = wait_for(lambda: pool.busy_pids() and pool.busy_pids()[0])
    waiter.kill(gevent.Timeout)
    assert waiter.dead
    wait_for(lambda: gone(pid))
    assert not pool.busy_pids()
