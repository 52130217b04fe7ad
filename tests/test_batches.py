"""Dependencies (`depends_on`) and batches (`enqueue_batch`) through the real
pool, on both databases: a job waits for the jobs it names and runs once
they succeeded, or is cancelled when one did not; a batch's callback runs
exactly once when every member is final, whatever their outcomes; bad
requests write nothing."""

from __future__ import annotations

import gevent
import pytest
from marshmallow import ValidationError

from mealquest.households import create_household
from mealquest.jobs.enqueueing import JobRequest
from mealquest.jobs.errors import TooManyJobs
from mealquest.jobs.runner.unblocker import Unblocker
from mealquest.jobs.service import JobService, get_jobs
from mealquest.jobs.service.retention import prune
from mealquest.model.batches import BatchStatus
from mealquest.model.jobs import MESSAGE_DEPENDENCY_FAILED, Status
from mealquest.operator_actions import erasure
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


def final(jobs, job_id):
    return wait_for(lambda: (job := jobs.get(job_id)).status in FINAL and job)


def count(store, table: str) -> int:
    return sql.scalar(store, f"SELECT count(*) FROM {table}")


def runs(log) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def test_a_job_waits_for_what_it_depends_on_then_runs(app, household, gates):
    jobs = get_jobs(app)
    first = jobs.enqueue(
        "wait_for_gate", {"url": gates.url("a")}, household_id=household.household_id
    )
    second = jobs.enqueue(
        "succeed", {"value": 530}, household_id=household.household_id, depends_on=[first]
    )
    wait_for(lambda: gates.arrivals("a") == 1)
    waiting = jobs.get(second)
    assert waiting.status is Status.QUEUED
    answer = app.test_client().get(
        f"/api/v1/jobs/{second}", headers={"Authorization": f"Bearer {household.token}"}
    )
    assert answer.get_json()["queue"]["waiting_for"] == "dependencies"
    assert answer.get_json()["queue"]["estimated_start_at"] is None

    gates.open("a")
    assert final(jobs, first).status is Status.SUCCEEDED
    done = final(jobs, second)
    assert (done.status, done.result) == (Status.SUCCEEDED, {"value": 530})
    assert done.started_at >= jobs.get(first).finished_at


def test_a_failed_dependency_cancels_the_chain_that_waits_for_it(app, household):
    jobs = get_jobs(app)
    hid = household.household_id
    failing = jobs.enqueue("fail_with_failure", {"message": "no"}, household_id=hid)
    middle = jobs.enqueue("succeed", {"value": 109}, household_id=hid, depends_on=[failing])
    last = jobs.enqueue("succeed", {"value": 108}, household_id=hid, depends_on=[middle])
    assert final(jobs, failing).status is Status.FAILED
    for job_id in (middle, last):
        job = final(jobs, job_id)
        assert (job.status, job.error, job.attempt) == (
            Status.CANCELLED,
            MESSAGE_DEPENDENCY_FAILED,
            0,
        )


def test_a_job_that_depends_on_a_job_already_done_runs_at_once(app, household):
    jobs = get_jobs(app)
    hid = household.household_id
    first = jobs.enqueue("succeed", {"value": 49}, household_id=hid)
    final(jobs, first)
    second = jobs.enqueue("succeed", {"value": 50}, household_id=hid, depends_on=[first])
    assert final(jobs, second).status is Status.SUCCEEDED


def test_cancelling_a_dependency_cancels_its_dependent(app, household, gates):
    jobs = get_jobs(app)
    hid = household.household_id
    held = jobs.enqueue("wait_for_gate", {"url": gates.url("held")}, household_id=hid)
    # Queued behind nothing it could start: its own kind waits on the gate too.
    blocker = jobs.enqueue("succeed", {"value": 120}, household_id=hid, depends_on=[held])
    dependent = jobs.enqueue("succeed", {"value": 121}, household_id=hid, depends_on=[blocker])
    jobs.cancel(blocker, hid)
    job = final(jobs, dependent)
    assert (job.status, job.error) == (Status.CANCELLED, MESSAGE_DEPENDENCY_FAILED)
    assert jobs.get(blocker).error is None  # cancelled by its household, not by a dependency
    gates.open("held")
    assert final(jobs, held).status is Status.SUCCEEDED


def test_unknown_or_foreign_dependencies_write_nothing(app, store, household, other_household):
    jobs = get_jobs(app)
    theirs = jobs.enqueue("succeed", {"value": 120}, household_id=other_household.household_id)
    before = count(store, "jobs")
    for depends_on in (["0" * 32], [theirs]):
        with pytest.raises(ValidationError) as raised:
            jobs.enqueue(
                "succeed",
                {"value": 121},
                household_id=household.household_id,
                depends_on=depends_on,
            )
        assert raised.value.normalized_messages() == {
            "depends_on": [f"no job {depends_on[0]} in this household"]
        }
    with pytest.raises(ValidationError) as raised:
        jobs.enqueue(
            "succeed",
            {"value": 121},
            household_id=household.household_id,
            depends_on=[theirs],
            delay=5,
        )
    assert "depends_on" in raised.value.normalized_messages()
    assert count(store, "jobs") == before
    assert count(store, "job_dependencies") == 0


def test_a_batch_callback_runs_once_when_every_member_is_final(app, household, gates, tmp_path):
    jobs = get_jobs(app)
    hid = household.household_id
    log = tmp_path / "callback.log"
    batched = jobs.enqueue_batch(
        [
            JobRequest("succeed", {"value": 97}, hid),
            JobRequest("fail_with_failure", {"message": "bad page"}, hid),
            JobRequest("wait_for_gate", {"url": gates.url("slow")}, hid),
            JobRequest("flaky", {"fail_times": 1}, hid),
        ],
        on_complete=JobRequest("batch_report", {"log": str(log)}, hid),
    )
    ok, bad, slow, flaky = batched.job_ids
    wait_for(lambda: gates.arrivals("slow") == 1)
    final(jobs, ok), final(jobs, bad), final(jobs, flaky)
    batch = jobs.batch(batched.batch_id, household_id=hid)
    assert batch.status is BatchStatus.RUNNING
    assert (batch.count(Status.SUCCEEDED), batch.count(Status.FAILED), batch.total) == (2, 1, 4)
    assert jobs.get(batched.callback_job_id).status is Status.QUEUED
    jobs.cancel(slow, hid)  # a member cancelled while it runs
    callback = final(jobs, batched.callback_job_id)
    assert callback.status is Status.SUCCEEDED
    assert callback.result == {
        "batch_id": batched.batch_id,
        "succeeded": [ok, flaky],
        "failed": [bad],
        "cancelled": [slow],
    }
    assert jobs.get(flaky).attempt == 2  # a retried member counted once, at its end
    assert runs(log) == [batched.callback_job_id]
    finished = jobs.batch(batched.batch_id, household_id=hid)
    assert finished.status is BatchStatus.FINISHED
    assert finished.finished_at == callback.finished_at
    assert jobs.batch(batched.batch_id, household_id=hid + 1000) is None


def test_a_batch_is_all_or_nothing(app, store, household, other_household):
    jobs = get_jobs(app)
    hid = household.household_id
    with pytest.raises(ValidationError) as raised:
        jobs.enqueue_batch(
            [JobRequest("succeed", {"value": 97}, hid), JobRequest("succeed", {}, hid)],
            on_complete=JobRequest("batch_report", {"log": "x"}, hid),
        )
    assert list(raised.value.normalized_messages()) == [1]
    with pytest.raises(ValidationError):
        jobs.enqueue_batch(
            [JobRequest("succeed", {"value": 97}, other_household.household_id)],
            on_complete=JobRequest("batch_report", {"log": "x"}, hid),
        )
    with pytest.raises(ValidationError):
        jobs.enqueue_batch([])
    for table in ("jobs", "batches", "batch_jobs", "job_dependencies"):
        assert count(store, table) == 0


def test_the_quota_counts_members_not_the_callback(make_app, store, household, tmp_path):
    app = make_app(JOB_MAX_PENDING_PER_HOUSEHOLD=3)
    jobs = get_jobs(app)
    hid = household.household_id
    callback = JobRequest("batch_report", {"log": str(tmp_path / "log")}, hid)
    members = [JobRequest("succeed", {"value": i}, hid) for i in range(4)]
    with pytest.raises(TooManyJobs):
        jobs.enqueue_batch(members, on_complete=callback)
    assert count(store, "jobs") == 0
    batched = jobs.enqueue_batch(members[:3], on_complete=callback)
    assert len(batched.job_ids) == 3
    assert count(store, "jobs") == 4


def test_erasing_the_household_takes_its_batches_and_cancels_nothing_else(
    app, store, household, other_household, gates, tmp_path
):
    jobs = get_jobs(app)
    hid = household.household_id
    log = tmp_path / "log"
    batched = jobs.enqueue_batch(
        [JobRequest("wait_for_gate", {"url": gates.url("erase")}, hid)],
        on_complete=JobRequest("batch_report", {"log": str(log)}, hid),
    )
    kept = jobs.enqueue_batch(
        [JobRequest("succeed", {"value": 107}, other_household.household_id)],
        on_complete=JobRequest("batch_report", {"log": str(log)}, other_household.household_id),
    )
    wait_for(lambda: gates.arrivals("erase") == 1)
    erasure.erase(store, jobs, hid, None, wait_seconds=30)
    assert jobs.batch(batched.batch_id) is None
    assert jobs.get(batched.callback_job_id) is None
    assert final(jobs, kept.callback_job_id).status is Status.SUCCEEDED
    assert runs(log) == [kept.callback_job_id]
    assert count(store, "job_dependencies") == 0


def test_the_cli_lists_a_batch_and_a_households_batches(app, household, runner, tmp_path):
    jobs = get_jobs(app)
    hid = household.household_id
    batched = jobs.enqueue_batch(
        [
            JobRequest("succeed", {"value": 1}, hid),
            JobRequest("fail_with_failure", {"message": "no"}, hid),
        ],
        on_complete=JobRequest("batch_report", {"log": str(tmp_path / "log")}, hid),
    )
    final(jobs, batched.callback_job_id)
    shown = runner.invoke(args=["jobs", "list", "--batch", batched.batch_id])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0].startswith(f"batch {batched.batch_id}  finished  household={hid}  total=2")
    assert "succeeded=1  failed=1" in lines[0]
    assert [line.split()[0] for line in lines[1:3]] == batched.job_ids
    assert lines[3].startswith(f"callback  {batched.callback_job_id}  succeeded")
    failed_only = runner.invoke(
        args=["jobs", "list", "--batch", batched.batch_id, "--status", "failed"]
    )
    assert len(failed_only.output.splitlines()) == 2
    listed = runner.invoke(args=["jobs", "batches", "--household", str(hid)])
    assert listed.output.startswith(f"batch {batched.batch_id}  finished")
    unknown = runner.invoke(args=["jobs", "list", "--batch", "0" * 32])
    assert unknown.exit_code == 1
    assert "no batch" in unknown.output


def test_the_dashboard_shows_a_households_batches_and_a_batchs_members(
    make_app, store, household, tmp_path
):
    app = make_app(DASHBOARD=True, SECRET_KEY=SECRET_KEY)
    jobs = get_jobs(app)
    jobs.start_pool()
    hid = household.household_id
    secret = "tok_1a2b3c4d5e6f"
    batched = jobs.enqueue_batch(
        [
            JobRequest("succeed", {"value": 1}, hid),
            JobRequest("fail_with_failure", {"message": f"https://x.example/?token={secret}"}, hid),
        ],
        on_complete=JobRequest("batch_report", {"log": str(tmp_path / "log")}, hid),
    )
    final(jobs, batched.callback_job_id)
    client, _ = signed_in(app, create_operator(store, "Ada").token)
    households_page = client.get("/admin/households").get_data(as_text=True)
    assert f'id="batches-{hid}"' in households_page
    listing = client.get(f"/admin/batches?household={hid}").get_data(as_text=True)
    assert f"/admin/batches/{batched.batch_id}" in listing
    page = client.get(f"/admin/batches/{batched.batch_id}")
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    assert 'id="batch-status">finished<' in text
    assert all(f"/admin/jobs/{job_id}" in text for job_id in batched.job_ids)
    assert f"/admin/jobs/{batched.callback_job_id}" in text
    assert "token=***" in text
    assert secret not in text
    assert client.get("/admin/batches/" + "0" * 32).status_code == 404
    assert client.get("/admin/batches").status_code == 400
    assert app.test_client().get(f"/admin/batches/{batched.batch_id}").status_code in (302, 401)


def test_a_batch_goes_with_the_prune_of_its_last_job(app, store, household, tmp_path):
    jobs = get_jobs(app)
    hid = household.household_id
    batched = jobs.enqueue_batch(
        [JobRequest("succeed", {"value": 1}, hid)],
        on_complete=JobRequest("batch_report", {"log": str(tmp_path / "log")}, hid),
    )
    final(jobs, batched.callback_job_id)
    # The member is pruned, the callback not yet: the batch stays, smaller.
    sql.execute(
        store,
        "UPDATE jobs SET finished_at = '2000-01-01T00:00:00.000000Z' WHERE id = ?",
        (batched.job_ids[0],),
    )
    prune(store, older_than_days=1, catchup_seconds=0)
    kept = jobs.batch(batched.batch_id)
    assert (kept.total, kept.members, kept.callback_job_id) == (1, (), batched.callback_job_id)
    sql.execute(store, "UPDATE jobs SET finished_at = '2000-01-01T00:00:00.000000Z'")
    prune(store, older_than_days=1, catchup_seconds=0)
    assert jobs.batch(batched.batch_id) is None
    assert count(store, "batches") == 0


def test_the_unblocker_outlives_a_pass_the_database_refused(
    make_app, store, household, gates, tmp_path
):
    # The chaos test through PgBouncer found the role dying when the database
    # was away, which restarted its whole process. Here its table is locked
    # by another transaction past the busy timeout while a member ends: the
    # pass is refused, then the lock goes, and the callback still runs.
    if store.name != "postgresql":
        pytest.skip("SQLite's lock is the whole file: the member's own end would wait on it too")
    import logging

    import psycopg

    app = make_app(DB_BUSY_TIMEOUT_SECONDS=0.5)
    jobs = get_jobs(app)
    jobs.start_pool()
    hid = household.household_id
    log = tmp_path / "callback.log"
    batched = jobs.enqueue_batch(
        [JobRequest("wait_for_gate", {"url": gates.url("member")}, hid)],
        on_complete=JobRequest("batch_report", {"log": str(log)}, hid),
    )
    (member,) = batched.job_ids
    wait_for(lambda: gates.arrivals("member") == 1)
    refused: list[str] = []

    class Refusals(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name.endswith("unblocker"):
                refused.append(record.getMessage())

    handler = Refusals(level=logging.WARNING)
    logging.getLogger("mealquest").addHandler(handler)
    try:
        with psycopg.connect(app.config["DATABASE_URL"]) as holder:
            holder.execute("LOCK TABLE job_dependencies IN ACCESS EXCLUSIVE MODE")
            gates.open("member")
            wait_for(
                lambda: (
                    holder.execute("SELECT status FROM jobs WHERE id = %s", (member,)).fetchone()[0]
                    == "succeeded"
                )
            )
            wait_for(lambda: refused)
            holder.rollback()
    finally:
        logging.getLogger("mealquest").removeHandler(handler)
    assert refused[0] == "unblocking jobs: database unavailable; trying again"
    callback = final(jobs, batched.callback_job_id)
    assert callback.status is Status.SUCCEEDED
    assert runs(log) == [batched.callback_job_id]
    pool = jobs.pool
    assert pool is not None
    assert not pool.roles["unblocker"].dead  # the role never died


def test_a_pass_given_the_jobs_that_ended_resolves_only_what_waits_for_them(make_app):
    # What the unblocker runs at each completion: the dependencies on the
    # jobs that ended, not every one still waiting (those wait for a full
    # pass, at the latest `interval_seconds` later). No pool: the passes are
    # this test's, and the jobs it marks ended must not be running meanwhile
    # (the module's pool claimed them under load before the update).
    jobs, hid = without_the_modules_pool(make_app)
    store = jobs.store
    first, second = (jobs.enqueue("succeed", {"value": v}, household_id=hid) for v in (1, 2))
    sql.execute(
        store,
        "UPDATE jobs SET status = 'succeeded', attempt = 1, started_at = updated_at, "
        "finished_at = updated_at",
    )
    waits_first = jobs.enqueue("succeed", {"value": 3}, household_id=hid, depends_on=[first])
    waits_second = jobs.enqueue("succeed", {"value": 4}, household_id=hid, depends_on=[second])

    targeted = store.write(store.batches.resolve_dependencies, limit=100, depends_on=[first])
    assert (targeted.due, targeted.resolved) == ((waits_first,), 1)
    assert store.write(store.batches.resolve_dependencies, limit=100, depends_on=[]).resolved == 0
    full = store.write(store.batches.resolve_dependencies, limit=100)
    assert (full.due, full.resolved) == ((waits_second,), 1)


def without_the_modules_pool(make_app, **config) -> tuple[JobService, int]:
    """An app of the test's own and a household of it: the module's `app`
    (which `household` and `store` need) runs a pool whose unblocker would
    make the passes this test makes or watches."""
    jobs = get_jobs(make_app(**config))
    return jobs, create_household(jobs.store, "The Smiths").household_id


def test_a_cascade_is_cancelled_a_level_a_statement_in_one_wake(make_app):
    # A failed chain of twenty: the old full pass cancelled one level a wake
    # (a wake a second), so the last waited twenty seconds.
    jobs, hid = without_the_modules_pool(make_app)  # no pool: the pass is this test's
    store = jobs.store
    head = jobs.enqueue("succeed", {"value": 0}, household_id=hid)
    chain = [head]
    for value in range(1, 21):
        chain.append(
            jobs.enqueue("succeed", {"value": value}, household_id=hid, depends_on=[chain[-1]])
        )
    jobs.cancel(head, hid)

    done = Unblocker(store).run_once()
    assert sorted(done.cancelled) == sorted(chain[1:])
    assert {jobs.get(job_id).status for job_id in chain[1:]} == {Status.CANCELLED}


def test_a_dependency_ended_elsewhere_is_seen_while_jobs_complete_steadily(make_app):
    # This process's pool completes a job every few hundredths of a second,
    # each completion nudging its unblocker; the jobs, and the cancel of the
    # callback's only member while it is queued, come from another process
    # (an app without a pool here), which nudges nothing here. The old
    # unblocker looked at every dependency only after a whole second without
    # a nudge: never, while jobs kept completing.
    jobs, hid = without_the_modules_pool(make_app, JOB_POLL_SECONDS=0.05)
    jobs.start_pool()
    elsewhere = get_jobs(make_app())
    batched = jobs.enqueue_batch(
        [JobRequest("succeed", {"value": 6}, hid, delay=3600)],
        on_complete=JobRequest("succeed", {"value": 7}, hid),
    )
    (member,) = batched.job_ids
    completed: list[str] = []
    steady = gevent.spawn(_complete_steadily, elsewhere, hid, completed)
    try:
        wait_for(lambda: len(completed) >= 3)
        elsewhere.cancel(member, hid)
        callback = final(jobs, batched.callback_job_id)
        assert callback.status is Status.SUCCEEDED
        assert not steady.dead  # jobs completed all along
    finally:
        steady.kill()


def _complete_steadily(jobs, household_id: int, completed: list[str]) -> None:
    while True:
        job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household_id)
        final(jobs, job_id)
        completed.append(job_id)
