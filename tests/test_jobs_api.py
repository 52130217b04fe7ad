"""`/api/v1/jobs`: exact answers, household scoping, filters and pages."""

from __future__ import annotations

import json
import re

import gevent
import pytest

from mealquest.jobs.enqueueing import JobRequest
from mealquest.jobs.service.live import get_live
from mealquest.model.jobs import ClaimRequest, Status, Transition
from tests.conftest import wait_for

pytestmark = pytest.mark.both_databases


RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def test_get_answers_exactly_the_job_and_its_details(client, auth, jobs, household):
    job_id = jobs.enqueue("flaky", {"fail_times": 1}, household_id=household.household_id)
    queued = client.get(f"/api/v1/jobs/{job_id}", headers=auth)
    assert queued.status_code == 200
    created = queued.json["created_at"]
    assert RFC3339_UTC.match(created)
    assert queued.json == {
        "id": job_id,
        "kind": "flaky",
        "status": "queued",
        "result": None,
        "error": None,
        "attempt": 0,
        "max_attempts": 3,
        "created_at": created,
        "run_at": created,
        "started_at": None,
        "finished_at": None,
        "version": 1,
        # No pool runs yet: no live process handles its kind.
        "queue": {
            "position": 0,
            "ahead_in_household": 0,
            "estimated_start_at": None,
            "waiting_for": "no_worker",
            "signal": None,
        },
    }
    assert queued.headers["ETag"] == '"1"'
    jobs.start_pool()
    wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED)
    done = client.get(f"/api/v1/jobs/{job_id}", headers=auth).json
    times = {key: done.pop(key) for key in ("created_at", "run_at", "started_at", "finished_at")}
    assert done == {
        "id": job_id,
        "kind": "flaky",
        "status": "succeeded",
        "result": {"attempt": 2},
        "error": None,
        "attempt": 2,
        "max_attempts": 3,
        # Enqueued, claimed, retried, claimed again, succeeded.
        "version": 5,
        "queue": None,
    }
    assert all(RFC3339_UTC.match(value) for value in times.values()), times
    # The retry was due after the first attempt; the second started then and ended last.
    assert created == times["created_at"] < times["run_at"] <= times["started_at"]
    assert times["started_at"] <= times["finished_at"]
    listed = client.get("/api/v1/jobs", headers=auth).json["jobs"]
    assert listed == [{**done, **times}]


@pytest.mark.parametrize("job_id", ["0" * 32, "not-an-id", "A" * 32, "0" * 31, "%00", "1 OR 1=1"])
def test_unknown_and_malformed_ids_are_the_same_404(client, auth, job_id):
    answer = client.get(f"/api/v1/jobs/{job_id}", headers=auth)
    assert answer.status_code == 404
    assert answer.json == {"error": {"code": "not_found", "message": "job not found"}}


def test_another_households_job_is_indistinguishable_from_unknown(
    client, auth, jobs, household, other_household
):
    theirs = jobs.enqueue("succeed", {"value": 1}, household_id=other_household.household_id)
    answer = client.get(f"/api/v1/jobs/{theirs}", headers=auth)
    unknown = client.get(f"/api/v1/jobs/{'0' * 32}", headers=auth)
    assert (answer.status_code, answer.json) == (unknown.status_code, unknown.json)
    listed = client.get("/api/v1/jobs", headers=auth).json
    assert listed == {"jobs": [], "next_cursor": None}
    other_auth = {"Authorization": f"Bearer {other_household.token}"}
    assert client.get(f"/api/v1/jobs/{theirs}", headers=other_auth).status_code == 200


def test_list_is_newest_first_with_cursor_pages(client, auth, jobs, household):
    ids = [
        jobs.enqueue("succeed", {"value": i}, household_id=household.household_id) for i in range(7)
    ]
    seen = []
    cursor = None
    pages = 0
    while True:
        query = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = client.get("/api/v1/jobs", headers=auth, query_string=query).json
        pages += 1
        seen += [job["id"] for job in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    assert pages == 3
    exact = client.get("/api/v1/jobs", headers=auth, query_string={"limit": 7}).json
    assert len(exact["jobs"]) == 7
    assert exact["next_cursor"] is None


def test_list_default_limit_is_50(client, auth, jobs, household):
    for i in range(51):
        jobs.enqueue("succeed", {"value": i}, household_id=household.household_id)
    page = client.get("/api/v1/jobs", headers=auth).json
    assert len(page["jobs"]) == 50
    assert page["next_cursor"] is not None


def test_list_filters_by_status_and_kind(client, auth, jobs, household):
    ok = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    bad = jobs.enqueue("fail_with_failure", {"message": "no"}, household_id=household.household_id)
    jobs.start_pool()
    wait_for(
        lambda: jobs.get(bad).status == Status.FAILED and jobs.get(ok).status == Status.SUCCEEDED
    )

    def ids(**query):
        answer = client.get("/api/v1/jobs", headers=auth, query_string=query)
        assert answer.status_code == 200
        return [job["id"] for job in answer.json["jobs"]]

    assert ids(status="failed") == [bad]
    assert ids(status="succeeded") == [ok]
    assert ids(kind="succeed") == [ok]
    assert ids(kind="succeed", status="failed") == []
    assert ids(status="queued") == []


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"status": "done"}, "status"),
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"cursor": "bm90LWEtY3Vyc29y"}, "cursor"),
        ({"cursor": "!!!"}, "cursor"),
        ({"kind": ""}, "kind"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_bad_filters_are_validation_errors_naming_the_field(client, auth, query, field):
    answer = client.get("/api/v1/jobs", headers=auth, query_string=query)
    assert answer.status_code == 400
    error = answer.json["error"]
    assert error["code"] == "validation_error"
    assert field in error["fields"]


def test_jobs_routes_need_a_token(client, jobs, household):
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    for path in ("/api/v1/jobs", f"/api/v1/jobs/{job_id}"):
        answer = client.get(path)
        assert answer.status_code == 401
        assert answer.json["error"]["code"] == "unauthorized"
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/api/v1/no-such-route"), ("DELETE", "/api/v1/jobs"), ("GET", "/api/v1")],
)
def test_unrouted_paths_under_the_api_need_a_token_first(client, auth, method, path):
    anonymous = client.open(path, method=method)
    assert anonymous.status_code == 401
    assert anonymous.json["error"]["code"] == "unauthorized"
    authenticated = client.open(path, method=method, headers=auth)
    assert authenticated.status_code in (404, 405)


def test_a_job_read_back_is_the_dataclass_built_from_its_fields_in_every_state(
    jobs, store, household
):
    """Rows become jobs without the dataclass's `__init__`: each must still be
    the job `Job(...)` builds from the same fields (equal, alike, frozen)."""
    import dataclasses

    from mealquest.model.jobs import Job, Transition

    mine = household.household_id
    ids = [jobs.enqueue("succeed", {"value": n}, household_id=mine) for n in range(4)]
    claimed = store.write(
        store.jobs.claim, ClaimRequest(owner="w.1", lease_seconds=60, limit=3, kinds=["succeed"])
    )
    store.write(
        store.jobs.transition_many,
        [
            Transition(claimed[0].lease, to=Status.SUCCEEDED, result='{"ok": [1, "two"]}'),
            Transition(claimed[1].lease, to=Status.FAILED, error="no recipe found"),
        ],
    )
    read = [jobs.get(job_id) for job_id in ids] + claimed
    assert {job.status for job in read} == {
        Status.SUCCEEDED,
        Status.FAILED,
        Status.RUNNING,
        Status.QUEUED,
    }
    for job in read:
        built = Job(**{field.name: getattr(job, field.name) for field in dataclasses.fields(Job)})
        assert job == built
        assert vars(job) == vars(built)
        assert repr(job) == repr(built)
        assert dataclasses.replace(job, attempt=9) == dataclasses.replace(built, attempt=9)
        with pytest.raises(dataclasses.FrozenInstanceError):
            job.attempt = 9  # type: ignore[misc]


def test_a_row_without_a_jobs_columns_or_with_others_is_not_a_job():
    from mealquest.model.jobs import Job

    row = {
        "id": "a" * 32,
        "seq": 1,
        "household_id": 2,
        "kind": "succeed",
        "payload": "{}",
        "status": "queued",
        "result": None,
        "error": None,
        "attempt": 0,
        "max_attempts": 1,
        "run_at": "2026-12-01T00:00:00.000000Z",
        "lease_owner": None,
        "lease_expires_at": None,
        "created_at": "2026-12-01T00:00:00.000000Z",
        "updated_at": "2026-12-01T00:00:00.000000Z",
        "started_at": None,
        "finished_at": None,
        "on_interrupt": "fail",
        "interruptions": 0,
    }
    job = Job.from_row(row)
    # The fields the row leaves out read as their defaults.
    assert (job.priority, job.unique_key, job.result_undecodable) == (0, None, False)
    assert Job.from_row({**row, "result": "not json"}).result_undecodable
    for left_out in ("attempt", "status", "result"):
        with pytest.raises(TypeError, match="not a job row"):
            Job.from_row({key: value for key, value in row.items() if key != left_out})
    with pytest.raises(TypeError, match="not a job row"):
        Job.from_row({**row, "token_household_id": 2})


def test_the_job_routes_dump_is_the_schemas_in_every_state(client, auth, jobs, store, household):
    """The job route writes its answer out by hand; it must stay `JobSchema`'s
    dump, field for field, whatever the job's state."""
    from mealquest.jobs.web.schemas import JobSchema, dump_job
    from mealquest.model.jobs import Attempt, Transition

    mine = household.household_id
    ids = [jobs.enqueue("succeed", {"value": n}, household_id=mine) for n in range(5)]
    claimed = store.write(
        store.jobs.claim, ClaimRequest(owner="w.1", lease_seconds=60, limit=4, kinds=["succeed"])
    )
    assert len(claimed) == 4
    store.write(
        store.jobs.transition_many,
        [
            Transition(claimed[0].lease, to=Status.SUCCEEDED, result='{"ok": [1, "two"]}'),
            Transition(claimed[1].lease, to=Status.FAILED, error="no recipe found"),
            Transition(claimed[2].lease, to=Status.QUEUED, attempt=Attempt.REFUND),
        ],
    )
    schema = JobSchema()
    statuses = set()
    for job_id in ids:
        job = jobs.get(job_id)
        statuses.add(job.status)
        answer = client.get(f"/api/v1/jobs/{job_id}", headers=auth).get_json()
        queue = answer["queue"]
        assert (queue is None) == (job.status is not Status.QUEUED)
        assert schema.validate(answer) == {}
        assert dump_job(job, queue) == answer
        assert dump_job(job) == schema.dump(with_queue(job, None))
        assert list(dump_job(job)) == list(schema.fields)
    assert statuses == {Status.SUCCEEDED, Status.FAILED, Status.QUEUED, Status.RUNNING}


def with_queue(job, queue):
    """The job as `JobSchema` dumps it: its fields, and its `queue` object."""
    from types import SimpleNamespace

    return SimpleNamespace(**vars(job), queue=queue)


def test_a_polled_job_answers_each_change_at_the_next_poll(client, auth, jobs, store, household):
    """The job route answers again from what it read while nothing commits
    (`ReadCache`); every change of the job shows at the very next poll."""
    from mealquest.jobs.web.schemas import JobSchema
    from mealquest.model.jobs import Transition

    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    path = f"/api/v1/jobs/{job_id}"

    def poll_twice():
        first, again = client.get(path, headers=auth), client.get(path, headers=auth)
        assert first.status_code == again.status_code == 200
        assert first.content_type == again.content_type == "application/json"
        assert first.data == again.data
        assert first.headers["ETag"] == again.headers["ETag"]
        job = jobs.get(job_id)
        assert first.headers["ETag"] == f'"{job.version}"'
        if job.status is Status.QUEUED:
            assert first.get_json()["queue"]["waiting_for"] == "no_worker"
        else:
            assert first.get_json() == JobSchema().dump(with_queue(job, None))
        return first.get_json()

    assert poll_twice()["status"] == "queued"
    (claimed,) = store.write(
        store.jobs.claim, ClaimRequest(owner="w.1", lease_seconds=60, limit=1, kinds=["succeed"])
    )
    assert poll_twice()["status"] == "running"
    store.write(store.jobs.publish, claimed.lease, result='{"value": 2}')
    assert poll_twice()["result"] == {"value": 2}
    store.write(
        store.jobs.transition_many,
        [Transition(claimed.lease, to=Status.SUCCEEDED, result='{"value": 3}')],
    )
    assert poll_twice()["status"] == "succeeded"
    assert poll_twice()["result"] == {"value": 3}


def test_a_conditional_requests_bad_wait_or_tag_list_is_a_400_naming_it(
    client, auth, jobs, household
):
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    url = f"/api/v1/jobs/{job_id}"
    tag = {"If-None-Match": '"1"'}
    # Numbers are ASCII digits: Python's float() takes `1_0`, Unicode digits,
    # spaces, `inf` and `nan`.
    for wait in (
        "0",
        "0.0",
        "-1",
        "30.5",
        "soon",
        "1_0",
        "\u0661\u0660",
        " 5",
        "5 ",
        "nan",
        "1e400",
    ):
        answer = client.get(f"{url}?wait={wait}", headers={**auth, **tag})
        assert answer.status_code == 400, wait
        assert list(answer.json["error"]["fields"]) == ["wait"]
    too_long = {"If-None-Match": ", ".join(f'"{n}"' for n in range(1, 300))}
    answer = client.get(url, headers={**auth, **too_long})
    assert answer.status_code == 400
    assert answer.json["error"]["fields"] == {"If-None-Match": ["must be at most 1000 characters"]}
    # A list of tags within the bound that names the version: 304.
    assert client.get(url, headers={**auth, "If-None-Match": '"9", "1"'}).status_code == 304


@pytest.mark.parametrize("limit", ["1_0", "\u0661\u0660", "\uff11", " 5", "+5", "5\n"])
@pytest.mark.parametrize("route", ["/api/v1/jobs", "/api/v1/recipes"])
def test_a_list_limit_is_ascii_digits_only(client, auth, route, limit):
    answer = client.get(route, query_string={"limit": limit}, headers=auth)
    assert answer.status_code == 400, limit
    assert list(answer.json["error"]["fields"]) == ["limit"]


def test_a_last_event_id_is_ascii_digits_only(client, auth, jobs, household):
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    for value in ("\u0661", "1_0", " 1"):
        answer = client.get(
            f"/api/v1/jobs/{job_id}/events", headers={**auth, "Last-Event-ID": value}
        )
        assert answer.status_code == 400, value


def test_a_page_of_jobs_stops_at_its_byte_bound_and_the_next_continues(
    client, auth, jobs, store, household
):
    # Each job's result may hold 256 KiB; a hundred of them in one answer
    # would be 25 MiB held in the worker's memory while it is sent.
    made = [
        jobs.enqueue("succeed", {"value": n}, household_id=household.household_id)
        for n in range(20)
    ]
    claimed = store.write(
        store.jobs.claim,
        ClaimRequest(owner="w.1", lease_seconds=60, limit=20, kinds=("succeed",)),
    )
    big = json.dumps({"value": 1, "padding": "x" * (250 * 1024)})
    store.write(
        store.jobs.transition_many,
        [Transition(job.lease, to=Status.SUCCEEDED, result=big) for job in claimed],
    )

    seen, cursor, pages = [], None, 0
    while True:
        query = "/api/v1/jobs?limit=100" + (f"&cursor={cursor}" if cursor else "")
        answer = client.get(query, headers=auth)
        assert answer.status_code == 200
        assert len(answer.get_data()) <= 4 * 1024 * 1024
        body = answer.get_json()
        seen += [job["id"] for job in body["jobs"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages > 1
    assert seen == list(reversed(made))  # every job once, newest first


def test_a_queued_job_says_its_kind_is_paused_or_its_partition_holds_it(
    client, auth, jobs, store, household
):
    from mealquest.jobs.service import flow
    from mealquest.model.jobs import ClaimRequest
    from mealquest.model.processes import ProcessEntry

    # A live process runs the kinds, so that what holds the jobs is the flow.
    kinds = ("rated_hourly", "one_per_key", "succeed")
    entry = ProcessEntry(owner="p1", host="h", pid=1, kinds=kinds, slots=4)
    store.write(store.processes.register_process, entry, forget_after_seconds=3600)
    mine = household.household_id
    limits = jobs.registry.partition_limits()

    def claim(kind: str, limit: int) -> list[str]:
        request = ClaimRequest(
            owner="w.1", lease_seconds=60, limit=limit, kinds=(kind,), partitions=limits
        )
        return [job.id for job in store.write(store.jobs.claim, request)]

    def waiting_for(job_id: str) -> str:
        response = client.get(f"/api/v1/jobs/{job_id}", headers=auth)
        assert response.status_code == 200
        return response.get_json()["queue"]["waiting_for"]

    # Its partition's rate is spent (2 an hour), or its limit of running jobs (1).
    rated = [jobs.enqueue("rated_hourly", {"key": "p"}, household_id=mine) for _ in range(3)]
    assert claim("rated_hourly", 3) == rated[:2]
    held = [jobs.enqueue("one_per_key", {"key": "q"}, household_id=mine) for _ in range(2)]
    assert claim("one_per_key", 2) == held[:1]
    free = jobs.enqueue("succeed", {"value": 1}, household_id=mine)
    assert (waiting_for(rated[2]), waiting_for(held[1]), waiting_for(free)) == (
        "rate_limit",
        "rate_limit",
        "turn",
    )

    # A pause comes first, whatever else holds the job.
    flow.pause(store, jobs.registry, "one_per_key", None)
    flow.pause(store, jobs.registry, "succeed", None)
    assert (waiting_for(held[1]), waiting_for(free)) == ("paused", "paused")
    flow.resume(store, "succeed", None)
    assert waiting_for(free) == "turn"


def held_until_answered(app, client, url: str, headers: dict[str, str]):
    """The answer to a long poll, or None if the request was held (it took
    one of the process's held places) instead of being answered."""
    places = get_live(app).places
    answers: list = []
    poll = gevent.spawn(lambda: answers.append(client.get(url, headers=headers)))
    try:
        wait_for(lambda: poll.dead or places.open > 0)
        return answers[0] if poll.dead else None
    finally:
        poll.kill()


def test_a_long_poll_on_a_final_job_is_answered_at_once(app, client, auth, jobs, household):
    # A final job cannot change: the poll used to wait out its `wait`.
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    jobs.cancel(job_id, household.household_id)
    url = f"/api/v1/jobs/{job_id}"
    etag = client.get(url, headers=auth).headers["ETag"]
    answer = held_until_answered(app, client, f"{url}?wait=30", {**auth, "If-None-Match": etag})
    assert answer is not None, "the long poll was held"
    assert answer.status_code == 304


def test_a_long_poll_on_a_finished_batch_is_answered_at_once(app, client, auth, jobs, household):
    hid = household.household_id
    batched = jobs.enqueue_batch([JobRequest("succeed", {"value": 1}, hid)])
    jobs.cancel(batched.job_ids[0], hid)
    url = f"/api/v1/batches/{batched.batch_id}"
    first = client.get(url, headers=auth)
    assert first.get_json()["status"] == "finished"
    answer = held_until_answered(
        app, client, f"{url}?wait=30", {**auth, "If-None-Match": first.headers["ETag"]}
    )
    assert answer is not None, "the long poll was held"
    assert answer.status_code == 304
