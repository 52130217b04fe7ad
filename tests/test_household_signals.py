"""A job that asks its household, on both databases, through the real pool
and the real API: its steps run once, its wait holds no slot, the
household's answer resumes it, and the timeout ends its wait."""

from __future__ import annotations

import gevent
import pytest

from mealquest.jobs.errors import TooManyJobs
from mealquest.jobs.service import get_jobs
from mealquest.jobs.service.live import get_live
from mealquest.jobs.service.retention import prune
from mealquest.model.jobs import Status
from mealquest.operator_actions import erasure, suspension
from mealquest.operators import create_operator
from tests.conftest import wait_for
from tests.support import sql
from tests.test_admin import SECRET_KEY, signed_in

pytestmark = pytest.mark.both_databases

FINAL = {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED}


@pytest.fixture
def app(make_app):
    app = make_app()
    get_jobs(app).start_pool()
    return app


def auth(household) -> dict[str, str]:
    return {"Authorization": f"Bearer {household.token}"}


def final(jobs, job_id):
    return wait_for(lambda: (job := jobs.get(job_id)).status in FINAL and job)


def waiting(client, household, job_id) -> dict:
    """The job's answer once it waits for its household."""

    def asked():
        answer = client.get(f"/api/v1/jobs/{job_id}", headers=auth(household)).get_json()
        queue = answer.get("queue") or {}
        return queue.get("waiting_for") == "household" and answer

    return wait_for(asked)


def steps_run(log) -> int:
    return sum(1 for line in log.read_text().splitlines() if line.startswith("step "))


def ask(jobs, household, log, **payload) -> str:
    return jobs.enqueue(
        "ask_household", {"log": str(log), **payload}, household_id=household.household_id
    )


def signal(client, household, job_id, body, name="answer", **headers):
    return client.post(
        f"/api/v1/jobs/{job_id}/signals/{name}", json=body, headers={**auth(household), **headers}
    )


def test_a_job_waits_for_its_households_answer_and_resumes_past_its_step(
    app, client, jobs, household, tmp_path
):
    log = tmp_path / "steps.log"
    job_id = ask(jobs, household, log)

    asked = waiting(client, household, job_id)
    assert asked["status"] == "queued"
    assert asked["attempt"] == 0  # the wait spent no attempt
    assert asked["queue"]["signal"] == "answer"
    assert asked["queue"]["estimated_start_at"] is None
    assert asked["result"] == {"question": "how many?", "prepared": 1}
    # No slot held while it waits: its slot frees once its greenlet, told
    # that the wait was committed, leaves it (the API can show the wait first).
    wait_for(lambda: not get_jobs(app).pool.slots.running)

    answered = signal(client, household, job_id, {"count": 7})
    assert answered.status_code == 202, answered.get_json()
    assert answered.get_json()["id"] == job_id

    done = final(jobs, job_id)
    assert (done.status, done.result) == (Status.SUCCEEDED, {"answer": 7, "prepared": 1})
    assert done.attempt == 1
    assert steps_run(log) == 1  # the resumed run got the step's kept result


def test_an_answer_sent_while_the_job_runs_is_kept_for_its_wait(
    app, client, jobs, household, tmp_path, gates
):
    log = tmp_path / "steps.log"
    job_id = ask(jobs, household, log, gate=gates.url("before-wait"))
    wait_for(lambda: gates.arrivals("before-wait") == 1)
    assert jobs.get(job_id).status is Status.RUNNING

    answered = signal(client, household, job_id, {"count": 3})
    assert answered.status_code == 202
    assert answered.get_json()["status"] == "running"
    gates.open("before-wait")

    done = final(jobs, job_id)
    assert (done.status, done.result) == (Status.SUCCEEDED, {"answer": 3, "prepared": 1})
    assert steps_run(log) == 1


def test_at_its_timeout_the_wait_ends_without_an_answer(client, jobs, household, tmp_path):
    log = tmp_path / "steps.log"
    job_id = ask(jobs, household, log, timeout=0.5)
    done = final(jobs, job_id)
    assert (done.status, done.result) == (Status.SUCCEEDED, {"answer": None, "prepared": 1})
    assert steps_run(log) == 1


def test_a_signal_is_refused_as_it_must_be(client, jobs, household, other_household, tmp_path):
    job_id = ask(jobs, household, tmp_path / "steps.log")
    waiting(client, household, job_id)

    # Another household's job, an unknown job, a name the kind does not take.
    assert signal(client, other_household, job_id, {"count": 1}).status_code == 404
    assert signal(client, household, "0" * 32, {"count": 1}).status_code == 404
    assert signal(client, household, job_id, {"count": 1}, name="never").status_code == 404
    # A body that does not fit: 400 naming the field, and nothing stored.
    bad = signal(client, household, job_id, {"count": "seven"})
    assert bad.status_code == 400
    assert list(bad.get_json()["error"]["fields"]) == ["count"]
    assert signal(client, household, job_id, {"count": 101}).status_code == 400
    assert jobs.get(job_id).waiting_signal == "answer"
    # It waits for `answer`, not `other`.
    other = signal(client, household, job_id, {"count": 1}, name="other")
    assert (other.status_code, other.get_json()["error"]["code"]) == (409, "not_waiting")

    first = signal(client, household, job_id, {"count": 2}, **{"Idempotency-Key": "k-1"})
    assert first.status_code == 202
    # The same request again: the same answer; another one: it has its answer.
    again = signal(client, household, job_id, {"count": 2}, **{"Idempotency-Key": "k-1"})
    assert again.status_code == 202
    assert signal(client, household, job_id, {"count": 5}).status_code == 409

    done = final(jobs, job_id)
    assert done.result["answer"] == 2
    # A final job waits for nothing.
    late = signal(client, household, job_id, {"count": 1}, name="other")
    assert (late.status_code, late.get_json()["error"]["code"]) == (409, "not_waiting")


def test_a_waiting_job_is_cancelled_and_its_steps_and_signals_go_with_it(
    app, client, jobs, store, household, tmp_path
):
    job_id = ask(jobs, household, tmp_path / "steps.log")
    waiting(client, household, job_id)
    assert jobs.cancel(job_id, household.household_id).status is Status.CANCELLED
    assert signal(client, household, job_id, {"count": 1}).status_code == 409
    assert sql.scalar(store, "SELECT count(*) FROM job_steps") == 2  # the step and the wait

    sql.execute(store, "UPDATE jobs SET finished_at = '2000-01-01T00:00:00.000000Z'")
    prune(store, older_than_days=1, catchup_seconds=60)
    assert sql.scalar(store, "SELECT count(*) FROM job_steps") == 0
    assert sql.scalar(store, "SELECT count(*) FROM job_signals") == 0


def test_operators_see_the_waits_answer_one_and_count_them(
    make_app, store, household, other_household, runner, tmp_path
):
    app = make_app(DASHBOARD=True, SECRET_KEY=SECRET_KEY)
    jobs = get_jobs(app)
    jobs.start_pool()
    client = app.test_client()
    mine = ask(jobs, household, tmp_path / "mine.log")
    theirs = ask(jobs, other_household, tmp_path / "theirs.log")
    for job_id in (mine, theirs):
        wait_for(lambda job_id=job_id: jobs.get(job_id).waiting_signal == "answer")

    operator = create_operator(store, "Ada")
    dashboard, _ = signed_in(app, operator.token)
    every = dashboard.get("/admin/waiting-for-households").get_data(as_text=True)
    assert f"/admin/jobs/{mine}" in every
    assert f"/admin/jobs/{theirs}" in every
    one = dashboard.get(f"/admin/waiting-for-households?household={household.household_id}")
    assert f"/admin/jobs/{theirs}" not in one.get_data(as_text=True)
    assert dashboard.get("/admin/waiting-for-households?household=x").status_code == 400
    page = dashboard.get(f"/admin/jobs/{mine}").get_data(as_text=True)
    assert "It waits for its household&#39;s answer (signal answer)" in page

    metrics = client.get("/metrics", headers={"Authorization": f"Bearer {operator.token}"})
    text = metrics.get_data(as_text=True)
    assert "mealquest_jobs_waiting_for_household 2.0" in text
    assert "mealquest_jobs_waiting_for_household_next_timeout_seconds " in text

    cli = app.test_cli_runner()
    refused = cli.invoke(args=["jobs", "signal", mine, "answer", "--json", '{"count": -1}'])
    assert refused.exit_code != 0
    assert "count" in refused.output
    answered = cli.invoke(args=["jobs", "signal", mine, "answer", "--json", '{"count": 4}'])
    assert answered.exit_code == 0, answered.output
    assert final(jobs, mine).result == {"answer": 4, "prepared": 1}
    again = cli.invoke(args=["jobs", "signal", mine, "answer", "--json", '{"count": 4}'])
    assert again.exit_code != 0
    assert "does not wait" in again.output
    audit_log = sql.rows(store, "SELECT action, target FROM audit_log ORDER BY seq")
    assert {"action": "signal", "target": f"job {mine}: answer"} in audit_log


def test_a_suspended_household_cannot_answer(app, client, jobs, store, household, tmp_path):
    job_id = ask(jobs, household, tmp_path / "steps.log")
    waiting(client, household, job_id)
    suspension.suspend(store, household.household_id, None)
    refused = signal(client, household, job_id, {"count": 1})
    assert (refused.status_code, refused.get_json()["error"]["code"]) == (
        403,
        "household_suspended",
    )
    assert jobs.get(job_id).waiting_signal == "answer"


def test_the_long_poll_sees_the_wait_begin_and_end(app, client, jobs, household, tmp_path, gates):
    job_id = ask(jobs, household, tmp_path / "steps.log", gate=gates.url("before-wait"))
    wait_for(lambda: gates.arrivals("before-wait") == 1)
    running = client.get(f"/api/v1/jobs/{job_id}", headers=auth(household))
    assert running.get_json()["status"] == "running"

    def long_poll(etag):
        return client.get(
            f"/api/v1/jobs/{job_id}?wait=30", headers={**auth(household), "If-None-Match": etag}
        )

    places = get_live(app).places

    def holding(poll):
        """Whether `poll` is held (it took one of the process's held places)."""
        wait_for(lambda: poll.ready() or places.open > 0)
        return not poll.ready()

    held = gevent.spawn(long_poll, running.headers["ETag"])
    assert holding(held)  # held while the job runs on
    gates.open("before-wait")
    began = held.get(timeout=30)
    assert began.status_code == 200
    assert began.get_json()["queue"]["waiting_for"] == "household"

    held = gevent.spawn(long_poll, began.headers["ETag"])
    assert holding(held)  # nothing changes while it waits
    assert signal(client, household, job_id, {"count": 1}).status_code == 202
    ended = held.get(timeout=30)
    assert ended.status_code == 200
    assert (
        ended.get_json()["queue"] is None
        or ended.get_json()["status"] != "queued"
        or (ended.get_json()["queue"]["waiting_for"] != "household")
    )


def test_a_waiting_job_counts_against_the_quota_and_goes_with_its_households_erasure(
    make_app, store, household, tmp_path
):
    app = make_app(JOB_MAX_PENDING_PER_HOUSEHOLD=1)
    jobs = get_jobs(app)
    jobs.start_pool()
    client = app.test_client()
    job_id = ask(jobs, household, tmp_path / "steps.log")
    waiting(client, household, job_id)
    assert signal(client, household, job_id, {"count": 1}, name="other").status_code == 409
    # Unfinished while it waits: the household is at its quota.
    with pytest.raises(TooManyJobs):
        jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    assert signal(client, household, job_id, {"count": 1}).status_code == 202
    final(jobs, job_id)
    assert sql.scalar(store, "SELECT count(*) FROM job_signals") == 1
    assert sql.scalar(store, "SELECT count(*) FROM job_steps") == 2  # the step and the wait

    erasure.erase(store, jobs, household.household_id, None, wait_seconds=30)
    for table in ("jobs", "job_steps", "job_signals"):
        assert sql.scalar(store, f"SELECT count(*) FROM {table}") == 0
