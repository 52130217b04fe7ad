"""A job's own log lines (`ctx.log`): kept with the attempt that wrote them,
bounded (100 lines, 16 KiB an attempt), masked, shown to operators (`flask
jobs show`, the dashboard's job page) and never to households, and gone with
the job (a prune) and with its household (an erasure); on both databases,
through the real pool."""

from __future__ import annotations

import json
import logging

import pytest

from mealquest.jobs.job_log import MAX_BYTES, MAX_LINES
from mealquest.jobs.service import get_jobs
from mealquest.jobs.service.retention import prune
from mealquest.logs import ContextFormatter, JsonFormatter
from mealquest.model.jobs import Status
from mealquest.operator_actions import erasure
from mealquest.operators import create_operator
from tests.conftest import wait_for
from tests.support import sql
from tests.test_admin import SECRET_KEY, signed_in

pytestmark = pytest.mark.both_databases

SECRET = "tok_9f8e7d6c5b4a"
URL = f"https://api.example/recipes?token={SECRET}"


@pytest.fixture
def app(make_app):
    app = make_app(DASHBOARD=True, SECRET_KEY=SECRET_KEY)
    get_jobs(app).start_pool()
    return app


def run(app, household, **payload):
    jobs = get_jobs(app)
    job_id = jobs.enqueue("talk", payload, household_id=household.household_id)
    return job_id, wait_for(lambda: (job := jobs.get(job_id)).status in FINAL and job)


FINAL = {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED}


def test_each_attempts_lines_are_kept_masked_and_shown_to_operators_only(
    app, household, auth, runner, store
):
    job_id, job = run(app, household, lines=3, text=f"fetched {URL}", fail_first=True)
    assert (job.status, job.attempt) == (Status.SUCCEEDED, 2)
    lines = get_jobs(app).log_lines(job_id)
    assert [(x.attempt, x.line, x.level) for x in lines] == [
        (1, 1, "INFO"),
        (1, 2, "WARNING"),
        (1, 3, "WARNING"),
        (1, 4, "WARNING"),  # how the attempt ended, the runner's line
        (2, 1, "INFO"),
        (2, 2, "WARNING"),
        (2, 3, "WARNING"),
    ]
    assert lines[0].message == "attempt 1 says: fetched https://api.example/recipes?token=***"
    assert not [x for x in lines if SECRET in x.message]

    # Households never see them.
    answer = app.test_client().get(f"/api/v1/jobs/{job_id}", headers=auth)
    assert answer.status_code == 200
    assert "says" not in answer.get_data(as_text=True)

    # `flask jobs show` does.
    shown = json.loads(runner.invoke(args=["jobs", "show", job_id]).output)
    assert [x["message"] for x in shown["log"]][4] == lines[4].message

    # And the dashboard's job page.
    operator = create_operator(store, "Ada")
    client, _ = signed_in(app, operator.token)
    page = client.get(f"/admin/jobs/{job_id}").get_data(as_text=True)
    assert 'id="story"' in page
    assert "attempt 2 says: fetched https://api.example/recipes?token=***" in page
    assert SECRET not in page


def test_the_job_page_tells_the_story_of_each_attempt_and_how_the_job_ended(app, household, store):
    # Attempt 1 fails and is retried, attempt 2 succeeds; another job fails for good.
    job_id, job = run(app, household, lines=1, text="hello", fail_first=True)
    assert (job.status, job.attempt) == (Status.SUCCEEDED, 2)
    failing = get_jobs(app).enqueue(
        "fail_with_failure",
        {"message": "the page was not found (HTTP 404)"},
        household_id=household.household_id,
    )
    wait_for(lambda: get_jobs(app).get(failing).status is Status.FAILED)
    lines = get_jobs(app).log_lines(job_id)
    ending = [x for x in lines if x.attempt == 1][-1]
    retried = "attempt 1 failed: RuntimeError: first attempt fails; retried in "
    assert ending.message.startswith(retried)
    # A success adds no line of its own.
    assert [x.message for x in lines if x.attempt == 2] == ["attempt 2 says: hello"]

    operator = create_operator(store, "Ada")
    client, _ = signed_in(app, operator.token)
    page = client.get(f"/admin/jobs/{job_id}").get_data(as_text=True)
    story = page[page.index('id="story"') : page.index("</ol>")]
    assert (
        story.index('id="attempt-1"')
        < story.index("attempt 1 failed")
        < story.index('id="attempt-2"')
    )
    assert 'id="ended"' in story
    assert "Ended succeeded" in story
    # The row's columns are folded away.
    assert '<details id="columns">' in page

    page = client.get(f"/admin/jobs/{failing}").get_data(as_text=True)
    story = page[page.index('id="story"') : page.index("</ol>")]
    assert "attempt 1 failed: the page was not found (HTTP 404)" in story
    assert 'id="ended-error">the page was not found (HTTP 404)<' in story


def test_an_attempts_lines_are_bounded_and_say_how_many_were_not_kept(app, household):
    job_id, job = run(app, household, lines=MAX_LINES + 50)
    assert job.status is Status.SUCCEEDED
    lines = get_jobs(app).log_lines(job_id)
    assert len(lines) == MAX_LINES
    assert lines[-1].message.startswith("51 more line(s) not kept")

    job_id, job = run(app, household, lines=3, text="x" * 5000)
    wide = get_jobs(app).log_lines(job_id)
    assert sum(len(x.message.encode()) for x in wide) <= MAX_BYTES
    assert len(wide[0].message) <= 2000  # one line is cut as a failure message is


def test_the_lines_go_with_their_job_and_with_their_household(app, household, store):
    job_id, _ = run(app, household, lines=2, text="hello")
    assert get_jobs(app).log_lines(job_id)
    sql.execute(store, "UPDATE jobs SET finished_at = '2000-01-01T00:00:00.000000Z'")
    prune(store, older_than_days=1, catchup_seconds=0)
    assert get_jobs(app).log_lines(job_id) == []

    job_id, _ = run(app, household, lines=2, text="hello")
    erasure.erase(store, get_jobs(app), household.household_id, None, wait_seconds=5)
    assert get_jobs(app).log_lines(job_id) == []


# What the review found reaching operators unmasked through `ctx.log`.
QUOTED_SECRETS = [
    ("token mq_Zm9vYmFyYmF6cXV4", "token mq_***"),
    ("sent Authorization: Bearer abc.DEF-123", "sent Authorization: Bearer ***"),
    ("connect password=hunter2 host=db", "connect password=*** host=db"),
    ("fetch recipes.example/r?sig=hunter2", "fetch recipes.example/r?sig=***"),
    ("via cook:hunter2@db.example:5432/x", "via ***@db.example:5432/x"),
]


@pytest.mark.parametrize(("text", "masked"), QUOTED_SECRETS)
def test_a_handlers_lines_and_the_services_lines_mask_alike(app, household, text, masked):
    job_id, job = run(app, household, lines=1, text=text)
    assert job.status == Status.SUCCEEDED
    [line] = get_jobs(app).log_lines(job_id)
    assert line.message == f"attempt 1 says: {masked}"

    quoted = logging.LogRecord("mealquest.x", logging.INFO, "", 0, "says: %s", (text,), None)
    # A text without arguments is masked once and kept (`mealquest.logs`):
    # masked again each time it is logged, by either format.
    constant = logging.LogRecord("mealquest.x", logging.INFO, "", 0, f"says: {text}", (), None)
    for formatter in (ContextFormatter("%(message)s"), JsonFormatter()):
        for record in (quoted, constant, constant):
            shown = formatter.format(record)
            for secret in ("hunter2", "Zm9vYmFy", "DEF-123"):
                assert secret not in shown
            assert masked in shown


def test_the_job_page_links_a_member_and_a_callback_to_their_batch(app, household, store):
    from mealquest.jobs import JobRequest

    member = JobRequest("succeed", {"value": 1}, household.household_id)
    batched = get_jobs(app).enqueue_batch([member], on_complete=member)
    wait_for(lambda: get_jobs(app).get(batched.callback_job_id).status is Status.SUCCEEDED)
    operator = create_operator(store, "Ada")
    client, _ = signed_in(app, operator.token)
    page = client.get(f"/admin/jobs/{batched.job_ids[0]}").get_data(as_text=True)
    assert f'href="/admin/batches/{batched.batch_id}" id="member-of"' in page
    page = client.get(f"/admin/jobs/{batched.callback_job_id}").get_data(as_text=True)
    assert f'href="/admin/batches/{batched.batch_id}" id="callback-of"' in page
