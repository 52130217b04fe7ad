"""Two hosts, one PostgreSQL database: real gunicorn masters that share nothing
but the database URL.

Each "host" is a gunicorn master with two gevent workers, started in a
working directory of its own (`--chdir`), so nothing but the URL connects
them. Runs are recorded by the jobs in a file (O_APPEND lines), and every
status change by a trigger in the database, so "exactly once" and "one final
write" are counted, not inferred from the last state.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mealquest.clock import to_text, utc_now
from mealquest.db.errors import StoreUnavailable
from mealquest.db.postgresql import migrate
from mealquest.households import create_household
from tests.serving.conftest import Served
from tests.support import sql, transitions
from tests.support.postgres import fresh_database, require_postgres_url
from tests.support.private_postgres import PrivateServer
from tests.support.processes import REPO
from tests.support.servers import (
    LEASE_SECONDS,
    RESCUE_SECONDS,
    Gunicorn,
    Process,
    enqueue,
    final_jobs,
    http,
    jobs_by_id,
    open_test_store,
    running_pids,
    serving_env,
    wait_until,
)
from tests.support.skew import HOST_NOW_HEADER, SKEW

# Generous for a loaded machine: a test that passes never waits one out.
DEADLINE = 120.0
# Each test starts two gunicorn masters and waits on several such deadlines.
pytestmark = pytest.mark.timeout(600)


def _served_on(url: str) -> Iterator[Served]:
    database = {"DATABASE_URL": url}
    store = open_test_store(database)
    try:
        token = create_household(store, "The Hosts").token
        transitions.install(store, database)
        yield Served(database, token, store)
    finally:
        store.close()


@pytest.fixture
def shared() -> Iterator[Served]:
    """A fresh migrated database on the test server, audited, with a household."""
    with fresh_database(require_postgres_url(), migrated=True) as url:
        yield from _served_on(url)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Callable[..., Gunicorn]]:
    """Starts "hosts": gunicorn masters in working directories of their own."""
    started: list[Process] = []

    def start(
        served: Served, *, app: str = "tests.support.serving_app:app", **config: Any
    ) -> Gunicorn:
        number = len(started)
        home = tmp_path / f"host-{number}"
        home.mkdir()
        # A quota above the thousands of jobs these tests queue for one household.
        config = {"JOB_MAX_PENDING_PER_HOUSEHOLD": 10_000, **config}
        env = {**serving_env(served.database, **config), "PYTHONPATH": str(REPO)}
        server = Gunicorn(
            tmp_path / f"host-{number}.log",
            env,
            workers=2,
            app=app,
            extra_args=("--chdir", str(home)),
        )
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in reversed(started):
        server.stop()


def runs(log: Path, event: str | None = None) -> Counter[str]:
    """Runs per job id in a log of `job_id pid` lines, or of `event job_id ...` lines."""
    if not log.exists():
        return Counter()
    lines = [line.split() for line in log.read_text().splitlines()]
    if event is None:
        return Counter(words[0] for words in lines)
    return Counter(words[1] for words in lines if words[0] == event)


def pids_of(server: Gunicorn) -> set[int]:
    return set(server.worker_pids())


# -- draining one queue from two hosts ---------------------------------------------------------


def test_two_hosts_drain_2000_jobs_enqueued_through_both_each_exactly_once(shared, hosts, tmp_path):
    first, second = hosts(shared), hosts(shared)
    workers = {"first": pids_of(first), "second": pids_of(second)}
    log = tmp_path / "runs.log"
    payload = {"log": str(log), "seconds": 0}
    ids: list[list[str]] = []

    def enqueue_through(server: Gunicorn) -> None:
        ids.append(
            [enqueue(server.url, shared.token, "append_job_id", payload) for _ in range(250)]
        )

    # Four clients a host, each 250 jobs: one client a host posting 1,000 in
    # turn made each job a claim and a completion of its own, 40-110 s of
    # the suite; under concurrent posts the workers claim them in batches.
    threads = [
        threading.Thread(target=enqueue_through, args=(server,))
        for server in (first, second)
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [job_id for posted in ids for job_id in posted]
    assert len(everything) == len(set(everything)) == 2000

    rows = wait_until(lambda: final_jobs(shared.store, everything), DEADLINE, "not drained")
    assert {row["status"] for row in rows.values()} == {"succeeded"}
    ran = runs(log)
    assert set(ran) == set(everything)
    assert set(ran.values()) == {1}
    # Both hosts took part; no worker died or was replaced meanwhile.
    ran_in = {int(line.split()[1]) for line in log.read_text().splitlines()}
    assert ran_in & workers["first"], (ran_in, workers)
    assert ran_in & workers["second"], (ran_in, workers)
    assert ran_in <= workers["first"] | workers["second"]
    assert {"first": pids_of(first), "second": pids_of(second)} == workers
    transitions.assert_one_final_state_each(shared.store, everything)


# -- one host killed whole --------------------------------------------------------------------


def test_a_host_sigkilled_whole_leaves_every_job_to_the_other(shared, hosts, gates, tmp_path):
    log = tmp_path / "runs.log"
    held = {"url": gates.url("held"), "log": str(log)}
    # Four slots a host (two workers, two each): the victim's are all taken
    # before the survivor starts, so the survivor runs only what it enqueues.
    config = {"JOB_WORKERS": 2}
    victim = hosts(shared, **config)
    once = [enqueue(victim.url, shared.token, "pid_gate", held) for _ in range(2)]
    retried = [enqueue(victim.url, shared.token, "pid_gate_retried", held) for _ in range(2)]
    on_victim = once + retried
    pids = wait_until(lambda: running_pids(shared.store, on_victim), DEADLINE, "not running")
    assert set(pids.values()) <= pids_of(victim)
    survivor = hosts(shared, **config)
    on_survivor = [enqueue(survivor.url, shared.token, "pid_gate_retried", held) for _ in range(2)]
    pids = wait_until(lambda: running_pids(shared.store, on_survivor), DEADLINE, "not running")
    assert set(pids.values()) <= pids_of(survivor)

    # The master and its workers at once, as when the host goes away.
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=DEADLINE)
    gates.open("held")

    everything = on_victim + on_survivor
    rows = wait_until(lambda: final_jobs(shared.store, everything), DEADLINE, "jobs not final")
    # A kind of one attempt fails `interrupted by restart`; one of several is
    # re-queued, its attempt refunded, and runs again on the survivor.
    for job_id in once:
        assert (rows[job_id]["status"], rows[job_id]["error"]) == (
            "failed",
            "interrupted by restart",
        )
    survivors = pids_of(survivor)
    for job_id in retried + on_survivor:
        row = rows[job_id]
        assert (row["status"], row["attempt"]) == ("succeeded", 1), dict(row)
        assert json.loads(row["result"])["pid"] in survivors
    assert runs(log, "start") == Counter(on_victim) + Counter(retried) + Counter(on_survivor)
    assert runs(log, "end") == Counter(retried + on_survivor)
    assert not [row for row in jobs_by_id(shared.store).values() if row["status"] == "running"]
    transitions.assert_one_final_state_each(shared.store, everything)
    assert pids_of(survivor) == survivors  # no worker of the survivor died


# -- a host whose clock is off -----------------------------------------------------------------


def database_now(served: Served) -> Any:
    return sql.scalar(served.store, "SELECT now()")


def lease_owners(served: Served, job_ids: list[str]) -> dict[str, str]:
    rows = jobs_by_id(served.store)
    return {job_id: rows[job_id]["lease_owner"] for job_id in job_ids}


def assert_still_held(served: Served, owners: dict[str, str]) -> None:
    """Every job still running, under the lease it was claimed with."""
    rows = jobs_by_id(served.store)
    states = {job_id: (rows[job_id]["status"], rows[job_id]["lease_owner"]) for job_id in owners}
    assert states == {job_id: ("running", owner) for job_id, owner in owners.items()}


def test_a_host_whose_clock_is_5_minutes_ahead_steals_no_lease_and_delays_no_job(
    shared, hosts, gates, tmp_path
):
    log = tmp_path / "runs.log"
    config = {"JOB_WORKERS": 2}
    honest = hosts(shared, **config)
    on_honest = [
        enqueue(honest.url, shared.token, "pid_gate", {"url": gates.url("held"), "log": str(log)})
        for _ in range(4)
    ]
    wait_until(lambda: running_pids(shared.store, on_honest), DEADLINE, "not running")
    honest_owners = lease_owners(shared, on_honest)
    ahead = hosts(shared, app="tests.support.skewed_app:app", **config)
    # The fake is in force in the skewed host's workers.
    answer = http("GET", f"{ahead.url}/healthz")
    assert answer.headers[HOST_NOW_HEADER] > to_text(utc_now() + SKEW / 2)
    # The honest host's slots are full: these run on the skewed host. Enqueued
    # there, they are due at once (the database's now), not 5 minutes later.
    on_ahead = [
        enqueue(ahead.url, shared.token, "pid_gate", {"url": gates.url("held"), "log": str(log)})
        for _ in range(4)
    ]

    def ahead_running() -> dict[str, int] | None:
        assert_still_held(shared, honest_owners)  # the skewed host's rescues ran meanwhile
        return running_pids(shared.store, on_ahead)

    pids = wait_until(ahead_running, DEADLINE, "not running")
    assert set(pids.values()) <= pids_of(ahead)
    everything = on_honest + on_ahead
    owners = lease_owners(shared, everything)

    # Hold every job until well past the leases they were claimed with: by its
    # own clock the skewed host sees the honest host's leases 5 minutes
    # expired, and the honest one would see the other's 5 minutes long.
    since = database_now(shared)

    def held_past_their_first_leases() -> bool:
        assert_still_held(shared, owners)
        elapsed = (database_now(shared) - since).total_seconds()
        return elapsed > LEASE_SECONDS + 4 * RESCUE_SECONDS

    wait_until(held_past_their_first_leases, DEADLINE, "jobs were not held")
    gates.open("held")
    rows = wait_until(lambda: final_jobs(shared.store, everything), DEADLINE, "jobs not final")
    assert {(row["status"], row["attempt"]) for row in rows.values()} == {("succeeded", 1)}
    assert runs(log, "start") == Counter(everything)

    # Due jobs enqueued through the skewed host run at once, wherever they run.
    quick = [enqueue(ahead.url, shared.token, "pid", {}) for _ in range(4)]
    rows = wait_until(lambda: final_jobs(shared.store, quick), DEADLINE, "due jobs were delayed")
    assert {row["status"] for row in rows.values()} == {"succeeded"}
    for row in rows.values():
        assert row["run_at"] <= row["started_at"] <= database_now(shared)
    transitions.assert_one_final_state_each(shared.store, everything + quick)


# -- the database restarted under load ---------------------------------------------------------


def unless_unavailable(condition: Callable[[], Any]) -> Callable[[], Any]:
    """`condition`, false while the test's own store is unavailable: its pool
    may still hold a connection the restart cut, and gives it up on first use."""

    def check() -> Any:
        try:
            return condition()
        except StoreUnavailable:
            return None

    return check


@pytest.fixture(scope="module")
def private_server() -> Iterator[PrivateServer]:
    require_postgres_url()  # PostgreSQL tests run only where a server can be had
    server = PrivateServer()
    try:
        migrate.upgrade(server.url)
        yield server
    finally:
        server.remove()


@pytest.fixture
def private(private_server: PrivateServer) -> Iterator[Served]:
    yield from _served_on(private_server.url)


def test_the_database_restarted_under_load_is_503_while_down_and_recovers_by_itself(
    private, private_server, hosts, tmp_path
):
    log = tmp_path / "runs.log"
    # A lease longer than the outage: a job that finished while the database
    # was down keeps it (its final write is retried), so it is not rescued as
    # interrupted. (A lease shorter than an outage ends like a dead process.)
    outlasting = {
        "JOB_LEASE_SECONDS": 30.0,
        "JOB_HEARTBEAT_SECONDS": 1.0,
        "JOB_RESCUE_SECONDS": 1.0,
    }
    first, second = hosts(private, **outlasting), hosts(private, **outlasting)
    workers = pids_of(first) | pids_of(second)
    accepted: list[str] = []
    statuses: Counter[int] = Counter()
    unexpected: list[Any] = []
    stop = threading.Event()

    def load(server: Gunicorn) -> None:
        """Enqueues without pause, each logical request with an Idempotency-Key of
        its own, sent again with the same key after a 503 until it is answered:
        every job that exists was answered to the client, and runs once."""
        while not stop.is_set():
            key = uuid.uuid4().hex
            while True:  # finished even once stopping: its job may exist already
                try:
                    answer = http(
                        "POST",
                        f"{server.url}/api/v1/test-jobs",
                        token=private.token,
                        json_body={
                            "kind": "append_job_id",
                            "payload": {"log": str(log), "seconds": 0},
                        },
                        headers={"Idempotency-Key": key},
                    )
                except OSError:
                    statuses[0] += 1
                    continue
                statuses[answer.status] += 1
                if answer.status in (200, 202):
                    accepted.append(answer.json["id"])
                    break
                if (
                    answer.status != 503
                    or answer.json["error"]["code"] != "unavailable"
                    or "Retry-After" not in answer.headers
                ):
                    unexpected.append(answer)
                    break

    threads = [threading.Thread(target=load, args=(server,)) for server in (first, second)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(accepted) >= 50, DEADLINE, "no load")
        private_server.run("stop")
        # While it is down every request is answered, 503 unavailable.
        down = http("GET", f"{first.url}/api/v1/jobs", token=private.token)
        assert (down.status, down.json["error"]["code"]) == (503, "unavailable")
        # (Each process answers /healthz from a check at most a second old.)
        wait_until(lambda: http("GET", f"{second.url}/healthz").status == 503, DEADLINE, "healthy")
        wait_until(lambda: statuses[503] >= 10, DEADLINE, "no 503 while the database was down")
        private_server.run("start")
        recovered = len(accepted)
        wait_until(lambda: len(accepted) >= recovered + 50, DEADLINE, "did not recover")
        # And once more as an operator would: pg_ctl restart, load running.
        private_server.run("restart")
        restarted = len(accepted)
        wait_until(lambda: len(accepted) >= restarted + 50, DEADLINE, "did not recover")
    finally:
        stop.set()
        for thread in threads:
            thread.join()

    assert not unexpected, unexpected  # every answer a 202 or a 503 unavailable
    assert statuses[0] == 0, statuses  # never a dropped connection or a hung request
    rows = wait_until(
        unless_unavailable(lambda: final_jobs(private.store, accepted)), DEADLINE, "jobs lost"
    )
    assert {row["status"] for row in rows.values()} == {"succeeded"}
    ran = runs(log)
    # A COMMIT whose acknowledgement the restart cut off is answered 503, yet
    # its job exists: the retry with the same key is answered that job (200).
    # So every job that ran was answered, and each ran once.
    assert set(ran) == set(accepted)
    assert set(ran.values()) == {1}
    assert len(accepted) == len(set(accepted)) == len(rows)
    assert sql.scalar(private.store, "SELECT count(*) AS n FROM jobs") == len(accepted)
    # No worker died: the same four serve on, each having logged no failure.
    assert pids_of(first) | pids_of(second) == workers
    for server in (first, second):
        assert server.log().count("job pool started") == 2
        assert "job pool cannot continue" not in server.log()
        wait_until(
            lambda url=server.url: http("GET", f"{url}/healthz").status == 200,
            DEADLINE,
            "unhealthy",
        )
