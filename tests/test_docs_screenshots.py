"""The docs' pictures of the dashboard, taken from a deployment as a user
runs it: real gunicorn on SQLite, three households importing a week's
recipes each as a batch with its shopping list (pages of a real HTTP server
on 127.0.0.1, one of them missing), and an operator looking at it in a real
headless Chromium. Never the test suite's own kinds.

Every run checks that the pages tell what happened (the failed import's
story, its batch, the lists); `scripts/screenshots` runs it with
`MQ_SCREENSHOT_DIR=docs` to write the pictures the docs show (docs/*.png).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from mealquest.db.sqlite import migrate
from mealquest.households import create_household
from mealquest.operators import create_operator
from tests.support import sql
from tests.support.browser import chromium, require_chromium, text_of, wait
from tests.support.pages import WEEK, PageServer, week_page
from tests.support.servers import (
    Gunicorn,
    final_jobs,
    http,
    open_test_store,
    serving_env,
    wait_until,
)

SECRET_KEY = "screenshots-secret-" + "s" * 32
HOUSEHOLDS = ("The Okafors", "The Lindqvists", "The Tanakas")
# The kinds a deployment runs: no picture shows another.
REAL_KINDS = {"recipe_import", "shopping_list"}

require_chromium()


@pytest.fixture(scope="module")
def browser():
    yield from chromium()


@pytest.fixture(scope="module")
def pages():
    server = PageServer().start()
    for index, title in enumerate(WEEK):
        server.page(f"/week/{index}", week_page(title))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, pages):
    """The service, each household's week posted, and every job ended."""
    root = tmp_path_factory.mktemp("deployment")
    database = {"DATABASE": str(root / "mealquest.sqlite3")}
    migrate.upgrade(database["DATABASE"])
    store = open_test_store(database)
    households = [create_household(store, name) for name in HOUSEHOLDS]
    operator = create_operator(store, "Ada")
    env = serving_env(database, DASHBOARD=True, SECRET_KEY=SECRET_KEY, ALLOW_PRIVATE_URLS=True)
    # The service's own app (`wsgi:app`), as deployed: its kinds only.
    server = Gunicorn(root / "gunicorn.log", env, workers=1, app="wsgi:app")
    try:
        server.wait_ready()
        batches = []
        for number, household in enumerate(households):
            urls = [pages.url(f"/week/{index}") for index in range(len(WEEK))]
            if number == 0:
                urls.append(pages.url("/week/gone"))  # a page that is not there
            answer = http(
                "POST",
                f"{server.url}/api/v1/recipe-imports/batch",
                token=household.token,
                json_body={"urls": urls, "shopping_list": True},
            )
            assert answer.status == 202, answer.json
            batches.append(answer.json)
        every = [
            job for batch in batches for job in (*batch["jobs"], batch["shopping_list_job_id"])
        ]
        wait_until(lambda: final_jobs(store, every), 120, "the imports did not end")
        yield {"url": server.url, "store": store, "operator": operator, "batches": batches}
    finally:
        server.stop()
        store.close()


def picture(browser, tmp_path, name, element=None):
    """The page's picture (or an element's), and the docs' when asked for."""
    path = tmp_path / f"{name}.png"
    if element is not None:
        assert element.screenshot(str(path))
    else:
        assert browser.save_screenshot(str(path))
    if os.environ.get("MQ_SCREENSHOT_DIR"):
        shutil.copy(path, Path(os.environ["MQ_SCREENSHOT_DIR"]) / f"{name}.png")


def test_the_dashboard_tells_a_weeks_imports_as_a_deployment_runs_them(
    deployment, browser, tmp_path
):
    url, store = deployment["url"], deployment["store"]
    kinds = {row["kind"] for row in sql.rows(store, "SELECT DISTINCT kind FROM jobs")}
    assert kinds <= REAL_KINDS | {"prune_jobs"}, kinds
    browser.get(f"{url}/admin/")
    browser.find_element(By.ID, "token").send_keys(deployment["operator"].token)
    browser.find_element(By.ID, "sign-in").click()
    wait(browser, lambda: browser.current_url.endswith("/admin/"), "not signed in")
    wait(
        browser,
        lambda: browser.find_elements(
            By.CSS_SELECTOR, "div.kind-charts[data-kind='recipe_import']"
        ),
        "no charts of the imports",
    )
    picture(browser, tmp_path, "overview")
    row = browser.find_element(By.CSS_SELECTOR, "div.kind-charts[data-kind='recipe_import']")
    picture(browser, tmp_path, "chart", row)

    browser.get(f"{url}/admin/households")
    for name in HOUSEHOLDS:
        assert name in browser.page_source
    picture(browser, tmp_path, "households")

    # The import of the missing page: its story says why it failed, and its batch.
    first = deployment["batches"][0]
    gone = first["jobs"][-1]
    browser.get(f"{url}/admin/jobs/{gone}")
    story = text_of(browser, "story")
    assert "attempt 1 failed: the page was not found (HTTP 404)" in story
    assert f"a member of batch {first['batch_id']}" in story
    assert "Ended failed" in story
    picture(browser, tmp_path, "job")

    # Its list: made of the recipes that were imported, the missing one skipped.
    browser.get(f"{url}/admin/jobs/{first['shopping_list_job_id']}")
    assert f"the callback of batch {first['batch_id']}" in text_of(browser, "story")
    assert "tbsp olive oil" in text_of(browser, "result")
    picture(browser, tmp_path, "shopping-list")


def test_a_bulk_retry_of_the_failed_imports_and_the_audit_log(deployment, browser, tmp_path):
    url = deployment["url"]
    browser.get(f"{url}/admin/")
    if browser.current_url.endswith("/admin/sign-in"):
        browser.find_element(By.ID, "token").send_keys(deployment["operator"].token)
        browser.find_element(By.ID, "sign-in").click()
        wait(browser, lambda: browser.current_url.endswith("/admin/"), "not signed in")
    browser.get(f"{url}/admin/jobs?status=failed&kind=recipe_import")
    assert len(browser.find_elements(By.CLASS_NAME, "job-row")) == 1
    browser.find_element(By.ID, "bulk-retry").click()
    wait(browser, lambda: "1 job can be queued again" in text_of(browser, "bulk-count"), "no count")
    picture(browser, tmp_path, "bulk")
    browser.find_element(By.ID, "bulk-confirm").click()
    wait(browser, lambda: "Queued again: 1 job." in text_of(browser, "flash"), "not retried")

    browser.get(f"{url}/admin/audit")
    row = browser.find_element(By.CSS_SELECTOR, "tr.audit-row[data-action='bulk retry']")
    assert row.find_element(By.CLASS_NAME, "target").text == "status=failed kind=recipe_import"
    picture(browser, tmp_path, "audit")
