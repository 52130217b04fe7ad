"""The `recipe_import` kind end to end: the API, the real pool, a real HTTP server on loopback."""

from __future__ import annotations

import email.utils
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from mealquest.clock import from_text
from mealquest.extensions import get_store
from mealquest.jobs.service import get_jobs
from mealquest.model.jobs import Status
from tests.conftest import wait_for
from tests.support import sql
from tests.support.kinds import SECRET
from tests.support.pages import (
    MICRODATA_PAGE,
    NO_RECIPE_PAGE,
    PageServer,
    Reply,
    recipe_page,
)

pytestmark = pytest.mark.both_databases

# Fast retries, so failures that retry finish in a moment. The time limits are
# deadlines for a loaded machine (a held page is released well within them);
# the test of the limit sets its own.
FETCH_CONFIG = {
    "RECIPE_IMPORT_RETRY_SECONDS": 0.01,
    "RECIPE_FETCH_CONNECT_TIMEOUT_SECONDS": 30.0,
    "RECIPE_FETCH_TIMEOUT_SECONDS": 60.0,
    "RECIPE_FETCH_MAX_BYTES": 64 * 1024,
}
REFUSED = "that address is not allowed"


@pytest.fixture
def pages() -> Iterator[PageServer]:
    server = PageServer().start()
    yield server
    server.stop()


@pytest.fixture
def start(make_app: Callable[..., Flask]) -> Callable[..., Flask]:
    """An app with the recipe kind and a running pool; private URLs allowed unless told."""

    def start(**config: Any) -> Flask:
        app = make_app(**{"ALLOW_PRIVATE_URLS": True, **FETCH_CONFIG, **config})
        get_jobs(app).start_pool()
        return app

    return start


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every record of the `mealquest` logger (which does not propagate), DEBUG up."""
    logger = logging.getLogger("mealquest")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG)
    yield caplog
    logger.removeHandler(caplog.handler)


def import_url(client: FlaskClient, auth: dict[str, str], url: str) -> str:
    response = client.post("/api/v1/recipe-imports", json={"url": url}, headers=auth)
    assert response.status_code == 202, response.get_json()
    return response.get_json()["id"]


def get_job(client: FlaskClient, auth: dict[str, str], job_id: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/jobs/{job_id}", headers=auth)
    assert response.status_code == 200
    return response.get_json()


def finished(
    client: FlaskClient, auth: dict[str, str], job_id: str, timeout: float = 60.0
) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        job = get_job(client, auth, job_id)
        return job if job["status"] in ("succeeded", "failed") else None

    return wait_for(done, timeout=timeout)


def attempts(app: Flask, job_id: str) -> int:
    job = get_jobs(app).get(job_id)
    assert job is not None
    return job.attempt


# -- importing ----------------------------------------------------------------------------


def test_json_ld_page_imports_into_a_stored_recipe(start, pages, auth):
    app = start()
    client = app.test_client()
    pages.page("/soup", recipe_page())
    url = pages.url("/soup?ref=newsletter")

    job = finished(client, auth, import_url(client, auth, url))

    assert job["status"] == "succeeded", job
    assert job["error"] is None
    recipe = job["result"]["recipe"]
    assert job["result"]["recipe_id"] == recipe["id"]
    assert recipe == {
        "id": recipe["id"],
        "job_id": job["id"],
        "title": "Tomato Soup",
        "ingredients": ["4 tomatoes", "1 onion", "500 ml stock"],
        "instructions": ["Chop the tomatoes and the onion.", "Simmer in the stock for an hour."],
        "yields": "4 servings",
        "total_time_minutes": 65,
        "image_url": pages.url("/images/soup.jpg"),
        "source_url": pages.url("/soup"),  # the query may carry a token: never echoed
        "author": "Ann Cook",
        "created_at": recipe["created_at"],
    }
    stored = client.get(f"/api/v1/recipes/{recipe['id']}", headers=auth)
    assert stored.status_code == 200
    assert stored.get_json() == recipe
    assert pages.hits["/soup"] == 1
    assert "MealQuest" in pages.requests[0]["user-agent"]


def test_text_neither_database_can_store_is_imported_replaced(start, pages, auth):
    # A JSON "\\u0000" decodes to NUL (PostgreSQL's text refuses it) and a
    # "\\udcff" to a lone surrogate (not UTF-8): the page still imports, with
    # U+FFFD in their place, rather than failing every attempt's write.
    app = start()
    client = app.test_client()
    page = recipe_page(
        title="Soup\x00 of the \udcffday",
        recipeIngredient=["4\x00tomatoes", "\udcff"],
        author={"@type": "Person", "name": "Ann\ud83d"},
    )
    pages.page("/soup", page)

    job = finished(client, auth, import_url(client, auth, pages.url("/soup")))

    assert job["status"] == "succeeded", job
    recipe = job["result"]["recipe"]
    assert (recipe["title"], recipe["ingredients"], recipe["author"]) == (
        "Soup\ufffd of the \ufffdday",
        ["4\ufffdtomatoes", "\ufffd"],
        "Ann\ufffd",
    )
    assert client.get(f"/api/v1/recipes/{recipe['id']}", headers=auth).get_json() == recipe
    assert attempts(app, job["id"]) == 1


@pytest.mark.parametrize("image", ["/soup\x00.jpg", "/soup\udcff.jpg"], ids=["nul", "surrogate"])
def test_an_image_that_is_no_address_is_left_out_of_the_recipe(start, pages, auth, image):
    app = start()
    client = app.test_client()
    pages.page("/soup", recipe_page(image=[image]))

    job = finished(client, auth, import_url(client, auth, pages.url("/soup")))

    assert job["status"] == "succeeded", job
    assert job["result"]["recipe"]["title"] == "Tomato Soup"
    assert job["result"]["recipe"]["image_url"] is None
    assert attempts(app, job["id"]) == 1


def test_microdata_page_imports(start, pages, auth):
    app = start()
    client = app.test_client()
    pages.page("/pancakes", MICRODATA_PAGE)

    job = finished(client, auth, import_url(client, auth, pages.url("/pancakes")))

    assert job["status"] == "succeeded", job
    recipe = client.get(f"/api/v1/recipes/{job['result']['recipe_id']}", headers=auth).get_json()
    assert recipe["title"] == "Pancakes"
    assert recipe["ingredients"] == ["2 eggs", "1 cup flour"]
    assert recipe["instructions"] == ["Whisk everything, then fry."]
    assert recipe["yields"] == "8 pancakes"
    assert recipe["total_time_minutes"] == 20
    assert recipe["image_url"] == "https://images.example/pancakes.jpg"
    assert recipe["author"] == "Bob Baker"


def test_a_url_with_non_ascii_characters_is_fetched_percent_encoded(start, pages, auth):
    app = start()
    client = app.test_client()
    pages.page("/soupe-%C3%A0-l-oignon", recipe_page("Soupe à l'oignon"))

    job = finished(client, auth, import_url(client, auth, pages.url("/soupe-à-l-oignon")))

    assert job["status"] == "succeeded", job
    assert job["result"]["recipe"]["title"] == "Soupe à l'oignon"
    assert pages.hits["/soupe-%C3%A0-l-oignon"] == 1


def test_partial_result_is_seen_while_a_slow_page_is_fetched(start, pages, auth):
    app = start()
    client = app.test_client()
    release = threading.Event()
    pages.add("/slow", Reply(body=recipe_page("Slow Stew"), stall_after=10, stall=release))
    job_id = import_url(client, auth, pages.url("/slow"))

    wait_for(lambda: get_job(client, auth, job_id)["result"] == {"stage": "fetching"})
    # The stage is published before the request is sent: wait for the server to hold it.
    wait_for(lambda: pages.hits["/slow"] == 1)
    fetching = get_job(client, auth, job_id)
    assert (fetching["status"], fetching["result"]) == ("running", {"stage": "fetching"})
    release.set()

    job = finished(client, auth, job_id)
    assert job["status"] == "succeeded", job
    assert job["result"]["recipe"]["title"] == "Slow Stew"


def test_redirects_are_followed_up_to_the_cap(start, pages, auth):
    app = start()
    client = app.test_client()
    pages.page("/recipe", recipe_page())
    for hop in range(1, 6):
        pages.redirect(f"/hop{hop}", f"/hop{hop + 1}" if hop < 5 else "/recipe")
    pages.redirect("/hop0", "/hop1")

    ok = finished(client, auth, import_url(client, auth, pages.url("/hop1")))  # 5 redirects
    too_many = finished(client, auth, import_url(client, auth, pages.url("/hop0")))  # 6

    assert ok["status"] == "succeeded", ok
    assert too_many["status"] == "failed"
    assert too_many["error"] == "the page redirected too many times"
    assert pages.hits["/recipe"] == 1


def test_503_then_200_succeeds_on_the_second_attempt(start, pages, auth):
    app = start()
    client = app.test_client()
    pages.add("/flaky", Reply(status=503, body=b"busy"), Reply(body=recipe_page()))

    job_id = import_url(client, auth, pages.url("/flaky"))
    job = finished(client, auth, job_id)

    assert job["status"] == "succeeded", job
    assert pages.hits["/flaky"] == 2
    assert attempts(app, job_id) == 2


# -- a site that asks to be asked later ----------------------------------------------------


def test_a_page_answering_429_with_retry_after_is_fetched_again_then_spending_no_attempt(
    start, pages, auth
):
    app = start()
    client = app.test_client()
    pages.add("/busy", Reply(status=429, headers={"Retry-After": "2"}), Reply(body=recipe_page()))

    job_id = import_url(client, auth, pages.url("/busy"))
    job = finished(client, auth, job_id)

    assert (job["status"], job["attempt"]) == ("succeeded", 1), job
    assert pages.hits["/busy"] == 2
    stored = get_jobs(app).get(job_id)
    assert stored.snoozes == 1
    # Its due time was put off by the two seconds the site asked for.
    assert from_text(stored.run_at) - from_text(stored.created_at) >= timedelta(seconds=2)


def test_a_retry_after_date_is_honoured_and_a_long_one_is_cut_to_ten_minutes(start, pages, auth):
    app = start()
    client = app.test_client()
    soon = email.utils.format_datetime(datetime.now(UTC) - timedelta(seconds=5), usegmt=True)
    pages.add("/soon", Reply(status=503, headers={"Retry-After": soon}), Reply(body=recipe_page()))
    pages.add("/later", Reply(status=429, headers={"Retry-After": "86400"}))

    # A date already past: at once again, no attempt spent.
    done = finished(client, auth, import_url(client, auth, pages.url("/soon")))
    assert (done["status"], done["attempt"]) == ("succeeded", 1), done
    later = import_url(client, auth, pages.url("/later"))
    jobs = get_jobs(app)
    job = wait_for(lambda: (found := jobs.get(later)).snoozes == 1 and found)

    assert (job.status, job.attempt, job.error) == (Status.QUEUED, 0, None)
    put_off = from_text(job.run_at) - from_text(job.started_at)
    assert timedelta(minutes=10) <= put_off < timedelta(minutes=11)
    jobs.cancel(later)


@pytest.mark.parametrize(
    ("status", "retry_after", "error", "tries"),
    [
        pytest.param(429, None, "the page could not be fetched (HTTP 429)", 1, id="429-alone"),
        pytest.param(429, "soon", "the page could not be fetched (HTTP 429)", 1, id="unreadable"),
        pytest.param(503, None, "the page could not be fetched (HTTP 503)", 3, id="503-alone"),
    ],
)
def test_without_a_readable_retry_after_those_answers_fail_as_before(
    start, pages, auth, status, retry_after, error, tries
):
    app = start()
    client = app.test_client()
    headers = {"Retry-After": retry_after} if retry_after else {}
    pages.add("/no", Reply(status=status, headers=headers, body=b"<p>try later " + SECRET.encode()))

    job = finished(client, auth, import_url(client, auth, pages.url("/no")))

    assert (job["status"], job["error"], job["attempt"]) == ("failed", error, tries)
    assert pages.hits["/no"] == tries
    assert get_jobs(app).get(job["id"]).snoozes == 0


# -- refusing private addresses (the default) ---------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        pytest.param("127.0.0.1", id="loopback"),
        pytest.param("localhost", id="name-resolving-to-loopback"),
        pytest.param("[::ffff:127.0.0.1]", id="ipv4-mapped-ipv6-loopback"),
        pytest.param("2130706433", id="decimal-loopback"),
    ],
)
def test_private_addresses_are_refused_without_contacting_them(start, pages, auth, host):
    app = start(ALLOW_PRIVATE_URLS=False)
    client = app.test_client()
    pages.page("/recipe", recipe_page())

    job_id = import_url(client, auth, pages.url("/recipe", host=host))
    job = finished(client, auth, job_id)

    assert job["status"] == "failed"
    assert job["error"] == REFUSED
    assert attempts(app, job_id) == 1  # not retried
    assert pages.total_hits == 0


def test_cloud_metadata_address_is_refused(start, auth):
    app = start(ALLOW_PRIVATE_URLS=False)
    client = app.test_client()

    job = finished(
        client, auth, import_url(client, auth, "http://169.254.169.254/latest/meta-data/")
    )

    assert job["status"] == "failed"
    assert job["error"] == REFUSED


def test_ipv6_loopback_is_refused_without_contacting_it(start, auth):
    try:
        server = PageServer("::1").start()
    except OSError:
        pytest.skip("no IPv6 loopback here")
    try:
        server.page("/recipe", recipe_page())
        app = start(ALLOW_PRIVATE_URLS=False)
        client = app.test_client()

        job = finished(client, auth, import_url(client, auth, server.url("/recipe")))

        assert job["status"] == "failed"
        assert job["error"] == REFUSED
        assert server.total_hits == 0
    finally:
        server.stop()


@pytest.fixture
def allowed_pages() -> Iterator[PageServer]:
    """A server on 127.0.0.2, which the tests below let through by network."""
    server = PageServer("127.0.0.2").start()
    yield server
    server.stop()


def test_an_allowed_network_is_fetched(start, allowed_pages, auth):
    app = start(ALLOW_PRIVATE_URLS=False, RECIPE_FETCH_ALLOWED_NETWORKS=["127.0.0.2/32"])
    client = app.test_client()
    allowed_pages.page("/recipe", recipe_page())

    job = finished(client, auth, import_url(client, auth, allowed_pages.url("/recipe")))

    assert job["status"] == "succeeded", job


@pytest.mark.parametrize("target_host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"])
def test_a_redirect_to_loopback_is_refused_without_contacting_it(
    start, pages, allowed_pages, auth, target_host
):
    app = start(ALLOW_PRIVATE_URLS=False, RECIPE_FETCH_ALLOWED_NETWORKS=["127.0.0.2/32"])
    client = app.test_client()
    pages.page("/internal", recipe_page())
    allowed_pages.redirect("/go", pages.url("/internal", host=target_host))

    job = finished(client, auth, import_url(client, auth, allowed_pages.url("/go")))

    assert job["status"] == "failed"
    assert job["error"] == REFUSED
    assert allowed_pages.hits["/go"] == 1
    assert pages.total_hits == 0


def test_a_redirect_to_another_scheme_is_refused(start, pages, auth):
    app = start()
    client = app.test_client()
    pages.redirect("/go", "file:///etc/passwd")

    job = finished(client, auth, import_url(client, auth, pages.url("/go")))

    assert job["error"] == REFUSED


# -- failures: plain messages, no secret anywhere ------------------------------------------


def _failure_cases(pages: PageServer) -> None:
    secret_body = f"stack trace with {SECRET}".encode()
    pages.add("/missing", Reply(status=404, body=secret_body))
    pages.add("/broken", Reply(status=500, body=secret_body))
    pages.page("/plain", NO_RECIPE_PAGE + SECRET.encode())
    big = recipe_page() + b"<!--" + SECRET.encode() * 10_000 + b"-->"
    # Sends more than the cap, then never finishes: only a streamed cap ends it.
    pages.add("/huge", Reply(body=big, no_length=True, stall_after=64 * 1024 + 1))
    pages.add("/huge-declared", Reply(body=big))
    pages.add("/stalled", Reply(body=recipe_page() + SECRET.encode(), stall_after=5))


@pytest.mark.parametrize(
    ("path", "config", "message", "hits"),
    [
        pytest.param("/missing", {}, "the page was not found (HTTP 404)", 1, id="404"),
        pytest.param("/broken", {}, "the page could not be fetched (HTTP 500)", 3, id="500"),
        pytest.param("/plain", {}, "no recipe found on the page", 1, id="no-recipe"),
        pytest.param("/huge", {}, "the page is too large", 1, id="too-large-streamed"),
        pytest.param("/huge-declared", {}, "the page is too large", 1, id="too-large-declared"),
        pytest.param(
            "/stalled",
            {"RECIPE_FETCH_TIMEOUT_SECONDS": 0.3},
            "the page took too long to answer",
            3,
            id="too-slow",
        ),
    ],
)
def test_failures_have_plain_messages_and_leak_no_secret(
    start, pages, auth, logs, path, config, message, hits
):
    app = start(**config)
    client = app.test_client()
    _failure_cases(pages)

    job_id = import_url(client, auth, pages.url(f"{path}?token={SECRET}"))
    job = finished(client, auth, job_id)

    assert job["status"] == "failed"
    assert job["error"] == message
    # A request the client gave up on (the stalled page) may be counted by
    # the page server's thread just after the job ended: awaited, not raced.
    wait_for(lambda: pages.hits[path] >= hits)
    assert pages.hits[path] == hits
    assert attempts(app, job_id) == hits
    listed = client.get("/api/v1/jobs", headers=auth)
    assert SECRET not in str(job)
    assert SECRET not in listed.get_data(as_text=True)
    # The row holds the URL in its payload (it must, to run); nothing else of it.
    [row] = sql.rows(
        get_store(app), "SELECT status, result, error FROM jobs WHERE id = ?", (job_id,)
    )
    assert SECRET not in repr(row)
    assert sql.rows(get_store(app), "SELECT * FROM recipes") == []
    formatter = logging.Formatter()
    below_error = [record for record in logs.records if record.levelno < logging.ERROR]
    assert below_error, "the job's outcome is logged"
    for record in below_error:
        assert SECRET not in formatter.format(record)


def test_an_address_nothing_listens_on_is_retried_then_fails_plainly(start, auth, logs):
    app = start()
    client = app.test_client()
    closed = PageServer().start()
    closed.stop()  # the port is now closed: connections are refused

    job_id = import_url(client, auth, closed.url(f"/recipe?token={SECRET}"))
    job = finished(client, auth, job_id)

    assert job["status"] == "failed"
    assert job["error"] == "the page could not be fetched (the site refused the connection)"
    assert attempts(app, job_id) == 3
    # The operator reads the cause on each attempt, in the log and with the job.
    causes = [r.getMessage() for r in logs.records if getattr(r, "job_id", None) == job_id]
    assert causes.count("recipe page could not be fetched: the site refused the connection") == 3
    lines = get_jobs(app).log_lines(job_id)
    refused = "fetch failed: the site refused the connection"
    plain = "the page could not be fetched (the site refused the connection)"
    # Each attempt's own line; the two retried end with the runner's line
    # saying why, and the last failed with the household's message.
    # (The backoff's delays have jitter.)
    assert [re.sub(r"retried in [0-9.]+ s", "retried in … s", line.message) for line in lines] == [
        refused,
        f"attempt 1 failed: TransientImportError: {plain}; retried in … s",
        refused,
        f"attempt 2 failed: TransientImportError: {plain}; retried in … s",
        refused,
        f"attempt 3 failed: {plain}",
    ]
    for record in logs.records:
        if record.levelno < logging.ERROR:
            assert SECRET not in logging.Formatter().format(record)


def test_a_recipe_of_megabytes_is_stored_cut_to_its_bound(start, pages, auth):
    # 300 ingredients and 300 steps of 5,000 characters each: about 3 MB,
    # which every answer showing the recipe (and every poll of its job) read.
    long_items = [f"{n:03d} " + "x" * 4_996 for n in range(300)]
    page = recipe_page(
        recipeIngredient=long_items,
        recipeInstructions=[{"@type": "HowToStep", "text": item} for item in long_items],
    )
    pages.page("/huge", page)
    app = start(RECIPE_FETCH_MAX_BYTES=4 * 1024 * 1024)
    client = app.test_client()

    job_id = import_url(client, auth, pages.url("/huge"))

    job = wait_for(
        lambda: (
            (found := get_job(client, auth, job_id))["status"] not in ("queued", "running")
            and found
        )
    )
    assert job["status"] == "succeeded", job
    stored = client.get(f"/api/v1/recipes/{job['result']['recipe_id']}", headers=auth)
    assert len(stored.get_data()) <= 256 * 1024
    assert len(json.dumps(job["result"], separators=(",", ":"))) <= 256 * 1024
    recipe = stored.get_json()
    # Items kept in order, whole but the last of each list, which is cut.
    for items in (recipe["ingredients"], recipe["instructions"]):
        assert 10 < len(items) < 300
        assert items[:-1] == long_items[: len(items) - 1]
        assert items[-1].endswith("…")
        assert long_items[len(items) - 1].startswith(items[-1][:-1])
    # Both lists share the room: neither is left out.
    assert abs(len(recipe["ingredients"]) - len(recipe["instructions"])) <= 1
