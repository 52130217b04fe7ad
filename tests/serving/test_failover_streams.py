"""A PostgreSQL failover under open event streams, through real gunicorn:
households follow running jobs while the primary crashes and the standby
(synchronous) is promoted. Each stream either goes on across the failover
or ends without `end`, as a stream ends when its worker cannot read, and
its reader comes back with `Last-Event-ID` as a browser's EventSource does
(answered `503` with `Retry-After` while no primary answers, never `500`);
either way every reader sees its job end `succeeded`, exactly once."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mealquest.db.postgresql.store import PostgresStore
from mealquest.households import create_household
from tests.support.events import Closed, EventStream
from tests.support.servers import Gunicorn, enqueue, http, serving_env, wait_until
from tests.test_failover import both_hosts, replicated  # noqa: F401 - the fixture

RECOVERY = 90.0
READERS = 4


@pytest.fixture
def served_on_both(replicated, tmp_path, processes) -> tuple[Any, Any, Gunicorn, str]:  # noqa: F811
    primary, standby = replicated
    primary.run("sync")
    url = both_hosts(primary, standby)
    store = PostgresStore(url)
    try:
        store.upgrade()
        token = create_household(store, "The Smiths").token
    finally:
        store.close()
    server = Gunicorn(tmp_path / "gunicorn.log", serving_env({"DATABASE_URL": url}), workers=2)
    processes.append(server)
    server.wait_ready()
    return primary, standby, server, token


def follow_to_the_end(
    url: str, token: str, deadline: float, last_id: str | None
) -> tuple[dict[str, Any], int, set[int]]:
    """Read the job's stream as EventSource would until its `end`: on a
    stream that ended without it, or a `503`, come back with the last id
    seen. Returns the `end` event's data, how many times it came back, and
    every status it was answered with."""
    comebacks = 0
    answered: set[int] = set()
    while time.monotonic() < deadline:
        headers = {"Last-Event-ID": last_id} if last_id else {}
        try:
            stream = EventStream(url, token, headers=headers, timeout=RECOVERY)
        except OSError:
            comebacks += 1
            time.sleep(0.2)
            continue
        answered.add(stream.status)
        with stream:
            if stream.status != 200:
                assert stream.status == 503, stream.body()
                assert "retry-after" in stream.headers
                comebacks += 1
                time.sleep(0.2)
                continue
            try:
                while True:
                    event = stream.next()
                    last_id = event.id or last_id
                    if event.name == "end":
                        return event.json, comebacks, answered
            except (Closed, OSError):
                comebacks += 1
    raise AssertionError("the stream never ended its job")


def test_streams_open_across_a_failover_see_their_job_end(served_on_both, gates):
    primary, standby, server, token = served_on_both
    # Of several attempts: a failover longer than its lease takes the job
    # from its handler, and it runs again on the new primary.
    job_id = enqueue(server.url, token, "wait_for_gate_retried", {"url": gates.url("held")})
    wait_until(lambda: gates.arrivals("held") >= 1, RECOVERY, "the job did not start")
    url = f"{server.url}/api/v1/jobs/{job_id}/events"
    streams = [EventStream(url, token, timeout=RECOVERY) for _ in range(READERS)]
    for stream in streams:
        assert stream.status == 200
        assert stream.next().name == "job"  # the job as it stands: running

    primary.run("crash")
    wait_until(
        lambda: http("GET", f"{server.url}/healthz").status == 503,
        RECOVERY,
        "healthz stayed 200 without a primary",
    )
    standby.run("promote")
    wait_until(
        lambda: http("GET", f"{server.url}/healthz").status == 200,
        RECOVERY,
        "healthz did not come back on the new primary",
    )
    gates.open("held")

    deadline = time.monotonic() + RECOVERY
    ends = []
    for stream in streams:
        # The stream opened before the crash, read on; then as a browser would.
        end = None
        last_id = None
        try:
            while end is None:
                event = stream.next()
                last_id = event.id or last_id
                if event.name == "end":
                    end = event.json
        except (Closed, OSError):
            pass
        finally:
            stream.close()
        if end is None:
            end, comebacks, answered = follow_to_the_end(url, token, deadline, last_id)
            assert 500 not in answered
            print(f"a stream came back {comebacks} times, answered {sorted(answered)}")
        ends.append(end)
    assert ends == [{"id": job_id, "status": "succeeded"}] * READERS
    assert "Traceback" not in server.log()
