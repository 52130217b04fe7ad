"""The job lifecycle through the real runner: cancelling, idempotent and scheduled
enqueues, priorities, bulk enqueues and follow-up jobs, on both databases."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import gevent
import pytest
from marshmallow import ValidationError

from mealquest.clock import to_text, utc_now
from mealquest.jobs import enqueueing
from mealquest.jobs.enqueueing import Enqueued
from mealquest.jobs.errors import IdempotencyKeyReused, UnknownKind
from mealquest.jobs.runner.outcome import Outcome
from mealquest.jobs.service import JobRequest, get_jobs
from mealquest.model.jobs import ClaimRequest, OnInterrupt, Status, Transition
from tests.conftest import wait_for
from tests.support import sql, transitions
from tests.support.processes import flask_jobs_work, process_group, wait_working
from tests.support.rescue import rescue_all

pytestmark = pytest.mark.both_databases

# A cancelled handler that does not stop is killed this soon.
QUICK_GRACE = {"JOB_KILL_GRACE_SECONDS": 0.3}


def final(jobs, job_id):
    job = jobs.get(job_id)
    return job if job.status in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED) else None


def count_jobs(store) -> int:
    return sql.scalar(store, "SELECT count(*) AS n FROM jobs")


# -- cancelling ------------------------------------------------------------------------------


def test_a_queued_job_is_cancelled_at_once_idempotently_and_never_runs(
    client, auth, jobs, household
):
    mine = household.household_id
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=mine)

    first = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth)
    again = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth)

    assert first.status_code == 200
    assert first.json["status"] == "cancelled"
    assert first.json["error"] is None
    assert first.json["attempt"] == 0
    assert first.json["finished_at"] is not None
    assert (again.status_code, again.json) == (200, first.json)
    # The pool runs a job enqueued after it, and never the cancelled one.
    jobs.start_pool()
    later = jobs.enqueue("succeed", {"value": 2}, household_id=mine)
    wait_for(lambda: final(jobs, later))
    assert client.get(f"/api/v1/jobs/{job_id}", headers=auth).json == first.json


def test_a_finished_job_is_a_conflict_and_an_unknown_or_others_job_is_404(
    client, auth, jobs, household, other_household
):
    mine = household.household_id
    done = jobs.enqueue("succeed", {"value": 1}, household_id=mine)
    failed = jobs.enqueue("fail_with_failure", {"message": "nope"}, household_id=mine)
    theirs = jobs.enqueue("succeed", {"value": 1}, household_id=other_household.household_id)
    jobs.start_pool()
    wait_for(lambda: final(jobs, done) and final(jobs, failed))

    for job_id, status in ((done, "succeeded"), (failed, "failed")):
        answer = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth)
        assert answer.status_code == 409
        assert answer.json == {
            "error": {"code": "conflict", "message": f"the job has already {status}"}
        }
        assert jobs.get(job_id).status == status
    for job_id in (theirs, "0" * 32, "not-an-id"):
        answer = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth)
        assert answer.status_code == 404
        assert answer.json == {"error": {"code": "not_found", "message": "job not found"}}
    assert jobs.get(theirs).status in (Status.QUEUED, Status.RUNNING, Status.SUCCEEDED)
    assert client.post(f"/api/v1/jobs/{done}/cancel").status_code == 401


def test_a_cooperative_running_job_stops_at_once_keeping_its_partial_result(
    client, auth, jobs, household
):
    job_id = jobs.enqueue("until_cancelled", {}, household_id=household.household_id)
    jobs.start_pool()
    partial = {"step": 1, "done": False}
    wait_for(lambda: jobs.get(job_id).result == partial)

    answer = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth)

    assert answer.status_code == 202
    assert (answer.json["status"], answer.json["result"]) == ("running", partial)
    job = wait_for(lambda: final(jobs, job_id))
    assert job.status == Status.CANCELLED
    assert (job.result, job.error, job.attempt) == (partial, None, 1)
    assert job.finished_at is not None
    # Cancelled, it is not retried, though its kind allows three attempts.
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth).status_code == 200


def test_a_handler_that_ignores_the_cancel_is_killed_after_the_grace(
    make_app, gates, household, logs
):
    jobs = get_jobs(make_app(**QUICK_GRACE))
    job_id = jobs.enqueue(
        "wait_for_gate_retried", {"url": gates.url("never")}, household_id=household.household_id
    )
    jobs.start_pool()
    wait_for(lambda: gates.arrivals("never") == 1)

    assert jobs.cancel(job_id).status == Status.RUNNING
    job = wait_for(lambda: final(jobs, job_id))

    assert (job.status, job.error, job.attempt) == (Status.CANCELLED, None, 1)
    assert "handler did not stop after its job was cancelled; killing it" in logs.text
    assert gates.arrivals("never") == 1  # not retried


def test_a_job_running_in_another_process_is_cancelled_there(
    database, jobs, store, household, gates
):
    with process_group() as processes:
        worker = flask_jobs_work(
            database,
            JOB_POLL_SECONDS=0.1,
            JOB_LEASE_SECONDS=2.0,
            JOB_HEARTBEAT_SECONDS=0.25,
            JOB_RESCUE_SECONDS=0.25,
            JOB_BLOCKED_EXIT_SECONDS=1.5,
            **QUICK_GRACE,
        )
        processes.append(worker)
        wait_working(worker)
        held = jobs.enqueue(
            "wait_for_gate", {"url": gates.url("held")}, household_id=household.household_id
        )
        wait_for(lambda: gates.arrivals("held") == 1, timeout=60)

        # This process runs no pool: only the other one's heartbeat can tell it.
        assert jobs.cancel(held).status == Status.RUNNING
        job = wait_for(lambda: final(jobs, held), timeout=60)

        assert (job.status, job.error) == (Status.CANCELLED, None)
        assert worker.stop() == 0
    assert "job cancelled" in worker.output()


def test_cancel_while_the_job_finishes_keeps_one_outcome(
    client, auth, jobs, store, database, household, gates
):
    """Opening the gate and cancelling at the same moment: the job ends either
    succeeded (it finished first: 409 or 202 then succeeded) or cancelled, the
    answer agrees with the end, and the database recorded one final state."""
    transitions.install(store, database)
    jobs.start_pool()
    seen = set()
    ids = []
    for round_ in range(6):
        name = f"race{round_}"
        job_id = jobs.enqueue(
            "wait_for_gate", {"url": gates.url(name)}, household_id=household.household_id
        )
        ids.append(job_id)
        wait_for(lambda name=name: gates.arrivals(name) == 1)
        opener = gevent.spawn(gates.open, name)
        answer = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth)
        opener.join()
        job = wait_for(lambda job_id=job_id: final(jobs, job_id))
        assert answer.status_code in (202, 409)
        if answer.status_code == 409:
            assert job.status == Status.SUCCEEDED
        assert job.status in (Status.SUCCEEDED, Status.CANCELLED)
        assert job.error is None
        if job.status == Status.SUCCEEDED:
            assert job.result["pid"] > 0
        seen.add(job.status)
    assert seen
    transitions.assert_one_final_state_each(store, ids)


def test_the_fenced_writes_honour_a_cancel_request(store, jobs, household):
    """What a worker writes after a cancel reached the database but not yet
    its process: a success stands, a retry or an interruption ends cancelled."""
    mine = household.household_id
    ids = [jobs.enqueue("flaky", {"fail_times": 0}, household_id=mine) for _ in range(4)]
    claimed = store.write(
        store.jobs.claim, ClaimRequest(owner="w.1", lease_seconds=60, limit=4, kinds=["flaky"])
    )
    leases = {job.id: job.lease for job in claimed}
    store.write(store.jobs.publish, leases[ids[1]], result='{"attempt": 1}')
    for job_id in ids:
        assert jobs.cancel(job_id).status == Status.RUNNING
    assert store.write(store.jobs.cancel_requested, list(leases.values())) == set(ids)

    assert store.write(
        store.jobs.transition,
        Transition(leases[ids[0]], to=Status.SUCCEEDED, result='{"attempt": 1}'),
    )
    assert store.write(
        store.jobs.transition, Transition(leases[ids[1]], to=Status.QUEUED, delay_seconds=0)
    )
    recovered = store.write(store.jobs.interrupt, [leases[ids[2]]])
    expired = rescue_all(store, now=utc_now() + timedelta(seconds=120))

    assert recovered.cancelled == (ids[2],)
    assert expired.cancelled == (ids[3],)
    ended = {job_id: jobs.get(job_id) for job_id in ids}
    assert ended[ids[0]].status == Status.SUCCEEDED
    for job_id in ids[1:]:
        assert (ended[job_id].status, ended[job_id].error) == (Status.CANCELLED, None)
        assert ended[job_id].finished_at is not None
    assert ended[ids[1]].result == {"attempt": 1}  # the last partial result stays
    # A final job is not cancelled; a failed or cancelled one can be retried.
    assert jobs.cancel(ids[0]).status == Status.SUCCEEDED
    retried = jobs.retry(ids[1])
    assert (retried.status, retried.attempt, retried.result) == (Status.QUEUED, 0, None)
    assert jobs.retry(ids[0]).status == Status.SUCCEEDED
    assert jobs.retry("0" * 32) is None


def test_flask_jobs_cancel(runner, jobs, household):
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)

    result = runner.invoke(args=["jobs", "cancel", job_id])

    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert (shown["id"], shown["status"], shown["error"]) == (job_id, "cancelled", None)
    assert runner.invoke(args=["jobs", "cancel", job_id]).exit_code == 0
    unknown = runner.invoke(args=["jobs", "cancel", "0" * 32])
    assert unknown.exit_code == 1
    assert unknown.output.strip() == f"Error: no job {'0' * 32}"


# -- idempotent enqueue ----------------------------------------------------------------------

URL = "https://recipes.example/soup"


def post_import(client, auth, key, url=URL, **extra_headers):
    headers = {**auth, **extra_headers}
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post("/api/v1/recipe-imports", json={"url": url}, headers=headers)


def test_a_repeated_key_answers_the_same_job_and_another_body_is_422(client, auth, store):
    first = post_import(client, auth, "order-42")
    repeat = post_import(client, auth, "order-42")
    other = post_import(client, auth, "order-42", url=URL + "?again")

    assert first.status_code == 202
    assert repeat.status_code == 200
    assert repeat.json == first.json
    assert repeat.headers["Location"] == first.headers["Location"]
    assert other.status_code == 422
    assert other.json["error"]["code"] == "idempotency_key_reused"
    assert "Idempotency-Key" in other.json["error"]["message"]
    # Without a key, every request makes a job.
    assert post_import(client, auth, None).json["id"] != first.json["id"]
    assert count_jobs(store) == 2


@pytest.mark.parametrize(
    "key",
    ["", " ", "a b", "x" * 256, "caf\u00e9", "tab\there", "\x7f"],
    ids=["empty", "space", "inner-space", "too-long", "non-ascii", "control", "del"],
)
def test_a_bad_key_is_a_validation_error_naming_the_header(client, auth, store, key):
    answer = client.post(
        "/api/v1/recipe-imports",
        json={"url": URL},
        headers={**auth, "Idempotency-Key": key.encode("utf-8").decode("latin-1")},
    )
    assert answer.status_code == 400
    assert answer.json["error"]["code"] == "validation_error"
    assert list(answer.json["error"]["fields"]) == ["Idempotency-Key"]
    assert count_jobs(store) == 0


def test_the_longest_and_oddest_visible_keys_are_accepted(client, auth):
    for key in ("x" * 255, "!", "~{}[]|\\\"'<>"):
        assert post_import(client, auth, key, url=f"{URL}/{len(key)}").status_code == 202


def test_keys_are_per_household_and_end_after_24_hours(
    client, auth, store, other_household, household
):
    theirs = {"Authorization": f"Bearer {other_household.token}"}
    mine = post_import(client, auth, "k1")
    also_mine_elsewhere = post_import(client, theirs, "k1")
    assert also_mine_elsewhere.status_code == 202
    assert also_mine_elsewhere.json["id"] != mine.json["id"]

    def created_hours_ago(hours: int) -> None:
        moment = to_text(utc_now() - timedelta(hours=hours))
        sql.execute(store, "UPDATE jobs SET created_at = ? WHERE id = ?", (moment, mine.json["id"]))

    # 23 hours on: still the same job. 25 hours on: the key may name a new one.
    created_hours_ago(23)
    repeat = post_import(client, auth, "k1")
    assert (repeat.status_code, repeat.json["id"]) == (200, mine.json["id"])
    created_hours_ago(25)
    renewed = post_import(client, auth, "k1", url=URL + "/next")
    assert renewed.status_code == 202
    assert renewed.json["id"] != mine.json["id"]
    again = post_import(client, auth, "k1", url=URL + "/next")
    assert (again.status_code, again.json["id"]) == (200, renewed.json["id"])
    assert count_jobs(store) == 3


def test_concurrent_repeats_make_one_job(make_app, household, store):
    """Greenlets on two apps (two stores: two writer threads on SQLite, two
    connection pools on PostgreSQL) insert the same key at once."""
    services = [get_jobs(make_app()) for _ in range(2)]
    results: list[Enqueued] = []

    def insert(service):
        results.append(
            service.insert(
                "succeed", {"value": 1}, household_id=household.household_id, unique_key="same"
            )
        )

    gevent.joinall([gevent.spawn(insert, services[i % 2]) for i in range(40)], raise_error=True)

    assert len(results) == 40
    assert len({result.job_id for result in results}) == 1
    assert sum(result.created for result in results) == 1
    assert count_jobs(store) == 1


def test_enqueue_with_a_key_in_code(jobs, household):
    mine = household.household_id
    first = jobs.enqueue("succeed", {"value": 1}, household_id=mine, unique_key="k")
    assert jobs.enqueue("succeed", {"value": 1}, household_id=mine, unique_key="k") == first
    with pytest.raises(IdempotencyKeyReused):
        jobs.enqueue("succeed", {"value": 2}, household_id=mine, unique_key="k")
    with pytest.raises(IdempotencyKeyReused):
        jobs.enqueue("sleep", {"seconds": 1}, household_id=mine, unique_key="k")
    with pytest.raises(ValidationError) as bad:
        jobs.enqueue("succeed", {"value": 1}, household_id=mine, unique_key="a b")
    assert list(bad.value.messages) == ["unique_key"]


# -- scheduling and priority -----------------------------------------------------------------


def test_claims_go_by_priority_then_due_time_then_insertion(store, jobs, household):
    mine = household.household_id
    now = utc_now()
    later = jobs.enqueue("succeed", {"value": 1}, household_id=mine, priority=5)
    first_normal = jobs.enqueue("succeed", {"value": 2}, household_id=mine)
    second_normal = jobs.enqueue("succeed", {"value": 3}, household_id=mine)
    older_normal = jobs.enqueue(
        "succeed", {"value": 4}, household_id=mine, run_at=now - timedelta(minutes=5)
    )
    urgent = jobs.enqueue("succeed", {"value": 5}, household_id=mine, priority=-1)
    future = jobs.enqueue("succeed", {"value": 6}, household_id=mine, delay=3600)
    scheduled = jobs.enqueue(
        "succeed", {"value": 7}, household_id=mine, run_at=now + timedelta(hours=2), priority=-9
    )

    claimed = store.write(
        store.jobs.claim, ClaimRequest(owner="w.1", lease_seconds=60, limit=10, kinds=["succeed"])
    )

    assert [job.id for job in claimed] == [urgent, older_normal, first_normal, second_normal, later]
    assert jobs.get(future).status == Status.QUEUED
    assert jobs.get(future).run_at >= to_text(now + timedelta(seconds=3590))
    assert jobs.get(scheduled).run_at == to_text(now + timedelta(hours=2))
    assert not store.read(store.jobs.has_due_job, ["succeed"])
    # The future jobs come due: at the claim's moment, by priority.
    due = store.write(
        store.jobs.claim,
        ClaimRequest(
            owner="w.2", lease_seconds=60, limit=10, kinds=["succeed"], now=now + timedelta(hours=3)
        ),
    )
    assert [job.id for job in due] == [scheduled, future]


def test_a_job_due_before_the_year_1000_is_due_now_and_runs(make_app, household):
    # Due times are stored as text whose order is their order: a year of
    # fewer than four digits sorted after every later one, and the job
    # never came due.
    jobs = get_jobs(make_app())
    long_ago = datetime(5, 1, 2, 3, 4, 5, tzinfo=UTC)
    job_id = jobs.enqueue(
        "succeed", {"value": 1}, household_id=household.household_id, run_at=long_ago
    )
    assert jobs.get(job_id).run_at == "0005-01-02T03:04:05.000000Z"
    jobs.start_pool()
    wait_for(lambda: final(jobs, job_id))
    assert jobs.get(job_id).status is Status.SUCCEEDED


def test_the_runner_runs_urgent_jobs_first(make_app, household, tmp_path):
    jobs = get_jobs(make_app(JOB_WORKERS=1))
    log = tmp_path / "runs.log"
    mine = household.household_id
    ids = [
        jobs.enqueue("append_job_id", {"log": str(log)}, household_id=mine, priority=priority)
        for priority in (3, 0, -2, 0, 1)
    ]
    jobs.start_pool()
    wait_for(lambda: all(final(jobs, job_id) for job_id in ids))
    ran = [line.split()[0] for line in log.read_text().splitlines()]
    assert ran == [ids[2], ids[1], ids[3], ids[4], ids[0]]


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"delay": -1}, "delay"),
        ({"delay": "soon"}, "delay"),
        ({"delay": float("inf")}, "delay"),
        ({"delay": float("nan")}, "delay"),
        ({"delay": enqueueing.MAX_DELAY_SECONDS + 1}, "delay"),
        ({"priority": 40000}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": True}, "priority"),
        ({"run_at": utc_now().replace(tzinfo=None)}, "run_at"),
        ({"run_at": utc_now(), "delay": 1}, "run_at"),
        ({"run_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=2)))}, "run_at"),
        ({"run_at": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-2)))}, "run_at"),
        ({"unique_key": ""}, "unique_key"),
    ],
)
def test_bad_scheduling_arguments_store_nothing(jobs, store, household, arguments, field):
    with pytest.raises(ValidationError) as raised:
        jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id, **arguments)
    assert list(raised.value.messages) == [field]
    assert count_jobs(store) == 0


@pytest.mark.parametrize("household_id", ["1", 1.0, True, None])
def test_a_household_id_that_is_not_an_integer_stores_nothing(jobs, store, household, household_id):
    with pytest.raises(ValidationError) as raised:
        jobs.enqueue("succeed", {"value": 1}, household_id=household_id)
    assert raised.value.messages == {"household_id": ["must be an integer"]}
    with pytest.raises(ValidationError) as raised:
        jobs.enqueue_many(
            [
                JobRequest("succeed", {"value": 1}, household.household_id),
                JobRequest("succeed", {"value": 1}, household_id),
            ]
        )
    assert raised.value.messages == {1: {"household_id": ["must be an integer"]}}
    assert count_jobs(store) == 0


def test_the_longest_delay_is_accepted(jobs, store, household):
    job_id = jobs.enqueue(
        "succeed",
        {"value": 1},
        household_id=household.household_id,
        delay=enqueueing.MAX_DELAY_SECONDS,
    )
    assert jobs.get(job_id).run_at > to_text(utc_now() + timedelta(days=99 * 365))


def test_flask_jobs_enqueue_prints_the_job(runner, jobs, household):
    mine = str(household.household_id)
    args = ["jobs", "enqueue", "succeed", '{"value": 3}', "--household", mine]
    result = runner.invoke(args=[*args, "--delay", "60", "--priority", "-3", "--key", "cli-1"])

    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert (shown["kind"], shown["status"], shown["payload"]) == ("succeed", "queued", {"value": 3})
    assert (shown["priority"], shown["unique_key"]) == (-3, "cli-1")
    assert shown["run_at"] > shown["created_at"]
    repeat = runner.invoke(args=[*args, "--key", "cli-1"])
    assert json.loads(repeat.stdout)["id"] == shown["id"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["succeed", '{"value": "x"}'], "Error: invalid: value: Not a valid integer."),
        (["succeed", '{"value": 1, "extra": 2}'], "Error: invalid: extra: Unknown field."),
        (["succeed", "{"], "Error: PAYLOAD_JSON is not valid JSON"),
        (["succeed", "[1]"], "Error: PAYLOAD_JSON must be a JSON object"),
        (["nope", "{}"], "Error: No handler is registered for that job kind: nope"),
        (
            ["succeed", '{"value": 1}', "--delay", "inf"],
            "Error: invalid: delay: must be a number of seconds from 0 to 3,153,600,000",
        ),
    ],
)
def test_flask_jobs_enqueue_refuses_bad_input_in_one_line(runner, store, household, args, message):
    result = runner.invoke(
        args=["jobs", "enqueue", *args, "--household", str(household.household_id)]
    )
    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [message]
    assert count_jobs(store) == 0


def test_flask_jobs_enqueue_refuses_an_unknown_household(runner, store):
    result = runner.invoke(args=["jobs", "enqueue", "succeed", '{"value": 1}', "--household", "99"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: no household 99"
    assert count_jobs(store) == 0


# -- bulk enqueue ----------------------------------------------------------------------------


def enqueue_alone(jobs, request: JobRequest) -> str:
    """`request` by one `enqueue`, to compare with `enqueue_many`."""
    return jobs.enqueue(
        request.kind,
        request.payload,
        household_id=request.household_id,
        run_at=request.run_at,
        delay=request.delay,
        priority=request.priority,
        unique_key=request.unique_key,
    )


def test_enqueue_many_is_one_transaction_all_or_nothing(jobs, store, household):
    mine = household.household_id
    good = JobRequest("succeed", {"value": 1}, mine)
    with pytest.raises(ValidationError) as raised:
        jobs.enqueue_many([good, JobRequest("succeed", {"value": "x"}, mine), good])
    assert raised.value.messages == {1: {"value": ["Not a valid integer."]}}
    with pytest.raises(UnknownKind):
        jobs.enqueue_many([good, JobRequest("nope", {}, mine)])
    jobs.enqueue("succeed", {"value": 9}, household_id=mine, unique_key="taken")
    with pytest.raises(IdempotencyKeyReused):
        jobs.enqueue_many([good, JobRequest("succeed", {"value": 1}, mine, unique_key="taken")])
    assert count_jobs(store) == 1

    done = jobs.enqueue_many(
        [
            good,
            JobRequest("succeed", {"value": 2}, mine, priority=-1, delay=0),
            JobRequest("succeed", {"value": 9}, mine, unique_key="taken"),
        ]
    )

    assert [result.created for result in done] == [True, True, False]
    assert count_jobs(store) == 3
    jobs.start_pool()
    wait_for(lambda: all(final(jobs, result.job_id) for result in done))


def test_enqueue_many_stores_each_job_as_asked_in_the_requests_order(jobs, store, household):
    # Runs of jobs without a key go in one statement; those with a key one
    # by one: the rows still come in the requests' order, each as asked.
    mine = household.household_id
    now = utc_now()
    requests = [
        JobRequest("succeed", {"value": 1}, mine),
        JobRequest("succeed", {"value": 2}, mine, priority=5, run_at=now + timedelta(hours=2)),
        JobRequest("succeed", {"value": 3}, mine, unique_key="three"),
        JobRequest("succeed", {"value": 4}, mine, delay=3600),
        JobRequest("succeed", {"value": 5}, mine, priority=-3),
        JobRequest("succeed", {"value": 6}, mine, unique_key="six"),
    ]

    done = jobs.enqueue_many(requests)

    rows = sql.rows(store, "SELECT id, payload FROM jobs ORDER BY seq")
    assert [row["id"] for row in rows] == [result.job_id for result in done]
    assert [json.loads(row["payload"])["value"] for row in rows] == [1, 2, 3, 4, 5, 6]
    stored = [jobs.get(result.job_id) for result in done]
    assert [job.priority for job in stored] == [0, 5, 0, 0, -3, 0]
    assert [job.unique_key for job in stored] == [None, None, "three", None, None, "six"]
    assert stored[1].run_at == to_text(now + timedelta(hours=2))
    assert stored[3].run_at >= to_text(now + timedelta(seconds=3590))
    assert stored[0].run_at <= to_text(utc_now())
    assert all(job.status == Status.QUEUED for job in stored)


def test_a_bulk_enqueue_stores_each_row_as_a_single_enqueue_stores_it(jobs, store, household):
    # SQLite's bulk insert reads its rows from JSON: each column must come
    # out as the single insert's bound value does, its type included.
    mine = household.household_id
    at = utc_now() + timedelta(hours=1)
    requests = [
        JobRequest("succeed", {"value": 7}, mine),
        JobRequest("succeed", {"value": -1}, mine, priority=-32768, run_at=at),
        JobRequest("sleep", {"seconds": 0.5}, mine, priority=32767, delay=90),
        JobRequest("fail_with_failure", {"message": 'é \u2603 say "hi"\n'}, mine),
    ]
    for request in requests:
        enqueue_alone(jobs, request)
    jobs.enqueue_many(requests)

    typed = (
        ""
        if store.name == "postgresql"
        else ", "
        + ", ".join(
            f"typeof({column}) AS {column}_type"
            for column in ("household_id", "kind", "payload", "max_attempts", "priority", "run_at")
        )
    )
    stored = sql.rows(store, f"SELECT *{typed} FROM jobs ORDER BY seq")
    for row in stored:
        for column in ("id", "seq", "created_at", "updated_at", "run_at"):
            row.pop(column)
    assert stored[4:] == stored[:4]
    assert [json.loads(row["payload"]) for row in stored[4:]] == [r.payload for r in requests]


def test_a_bulk_enqueue_names_each_bad_request_by_its_index_as_one_enqueue_would(
    jobs, store, household
):
    # The payloads of each kind are validated together: each request's
    # errors must still land under its own index, whatever kinds surround it.
    mine = household.household_id
    requests = [
        JobRequest("succeed", {"value": 1}, mine),
        JobRequest("sleep", {"seconds": "soon"}, mine),
        JobRequest("succeed", {"value": "x"}, mine),
        JobRequest("sleep", {"seconds": 1}, mine),
        JobRequest("succeed", {"value": 2, "extra": 1}, mine),
        JobRequest("sleep", [], mine),
        JobRequest("succeed", {"value": "y"}, mine, priority=10_000),
        JobRequest("succeed", {"value": 3}, mine, unique_key="has space"),
        JobRequest("sleep", {"seconds": 2}, mine),
        # A schema validator (skipped by marshmallow for every payload of a
        # list once one has a field error), and a hook that refuses one.
        JobRequest("range", {"low": 1, "high": 2}, mine),
        JobRequest("range", {"low": 5, "high": 1}, mine),
        JobRequest("range", {"low": "x", "high": 1}, mine),
        JobRequest("range", {"low": 13, "high": 20}, mine),
    ]

    with pytest.raises(ValidationError) as raised:
        jobs.enqueue_many(requests)

    alone = {}
    for index, request in enumerate(requests):
        try:
            enqueue_alone(jobs, request)
        except ValidationError as error:
            alone[index] = error.messages
    assert sorted(alone) == [1, 2, 4, 5, 6, 7, 10, 11, 12]
    assert raised.value.messages == alone
    assert list(raised.value.messages) == sorted(alone)
    assert count_jobs(store) == 4  # the four good requests, enqueued alone


def test_a_bulk_enqueue_of_a_kind_whose_hook_takes_the_collection_works_as_one_at_a_time(
    jobs, store, household
):
    # The hook, written for one payload, would get a list from a bulk load.
    mine = household.household_id
    done = jobs.enqueue_many([JobRequest("one_at_a_time", {"value": n}, mine) for n in range(3)])
    payloads = [json.loads(jobs.get(result.job_id).payload) for result in done]
    assert payloads == [{"value": 0}, {"value": 1}, {"value": 2}]
    with pytest.raises(ValidationError) as raised:
        jobs.enqueue_many([JobRequest("one_at_a_time", {"value": "x"}, mine)] * 2)
    assert raised.value.messages == {index: {"value": ["Not a valid integer."]} for index in (0, 1)}


def test_a_bulk_enqueue_larger_than_one_statement_stores_every_job_in_order(jobs, store, household):
    # One job alone, a keyed one, a run of the most one statement takes, and
    # the one past it.
    mine = household.household_id
    count = enqueueing.BULK_MAX_ROWS + 3
    requests = [JobRequest("succeed", {"value": n}, mine) for n in range(count)]
    requests[1] = JobRequest("succeed", {"value": 1}, mine, unique_key="k")
    prepared = enqueueing.prepare_all(jobs.registry, requests)
    assert [len(run) for run in enqueueing.runs(prepared)] == [1, 1, enqueueing.BULK_MAX_ROWS, 1]

    done = jobs.enqueue_many(requests, within_quota=False)

    rows = sql.rows(store, "SELECT id, payload FROM jobs ORDER BY seq")
    assert [row["id"] for row in rows] == [result.job_id for result in done]
    assert [json.loads(row["payload"])["value"] for row in rows] == list(range(count))


def test_a_bulk_insert_is_cut_into_statements_by_rows_payload_and_keys():
    def job(payload: str, key: str | None = None) -> enqueueing.NewJob:
        return enqueueing.NewJob(
            job_id=enqueueing.new_job_id(),
            household_id=1,
            kind="succeed",
            payload=payload,
            max_attempts=1,
            on_interrupt=OnInterrupt.FAIL,
            unique_key=key,
        )

    jobs = [job("a" * 4), job("b" * 4), job("c" * 4), job("k", key="k"), job("d" * 30)]
    jobs += [job("e" * 2) for _ in range(5)]

    runs = list(enqueueing.runs(jobs, max_rows=3, max_payload_chars=10))

    assert [[len(item.payload) for item in run] for run in runs] == [
        [4, 4],  # a third would pass 10 characters
        [4],
        [1],  # a keyed job goes alone
        [30],  # a run's first job, whatever its size
        [2, 2, 2],  # at most 3 rows
        [2, 2],
    ]
    assert [item for run in runs for item in run] == jobs


def test_job_ids_are_distinct_version_4_uuids():
    ids = [enqueueing.new_job_id() for _ in range(2_000)]
    assert len(set(ids)) == len(ids)
    for job_id in ids:
        parsed = uuid.UUID(job_id)
        assert (parsed.hex, parsed.version, parsed.variant) == (job_id, 4, uuid.RFC_4122)


def test_the_bulk_insert_refuses_a_job_with_a_key(jobs, store, household):
    # A key's holder may answer instead of a new row: only `insert_job` says so.
    job = enqueueing.prepare(
        jobs.registry, "succeed", {"value": 1}, household_id=household.household_id
    )
    plain = dataclasses.replace(job, job_id="a" * 32)
    with pytest.raises(ValueError, match="idempotency key"):
        store.write(store.jobs.insert_jobs, [plain, dataclasses.replace(job, unique_key="k")])
    assert count_jobs(store) == 0


# -- enqueue from a handler ------------------------------------------------------------------


def follow_ups(store, parent_household: int) -> list[int]:
    rows = sql.rows(
        store,
        "SELECT payload FROM jobs WHERE kind = 'succeed' AND household_id = ?",
        (parent_household,),
    )
    return sorted(json.loads(row["payload"])["value"] for row in rows)


def test_follow_ups_commit_with_the_success_only(jobs, store, household):
    mine = household.household_id
    retried = jobs.enqueue(
        "enqueue_follow_ups", {"values": [1, 2], "fail_times": 2}, household_id=mine
    )
    failed = jobs.enqueue(
        "enqueue_follow_ups", {"values": [10], "failure": "no luck"}, household_id=mine
    )
    jobs.start_pool()
    parent = wait_for(lambda: final(jobs, retried))
    assert (parent.status, parent.attempt) == (Status.SUCCEEDED, 3)
    assert wait_for(lambda: final(jobs, failed)).status == Status.FAILED

    # Three attempts enqueued [1, 2] each; only the successful one's exist.
    assert follow_ups(store, mine) == [1, 2]
    children = sql.rows(store, "SELECT id FROM jobs WHERE kind = 'succeed'")
    for child in children:
        assert wait_for(lambda child=child: final(jobs, child["id"])).status == Status.SUCCEEDED


def test_follow_ups_of_a_lost_lease_are_not_written(jobs, store, household):
    mine = household.household_id
    jobs.enqueue("enqueue_follow_ups", {"values": [1]}, household_id=mine)
    [claimed] = store.write(
        store.jobs.claim,
        ClaimRequest(owner="w.1", lease_seconds=60, limit=1, kinds=["enqueue_follow_ups"]),
    )
    child = enqueueing.prepare(jobs.registry, "succeed", {"value": 1}, household_id=mine)
    success = Outcome(Status.SUCCEEDED, result='{"attempt": 1}', follow_ups=(child,))
    stale = type(claimed.lease)(claimed.id, "someone-else", claimed.attempt)

    assert store.write(lambda tx: success.write(store.jobs, tx, stale)) is False
    assert follow_ups(store, mine) == []
    assert store.write(lambda tx: success.write(store.jobs, tx, claimed.lease)) is True
    assert follow_ups(store, mine) == [1]
