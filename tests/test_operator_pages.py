"""The operators' new pages through Flask's test client, on both databases
(and through PgBouncer): the overview's charts drawn from what the runner
did, a bulk retry of one kind's failed jobs (its confirmation count, CSRF,
batches, and what it leaves alone), a bulk cancel, the audit log of every
action, and the households page with suspend, resume and erase. The real
browser drives them in tests/test_dashboard_operators_browser.py."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from mealquest.extensions import get_store
from mealquest.households import create_household
from mealquest.jobs.service import get_jobs
from mealquest.model.jobs import Status
from mealquest.model.operations import BulkAction, JobFilter
from mealquest.operator_actions import bulk
from mealquest.operators import create_operator
from tests.conftest import wait_for
from tests.support import sql

pytestmark = [pytest.mark.both_databases, pytest.mark.through_pgbouncer]

SECRET_KEY = "test-secret-key-" + "k" * 32
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def admin_app(make_app):
    return make_app(DASHBOARD=True, SECRET_KEY=SECRET_KEY)


@pytest.fixture
def admin_store(admin_app):
    return get_store(admin_app)


@pytest.fixture
def admin_jobs(admin_app):
    return get_jobs(admin_app)


@pytest.fixture
def operator(admin_store):
    return create_operator(admin_store, "Ada")


@pytest.fixture
def client(admin_app, operator):
    client = admin_app.test_client()
    form = client.get("/admin/sign-in").get_data(as_text=True)
    answer = client.post(
        "/admin/sign-in",
        data={"token": operator.token, "csrf_token": _CSRF.search(form).group(1)},
    )
    assert answer.status_code == 303
    return client


def csrf_of(client, path) -> str:
    return _CSRF.search(client.get(path).get_data(as_text=True)).group(1)


class SvgReader(HTMLParser):
    """The charts' bars and points, as their data- attributes say."""

    def __init__(self) -> None:
        super().__init__()
        self.chart: tuple[str, str] | None = None
        self.marks: list[dict[str, str]] = []

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        if tag == "svg" and "data-chart" in values:
            self.chart = (values["data-kind"], values["data-chart"])
        elif tag in ("rect", "circle") and "data-series" in values and self.chart:
            self.marks.append({"kind": self.chart[0], "chart": self.chart[1], **values})


def marks_of(page: str) -> list[dict[str, str]]:
    reader = SvgReader()
    reader.feed(page)
    return reader.marks


def total(marks, kind, chart, series) -> float:
    return sum(
        float(m["data-value"])
        for m in marks
        if (m["kind"], m["chart"], m["data-series"]) == (kind, chart, series)
    )


def fail_jobs(store, jobs, household_id, kind, n) -> list[str]:
    """`n` jobs of `kind` that failed (the runner is not needed for that)."""
    ids = [jobs.enqueue(kind, {"value": i}, household_id=household_id) for i in range(n)]
    for job_id in ids:
        sql.execute(
            store,
            "UPDATE jobs SET status = 'failed', attempt = 1, error = 'boom', "
            "finished_at = updated_at WHERE id = ?",
            (job_id,),
        )
    return ids


def test_the_overviews_charts_show_what_the_runner_did(admin_jobs, client):
    household = create_household(admin_jobs.store, "Cooks").household_id
    done = [admin_jobs.enqueue("succeed", {"value": n}, household_id=household) for n in range(3)]
    failed = admin_jobs.enqueue("fail_with_failure", {"message": "no"}, household_id=household)
    cancelled = admin_jobs.enqueue("succeed", {"value": 9}, household_id=household, delay=3600)
    admin_jobs.cancel(cancelled)
    admin_jobs.start_pool()
    final = (Status.SUCCEEDED, Status.FAILED)
    wait_for(lambda: all(admin_jobs.get(j).status in final for j in [*done, failed]))

    for query in ("", "?range=day"):
        page = client.get(f"/admin/{query}").get_data(as_text=True)
        marks = marks_of(page)
        assert total(marks, "succeed", "outcomes", "succeeded") == 3, query
        assert total(marks, "succeed", "outcomes", "cancelled") == 1
        assert total(marks, "fail_with_failure", "outcomes", "failed") == 1
        # Every job that started has a wait, and every one that ran a run time.
        waits = [m for m in marks if m["kind"] == "succeed" and m["chart"] == "wait"]
        runs = [m for m in marks if m["kind"] == "succeed" and m["chart"] == "run"]
        assert {m["data-series"] for m in waits} == {"p50", "p95"}
        assert {m["data-series"] for m in runs} == {"p50", "p95"}
        assert all(0 < float(m["data-value"]) < 60 for m in waits + runs)
    assert 'id="range-hour"' in page


def test_a_bulk_retry_of_one_kinds_failed_jobs_asks_first_and_is_audited(
    admin_store, admin_jobs, client
):
    mine = create_household(admin_store, "Cooks").household_id
    theirs = create_household(admin_store, "Others").household_id
    wanted = fail_jobs(admin_store, admin_jobs, mine, "succeed", 5)
    wanted += fail_jobs(admin_store, admin_jobs, theirs, "succeed", 2)
    other_kind = fail_jobs(admin_store, admin_jobs, mine, "fail_with_number", 2)

    listing = client.get("/admin/jobs?status=failed&kind=succeed").get_data(as_text=True)
    assert 'href="/admin/jobs/bulk?action=retry&amp;status=failed&amp;kind=succeed"' in listing
    page = client.get("/admin/jobs/bulk?action=retry&status=failed&kind=succeed")
    text = page.get_data(as_text=True)
    assert page.status_code == 200
    assert re.search(r'id="bulk-count"><b>7</b>', text), text
    upto = re.search(r'name="upto" value="(\d+)"', text).group(1)
    # Arrives after the confirmation: left alone.
    late = fail_jobs(admin_store, admin_jobs, mine, "succeed", 1)
    form = {"action": "retry", "status": "failed", "kind": "succeed", "upto": upto}

    # No CSRF token: refused, nothing done.
    assert client.post("/admin/jobs/bulk", data=form).status_code == 400
    assert all(admin_jobs.get(j).status is Status.FAILED for j in wanted)

    answer = client.post(
        "/admin/jobs/bulk",
        data={**form, "csrf_token": csrf_of(client, "/admin/jobs")},
    )
    assert answer.status_code == 303
    assert "/admin/jobs?status=failed&kind=succeed" in answer.headers["Location"]
    assert "Queued again: 7 jobs." in client.get(answer.headers["Location"]).get_data(as_text=True)
    assert all(admin_jobs.get(j).status is Status.QUEUED for j in wanted)
    assert all(admin_jobs.get(j).attempt == 0 for j in wanted)
    assert all(admin_jobs.get(j).status is Status.FAILED for j in [*other_kind, *late])

    audit = client.get("/admin/audit").get_data(as_text=True)
    row = re.search(r'<tr class="audit-row" data-action="bulk retry">(.*?)</tr>', audit, re.S)
    assert row, audit
    assert "Ada" in row.group(1)
    assert "status=failed kind=succeed" in row.group(1)
    assert re.search(r'class="num count">7<', row.group(1))
    assert 'data-action="sign-in"' in audit


def test_a_bulk_action_runs_in_small_batches_and_stops_when_its_time_is_up(
    admin_store, admin_jobs, operator
):
    household = create_household(admin_store, "Cooks").household_id
    ids = fail_jobs(admin_store, admin_jobs, household, "succeed", 7)
    job_filter = JobFilter(status=Status.FAILED)
    seen = bulk.preview(admin_store, BulkAction.DELETE, job_filter)
    assert (seen.total, seen.counts) == (7, {Status.FAILED: 7})

    stopped = bulk.run(
        admin_store,
        admin_jobs,
        BulkAction.DELETE,
        job_filter,
        upto_seq=seen.upto_seq,
        operator=None,
        seconds=0,
    )
    assert (stopped.acted, stopped.complete) == (0, False)

    batches = []
    write = admin_store.write

    def counting(fn, *args, **kwargs):
        result = write(fn, *args, **kwargs)
        if hasattr(result, "picked"):
            batches.append(len(result.acted))
        return result

    admin_store.write = counting
    try:
        done = bulk.run(
            admin_store,
            admin_jobs,
            BulkAction.DELETE,
            job_filter,
            upto_seq=seen.upto_seq,
            operator=None,
            batch_size=3,
        )
    finally:
        del admin_store.write
    assert (done.acted, done.complete) == (7, True)
    assert batches == [3, 3, 1]
    assert all(admin_jobs.get(j) is None for j in ids)
    counts = sql.rows(
        admin_store, "SELECT action, count FROM audit_log WHERE action <> 'create' ORDER BY seq"
    )
    assert counts == [
        {"action": "bulk delete", "count": 0},
        {"action": "bulk delete", "count": 7},
    ]


def test_a_bulk_cancel_cancels_queued_jobs_and_stops_running_ones(
    admin_store, admin_jobs, client, gates
):
    household = create_household(admin_store, "Cooks").household_id
    running = admin_jobs.enqueue("wait_for_gate", {"url": gates.url("g")}, household_id=household)
    admin_jobs.start_pool()
    wait_for(lambda: gates.arrivals("g") == 1)
    queued = [
        admin_jobs.enqueue("succeed", {"value": n}, household_id=household, delay=3600)
        for n in range(3)
    ]
    page = client.get(f"/admin/jobs/bulk?action=cancel&household={household}")
    text = page.get_data(as_text=True)
    assert re.search(r'id="bulk-count"><b>4</b>', text), text
    upto = re.search(r'name="upto" value="(\d+)"', text).group(1)

    answer = client.post(
        "/admin/jobs/bulk",
        data={
            "action": "cancel",
            "household": str(household),
            "upto": upto,
            "csrf_token": csrf_of(client, "/admin/jobs"),
        },
    )
    assert answer.status_code == 303
    assert all(admin_jobs.get(j).status is Status.CANCELLED for j in queued)
    # Told at once (it runs in this process): its handler ends it cancelled.
    gates.open("g")
    wait_for(lambda: admin_jobs.get(running).status is Status.CANCELLED)


def test_bad_bulk_requests_are_refused_without_acting(admin_store, admin_jobs, client):
    household = create_household(admin_store, "Cooks").household_id
    [job_id] = fail_jobs(admin_store, admin_jobs, household, "succeed", 1)
    for query in (
        "action=explode",
        "action=retry&status=succeeded",
        "action=delete&status=running",
        "action=retry&household=x",
    ):
        assert client.get(f"/admin/jobs/bulk?{query}").status_code == 400, query
    csrf = csrf_of(client, "/admin/jobs")
    for form in (
        {"action": "retry", "upto": "x"},
        {"action": "retry", "status": "queued", "upto": "5"},
    ):
        answer = client.post("/admin/jobs/bulk", data={**form, "csrf_token": csrf})
        assert answer.status_code == 400, form
    assert admin_jobs.get(job_id).status is Status.FAILED


def test_the_households_page_suspends_resumes_and_erases(admin_store, admin_jobs, client):
    mine = create_household(admin_store, "Cooks")
    theirs = create_household(admin_store, "Others")
    admin_jobs.enqueue("succeed", {"value": 1}, household_id=mine.household_id, delay=3600)
    fail_jobs(admin_store, admin_jobs, mine.household_id, "succeed", 2)

    page = client.get("/admin/households").get_data(as_text=True)
    row = re.search(
        rf'<tr class="household-row" id="household-{mine.household_id}">(.*?)</tr>', page, re.S
    )
    cells = re.findall(r'<td class="num[^"]*">\s*([^<]*?)\s*<', row.group(1))
    # queued, running, quota use, succeeded, failed, cancelled, tokens
    assert cells == ["1", "0", "1 / 100", "0", "2", "0", "1"], cells

    csrf = csrf_of(client, "/admin/households")
    suspend = f"/admin/households/{mine.household_id}/suspend"
    assert client.post(suspend, data={"csrf_token": csrf}).status_code == 303
    api = client.application.test_client()
    answer = api.get("/api/v1/jobs", headers={"Authorization": f"Bearer {mine.token}"})
    assert (answer.status_code, answer.json["error"]["code"]) == (403, "household_suspended")
    assert "suspended" in client.get("/admin/households").get_data(as_text=True)
    resume = f"/admin/households/{mine.household_id}/resume"
    assert client.post(resume, data={"csrf_token": csrf}).status_code == 303
    answer = api.get("/api/v1/jobs", headers={"Authorization": f"Bearer {mine.token}"})
    assert answer.status_code == 200

    erase = f"/admin/households/{mine.household_id}/erase"
    confirm = client.get(erase).get_data(as_text=True)
    assert "Type the household" in confirm
    # A wrong id erases nothing.
    client.post(erase, data={"csrf_token": csrf, "confirm": str(theirs.household_id)})
    assert (
        sql.scalar(
            admin_store, "SELECT count(*) FROM jobs WHERE household_id = ?", (mine.household_id,)
        )
        == 3
    )
    answer = client.post(erase, data={"csrf_token": csrf, "confirm": str(mine.household_id)})
    assert answer.status_code == 303
    after = client.get(answer.headers["Location"]).get_data(as_text=True)
    assert "3 jobs" in after
    assert "erased" in after
    assert (
        sql.scalar(
            admin_store, "SELECT count(*) FROM jobs WHERE household_id = ?", (mine.household_id,)
        )
        == 0
    )
    assert (
        sql.scalar(
            admin_store,
            "SELECT count(*) FROM api_tokens WHERE household_id = ?",
            (theirs.household_id,),
        )
        == 1
    )
    actions = [
        row["action"]
        for row in sql.rows(
            admin_store, "SELECT action FROM audit_log WHERE action <> 'create' ORDER BY seq"
        )
    ]
    assert actions == ["sign-in", "suspend", "resume", "erase"]
