"""The dashboard in a real headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by selenium) against real gunicorn: sign in, read
the overview, filter the jobs list, open a job, retry a failed job and watch
it run again without a reload, cancel a running job, sign out. One browser
and one server for the module; each step saves a screenshot of its page
under the test's temp directory (the docs' pictures come from a realistic
deployment instead: tests/test_docs_screenshots.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.select import Select

from mealquest.config import DEFAULTS
from mealquest.db.sqlite import migrate
from mealquest.households import create_household
from mealquest.operators import create_operator
from tests.support import sql
from tests.support.browser import chromium, require_chromium, text_of, wait
from tests.support.gates import Gates
from tests.support.kinds import SECRET
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

require_chromium()


class Site:
    """The served dashboard, its database and the jobs the tests look at."""

    def __init__(self, root: Path) -> None:
        database = {"DATABASE": str(root / "mealquest.sqlite3")}
        migrate.upgrade(database["DATABASE"])
        self.store = open_test_store(database)
        self.gates = Gates()
        self.token = create_household(self.store, "The Browsers").token
        self.operator = create_operator(self.store, "Ada")
        env = serving_env(database, DASHBOARD=True, SECRET_KEY=SECRET_KEY)
        self.server = Gunicorn(root / "gunicorn.log", env, workers=1)
        self.server.wait_ready()
        self.url = self.server.url

    def enqueue(self, kind: str, payload: dict) -> str:
        return enqueue(self.url, self.token, kind, payload)

    def status(self, job_id: str) -> str:
        return sql.scalar(self.store, "SELECT status FROM jobs WHERE id = ?", (job_id,))

    def close(self) -> None:
        self.gates.close()
        self.server.stop()
        self.store.close()


@pytest.fixture(scope="module")
def browser():
    yield from chromium()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = Site(tmp_path_factory.mktemp("dashboard"))
    try:
        yield site
    finally:
        site.close()


@pytest.fixture(scope="module")
def jobs(site):
    """Jobs of every outcome, finished before the first page is read."""
    done = [site.enqueue("succeed", {"value": n}) for n in range(3)]
    failed = site.enqueue("fail_with_failure", {"message": "the soup burnt"})
    secret = site.enqueue(
        "raise_secret_error", {"secret": f"https://recipes.example/soup?token={SECRET}"}
    )
    wait_until(lambda: final_jobs(site.store, [*done, failed, secret]), 60, "jobs did not end")
    return {"succeeded": done, "failed": failed, "secret": secret}


def screenshot(browser, tmp_path, name):
    path = tmp_path / f"{name}.png"
    assert browser.save_screenshot(str(path))
    return path


def mark_page(browser):
    """A marker that a reload would erase: proves a change came without one."""
    browser.execute_script("window.__notReloaded = true;")


def not_reloaded(browser):
    return browser.execute_script("return window.__notReloaded === true;")


def test_sign_in_leads_to_the_overview(site, browser, jobs, tmp_path):
    browser.get(f"{site.url}/admin/")
    assert browser.current_url.endswith("/admin/sign-in")
    screenshot(browser, tmp_path, "sign_in")
    # A household's token does not sign in.
    browser.find_element(By.ID, "token").send_keys(site.token)
    browser.find_element(By.ID, "sign-in").click()
    # The click only starts the form's submission: the answer comes later.
    wait(
        browser,
        lambda: "not a live operator token" in text_of(browser, "sign-in-failed"),
        "the household's token was not refused",
    )
    browser.find_element(By.ID, "token").send_keys(site.operator.token)
    browser.find_element(By.ID, "sign-in").click()
    wait(
        browser,
        lambda: browser.current_url.endswith("/admin/") and text_of(browser, "count-succeeded"),
        "not on the overview",
    )
    assert text_of(browser, "count-succeeded") == "3"
    assert text_of(browser, "count-failed") == "2"
    assert text_of(browser, "throughput") == "5"
    # The session cookie is out of the page's reach.
    assert browser.execute_script("return document.cookie;") == ""
    screenshot(browser, tmp_path, "overview")


def test_the_overview_refreshes_itself(site, browser, jobs, tmp_path):
    browser.get(f"{site.url}/admin/")
    mark_page(browser)
    site.enqueue("succeed", {"value": 99})
    wait(browser, lambda: text_of(browser, "count-succeeded") == "4", "the count did not change")
    assert not_reloaded(browser)


def test_filter_the_jobs_list(site, browser, jobs, tmp_path):
    browser.get(f"{site.url}/admin/jobs")
    assert len(browser.find_elements(By.CLASS_NAME, "job-row")) == 6
    Select(browser.find_element(By.ID, "filter-status")).select_by_value("failed")
    browser.find_element(By.ID, "apply-filters").click()
    wait(
        browser,
        lambda: (
            "status=failed" in browser.current_url
            and browser.find_elements(By.CLASS_NAME, "job-row")
        ),
        "the filter was not applied",
    )
    rows = browser.find_elements(By.CLASS_NAME, "job-row")
    assert {row.find_element(By.TAG_NAME, "a").text for row in rows} == {
        jobs["failed"],
        jobs["secret"],
    }
    browser.find_element(By.ID, "filter-kind").send_keys("fail_with_failure")
    browser.find_element(By.ID, "apply-filters").click()
    wait(
        browser,
        lambda: (
            "kind=fail_with_failure" in browser.current_url
            and browser.find_elements(By.CLASS_NAME, "job-row")
        ),
        "kind not applied",
    )
    [row] = browser.find_elements(By.CLASS_NAME, "job-row")
    assert "the soup burnt" in row.text
    screenshot(browser, tmp_path, "jobs")


def test_open_a_job_and_its_payload_url_is_masked(site, browser, jobs, tmp_path):
    browser.get(f"{site.url}/admin/jobs?status=failed")
    browser.find_element(By.LINK_TEXT, jobs["secret"]).click()
    wait(
        browser,
        lambda: browser.current_url.endswith(jobs["secret"]) and text_of(browser, "job-status"),
        "the job did not open",
    )
    assert text_of(browser, "job-status") == "failed"
    assert "https://recipes.example/soup?token=***" in text_of(browser, "payload")
    assert text_of(browser, "error") == "internal error"
    assert SECRET not in browser.page_source
    screenshot(browser, tmp_path, "job")


def test_retry_a_failed_job_and_watch_it_run_again(site, browser, jobs, tmp_path):
    # A job of a kind that succeeds, failed as if by a passing outage.
    job_id = site.enqueue("succeed", {"value": 7})
    wait_until(lambda: site.status(job_id) == "succeeded", 30, "the job did not run")
    sql.execute(
        site.store,
        "UPDATE jobs SET status = 'failed', error = 'the page took too long to answer', "
        "result = NULL WHERE id = ?",
        (job_id,),
    )
    browser.get(f"{site.url}/admin/jobs/{job_id}")
    assert text_of(browser, "job-status") == "failed"
    browser.find_element(By.ID, "retry").click()
    wait(browser, lambda: "fresh attempt budget" in browser.page_source, "no confirmation")
    mark_page(browser)
    wait(browser, lambda: text_of(browser, "job-status") == "succeeded", "it did not run again")
    assert not_reloaded(browser)
    assert text_of(browser, "error") == "none"
    screenshot(browser, tmp_path, "retried")


def test_cancel_a_running_job_and_watch_it_end_cancelled(site, browser, jobs, tmp_path):
    job_id = site.enqueue("wait_for_gate", {"url": site.gates.url("cancel-me")})
    wait_until(lambda: site.gates.arrivals("cancel-me") == 1, 30, "the job did not start")
    browser.get(f"{site.url}/admin/jobs/{job_id}")
    assert text_of(browser, "job-status") == "running"
    browser.find_element(By.ID, "cancel").click()
    wait(browser, lambda: "Cancel" in text_of(browser, "flash"), "no confirmation")
    assert "not available" not in text_of(browser, "flash")
    mark_page(browser)
    screenshot(browser, tmp_path, "cancelling")
    wait(browser, lambda: text_of(browser, "job-status") == "cancelled", "not shown cancelled")
    assert not_reloaded(browser)
    assert site.status(job_id) == "cancelled"
    screenshot(browser, tmp_path, "cancelled")


def test_a_jobs_page_shows_its_partial_result_from_the_stream(site, browser, jobs, tmp_path):
    # Every slot held, so the page opens on the job while it is still queued.
    holders = [
        site.enqueue("wait_for_gate", {"url": site.gates.url(f"slot{n}")})
        for n in range(DEFAULTS["JOB_WORKERS"])
    ]
    wait_until(lambda: all(site.status(h) == "running" for h in holders), 30, "slots not held")
    job_id = site.enqueue("pid_gate", {"url": site.gates.url("live-page")})
    try:
        browser.get(f"{site.url}/admin/jobs/{job_id}")
        assert text_of(browser, "job-status") == "queued"
        assert text_of(browser, "result") == "none yet"
        mark_page(browser)
        site.gates.open("slot0")  # the job starts and publishes its process's pid
        wait(browser, lambda: '"pid"' in text_of(browser, "result"), "no partial result")
        assert text_of(browser, "job-status") == "running"
        assert not_reloaded(browser)
        # It came by the stream: the page holds the id of the event it followed.
        version = sql.scalar(site.store, "SELECT version FROM jobs WHERE id = ?", (job_id,))
        live = browser.find_element(By.ID, "live")
        assert live.get_attribute("data-event-id") == str(version)
        screenshot(browser, tmp_path, "partial-result")
        site.gates.open("live-page")
        wait(browser, lambda: text_of(browser, "job-status") == "succeeded", "not shown done")
        assert not_reloaded(browser)
    finally:
        for n in range(DEFAULTS["JOB_WORKERS"]):
            site.gates.open(f"slot{n}")
        site.gates.open("live-page")
    wait_until(lambda: final_jobs(site.store, [*holders, job_id]), 30, "the jobs did not end")


def test_a_jobs_stream_needs_a_signed_in_operator(site, browser, jobs):
    job_id = jobs["succeeded"][0]
    # Neither no credential nor a household's token opens it: to the sign-in form.
    for token in (None, site.token):
        answer = http("GET", f"{site.url}/admin/jobs/{job_id}/events", token=token)
        assert answer.status == 302
        assert answer.headers["Location"].endswith("/admin/sign-in")


# Late (before signing out): its job would change the counts the pages above show.
def test_a_jobs_page_shows_the_lines_its_handler_logged_masked(site, browser, jobs):
    talked = site.enqueue(
        "talk", {"lines": 2, "text": f"fetched https://recipes.example/soup?token={SECRET}"}
    )
    wait_until(lambda: final_jobs(site.store, [talked]), 60, "the job did not end")
    browser.get(f"{site.url}/admin/jobs/{talked}")
    wait(browser, lambda: text_of(browser, "attempt-1"), "the job's story did not show")
    log = text_of(browser, "attempt-1")
    assert "attempt 1 says: fetched https://recipes.example/soup?token=***" in log
    assert "line 2" in log
    assert SECRET not in browser.page_source


def test_sign_out(site, browser, jobs, tmp_path):
    browser.get(f"{site.url}/admin/")
    browser.find_element(By.ID, "sign-out").click()
    wait(browser, lambda: browser.current_url.endswith("/admin/sign-in"), "not signed out")
    browser.get(f"{site.url}/admin/jobs")
    assert browser.current_url.endswith("/admin/sign-in")
