"""Held requests (event streams and long polls) are bounded, through real
gunicorn on both databases: per household and per process together, so that
one household's thousands of long polls, or many households' held requests,
never take the connections another household's plain request needs; and a
stream whose reader stops reading holds nothing, not even a restart."""

from __future__ import annotations

import json
import select
import signal
import socket
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from mealquest.households import create_household
from mealquest.model.jobs import NewJob, OnInterrupt
from tests.support import sql
from tests.support.servers import TIMEOUT, enqueue, final_jobs, http, job, wait_until

pytestmark = pytest.mark.both_databases

# A worker of few connections, so that a test fills them with few sockets.
CONNECTIONS = 60
DEADLINE = 60


def held(store, household_id: int | None = None) -> int:
    """Held requests with a place in the database (every household's, or one's)."""
    if household_id is None:
        return sql.scalar(store, "SELECT count(*) FROM job_streams")
    return sql.scalar(
        store, "SELECT count(*) FROM job_streams WHERE household_id = ?", (household_id,)
    )


def unchanging_job(server, store, household) -> tuple[str, str]:
    """A job that will not change while the test runs, and its ETag: queued,
    due in a year. (Not a final job: a long poll on one is answered at once,
    never held.)"""
    job_id = uuid.uuid4().hex
    store.write(
        store.jobs.insert_job,
        NewJob(
            job_id=job_id,
            household_id=household.household_id,
            kind="succeed",
            payload='{"value": 1}',
            max_attempts=1,
            on_interrupt=OnInterrupt.FAIL,
            delay_seconds=365 * 24 * 3600.0,
        ),
    )
    answer = http("GET", f"{server.url}/api/v1/jobs/{job_id}", token=household.token)
    assert answer.json["status"] == "queued", answer
    return job_id, answer.headers["ETag"]


@contextmanager
def long_polls(server, token, job_id, etag, count: int) -> Iterator[list[socket.socket]]:
    """`count` long polls of 30 s sent on raw sockets, whose answers nobody
    reads until the test looks; all closed at the end."""
    request = (
        f"GET /api/v1/jobs/{job_id}?wait=30 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nIf-None-Match: {etag}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    sockets = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE)
            sock.sendall(request)
            sockets.append(sock)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def answered(sockets: list[socket.socket]) -> int:
    """How many of the sockets have an answer (or a close) to read now."""
    ready, _, _ = select.select(sockets, [], [], 0)
    return len(ready)


def test_one_households_thousands_of_long_polls_leave_others_served(served, start_gunicorn):
    server = start_gunicorn(
        workers=1,
        config={"STREAM_MAX_PER_HOUSEHOLD": 20},
        extra_args=("--worker-connections", str(CONNECTIONS)),
    )
    attacker = create_household(served.store, "The Pollers")
    other = served.token
    job_id, etag = unchanging_job(server, served.store, attacker)

    with long_polls(server, attacker.token, job_id, etag, 400) as sockets:
        # 20 held (the household's cap); the rest answered at once, as
        # without `wait`, and so never held a connection.
        wait_until(lambda: answered(sockets) == 380, DEADLINE, "long polls past the cap were held")
        wait_until(lambda: held(served.store, attacker.household_id) == 20, DEADLINE, "not held")
        # Another household is served meanwhile: a read and an import.
        theirs = enqueue(server.url, other, "succeed", {"value": 2})
        assert http("GET", f"{server.url}/api/v1/jobs/{theirs}", token=other).status == 200
        assert http("GET", f"{server.url}/healthz").status == 200
        # ... while the 20 are still held.
        assert answered(sockets) == 380
        first = next(sock for sock in sockets if select.select([sock], [], [], 0)[0])
        assert first.recv(100).startswith(b"HTTP/1.1 304 ")


def test_many_households_held_requests_stop_at_the_process_cap(served, start_gunicorn):
    server = start_gunicorn(
        workers=1,
        config={"STREAM_MAX_PER_HOUSEHOLD": 20},
        extra_args=("--worker-connections", str(CONNECTIONS)),
    )
    households = [create_household(served.store, f"House {n}") for n in range(6)]
    jobs = [unchanging_job(server, served.store, house) for house in households]
    with ExitStack() as stack:
        sockets = [
            sock
            for house, (job_id, etag) in zip(households, jobs, strict=True)
            for sock in stack.enter_context(long_polls(server, house.token, job_id, etag, 10))
        ]
        # Half of the worker's connections held, the rest answered at once.
        wait_until(
            lambda: answered(sockets) == 60 - CONNECTIONS // 2,
            DEADLINE,
            "long polls past the process's cap were held",
        )
        wait_until(lambda: held(served.store) == CONNECTIONS // 2, DEADLINE, "not held")
        theirs = enqueue(server.url, served.token, "succeed", {"value": 2})
        assert http("GET", f"{server.url}/api/v1/jobs/{theirs}", token=served.token).status == 200
        # A stream past the process's cap is refused, with when to come back.
        refused = http("GET", f"{server.url}/api/v1/jobs/{theirs}/events", token=served.token)
        assert refused.status == 503
        assert int(refused.headers["Retry-After"]) >= 1
        assert answered(sockets) == 60 - CONNECTIONS // 2


@contextmanager
def stalled_stream(server, token, job_id) -> Iterator[socket.socket]:
    """A job's event stream whose client reads nothing: a small receive buffer
    that fills at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(
            f"GET /api/v1/jobs/{job_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\n\r\n".encode()
        )
        yield sock
    finally:
        sock.close()


def test_a_stream_whose_reader_stops_is_dropped_after_its_send_timeout(served, start_gunicorn):
    server = start_gunicorn(workers=1, config={"STREAM_SEND_TIMEOUT_SECONDS": 1})
    household = create_household(served.store, "The Stalled")
    job_id = enqueue(server.url, household.token, "publish_big", {"steps": 400, "pause": 0.02})
    with stalled_stream(server, household.token, job_id):
        wait_until(lambda: held(served.store, household.household_id) == 1, DEADLINE, "no stream")
        # Dropped: its place released. Without the send timeout the write
        # stays stuck, and the place held, even after the job has ended.
        wait_until(
            lambda: held(served.store, household.household_id) == 0,
            DEADLINE,
            "the stalled stream was never dropped",
        )
    wait_until(lambda: final_jobs(served.store, [job_id]), DEADLINE, "the job did not finish")


def test_a_stopping_worker_with_a_stalled_stream_exits_without_waiting_for_it(
    served, start_gunicorn
):
    # A graceful timeout far longer than the test waits, and a send timeout
    # too: only the stop itself may end the stream in time.
    server = start_gunicorn(
        workers=1,
        graceful_timeout=300,
        timeout=TIMEOUT,
        config={"STREAM_SEND_TIMEOUT_SECONDS": 250},
    )
    household = create_household(served.store, "The Stalled")
    job_id = enqueue(server.url, household.token, "publish_big", {"steps": 200, "pause": 0.01})
    with stalled_stream(server, household.token, job_id):
        wait_until(lambda: held(served.store, household.household_id) == 1, DEADLINE, "no stream")
        # Far more published than the socket buffers hold: the stream's write waits.
        wait_until(
            lambda: _step(served.store, job_id) >= 100,
            DEADLINE,
            "the job did not publish",
        )
        server.signal(signal.SIGTERM)
        assert server.wait(DEADLINE) == 0
    assert "graceful timeout" not in server.log().lower()


def _step(store, job_id) -> int:
    result = job(store, job_id)["result"]
    return json.loads(result)["step"] if result else 0
