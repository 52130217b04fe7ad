"""The operators' pages in a real headless Chromium (Debian's `chromium` and
`chromium-driver`) against real gunicorn, on SQLite and on PostgreSQL: the
overview's charts (SVG whose series are the jobs this test made), a bulk
retry of one kind's failed jobs from the jobs list, the audit page showing
it, and a household suspended (its token answers 403, its queued job waits
while another household's runs) and then erased (its rows gone, the other
household's untouched). One browser for the module, one server per
database; screenshots go under the test's temp directory (the docs' pictures
come from a realistic deployment: tests/test_docs_screenshots.py)."""

from __future__ import annotations

import contextlib
import re
import uuid
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from mealquest.clock import from_text
from mealquest.db.sqlite import migrate
from mealquest.households import create_household
from mealquest.model.jobs import NewJob, OnInterrupt
from mealquest.operators import create_operator
from tests.support import sql
from tests.support.browser import chromium, require_chromium, text_of, wait
from tests.support.postgres import fresh_database, require_postgres_url
from tests.support.servers import (
    Gunicorn,
    enqueue,
    final_jobs,
    http,
    open_test_store,
    serving_env,
    wait_until,
)

SECRET_KEY = "browser-test-secret-" + "s" * 32
WITHIN = 2**0.25

require_chromium()


class Site:
    """The served dashboard on one database, and the households the tests use."""

    def __init__(self, root: Path, database: dict) -> None:
        self.name = "postgresql" if "DATABASE_URL" in database else "sqlite"
        self.store = open_test_store(database)
        self.cooks = create_household(self.store, "The Cooks")
        self.abusers = create_household(self.store, "The Floods")
        self.operator = create_operator(self.store, "Ada")
        env = serving_env(database, DASHBOARD=True, SECRET_KEY=SECRET_KEY)
        self.server = Gunicorn(root / "gunicorn.log", env, workers=1)
        self.server.wait_ready()
        self.url = self.server.url

    def enqueue(self, kind: str, payload: dict, token: str | None = None) -> str:
        return enqueue(self.url, token or self.cooks.token, kind, payload)

    def job(self, job_id: str) -> dict:
        rows = sql.rows(self.store, "SELECT * FROM jobs WHERE id = ?", (job_id,))
        return rows[0] if rows else {}

    def close(self) -> None:
        self.server.stop()
        self.store.close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def site(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"operators-{request.param}")
    with contextlib.ExitStack() as stack:
        if request.param == "postgresql":
            database = {
                "DATABASE_URL": stack.enter_context(
                    fresh_database(require_postgres_url(), migrated=True)
                )
            }
        else:
            database = {"DATABASE": str(root / "mealquest.sqlite3")}
            migrate.upgrade(database["DATABASE"])
        served = Site(root, database)
        stack.callback(served.close)
        yield served


@pytest.fixture(scope="module")
def browser():
    yield from chromium()


def screenshot(site, target, tmp_path, name):
    """A page's (or an element's) picture, kept with the test's files."""
    path = tmp_path / f"{name}.png"
    if isinstance(target, WebElement):
        assert target.screenshot(str(path))
    else:
        assert target.save_screenshot(str(path))
    return path


def signed_in(site, browser):
    """The browser signed in as the site's operator (once per site)."""
    browser.get(f"{site.url}/admin/")
    if browser.current_url.endswith("/admin/sign-in"):
        browser.find_element(By.ID, "token").send_keys(site.operator.token)
        browser.find_element(By.ID, "sign-in").click()
        wait(browser, lambda: browser.current_url.endswith("/admin/"), "not signed in")


def chart_marks(browser, kind, chart):
    """(series, value) of each bar or point of one of a kind's charts, as the SVG says."""
    script = (
        "const svg = document.querySelector("
        "`svg[data-kind='${arguments[0]}'][data-chart='${arguments[1]}']`);"
        "if (!svg) return null;"
        "return Array.from(svg.querySelectorAll('[data-series]'))"
        ".filter(e => e.hasAttribute('data-value'))"
        ".map(e => [e.getAttribute('data-series'), Number(e.getAttribute('data-value'))]);"
    )
    return browser.execute_script(script, kind, chart)


def total(marks, series):
    return sum(value for name, value in marks or [] if name == series)


def test_the_overviews_charts_are_the_jobs_this_test_made(site, browser, tmp_path):
    done = [site.enqueue("sleep", {"seconds": seconds}) for seconds in (0.05, 0.1, 0.2)]
    failed = [site.enqueue("fail_with_failure", {"message": "burnt"}) for _ in range(2)]
    rows = wait_until(lambda: final_jobs(site.store, [*done, *failed]), 60, "jobs did not end")
    signed_in(site, browser)

    # The page draws what the history holds; its refresh may redraw it meanwhile.
    wait(
        browser,
        lambda: total(chart_marks(browser, "sleep", "outcomes"), "succeeded") == 3,
        "no bars",
    )
    assert total(chart_marks(browser, "fail_with_failure", "outcomes"), "failed") == 2
    assert total(chart_marks(browser, "sleep", "outcomes"), "failed") == 0
    runs = sorted(
        (from_text(rows[j]["finished_at"]) - from_text(rows[j]["started_at"])).total_seconds()
        if site.name == "sqlite"
        else (rows[j]["finished_at"] - rows[j]["started_at"]).total_seconds()
        for j in done
    )
    run_marks = chart_marks(browser, "sleep", "run")
    p50 = [value for name, value in run_marks if name == "p50"]
    assert {name for name, _ in run_marks} == {"p50", "p95"}
    if len(p50) == 1:  # the three ended within one minute
        assert runs[1] / WITHIN / 1.01 <= p50[0] <= runs[1] * WITHIN * 1.01, (runs, p50)
    assert {name for name, _ in chart_marks(browser, "sleep", "wait")} == {"p50", "p95"}
    screenshot(site, browser, tmp_path, "overview")
    row = browser.find_element(By.CSS_SELECTOR, "div.kind-charts[data-kind='sleep']")
    screenshot(site, row, tmp_path, "chart")

    browser.find_element(By.ID, "range-day").click()
    wait(browser, lambda: "range=day" in browser.current_url, "no day range")
    wait(
        browser,
        lambda: total(chart_marks(browser, "sleep", "outcomes"), "succeeded") == 3,
        "no day bars",
    )


def test_a_bulk_retry_of_one_kinds_failed_jobs_and_the_audit_page_shows_it(site, browser, tmp_path):
    jobs = [site.enqueue("succeed", {"value": n}) for n in range(3)]
    other = site.enqueue("fail_with_failure", {"message": "stays failed"})
    wait_until(lambda: final_jobs(site.store, [*jobs, other]), 60, "jobs did not end")
    for job_id in jobs:  # failed, as if by an outage that is now over
        sql.execute(
            site.store,
            "UPDATE jobs SET status = 'failed', error = 'the page took too long to answer', "
            "result = NULL WHERE id = ?",
            (job_id,),
        )
    signed_in(site, browser)
    browser.get(f"{site.url}/admin/jobs?status=failed&kind=succeed")
    assert len(browser.find_elements(By.CLASS_NAME, "job-row")) == 3
    browser.find_element(By.ID, "bulk-retry").click()
    wait(
        browser, lambda: "3 jobs can be queued again" in text_of(browser, "bulk-count"), "no count"
    )
    screenshot(site, browser, tmp_path, "bulk")
    browser.find_element(By.ID, "bulk-confirm").click()
    wait(browser, lambda: "Queued again: 3 jobs." in text_of(browser, "flash"), "not retried")

    wait_until(lambda: all(site.job(j)["status"] == "succeeded" for j in jobs), 60, "not run again")
    assert site.job(other)["status"] == "failed"

    browser.get(f"{site.url}/admin/audit")
    row = browser.find_element(By.CSS_SELECTOR, "tr.audit-row[data-action='bulk retry']")
    assert "Ada" in row.text
    assert row.find_element(By.CLASS_NAME, "target").text == "status=failed kind=succeed"
    assert row.find_element(By.CLASS_NAME, "count").text == "3"
    assert browser.find_elements(By.CSS_SELECTOR, "tr.audit-row[data-action='sign-in']")
    screenshot(site, browser, tmp_path, "audit")


def test_a_household_suspended_waits_and_erased_leaves_the_others(site, browser, tmp_path):
    floods = site.abusers.household_id
    kept = site.enqueue("succeed", {"value": 1})
    wait_until(lambda: final_jobs(site.store, [kept]), 60, "the job did not end")
    before = sql.rows(
        site.store,
        "SELECT id, status FROM jobs WHERE household_id = ? ORDER BY seq",
        (site.cooks.household_id,),
    )
    signed_in(site, browser)
    browser.get(f"{site.url}/admin/households")
    browser.find_element(By.ID, f"suspend-{floods}").click()
    wait(browser, lambda: "suspended" in text_of(browser, "flash"), "not suspended")

    answer = http("GET", f"{site.url}/api/v1/jobs", token=site.abusers.token)
    assert (answer.status, answer.json["error"]["code"]) == (403, "household_suspended")
    # Its queued job (an operator's enqueue) waits; a later job of another household runs.
    waiting = uuid.uuid4().hex
    site.store.write(
        site.store.jobs.insert_job,
        NewJob(waiting, floods, "succeed", '{"value": 2}', 1, OnInterrupt.FAIL),
    )
    later = site.enqueue("succeed", {"value": 3})
    wait_until(
        lambda: site.job(later).get("status") == "succeeded", 60, "the later job did not run"
    )
    assert site.job(waiting)["status"] == "queued"
    browser.get(f"{site.url}/admin/households")
    row = browser.find_element(By.ID, f"household-{floods}")
    assert "suspended" in row.text
    screenshot(site, browser, tmp_path, "households")

    row.find_element(By.ID, f"erase-{floods}").click()
    wait(browser, lambda: browser.find_elements(By.ID, "erase-confirm-id"), "no confirmation")
    browser.find_element(By.ID, "erase-confirm-id").send_keys(str(floods))
    browser.find_element(By.ID, "erase-confirm").click()
    wait(browser, lambda: "erased" in text_of(browser, "flash"), "not erased")

    for table in ("jobs", "recipes", "api_tokens"):
        count = sql.scalar(
            site.store, f"SELECT count(*) FROM {table} WHERE household_id = ?", (floods,)
        )
        assert count == 0, table
    after = sql.rows(
        site.store,
        "SELECT id, status FROM jobs WHERE household_id = ? ORDER BY seq",
        (site.cooks.household_id,),
    )
    assert after[: len(before)] == before
    assert http("GET", f"{site.url}/api/v1/jobs", token=site.cooks.token).status == 200
    assert http("GET", f"{site.url}/api/v1/jobs", token=site.abusers.token).status == 401
    assert "erased" in browser.find_element(By.ID, f"household-{floods}").text
    browser.get(f"{site.url}/admin/audit")
    actions = [
        r.get_attribute("data-action") for r in browser.find_elements(By.CLASS_NAME, "audit-row")
    ]
    assert actions[:2] == ["erase", "suspend"]
    assert re.search(r"household \d+", browser.find_element(By.CLASS_NAME, "target").text)
