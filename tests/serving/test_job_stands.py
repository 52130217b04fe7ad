"""Where a household's job stands, through real gunicorn on both databases (and
through PgBouncer): its event stream, conditional and long polls, and its
place in line. One server per database for the module (two workers, each
with its pool), and a household of its own per test; the ends of a stream
that need a server of their own are in `test_stream_ends.py`."""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mealquest.db.driver import Store
from mealquest.db.sqlite import migrate
from mealquest.households import IssuedToken, create_household, revoke_token
from mealquest.model.jobs import NewJob, OnInterrupt
from mealquest.operator_actions import suspension
from tests.support import sql
from tests.support.events import EventStream
from tests.support.gates import Gates
from tests.support.postgres import (
    fresh_database,
    require_pgbouncer_url,
    require_postgres_url,
    through_pgbouncer,
)
from tests.support.servers import (
    BIN,
    REPO,
    Gunicorn,
    enqueue,
    http,
    job,
    open_test_store,
    serving_env,
    wait_until,
)

SITE_CONFIG = {"STREAM_HEARTBEAT_SECONDS": 0.3, "STREAM_MAX_PER_HOUSEHOLD": 2, "JOB_WORKERS": 4}


@dataclass
class Site:
    server: Gunicorn
    store: Store
    gates: Gates
    database: dict[str, str]

    def household(self, name: str = "The Streamers") -> IssuedToken:
        return create_household(self.store, name)


def _database(name: str, root: Path) -> Iterator[dict[str, str]]:
    if name == "sqlite":
        path = str(root / "mealquest.sqlite3")
        migrate.upgrade(path)
        yield {"DATABASE": path}
        return
    if name == "pgbouncer":
        require_pgbouncer_url()
    with fresh_database(require_postgres_url(), migrated=True) as url:
        if name == "pgbouncer":
            yield {"DATABASE_URL": through_pgbouncer(url), "PG_POOLER": "transaction"}
        else:
            yield {"DATABASE_URL": url}


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "pgbouncer"])
def site(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp(f"stands-{request.param}")
    databases = _database(request.param, root)
    database = next(databases)
    store = open_test_store(database)
    gates = Gates()
    server = Gunicorn(root / "gunicorn.log", serving_env(database, **SITE_CONFIG), workers=2)
    try:
        server.wait_ready()
        yield Site(server, store, gates, database)
    finally:
        gates.close()
        server.stop()
        store.close()
        databases.close()


def run_cli(site, *args: str) -> None:
    """A `flask` command against the site's database, as an operator runs it."""
    done = subprocess.run(
        [str(BIN / "flask"), "--app", "app", *args],
        env=serving_env(site.database),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def events_url(site, job_id):
    return f"{site.server.url}/api/v1/jobs/{job_id}/events"


def running(site, job_id):
    return job(site.store, job_id)["status"] == "running"


def test_a_stream_sends_the_state_then_each_change_then_end(site):
    token, gates = site.household().token, site.gates
    job_id = enqueue(site.server.url, token, "pid_gate", {"url": gates.url("sends")})

    with EventStream(events_url(site, job_id), token) as stream:
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert stream.headers["x-accel-buffering"] == "no"
        assert stream.headers["cache-control"] == "no-cache"
        first = stream.next()
        assert first.name == "job"
        assert first.json["id"] == job_id
        assert first.id == str(first.json["version"])
        # The partial result (its process's pid) comes as a later version.
        seen = [first]
        while seen[-1].json["result"] is None:
            seen.append(stream.next())
        assert seen[-1].json["status"] == "running"
        gates.open("sends")
        rest = stream.events_until_closed()

    events = seen + rest
    assert [e.name for e in events[-2:]] == ["job", "end"]
    final = events[-2].json
    assert final["status"] == "succeeded"
    assert final["queue"] is None
    versions = [int(e.id) for e in events[:-1]]
    assert versions == sorted(set(versions))
    assert json.loads(events[-1].data) == {"id": job_id, "status": "succeeded"}
    assert events[-1].id == str(final["version"])


def test_a_change_another_process_writes_reaches_the_stream(site):
    """The test's own process cancels a job gunicorn's worker streams: its
    watcher sees writes from anywhere (NOTIFY, or polling through PgBouncer)."""
    household = site.household("The Elsewheres")
    job_id = insert(site, household, "succeed", delay=3600)

    with EventStream(events_url(site, job_id), household.token) as stream:
        assert stream.next().json["queue"]["waiting_for"] == "scheduled"
        site.store.write(site.store.jobs.cancel_job, job_id)
        events = stream.events_until_closed()
    assert [e.name for e in events] == ["job", "end"]
    assert events[0].json["status"] == "cancelled"


def test_a_reconnect_with_the_last_event_id_gets_only_what_is_newer(site):
    token = site.household().token
    job_id = enqueue(site.server.url, token, "pid_gate", {"url": site.gates.url("resume")})
    wait_until(lambda: job(site.store, job_id)["result"], 60, "the job did not publish")
    version = job(site.store, job_id)["version"]

    with EventStream(
        events_url(site, job_id), token, headers={"Last-Event-ID": str(version)}
    ) as stream:
        assert stream.status == 200
        assert stream.next(comments=True).name is None  # nothing newer: a heartbeat first
        site.gates.open("resume")
        events = stream.events_until_closed()
    assert [e.name for e in events] == ["job", "end"]
    assert int(events[0].id) > version

    final = job(site.store, job_id)["version"]
    with EventStream(
        events_url(site, job_id), token, headers={"Last-Event-ID": str(final)}
    ) as stream:
        assert [e.name for e in stream.events_until_closed()] == ["end"]
    with EventStream(
        events_url(site, job_id), token, headers={"Last-Event-ID": str(final - 1)}
    ) as stream:
        assert [e.name for e in stream.events_until_closed()] == ["job", "end"]


def test_the_stream_is_scoped_and_checked_as_every_api_route(site):
    mine, theirs = site.household().token, site.household("The Others").token
    their_job = enqueue(site.server.url, theirs, "succeed", {"value": 1})

    assert EventStream(events_url(site, their_job), mine).status == 404
    assert EventStream(events_url(site, "0" * 32), mine).status == 404
    assert EventStream(events_url(site, their_job), None).status == 401
    bad = EventStream(events_url(site, their_job), theirs, headers={"Last-Event-ID": "soon"})
    assert bad.status == 400
    assert json.loads(bad.body())["error"]["fields"] == {
        "Last-Event-ID": ["must be an event's id: a version"]
    }


def test_a_revoked_token_ends_its_stream_at_the_next_heartbeat(site):
    household = site.household("The Revoked")
    job_id = enqueue(site.server.url, household.token, "pid_gate", {"url": site.gates.url("rv")})

    with EventStream(events_url(site, job_id), household.token) as stream:
        assert stream.next().name == "job"
        revoke_token(site.store, household.token_id)
        # Heartbeats (and no `end`: the job still runs) until the stream ends.
        assert {e.name for e in stream.events_until_closed(comments=True)} <= {None, "job"}
    assert EventStream(events_url(site, job_id), household.token).status == 401
    site.gates.open("rv")


def _held_long_poll(site, token, job_id) -> tuple[threading.Thread, list]:
    """A long poll of the job (30 s) in a thread, once the job's version is
    still; its answer lands in the list."""
    wait_until(lambda: job(site.store, job_id)["result"], 60, "the job did not publish")
    url = f"{site.server.url}/api/v1/jobs/{job_id}"
    etag = http("GET", url, token=token).headers["ETag"]
    answers: list = []
    poll = threading.Thread(
        target=lambda: answers.append(
            http("GET", f"{url}?wait=30", token=token, headers={"If-None-Match": etag})
        )
    )
    poll.start()
    return poll, answers


def _held(site, household_id) -> int:
    return sql.scalar(
        site.store, "SELECT count(*) FROM job_streams WHERE household_id = ?", (household_id,)
    )


@pytest.mark.parametrize("action", ["suspend", "erase"])
def test_a_suspension_or_erasure_ends_open_streams_and_held_long_polls(site, action):
    household = site.household(f"The {action.title()}ed")
    gate = site.gates.url(f"off-{action}")
    job_id = enqueue(site.server.url, household.token, "pid_gate", {"url": gate})

    with EventStream(events_url(site, job_id), household.token) as stream:
        assert stream.next().name == "job"
        poll, answers = _held_long_poll(site, household.token, job_id)
        wait_until(lambda: _held(site, household.household_id) == 2, 60, "the poll was not held")
        if action == "suspend":
            suspension.suspend(site.store, household.household_id, None)
        else:
            run_cli(
                site, "households", "erase", str(household.household_id), "--yes", "--wait", "0"
            )
        # Heartbeats (and no `end`: the job still runs) until the stream ends.
        assert {e.name for e in stream.events_until_closed(comments=True)} <= {None, "job"}
    poll.join(60)
    [answer] = answers
    if action == "suspend":
        assert (answer.status, answer.json["error"]["code"]) == (403, "household_suspended")
    else:
        assert answer.status == 401
    site.gates.open(f"off-{action}")


def test_a_household_holds_so_many_streams_across_workers(site):
    token, theirs = site.household().token, site.household("The Others").token
    job_id = enqueue(site.server.url, token, "pid_gate", {"url": site.gates.url("many")})
    their_job = enqueue(site.server.url, theirs, "succeed", {"value": 1})

    held = [EventStream(events_url(site, job_id), token) for _ in range(2)]
    try:
        assert [stream.status for stream in held] == [200, 200]
        for _ in range(4):  # on new connections: whichever worker takes them
            refused = EventStream(events_url(site, job_id), token)
            assert refused.status == 429
            assert json.loads(refused.body())["error"]["code"] == "too_many_streams"
            assert 1 <= int(refused.headers["retry-after"]) <= 300
        # Another household's streams are its own.
        assert EventStream(events_url(site, their_job), theirs).status == 200
        held.pop().close()

        def reopened():
            stream = EventStream(events_url(site, job_id), token)
            if stream.status == 200:
                return stream
            stream.close()
            return None

        held.append(wait_until(reopened, 60, "the closed stream's place was not freed"))
    finally:
        for stream in held:
            stream.close()
        site.gates.open("many")


def test_a_conditional_poll_answers_304_until_the_job_changes(site):
    token = site.household().token
    job_id = enqueue(site.server.url, token, "pid_gate", {"url": site.gates.url("poll")})
    url = f"{site.server.url}/api/v1/jobs/{job_id}"
    wait_until(lambda: job(site.store, job_id)["result"], 60, "the job did not publish")

    answer = http("GET", url, token=token)
    etag = answer.headers["ETag"]
    assert etag == f'"{answer.json["version"]}"'
    unchanged = http("GET", url, token=token, headers={"If-None-Match": etag})
    assert (unchanged.status, unchanged.body, unchanged.headers["ETag"]) == (304, b"", etag)
    # Held for its wait, then 304.
    waited = http("GET", f"{url}?wait=0.5", token=token, headers={"If-None-Match": etag})
    assert waited.status == 304

    # A long poll held while the job changes answers the change.
    answers = []
    poll = threading.Thread(
        target=lambda: answers.append(
            http("GET", f"{url}?wait=30", token=token, headers={"If-None-Match": etag})
        )
    )
    poll.start()
    site.gates.open("poll")
    poll.join(60)
    [changed] = answers
    assert changed.status == 200
    assert changed.json["status"] == "succeeded"
    assert changed.headers["ETag"] == f'"{changed.json["version"]}"'


def test_a_queued_job_says_where_it_stands_and_why_it_waits(site):
    household = site.household("The Queuers")
    url, token = site.server.url, household.token
    # Every slot of both workers held, so the next jobs wait their turn.
    holding = [
        enqueue(url, token, "pid_gate", {"url": site.gates.url(f"hold{n}")}) for n in range(8)
    ]
    wait_until(lambda: all(running(site, j) for j in holding), 60, "the slots did not fill")
    waiting = [
        enqueue(url, token, "pid_gate", {"url": site.gates.url(f"wait{n}")}) for n in range(3)
    ]

    def queue_of(job_id):
        return http("GET", f"{url}/api/v1/jobs/{job_id}", token=token).json["queue"]

    queues = [queue_of(job_id) for job_id in waiting]
    assert [(q["position"], q["ahead_in_household"], q["waiting_for"]) for q in queues] == [
        (0, 0, "turn"),
        (1, 1, "turn"),
        (2, 2, "turn"),
    ]
    # A job due later stands behind every due job.
    later = insert(site, household, "succeed", delay=3600)
    assert (queue_of(later)["position"], queue_of(later)["waiting_for"]) == (3, "scheduled")
    # A job of a kind no live process has a handler for (a newer release's).
    nobody = insert(site, household, "a_kind_of_a_newer_release")
    assert queue_of(nobody) == {
        "position": 3,
        "ahead_in_household": 3,
        "estimated_start_at": None,
        "waiting_for": "no_worker",
        "signal": None,
    }
    # A slot frees and the first waiting job takes it: the others move up by one.
    site.gates.open("hold0")
    wait_until(lambda: running(site, waiting[0]), 60, "the freed slot was not taken")
    assert [queue_of(job_id)["position"] for job_id in waiting[1:]] == [0, 1]
    for name in [f"hold{n}" for n in range(1, 8)] + [f"wait{n}" for n in range(3)]:
        site.gates.open(name)
    wait_until(
        lambda: all(job(site.store, j)["status"] == "succeeded" for j in holding + waiting),
        60,
        "the jobs did not run",
    )
    # Leave nothing queued for the module's other tests.
    for job_id in (later, nobody):
        site.store.write(site.store.jobs.cancel_job, job_id)


def insert(site, household, kind, delay=None):
    """A job inserted as a release with that kind would (no handler needed here)."""
    job_id = uuid.uuid4().hex
    site.store.write(
        site.store.jobs.insert_job,
        NewJob(
            job_id=job_id,
            household_id=household.household_id,
            kind=kind,
            payload='{"value": 1}',
            max_attempts=1,
            on_interrupt=OnInterrupt.FAIL,
            delay_seconds=delay,
        ),
    )
    return job_id
