"""The runner against hostile handlers, lost leases, interruptions and bad rows.

Jobs that must stay running wait on latches the test opens (gevent events: the
pool runs in the test's process), never on a sleep.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sqlite3
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import gevent
import pytest
from gevent.event import Event
from marshmallow import Schema, fields, post_load

from mealquest.clock import to_text, utc_now
from mealquest.db.errors import StoreUnavailable
from mealquest.db.postgresql.store import PostgresStore
from mealquest.db.sqlite import migrate
from mealquest.jobs import enqueueing
from mealquest.jobs.context import JobContext
from mealquest.jobs.errors import JobCancelled, LeaseLost, PoolStopping
from mealquest.jobs.registry import Backoff, KindOptions
from mealquest.jobs.service import JobService, get_jobs
from mealquest.model.jobs import (
    FINAL_STATUSES,
    MAX_INTERRUPTIONS,
    ClaimRequest,
    Failure,
    OnInterrupt,
    Recovered,
    Status,
    Transition,
)
from tests.conftest import FAST_POOL, wait_for
from tests.support import sql
from tests.support.kinds import EmptySchema, ValueSchema
from tests.support.rescue import rescue_all, watched_rescuer
from tests.support.ticks import Ticks
from tests.test_store import Fatal, checkpoint_soon, sabotage_checkpoint

# Also through PgBouncer in transaction mode (see tests/conftest.py).
pytestmark = [pytest.mark.both_databases, pytest.mark.through_pgbouncer]

QUICK_RETRY = Backoff(base_seconds=0.01, factor=1.0, max_seconds=0.01, jitter=0.0)


class GateSchema(Schema):
    gate = fields.String(required=True)


# What a handler may raise that `except Exception` does not catch, the
# pool's own exceptions included (raised by the handler, not the pool).
# SystemExit and KeyboardInterrupt stop the process (`tests/serving/test_poison.py`).
BASE_EXCEPTIONS: dict[str, BaseException] = {
    "GreenletExit": gevent.GreenletExit(),
    "PoolStopping": PoolStopping(),
    "JobCancelled": JobCancelled(),
    "LeaseLost": LeaseLost(),
}


class NameSchema(Schema):
    name = fields.String(required=True)


class RawSchema(Schema):
    value = fields.Raw(required=True)


class FailureWithoutMessage(Failure):
    """A handler's bug: its `__init__` never sets the message."""

    def __init__(self) -> None:
        Exception.__init__(self)


class Latches:
    """In-process latches (gevent events) the hostile kinds wait on, and what
    happened to their handlers, in order."""

    def __init__(self) -> None:
        self.events: defaultdict[str, Event] = defaultdict(Event)
        self.log: list[tuple[str, str, int]] = []
        # Set from the hub monitor's thread (a native event: the hub is blocked).
        self.hub_reported = threading.Event()

    def open(self, gate: str) -> None:
        self.events[gate].set()

    def seen(self, what: str, gate: str) -> list[tuple[str, str, int]]:
        return [entry for entry in self.log if entry[:2] == (what, gate)]


def register_hostile_kinds(service: JobService, latches: Latches) -> None:
    """Handlers that hold, ignore their timeout or stop, block the hub, or meet a locked store."""

    def held(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        gate = payload["gate"]
        latches.log.append(("start", gate, ctx.attempt))
        try:
            latches.events[gate].wait()
        except BaseException as stop:
            latches.log.append((f"stopped by {type(stop).__name__}", gate, ctx.attempt))
            raise
        latches.log.append(("end", gate, ctx.attempt))
        return {}

    def stubborn(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Swallows every kill (a timeout, a stop, a lost lease) until its gate opens."""
        gate = payload["gate"]
        latches.log.append(("start", gate, ctx.attempt))
        while not latches.events[gate].is_set():
            try:
                latches.events[gate].wait()
            except BaseException as stop:
                latches.log.append((f"ignored {type(stop).__name__}", gate, ctx.attempt))
        latches.log.append(("end", gate, ctx.attempt))
        return {}

    def returns_after_its_timeout(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        with contextlib.suppress(BaseException):
            latches.events[payload["gate"]].wait()
        return {"value": 1}

    def blocks_the_hub(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        # The test process is not monkey-patched: these sleeps hold the hub,
        # until the monitor (in its own thread) has said so, or a deadline.
        deadline = time.monotonic() + 30
        while not latches.hub_reported.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        return {}

    def writes_after_its_gate(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        latches.log.append(("start", payload["gate"], ctx.attempt))
        latches.events[payload["gate"]].wait()
        ctx.write(lambda tx: tx.execute("UPDATE households SET name = name WHERE id = 0"))
        return {}

    def raises_lease_lost_in_its_write(payload: dict[str, Any], ctx: JobContext) -> None:
        def write(tx: Any) -> None:
            raise LeaseLost()

        ctx.write(write)

    def publishes_after_its_gate(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        latches.log.append(("start", payload["gate"], ctx.attempt))
        latches.events[payload["gate"]].wait()
        ctx.publish({})
        return {}

    def bad_result(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        return {"value": "not a number"}

    def raises(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        raise BASE_EXCEPTIONS[payload["name"]]

    def nested_too_deep(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        latches.log.append(("start", "deep", ctx.attempt))
        value: list[Any] = []
        for _ in range(100_000):
            value = [value]
        return {"value": value}

    def raises_a_failure_without_message(payload: dict[str, Any], ctx: JobContext) -> None:
        raise FailureWithoutMessage()

    class LoadsUntilTheGateOpens(GateSchema):
        """Loads at enqueue; from the gate's opening, its hook raises a KeyError."""

        @post_load
        def look_up(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
            if latches.events["payload breaks"].is_set():
                return data["missing"]
            return data

    register = service.registry.register
    retried = KindOptions(max_attempts=3, backoff=QUICK_RETRY)
    register("held", held, payload=GateSchema, result=EmptySchema, options=retried)
    register("held_once", held, payload=GateSchema, result=EmptySchema)
    register(
        "stubborn",
        stubborn,
        payload=GateSchema,
        result=EmptySchema,
        options=KindOptions(max_attempts=3, backoff=QUICK_RETRY, timeout_seconds=0.3),
    )
    register("stubborn_slow", stubborn, payload=GateSchema, result=EmptySchema, options=retried)
    register(
        "returns_after_its_timeout",
        returns_after_its_timeout,
        payload=GateSchema,
        result=ValueSchema,
        options=KindOptions(timeout_seconds=0.2),
    )
    register("blocks_the_hub", blocks_the_hub, payload=EmptySchema, result=EmptySchema)
    register(
        "writes_after_its_gate",
        writes_after_its_gate,
        payload=GateSchema,
        result=EmptySchema,
        options=retried,
    )
    register(
        "writes_after_its_gate_once", writes_after_its_gate, payload=GateSchema, result=EmptySchema
    )
    register(
        "raises_lease_lost_in_its_write",
        raises_lease_lost_in_its_write,
        payload=EmptySchema,
        result=EmptySchema,
        options=retried,
    )
    register(
        "publishes_after_its_gate_once",
        publishes_after_its_gate,
        payload=GateSchema,
        result=EmptySchema,
        partial=EmptySchema,
    )
    register(
        "bad_result_retried", bad_result, payload=EmptySchema, result=ValueSchema, options=retried
    )
    register("raises", raises, payload=NameSchema, result=EmptySchema, options=retried)
    register(
        "nested_too_deep", nested_too_deep, payload=EmptySchema, result=RawSchema, options=retried
    )
    register(
        "raises_a_failure_without_message",
        raises_a_failure_without_message,
        payload=EmptySchema,
        result=EmptySchema,
        options=retried,
    )
    register(
        "payload_breaks", held, payload=LoadsUntilTheGateOpens, result=EmptySchema, options=retried
    )


@pytest.fixture
def latches() -> Iterator[Latches]:
    latches = Latches()
    yield latches
    for event in latches.events.values():  # let every held handler end
        event.set()


@pytest.fixture
def hostile(make_app, latches) -> Callable[..., JobService]:
    def make(**config: Any) -> JobService:
        service = get_jobs(make_app(JOB_KILL_GRACE_SECONDS=0.3, **config))
        register_hostile_kinds(service, latches)
        return service

    return make


@pytest.fixture
def logs(latches) -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)
            if "blocked the event loop" in record.getMessage():
                latches.hub_reported.set()  # may be the monitor's thread

    handler = Collect(level=logging.DEBUG)
    logger = logging.getLogger("mealquest")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def errors_about(records: list[logging.LogRecord], job_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in records
        if r.levelno >= logging.ERROR and getattr(r, "job_id", None) == job_id
    ]


def enqueue(service: JobService, kind: str, household, **payload: Any) -> str:
    return service.enqueue(kind, payload, household_id=household.household_id)


# -- handlers that ignore their timeout or their stop ------------------------------------------


def test_a_handler_that_catches_its_timeout_and_returns_is_recorded_timed_out(
    hostile, household, logs
):
    jobs = hostile()
    job_id = enqueue(jobs, "returns_after_its_timeout", household, gate="never")
    jobs.start_pool()
    job = wait_for(lambda: jobs.get(job_id).status == Status.FAILED and jobs.get(job_id))
    assert (job.error, job.result) == ("timed out", None)
    assert "handler ignored its timeout" in errors_about(logs, job_id)


def test_a_handler_that_will_not_die_keeps_its_slot_is_recorded_and_restarts_the_process(
    hostile, household, latches, logs
):
    jobs = hostile(JOB_WORKERS=1)
    stubborn = enqueue(jobs, "stubborn", household, gate="stubborn")
    fatal: list[str] = []
    pool = jobs.start_pool(on_fatal=fatal.append)
    wait_for(lambda: latches.seen("ignored Timeout", "stubborn"))
    # Past its timeout plus the grace, still alive: recorded now, and final even
    # with attempts left (a second attempt would run beside it).
    job = wait_for(lambda: jobs.get(stubborn).status == Status.FAILED and jobs.get(stubborn))
    assert (job.error, job.attempt, job.lease_owner) == ("timed out", 1, None)
    wait_for(lambda: fatal)
    assert fatal == [f"a handler will not die (job {stubborn}, kind stubborn)"]
    assert any("handler will not die" in m for m in errors_about(logs, stubborn))
    # Its slot is not reused while the greenlet lives.
    waiting = enqueue(jobs, "held", household, gate="next")
    gevent.sleep(0.3)
    assert jobs.get(waiting).status == Status.QUEUED
    assert pool.active_jobs() == [stubborn]
    # Once it dies, the slot frees; nothing it returns is recorded.
    latches.open("stubborn")
    wait_for(lambda: latches.seen("start", "next"))
    latches.open("next")
    assert wait_for(lambda: jobs.get(waiting).status == Status.SUCCEEDED)
    assert (jobs.get(stubborn).status, jobs.get(stubborn).error) == (Status.FAILED, "timed out")


def test_the_heartbeat_does_not_renew_a_handler_past_its_timeout_and_grace(
    hostile, household, latches
):
    jobs = hostile()
    job_id = enqueue(jobs, "stubborn", household, gate="g")
    pool = jobs.start_pool()
    wait_for(lambda: latches.seen("start", "g"))
    [entry] = pool.slots.running.values()
    assert pool.heartbeat.renewable(entry, time.monotonic())
    assert not pool.heartbeat.renewable(entry, entry.deadline + 0.31)
    wait_for(lambda: jobs.get(job_id).status == Status.FAILED)


def test_stop_never_requeues_a_handler_that_ignores_it(hostile, household, latches, logs):
    jobs = hostile()
    job_id = enqueue(jobs, "stubborn_slow", household, gate="g")
    pool = jobs.start_pool()
    wait_for(lambda: latches.seen("start", "g"))
    report = pool.stop(timeout=0.1)
    # Its kind re-queues interrupted jobs, but this handler still runs: failed instead.
    assert (report.requeued, report.failed) == ((), (job_id,))
    job = jobs.get(job_id)
    assert (job.status, job.error, job.attempt) == (Status.FAILED, "interrupted by restart", 1)
    assert "handler will not die: it ignored the stop" in errors_about(logs, job_id)
    latches.open("g")
    wait_for(lambda: latches.seen("end", "g"))
    assert [entry[0] for entry in latches.log] == ["start", "ignored PoolStopping", "end"]
    assert jobs.get(job_id).status == Status.FAILED


# -- leases ------------------------------------------------------------------------------------


def test_a_process_never_rescues_its_own_live_handlers_job(hostile, household, latches):
    jobs = hostile()
    job_id = enqueue(jobs, "held", household, gate="g")
    pool = jobs.start_pool()
    wait_for(lambda: latches.seen("start", "g"))
    # Watched past a whole lease, expired by the database's clock: still
    # not taken from its live handler.
    pool.rescuer.clock = ticks = Ticks()
    assert pool.rescue_once(utc_now() + timedelta(hours=1)) == Recovered()
    ticks.advance(3600)
    assert pool.rescue_once(utc_now() + timedelta(hours=1)) == Recovered()
    latches.open("g")
    job = wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED and jobs.get(job_id))
    assert job.attempt == 1


def test_a_rescuer_whose_clock_runs_ahead_takes_no_lease_its_owner_renews(
    hostile, household, latches
):
    # SQLite's leases are judged by a host's wall clock, which NTP may step:
    # to a rescuer ten minutes ahead, every lease has expired. It takes only
    # what it has itself read unrenewed for a whole lease of its own clock.
    jobs = hostile()
    store = jobs.store
    job_id = enqueue(jobs, "held", household, gate="g")
    jobs.start_pool()
    wait_for(lambda: latches.seen("start", "g"))
    # A lease nobody renews: a claim of a dead process, of a kind no pool here runs.
    elsewhere = enqueueing.prepare(
        jobs.registry, "held", {"gate": "x"}, household_id=household.household_id
    )
    store.write(store.jobs.insert_job, dataclasses.replace(elsewhere, kind="elsewhere"))
    dead = store.write(
        store.jobs.claim,
        ClaimRequest(owner="dead-worker", lease_seconds=0, limit=1, kinds=("elsewhere",)),
    )
    lease = FAST_POOL["JOB_LEASE_SECONDS"]
    ahead = utc_now() + timedelta(minutes=10)
    rescuer = watched_rescuer(store, lease_seconds=lease)
    recovered = Recovered()
    for _ in range(3):
        before = jobs.get(job_id).lease_expires_at
        recovered += rescuer.run_once(ahead)
        rescuer.clock.advance(lease)
        wait_for(lambda before=before: jobs.get(job_id).lease_expires_at != before)
    recovered += rescuer.run_once(ahead)
    # The dead claim's lease, unrenewed all along, is the only one it took.
    assert recovered == Recovered(requeued=tuple(job.id for job in dead))
    latches.open("g")
    job = wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED and jobs.get(job_id))
    assert job.attempt == 1


def test_a_job_another_process_took_starts_again_only_once_its_old_handler_died(
    hostile, household, latches
):
    jobs = hostile()
    store = jobs.store
    job_id = enqueue(jobs, "held", household, gate="g")
    jobs.start_pool()
    wait_for(lambda: latches.seen("start", "g"))
    # Another process, whose clock runs an hour ahead, takes the job back.
    recovered = rescue_all(store, now=utc_now() + timedelta(hours=1))
    assert recovered.requeued == (job_id,)
    wait_for(lambda: len(latches.seen("start", "g")) == 2)
    first_stop = latches.log.index(("stopped by LeaseLost", "g", 1))
    second_start = [i for i, entry in enumerate(latches.log) if entry[:2] == ("start", "g")][1]
    assert first_stop < second_start
    latches.open("g")
    job = wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED and jobs.get(job_id))
    # The interruption refunded the attempt.
    assert (job.attempt, job.interruptions) == (1, 0)


def test_a_lease_lost_raised_by_the_handlers_own_write_function_fails_its_job(hostile, household):
    # Out of `ctx.write`, as its lease check's would be, but the lease is the job's.
    jobs = hostile()
    job_id = enqueue(jobs, "raises_lease_lost_in_its_write", household)
    jobs.start_pool()
    job = wait_for(lambda: jobs.get(job_id).status == Status.FAILED and jobs.get(job_id))
    assert (job.error, job.attempt) == ("internal error", 3)


@pytest.mark.parametrize("kind", ["writes_after_its_gate_once", "publishes_after_its_gate_once"])
def test_a_handlers_write_that_finds_its_lease_gone_ends_the_attempt_unrecorded(
    hostile, household, latches, logs, kind
):
    # A heartbeat too slow to notice first: the handler's own write finds the
    # lease gone, and its LeaseLost ends the attempt as the pool's would.
    jobs = hostile(JOB_LEASE_SECONDS=120.0, JOB_HEARTBEAT_SECONDS=60.0)
    store = jobs.store
    job_id = enqueue(jobs, kind, household, gate="g")
    pool = jobs.start_pool()
    wait_for(lambda: latches.seen("start", "g"))
    recovered = rescue_all(store, now=utc_now() + timedelta(hours=1))
    assert recovered.failed == (job_id,)
    latches.open("g")
    wait_for(lambda: pool.active_jobs() == [])
    about_job = [
        (record.levelname, record.getMessage())
        for record in logs
        if getattr(record, "job_id", None) == job_id
    ]
    assert about_job[-1] == ("WARNING", "job lost its lease; its outcome is not recorded")
    job = jobs.get(job_id)
    assert (job.status, job.error, job.attempt) == (Status.FAILED, "interrupted by restart", 1)


def test_a_handler_whose_lease_cannot_be_renewed_is_stopped_before_the_lease_expires(
    hostile, household, latches, lock_holder
):
    jobs = hostile(DB_BUSY_TIMEOUT_SECONDS=0.1)
    job_id = enqueue(jobs, "held", household, gate="g")
    jobs.start_pool()
    wait_for(lambda: latches.seen("start", "g"))
    expires = jobs.get(job_id).lease_expires_at
    lock_holder.hold()
    wait_for(lambda: latches.seen("stopped by LeaseLost", "g"))
    stopped_at = to_text(utc_now())
    latches.open("g")
    lock_holder.release()
    # Stopped while its lease still held, so no rescuer could have re-queued it
    # beside the live handler; then rescued once the lease expired, and re-run.
    assert stopped_at < expires or jobs.get(job_id).lease_expires_at is not None
    job = wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED and jobs.get(job_id))
    assert (job.attempt, job.interruptions) == (1, 0)


def test_a_job_whose_database_stayed_away_past_its_lease_again_and_again_is_no_poison_pill(
    hostile, household, latches, write_lock
):
    """The three jobs a twenty-round chaos run through PgBouncer lost: each
    PostgreSQL restart kept the database away past the lease (PgBouncer's
    15 s login retry), every running job's handler was stopped, and its
    rescue counted an interruption, as if the job had killed its process;
    the third such count in a row failed the job `interrupted by restart`.
    Its process lived through each: the job goes back uncounted."""
    jobs = hostile(DB_BUSY_TIMEOUT_SECONDS=0.1)
    job_id = enqueue(jobs, "held", household, gate="g")
    jobs.start_pool()
    for outage in range(1, MAX_INTERRUPTIONS + 1):
        wait_for(lambda outage=outage: len(latches.seen("start", "g")) == outage)
        expires = wait_for(lambda: jobs.get(job_id).lease_expires_at)
        write_lock.hold()
        wait_for(lambda outage=outage: len(latches.seen("stopped by LeaseLost", "g")) == outage)
        # Away until the lease has expired by the database's clock too.
        wait_for(lambda expires=expires: to_text(utc_now()) > expires)
        write_lock.release()
    latches.open("g")
    job = wait_for(lambda: jobs.get(job_id).status in FINAL_STATUSES and jobs.get(job_id))
    assert (job.status, job.attempt, job.interruptions) == (Status.SUCCEEDED, 1, 0)
    assert len(latches.seen("start", "g")) == MAX_INTERRUPTIONS + 1


def test_a_rescuer_that_could_not_reach_the_database_watches_each_lease_a_whole_lease_again(
    hostile, household, write_lock
):
    """While the database is away nobody renews a lease, its owner no more
    than the others: a rescuer that counted that time as the lease going
    unrenewed took every lease the moment the database came back, before
    the owners' first renewal (a job then ran twice)."""
    jobs = hostile(DB_BUSY_TIMEOUT_SECONDS=0.1)
    store = jobs.store
    job_id = enqueue(jobs, "held", household, gate="g")
    claim_all(store, "away", utc_now())
    rescuer = watched_rescuer(store, lease_seconds=1.0)
    assert rescuer.run_once() == Recovered()  # the first look
    rescuer.clock.advance(1.0)
    write_lock.hold()
    with pytest.raises(StoreUnavailable):
        rescuer.run_once()  # its rescue cannot be written
    write_lock.release()
    # Back: a whole lease for the owner to renew before the lease is taken.
    assert rescuer.run_once() == Recovered()
    rescuer.clock.advance(0.5)
    assert rescuer.run_once() == Recovered()
    rescuer.clock.advance(0.5)
    assert rescuer.run_once() == Recovered(requeued=(job_id,))


@pytest.mark.parametrize("database", ["postgresql", "pgbouncer"], indirect=True)
def test_requests_holding_every_connection_of_theirs_leave_the_runners_leases_renewed(
    hostile, household, latches, database
):
    """A flood of requests used to take every connection of the one pool the
    heartbeats shared: they failed, the watchdog gave the job up and rescues
    failed it. (PostgreSQL only: SQLite's runner writes through the store's
    writer thread, which no request holds.)"""
    lease = 1.0
    jobs = hostile(
        JOB_LEASE_SECONDS=lease,
        JOB_HEARTBEAT_SECONDS=0.2,
        # Below the lease minus a heartbeat, as the configuration requires.
        JOB_BLOCKED_EXIT_SECONDS=0.5,
        PG_POOL_SIZE=2,
        DB_BUSY_TIMEOUT_SECONDS=0.3,
    )
    job_id = enqueue(jobs, "held", household, gate="g")
    jobs.start_pool()
    wait_for(lambda: latches.seen("start", "g"))
    # Watched through a connection of its own, outside both of the process's pools.
    watcher = PostgresStore(
        database["DATABASE_URL"],
        pool_size=1,
        listen=False,
        pooler=database.get("PG_POOLER", "none"),
    )
    requests_store = jobs.store
    released = Event()
    holding: list[int] = []

    def hold(conn: Any) -> None:
        holding.append(1)
        released.wait()

    requests = [gevent.spawn(requests_store.read, hold) for _ in range(2)]
    try:
        wait_for(lambda: len(holding) == 2)
        with pytest.raises(StoreUnavailable):  # a request finds no connection now
            requests_store.read(lambda conn: conn.execute("SELECT 1"))
        started = time.monotonic()
        leases: set[str] = set()

        def renewed_for_two_leases() -> bool:
            leases.add(
                sql.scalar(watcher, "SELECT lease_expires_at FROM jobs WHERE id = ?", (job_id,))
            )
            assert not latches.seen("stopped by LeaseLost", "g")
            return time.monotonic() - started > 2 * lease and len(leases) >= 4

        wait_for(renewed_for_two_leases, timeout=10)
    finally:
        released.set()
        gevent.joinall(requests)
        watcher.close()
    latches.open("g")
    job = wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED and jobs.get(job_id))
    assert (job.attempt, job.interruptions) == (1, 0)
    assert latches.seen("start", "g") == [("start", "g", 1)]


def _returned_and_recording(jobs: JobService, job_id: str) -> Any:
    """The job's entry once its handler returned and its outcome is being written."""
    assert jobs.pool is not None
    for entry in list(jobs.pool.slots.running.values()):
        if entry.job.id == job_id and entry.recording:
            return entry
    return None


def _succeeded_cleanly(jobs: JobService, job_id: str, entry: Any, logs: list) -> None:
    wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED)
    wait_for(lambda: not entry.alive())
    assert entry.greenlet.exception is None
    assert any(
        r.getMessage() == "job succeeded" and getattr(r, "job_id", None) == job_id for r in logs
    )


def _held_in_its_outcome_write(
    hostile, household, latches, lock_holder
) -> tuple[JobService, str, Any]:
    """A job whose handler has returned, its outcome's write held by the
    lock holder: the service, the job's id and its entry."""
    jobs = hostile(DB_BUSY_TIMEOUT_SECONDS=0.1)
    job_id = enqueue(jobs, "held", household, gate="g")
    jobs.start_pool()
    wait_for(lambda: latches.seen("start", "g"))
    lock_holder.hold()
    latches.open("g")
    return jobs, job_id, wait_for(lambda: _returned_and_recording(jobs, job_id))


def test_a_job_taken_while_its_outcome_is_written_keeps_that_outcome(
    hostile, household, latches, lock_holder, logs
):
    # The pool takes an earlier attempt's handler when it claims the job
    # again; one that has returned is only waiting for its outcome's write,
    # which its lease's fence decides.
    jobs, job_id, entry = _held_in_its_outcome_write(hostile, household, latches, lock_holder)
    assert jobs.pool is not None
    jobs.pool.executor.take(entry, "lease lost", LeaseLost)
    gevent.sleep(0)
    assert entry.alive()
    lock_holder.release()
    _succeeded_cleanly(jobs, job_id, entry, logs)
    assert entry.taken is None


@pytest.mark.parametrize("kill", [LeaseLost, PoolStopping, JobCancelled])
def test_a_kill_that_lands_after_the_handler_returned_leaves_its_outcome_to_stand(
    hostile, household, latches, lock_holder, logs, kill
):
    # A cancel's kill or a take, sent while the handler still ran, lands at
    # the greenlet's next switch: if the handler returned first, that is the
    # wait for its outcome's write.
    jobs, job_id, entry = _held_in_its_outcome_write(hostile, household, latches, lock_holder)
    entry.greenlet.kill(kill, block=False)
    gevent.sleep(0)
    assert entry.alive()
    lock_holder.release()
    _succeeded_cleanly(jobs, job_id, entry, logs)


def _sleeping(greenlet: gevent.Greenlet) -> bool:
    """Whether the greenlet is suspended in `gevent.sleep`."""
    frame = greenlet.gr_frame
    while frame is not None:
        if frame.f_code is gevent.sleep.__code__:
            return True
        frame = frame.f_back
    return False


@pytest.mark.parametrize("kill", [LeaseLost, PoolStopping, JobCancelled])
def test_a_kill_that_lands_in_the_outcomes_retry_sleep_leaves_its_outcome_to_stand(
    hostile, household, latches, lock_holder, logs, kill
):
    # The database refused the outcome's write for longer than its deadline,
    # and the finished job waits to try again: a kill sent then lands in
    # that sleep, not in a wait for the write.
    jobs, job_id, entry = _held_in_its_outcome_write(hostile, household, latches, lock_holder)
    wait_for(lambda: _sleeping(entry.greenlet))
    assert any(
        r.getMessage().startswith("database unavailable while recording the job's outcome")
        for r in logs
    )
    entry.greenlet.kill(kill, block=False)
    gevent.sleep(0)
    assert entry.alive()
    lock_holder.release()
    _succeeded_cleanly(jobs, job_id, entry, logs)


# -- interruptions -----------------------------------------------------------------------------


def claim_all(store, owner: str, now) -> list:
    return store.write(
        store.jobs.claim,
        ClaimRequest(
            owner=owner,
            lease_seconds=0,
            now=now,
            limit=10,
            kinds=("held", "held_once", "writes_after_its_gate"),
        ),
    )


def test_an_interrupted_requeue_job_keeps_its_attempt_and_fails_at_the_third_in_a_row(
    hostile, household
):
    jobs = hostile()
    store = jobs.store
    job_id = enqueue(jobs, "held", household, gate="g")
    for interruption in range(1, MAX_INTERRUPTIONS):
        now = utc_now()
        assert [job.attempt for job in claim_all(store, f"dead-{interruption}", now)] == [1]
        later = now + timedelta(seconds=1)
        assert rescue_all(store, later) == Recovered(requeued=(job_id,))
        job = jobs.get(job_id)
        assert (job.status, job.attempt, job.interruptions) == (Status.QUEUED, 0, interruption)
    now = utc_now()
    claim_all(store, "dead-last", now)
    assert rescue_all(store, now + timedelta(seconds=1)) == Recovered(failed=(job_id,))
    job = jobs.get(job_id)
    assert (job.status, job.error, job.attempt, job.interruptions) == (
        Status.FAILED,
        "interrupted by restart",
        1,
        MAX_INTERRUPTIONS,
    )


def test_an_attempt_that_ends_otherwise_resets_the_interruptions_in_a_row(hostile, household):
    jobs = hostile()
    store = jobs.store
    job_id = enqueue(jobs, "held", household, gate="g")
    now = utc_now()
    claim_all(store, "dead", now)
    rescue_all(store, now + timedelta(seconds=1))
    [claimed] = claim_all(store, "live", utc_now())
    assert store.write(store.jobs.transition, Transition(claimed.lease, to=Status.QUEUED))
    job = jobs.get(job_id)
    assert (job.status, job.attempt, job.interruptions) == (Status.QUEUED, 1, 0)


def test_a_kind_of_one_attempt_fails_at_its_first_interruption_unless_it_says_requeue(
    hostile, household
):
    jobs = hostile()
    store = jobs.store
    once = enqueue(jobs, "held_once", household, gate="g")
    assert jobs.get(once).on_interrupt == OnInterrupt.FAIL
    assert jobs.get(enqueue(jobs, "held", household, gate="g")).on_interrupt == OnInterrupt.REQUEUE
    now = utc_now()
    claim_all(store, "dead", now)
    recovered = rescue_all(store, now + timedelta(seconds=1))
    assert once in recovered.failed
    assert KindOptions(on_interrupt=OnInterrupt.REQUEUE).interrupt_policy == OnInterrupt.REQUEUE
    assert (
        KindOptions(max_attempts=5, on_interrupt=OnInterrupt.FAIL).interrupt_policy
        == OnInterrupt.FAIL
    )


def test_a_graceful_stop_refunds_the_attempt_of_a_requeue_kind(hostile, household, latches):
    jobs = hostile()
    job_id = enqueue(jobs, "held", household, gate="g")
    pool = jobs.start_pool()
    wait_for(lambda: latches.seen("start", "g"))
    assert pool.stop(timeout=0.1).requeued == (job_id,)
    job = jobs.get(job_id)
    assert (job.status, job.attempt, job.interruptions) == (Status.QUEUED, 0, 1)


# -- storage faults and results ----------------------------------------------------------------


def test_a_handler_whose_write_meets_an_unavailable_store_keeps_its_attempt(
    hostile, household, latches, lock_holder, logs
):
    jobs = hostile(DB_BUSY_TIMEOUT_SECONDS=0.2)
    job_id = enqueue(jobs, "writes_after_its_gate", household, gate="g")
    jobs.start_pool()
    wait_for(lambda: latches.seen("start", "g"))
    lock_holder.hold()
    latches.open("g")
    wait_for(lambda: any("storage fault" in r.getMessage() for r in logs))
    lock_holder.release()
    job = wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED and jobs.get(job_id))
    assert job.attempt == 1
    assert len(latches.seen("start", "g")) == 2


def test_a_result_that_breaks_its_schema_fails_at_once_without_a_retry(hostile, household, logs):
    jobs = hostile()
    job_id = enqueue(jobs, "bad_result_retried", household)
    jobs.start_pool()
    job = wait_for(lambda: jobs.get(job_id).status == Status.FAILED and jobs.get(job_id))
    assert (job.error, job.attempt, job.max_attempts) == ("internal error", 1, 3)
    assert errors_about(logs, job_id) == [
        "handler's result does not match its schema (ValidationError)"
    ]


@pytest.mark.parametrize("name", sorted(BASE_EXCEPTIONS))
def test_a_handler_raising_a_base_exception_fails_its_job_alone(hostile, household, latches, name):
    # Let through, GreenletExit would end the greenlet quietly and the pool's
    # PoolStopping and LeaseLost, not thrown by the pool, would not be
    # recorded (the job would wait for its lease); the pool's JobCancelled,
    # not thrown by the pool, would record the job cancelled.
    jobs = hostile()
    held = enqueue(jobs, "held", household, gate="other")
    raising = enqueue(jobs, "raises", household, name=name)
    jobs.start_pool()
    job = wait_for(lambda: jobs.get(raising).status == Status.FAILED and jobs.get(raising))
    assert (job.error, job.attempt) == ("internal error", 3)
    assert jobs.get(held).status == Status.RUNNING
    latches.open("other")
    assert wait_for(lambda: jobs.get(held).status == Status.SUCCEEDED)
    assert latches.seen("start", "other") == [("start", "other", 1)]


def test_a_result_nested_too_deep_to_encode_fails_at_once(hostile, household, latches, logs):
    jobs = hostile()
    job_id = enqueue(jobs, "nested_too_deep", household)
    jobs.start_pool()
    job = wait_for(lambda: jobs.get(job_id).status == Status.FAILED and jobs.get(job_id))
    assert (job.error, job.attempt) == ("internal error", 1)
    assert latches.seen("start", "deep") == [("start", "deep", 1)]
    assert errors_about(logs, job_id) == [
        "handler's result does not match its schema (RecursionError)"
    ]


def test_a_stored_payload_whose_schema_raises_fails_at_once(hostile, household, latches, logs):
    jobs = hostile()
    job_id = enqueue(jobs, "payload_breaks", household, gate="never")
    latches.open("payload breaks")
    jobs.start_pool()
    job = wait_for(lambda: jobs.get(job_id).status == Status.FAILED and jobs.get(job_id))
    assert (job.error, job.attempt) == ("internal error", 1)
    assert latches.seen("start", "never") == []
    assert errors_about(logs, job_id) == ["stored payload no longer loads (KeyError)"]


def test_an_error_of_the_runner_around_a_handler_fails_the_job_at_once(hostile, household, logs):
    # Reading the message of a Failure that has none raises in the runner,
    # after the handler: the job is failed there, not left to its lease.
    jobs = hostile()
    job_id = enqueue(jobs, "raises_a_failure_without_message", household)
    jobs.start_pool()
    job = wait_for(lambda: jobs.get(job_id).status == Status.FAILED and jobs.get(job_id))
    assert (job.error, job.attempt) == ("internal error", 1)
    assert errors_about(logs, job_id) == ["running the job failed"]


# -- rows that do not decode ---------------------------------------------------------------------


def test_a_row_that_does_not_decode_fails_alone(hostile, household, client, auth, logs):
    jobs = hostile(JOB_WORKERS=4)
    store = jobs.store
    good = [
        jobs.enqueue("succeed", {"value": n}, household_id=household.household_id) for n in (1, 2)
    ]
    bad_result = jobs.enqueue("succeed", {"value": 3}, household_id=household.household_id)
    bad_payload = jobs.enqueue("succeed", {"value": 4}, household_id=household.household_id)
    sql.execute(store, "UPDATE jobs SET result = '{half' WHERE id = ?", (bad_result,))
    sql.execute(store, "UPDATE jobs SET payload = 'nope' WHERE id = ?", (bad_payload,))
    jobs.start_pool()
    for job_id in good:
        assert wait_for(lambda job_id=job_id: jobs.get(job_id).status == Status.SUCCEEDED)
    for job_id in (bad_result, bad_payload):
        job = wait_for(
            lambda job_id=job_id: jobs.get(job_id).status == Status.FAILED and jobs.get(job_id)
        )
        assert job.error == "internal error"
        assert errors_about(logs, job_id)
    # Read through the API, the undecodable result is null, not a 500.
    answer = client.get(f"/api/v1/jobs/{bad_result}", headers=auth)
    assert answer.status_code == 200
    assert answer.get_json()["result"] is None


@pytest.mark.sqlite_only("legacy data only ever lived in SQLite")
def test_a_legacy_pending_row_whose_result_is_not_json_fails_alone(tmp_path: Path, make_app, logs):
    path = str(tmp_path / "legacy.sqlite3")
    migrate.upgrade(path, target=2)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO households (id, name, created_at) VALUES (1, 'Smiths', 'T')")
    for job_id, result in (("legacy-bad", "<html>not json"), ("legacy-good", None)):
        conn.execute(
            "INSERT INTO jobs (id, household_id, kind, payload, status, result, created_at, "
            "updated_at) VALUES (?, 1, 'succeed', '{\"value\": 7}', 'pending', ?, ?, ?)",
            (job_id, result, "2025-01-01T10:00:00.000000Z", "2025-01-01T10:00:00.000000Z"),
        )
    conn.close()
    migrate.upgrade(path)
    jobs = get_jobs(make_app(DATABASE=path))
    jobs.start_pool()
    good = wait_for(
        lambda: jobs.get("legacy-good").status == Status.SUCCEEDED and jobs.get("legacy-good")
    )
    assert good.result == {"value": 7}
    bad = wait_for(
        lambda: jobs.get("legacy-bad").status == Status.FAILED and jobs.get("legacy-bad")
    )
    assert bad.error == "internal error"
    assert "stored result of the job is not JSON" in errors_about(logs, "legacy-bad")


# -- the hub, and supervision ------------------------------------------------------------------


def test_a_handler_that_blocks_the_hub_is_named_at_error(hostile, household, logs):
    jobs = hostile(JOB_MAX_BLOCKING_SECONDS=0.1)
    job_id = enqueue(jobs, "blocks_the_hub", household)
    jobs.start_pool()
    assert wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED)
    [message] = [m for m in errors_about(logs, job_id) if "blocked the event loop" in m][:1]
    record = next(r for r in logs if r.getMessage() == message)
    assert record.kind == "blocks_the_hub"


def test_reporting_a_blocked_hub_reads_no_thread_stacks(hostile, household, logs, monkeypatch):
    # `sys._current_frames()` can freeze a CPython 3.11 process for good (a
    # garbage collection inside it takes a lock the call holds): one froze
    # this suite's PostgreSQL fuzz test, in the report of a hub it saw blocked.
    reads: list[int] = []
    current_frames = sys._current_frames

    def counted() -> dict[int, Any]:
        reads.append(threading.get_ident())
        return current_frames()

    monkeypatch.setattr(sys, "_current_frames", counted)
    jobs = hostile(JOB_MAX_BLOCKING_SECONDS=0.1)
    job_id = enqueue(jobs, "blocks_the_hub", household)
    jobs.start_pool()
    assert wait_for(lambda: jobs.get(job_id).status == Status.SUCCEEDED)
    assert any("blocked the event loop" in m for m in errors_about(logs, job_id))
    assert reads == []


@pytest.mark.parametrize(
    "role", ["producer", "completer", "heartbeat", "watchdog", "rescuer", "scheduler"]
)
def test_a_role_that_dies_is_logged_and_restarts_the_process(hostile, household, logs, role):
    jobs = hostile(JOB_RETENTION_DAYS=14)  # a periodic kind: the scheduler runs
    fatal: list[str] = []
    pool = jobs.start_pool(on_fatal=fatal.append)
    pool.roles[role].kill(RuntimeError("boom"), block=True)
    wait_for(lambda: fatal)
    assert fatal == [f"the pool's {role} died"]
    assert any(
        r.levelno == logging.ERROR and r.getMessage() == f"the pool's {role} died" for r in logs
    )


@pytest.mark.sqlite_only("the writer thread is SQLite's")
def test_a_store_whose_writer_died_restarts_the_process(hostile, household):
    jobs = hostile()
    fatal: list[str] = []
    jobs.start_pool(on_fatal=fatal.append)

    def die() -> None:
        raise Fatal("writer thread ended")

    jobs.store.write(sabotage_checkpoint, die)
    checkpoint_soon(jobs.store)
    wait_for(lambda: fatal)
    assert fatal == ["the store's writer thread died"]
