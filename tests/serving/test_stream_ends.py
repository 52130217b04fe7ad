"""The ends of a job's event stream that need a server of their own, through
real gunicorn on both databases: its longest time, and its worker's stop,
which the stream must not hold up."""

from __future__ import annotations

import signal

import pytest

from tests.support.events import EventStream
from tests.support.servers import TIMEOUT, enqueue

pytestmark = pytest.mark.both_databases

FAST_STREAMS = {"STREAM_HEARTBEAT_SECONDS": 0.3}


def test_a_stream_ends_after_its_longest_time(served, start_gunicorn, gates):
    server = start_gunicorn(workers=1, config={**FAST_STREAMS, "STREAM_MAX_SECONDS": 1})
    job_id = enqueue(server.url, served.token, "pid_gate", {"url": gates.url("g")})

    with EventStream(f"{server.url}/api/v1/jobs/{job_id}/events", served.token) as stream:
        events = stream.events_until_closed(comments=True)
    assert events[0].name == "job"
    assert "end" not in [e.name for e in events]  # the job still runs: the client reconnects
    gates.open("g")


def test_a_stopping_worker_ends_its_streams_and_is_not_held_by_them(served, start_gunicorn, gates):
    # A graceful timeout far longer than the test waits: a worker that waited
    # for its open stream would outlast the deadline below. The worker's own
    # timeout stays the one the tests' short lease allows.
    server = start_gunicorn(workers=1, graceful_timeout=300, timeout=TIMEOUT, config=FAST_STREAMS)
    job_id = enqueue(server.url, served.token, "pid_gate", {"url": gates.url("g")})
    stream = EventStream(f"{server.url}/api/v1/jobs/{job_id}/events", served.token)
    assert stream.next().name == "job"

    server.signal(signal.SIGTERM)
    # Heartbeats (and no `end`: the job still runs) until the stream ends.
    assert {e.name for e in stream.events_until_closed(comments=True)} <= {None, "job"}
    stream.close()
    gates.open("g")  # the pool drains its job within the graceful timeout
    assert server.wait(60) == 0
    assert "graceful timeout" not in server.log().lower()
