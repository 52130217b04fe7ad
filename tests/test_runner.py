"""The runner's behaviour on a real database and a real pool."""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from datetime import datetime, timedelta

import gevent
import psycopg
import pytest
from marshmallow import Schema, ValidationError, fields, post_load

from mealquest.clock import to_text, utc_now
from mealquest.db.errors import StoreUnavailable
from mealquest.db.postgresql.claim import _CAP_LOCK_CLASS as _CAP_LOCK
from mealquest.extensions import get_store
from mealquest.jobs import enqueueing
from mealquest.jobs.errors import PoolAlreadyStarted, RegistrationError, UnknownKind
from mealquest.jobs.registry import KindOptions, Registry
from mealquest.jobs.runner.pool import Pool
from mealquest.jobs.runner.settings import PoolSettings
from mealquest.jobs.service import get_jobs
from mealquest.masking import MAX_FAILURE_MESSAGE
from mealquest.model.jobs import (
    Attempt,
    ClaimRequest,
    Lease,
    NewJob,
    OnInterrupt,
    Recovered,
    Status,
    Transition,
)
from tests.conftest import wait_for
from tests.support import sql
from tests.support.kinds import SECRET, EmptySchema, MessageSchema, ValueSchema, succeed
from tests.support.rescue import rescue_all, watched_rescuer

# Also through PgBouncer in transaction mode (see tests/conftest.py).
pytestmark = [pytest.mark.both_databases, pytest.mark.through_pgbouncer]

TEST_KINDS = ("succeed", "flaky", "sleep", "sleep_retried", "publish_then_finish")


def claim(store, *, owner: str, limit: int, lease_seconds: float = 30.0, now=None):
    """A claim as another process with the test kinds would make it (at `now`)."""
    return store.write(
        store.jobs.claim,
        ClaimRequest(
            owner=owner, lease_seconds=lease_seconds, limit=limit, kinds=TEST_KINDS, now=now
        ),
    )


def final(jobs, job_id: str):
    job = jobs.get(job_id)
    return job if job.status in (Status.SUCCEEDED, Status.FAILED) else None


def raw_row(store, job_id: str) -> dict:
    [row] = sql.rows(store, "SELECT * FROM jobs WHERE id = ?", (job_id,))
    return row


@pytest.fixture
def mealquest_logs() -> Iterator[list[logging.LogRecord]]:
    """Every record the service logs (its logger does not propagate to the root)."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect(level=logging.DEBUG)
    logger = logging.getLogger("mealquest")
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def test_jobs_run_oldest_first(make_app, household):

    app = make_app(JOB_WORKERS=1)
    jobs = get_jobs(app)
    ids = [
        jobs.enqueue("succeed", {"value": i}, household_id=household.household_id)
        for i in range(20)
    ]
    jobs.start_pool()
    wait_for(lambda: all(final(jobs, i) for i in ids))
    finished = [jobs.get(i) for i in ids]
    assert [job.result for job in finished] == [{"value": i} for i in range(20)]
    started = [job.started_at for job in finished]
    assert started == sorted(started)


def test_a_finished_jobs_objects_are_freed_as_it_ends_not_by_the_cyclic_collector(jobs, household):
    # A drain makes a job's objects (its context, its entry in the slots,
    # its greenlet and what they hold) by the thousand: in a cycle, they
    # waited for a pass of the cyclic collector, about 10 ms every few
    # hundred jobs.
    contexts: list[weakref.ref] = []

    def remember(payload, ctx):
        contexts.append(weakref.ref(ctx))
        return payload

    jobs.registry.register("remembered", remember, payload=EmptySchema, result=EmptySchema)
    job_id = jobs.enqueue("remembered", {}, household_id=household.household_id)
    gc.collect()
    gc.disable()
    try:
        jobs.start_pool()
        wait_for(lambda: final(jobs, job_id))
        # Its greenlet is dead once its slot is free again.
        wait_for(lambda: jobs.pool is not None and not jobs.pool.slots.running)
        [context] = contexts
        assert context() is None
    finally:
        gc.enable()


def test_enqueue_wakes_an_idle_pool_before_the_poll(make_app, household):

    # A poll far beyond the test's deadline: only the wake can start the job in time.
    app = make_app(JOB_POLL_SECONDS=60.0, JOB_CHANGE_CHECK_SECONDS=60.0)
    jobs = get_jobs(app)
    jobs.start_pool()
    gevent.sleep(0)  # let the dispatcher go idle
    job_id = jobs.enqueue("succeed", {"value": 7}, household_id=household.household_id)
    assert wait_for(lambda: final(jobs, job_id), timeout=5).result == {"value": 7}


def idle_pool(jobs, household):
    """Start the pool and wait until its producer is idle: it made its first
    claim (a job it ran proves it) and no claim is in flight."""
    pool = jobs.start_pool()
    warm_up = jobs.enqueue("succeed", {"value": 0}, household_id=household.household_id)
    wait_for(lambda: final(jobs, warm_up))
    wait_for(
        lambda: pool.slots.free() == jobs.settings.workers and not pool.slots.claims_in_flight()
    )
    return pool


@pytest.mark.sqlite_only("the writer thread's group commit makes the outcome unknown at will")
def test_a_claim_whose_answer_is_lost_puts_its_jobs_back_at_once(make_app, household, logs):
    # A write's caller gives up at its deadline plus a margin, and the write
    # may still commit: here the claim shares a transaction with a write
    # queued behind it that holds the writer thread past the claim's answer.
    # Its job must go back at once, not run nowhere until its lease expires
    # (a lease far beyond the test's deadline).
    app = make_app(
        JOB_WORKERS=1,
        JOB_POLL_SECONDS=60.0,
        JOB_CHANGE_CHECK_SECONDS=60.0,
        JOB_LEASE_SECONDS=600.0,
    )
    jobs, store = get_jobs(app), get_store(app)
    pool = idle_pool(jobs, household)
    holding, release_holder = threading.Event(), threading.Event()
    slow_started, release_slow = threading.Event(), threading.Event()

    def hold(tx):
        holding.set()
        release_holder.wait(30)  # natively, in the writer thread

    def slow(tx):
        slow_started.set()
        release_slow.wait(30)

    # Queued without waking the pool: only the test's wake below claims it.
    job = enqueueing.prepare(
        jobs.registry, "succeed", {"value": 8}, household_id=household.household_id
    )
    store.write(store.jobs.insert_job, job)
    holder = gevent.spawn(store.write, hold)
    wait_for(holding.is_set)
    pool.wake()
    wait_for(pool.slots.claims_in_flight)  # the claim is queued behind the holder
    behind = gevent.spawn(store.write, slow)  # and this behind the claim, in its group
    gevent.sleep(0)
    release_holder.set()
    holder.get(timeout=10)
    wait_for(slow_started.is_set)
    # The claim ran and waits for its group's COMMIT; its caller gives up.
    wait_for(lambda: not pool.slots.claims_in_flight(), timeout=30)
    release_slow.set()
    with pytest.raises(StoreUnavailable):
        behind.get(timeout=10)  # past its own deadline: rolled back alone

    done = wait_for(lambda: final(jobs, job.job_id), timeout=20)
    assert (done.status, done.attempt) == (Status.SUCCEEDED, 1)
    assert any(
        "put back 1 jobs of a claim whose answer was lost" in r.getMessage() for r in logs.records
    )


def test_an_enqueue_in_the_callers_transaction_is_claimed_after_its_commit(
    make_app, household, gates
):
    app = make_app(JOB_POLL_SECONDS=60.0, JOB_CHANGE_CHECK_SECONDS=60.0)
    jobs, store = get_jobs(app), get_store(app)
    pool = idle_pool(jobs, household)

    def with_own_writes(tx):
        return jobs.enqueue("succeed", {"value": 5}, household_id=household.household_id, tx=tx)

    job_id = store.write(with_own_writes)

    assert not pool.slots.claims_in_flight()
    assert wait_for(lambda: final(jobs, job_id), timeout=5).result == {"value": 5}


def _terminate_the_claim_waiting_for(url: str, terminated: list[int]) -> None:
    """Terminate the backend that waits for an advisory lock (a claim), once
    one does. A native thread: in this process the claim's wait holds the hub.

    Never prepared: psycopg prepares a query from its sixth run, and through
    PgBouncer's transaction pooling the next run may reach a server
    connection that never saw it ("prepared statement does not exist")."""
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as admin:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            row = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event = 'advisory' AND pid <> pg_backend_pid()"
            ).fetchone()
            if row is not None:
                admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
                terminated.append(row[0])
                return
            time.sleep(0.01)


def test_a_claim_whose_connection_was_terminated_claims_again_at_the_next_commit(
    make_app, database, household
):
    # The chaos harness's stall: a claim whose backend was killed waited out
    # the whole poll interval, so another process's jobs started only then.
    # Here the poll is far beyond the test's deadline: only the next commit
    # another process makes can start the jobs in time.
    if "DATABASE_URL" not in database:
        pytest.skip("an SQLite connection is not the server's to terminate")
    app = make_app(JOB_WORKERS=2, JOB_POLL_SECONDS=600.0)
    jobs, store = get_jobs(app), get_store(app)
    pool = idle_pool(jobs, household)
    url = database["DATABASE_URL"]
    terminated: list[int] = []
    with psycopg.connect(url) as holder:
        # A claim takes this lock when a registered kind has a deployment cap
        # (`capped_deployment`): held here, it holds the claim in flight.
        holder.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext('capped_deployment'))", (_CAP_LOCK,)
        )
        terminator = threading.Thread(
            target=_terminate_the_claim_waiting_for, args=(url, terminated)
        )
        terminator.start()
        # Committed as another process would, without waking the pool: its
        # listener (or, through PgBouncer, its poll for changes) starts the claim.
        first = enqueueing.prepare(
            jobs.registry, "succeed", {"value": 1}, household_id=household.household_id
        )
        store.write(store.jobs.insert_job, first)
        wait_for(lambda: terminated)
        terminator.join()
        wait_for(lambda: not pool.slots.claims_in_flight())
        holder.rollback()

    second = enqueueing.prepare(
        jobs.registry, "succeed", {"value": 2}, household_id=household.household_id
    )
    store.write(store.jobs.insert_job, second)
    for job in (first, second):
        done = wait_for(lambda job=job: final(jobs, job.job_id), timeout=30)
        assert (done.status, done.attempt) == (Status.SUCCEEDED, 1)


def test_partial_results_are_visible_while_running_then_the_final_one(jobs, household):
    job_id = jobs.enqueue(
        "publish_then_finish", {"steps": 3, "pause": 0.2}, household_id=household.household_id
    )
    jobs.start_pool()
    seen = wait_for(lambda: jobs.get(job_id).result)
    assert jobs.get(job_id).status == Status.RUNNING
    assert seen == {"step": 1, "done": False}
    done = wait_for(lambda: final(jobs, job_id))
    assert done.status == Status.SUCCEEDED
    assert done.result == {"step": 3, "done": True}


def test_failure_message_is_stored(jobs, household):
    job_id = jobs.enqueue(
        "fail_with_failure",
        {"message": "the page has no recipe"},
        household_id=household.household_id,
    )
    jobs.start_pool()
    job = wait_for(lambda: final(jobs, job_id))
    assert job.status == Status.FAILED
    assert job.error == "the page has no recipe"
    assert job.result is None


def test_a_failure_message_neither_database_can_store_is_stored_replaced(jobs, household):
    # NUL (PostgreSQL's text refuses it) and lone surrogates (not UTF-8): the
    # attempt's outcome is still written, with U+FFFD in their place, rather
    # than failing its write and leaving the job to its lease's expiry.
    messages = {"nul\x00in the middle": "nul\ufffdin the middle", "\udcff\x00": "\ufffd\ufffd"}
    ids = {
        jobs.enqueue(
            "fail_with_failure", {"message": message}, household_id=household.household_id
        ): stored
        for message, stored in messages.items()
    }
    plain = jobs.enqueue(
        "fail_with_failure", {"message": "é ✓ 😀"}, household_id=household.household_id
    )
    jobs.start_pool()
    for job_id, stored in ids.items():
        job = wait_for(lambda job_id=job_id: final(jobs, job_id))
        assert (job.status, job.error, job.attempt) == (Status.FAILED, stored, 1)
    assert wait_for(lambda: final(jobs, plain)).error == "é ✓ 😀"


def test_a_long_failure_message_is_stored_cut_to_its_first_characters(jobs, household):
    longest = MAX_FAILURE_MESSAGE
    # A URL the cut would go through is left out whole: where jobs are shown,
    # a URL's credentials are masked only when the URL is whole.
    before_url = "c" * (longest - 20) + " see "
    messages = {
        "a" * longest: "a" * longest,
        "b" * (longest + 1): "b" * (longest - 1) + "…",
        before_url + "https://bob:hunter2@example.com/page " + "d" * 50: before_url + "…",
    }
    ids = {
        jobs.enqueue(
            "fail_with_failure", {"message": message}, household_id=household.household_id
        ): stored
        for message, stored in messages.items()
    }
    jobs.start_pool()
    for job_id, stored in ids.items():
        job = wait_for(lambda job_id=job_id: final(jobs, job_id))
        assert (job.status, job.error) == (Status.FAILED, stored)


def test_a_failure_whose_message_is_not_text_fails_as_internal_error(
    jobs, household, mealquest_logs
):
    job_id = jobs.enqueue("fail_with_number", {"value": 7}, household_id=household.household_id)
    jobs.start_pool()
    job = wait_for(lambda: final(jobs, job_id))
    assert (job.status, job.error, job.attempt) == (Status.FAILED, "internal error", 1)
    assert [
        (record.levelno, record.getMessage())
        for record in mealquest_logs
        if getattr(record, "job_id", None) == job_id and record.levelno >= logging.ERROR
    ] == [(logging.ERROR, "handler's Failure message is not text (int)")]


def test_other_errors_are_stored_as_internal_error_and_the_secret_stays_out(
    jobs, store, client, auth, household, mealquest_logs
):
    job_id = jobs.enqueue(
        "raise_secret_error", {"secret": SECRET}, household_id=household.household_id
    )
    jobs.start_pool()
    job = wait_for(lambda: final(jobs, job_id))
    assert job.error == "internal error"
    row = raw_row(store, job_id)
    assert SECRET not in json.dumps({k: v for k, v in row.items() if k != "payload"}, default=str)
    answer = client.get(f"/api/v1/jobs/{job_id}", headers=auth)
    assert {key: answer.json[key] for key in ("id", "kind", "status", "result", "error")} == {
        "id": job_id,
        "kind": "raise_secret_error",
        "status": "failed",
        "result": None,
        "error": "internal error",
    }
    assert SECRET not in answer.get_data(as_text=True)
    below_error = [r for r in mealquest_logs if r.levelno < logging.ERROR]
    assert below_error
    for record in below_error:
        assert SECRET not in record.getMessage()
        assert record.exc_info is None
    errors = [r for r in mealquest_logs if r.levelno >= logging.ERROR]
    assert [(r.job_id, r.kind) for r in errors] == [(job_id, "raise_secret_error")]


def test_a_retried_error_logs_no_secret_below_error(jobs, household, mealquest_logs):
    job_id = jobs.enqueue("flaky", {"fail_times": 2}, household_id=household.household_id)
    jobs.start_pool()
    job = wait_for(lambda: final(jobs, job_id))
    assert job.status == Status.SUCCEEDED
    assert job.result == {"attempt": 3}
    assert job.attempt == 3
    for record in mealquest_logs:
        assert SECRET not in record.getMessage()
        assert record.exc_info is None


def test_a_kind_this_process_has_no_handler_for_stays_queued_and_is_reported(
    make_app, store, household, mealquest_logs
):
    job_id = "f" * 32

    def insert(tx):
        store.jobs.insert_job(
            tx,
            NewJob(
                job_id=job_id,
                household_id=household.household_id,
                kind="newer_kind",
                payload="{}",
                max_attempts=1,
                on_interrupt=OnInterrupt.FAIL,
            ),
        )

    store.write(insert)
    jobs = get_jobs(make_app(JOB_UNHANDLED_REPORT_SECONDS=0.1))
    later = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    jobs.start_pool()
    # Older than any other job, yet the pool runs the next one and leaves it queued.
    assert wait_for(lambda: final(jobs, later)).status == Status.SUCCEEDED
    wait_for(
        lambda: any(
            "1 queued jobs wait for kinds no handler here runs: newer_kind (1)" in r.getMessage()
            for r in mealquest_logs
        )
    )
    job = jobs.get(job_id)
    assert (job.status, job.attempt, job.error) == (Status.QUEUED, 0, None)


def test_a_payload_that_no_longer_loads_is_an_internal_error(jobs, store, household):
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    sql.execute(
        store, "UPDATE jobs SET payload = ? WHERE id = ?", ('{"value": 1, "renamed": true}', job_id)
    )
    jobs.start_pool()
    job = wait_for(lambda: final(jobs, job_id))
    assert (job.status, job.error) == (Status.FAILED, "internal error")


def test_a_result_that_breaks_its_schema_is_an_internal_error(jobs, household):
    job_id = jobs.enqueue("bad_result", {}, household_id=household.household_id)
    jobs.start_pool()
    job = wait_for(lambda: final(jobs, job_id))
    assert (job.status, job.error, job.result) == (Status.FAILED, "internal error", None)


def test_enqueue_validates_the_payload_and_stores_nothing_when_bad(jobs, store, household):
    with pytest.raises(ValidationError) as caught:
        jobs.enqueue("succeed", {"value": "5", "extra": 1}, household_id=household.household_id)
    assert set(caught.value.messages) == {"value", "extra"}
    with pytest.raises(UnknownKind):
        jobs.enqueue("no_such_kind", {}, household_id=household.household_id)
    assert sql.scalar(store, "SELECT count(*) FROM jobs") == 0


def test_enqueue_joins_the_callers_transaction(jobs, store, household):
    class Boom(Exception):
        pass

    rename = sql.dialect(store, "UPDATE households SET name = 'renamed' WHERE id = ?")

    def domain_write_then_fail(tx):
        tx.execute(rename, (household.household_id,))
        jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id, tx=tx)
        raise Boom

    with pytest.raises(Boom):
        store.write(domain_write_then_fail)
    counts = (
        sql.scalar(store, "SELECT count(*) FROM jobs"),
        sql.scalar(store, "SELECT name FROM households WHERE id <> 0"),
    )
    assert counts == (0, "The Smiths")

    def domain_write_and_enqueue(tx):
        tx.execute(rename, (household.household_id,))
        return jobs.enqueue("succeed", {"value": 2}, household_id=household.household_id, tx=tx)

    job_id = store.write(domain_write_and_enqueue)
    jobs.start_pool()
    assert wait_for(lambda: final(jobs, job_id)).result == {"value": 2}


def test_a_kind_of_empty_schemas_is_as_strict_without_marshmallow_as_with_it():
    # Empty payloads and results skip marshmallow; anything else still meets it.
    class Empty(Schema):
        pass

    class Hooked(Schema):
        @post_load
        def refuse(self, data, **kwargs):
            raise ValidationError("no")

    registry = Registry()
    registry.register("empty", succeed, payload=Empty, result=Empty)
    registry.register("hooked", succeed, payload=Hooked, result=Hooked)
    empty, hooked = registry.get("empty"), registry.get("hooked")
    assert empty.canonical_payload({}) == "{}"
    assert empty.load_payload("{}") == {}
    assert empty.encode_result({}) == "{}"
    for bad in ({"x": 1}, {"": None}):
        with pytest.raises(ValidationError):
            empty.canonical_payload(bad)
        with pytest.raises(ValidationError):
            empty.encode_result(bad)
        with pytest.raises(ValidationError):
            empty.load_payload(json.dumps(bad))
    # A schema with a hook has no fields either, but is not empty.
    with pytest.raises(ValidationError):
        hooked.canonical_payload({})
    with pytest.raises(ValidationError):
        hooked.encode_result({})


def test_register_is_refused_twice_empty_or_after_start(jobs):
    with pytest.raises(RegistrationError):
        jobs.registry.register("succeed", succeed, payload=ValueSchema, result=ValueSchema)
    with pytest.raises(RegistrationError):
        jobs.registry.register("", succeed, payload=ValueSchema, result=ValueSchema)
    jobs.start_pool()
    with pytest.raises(RegistrationError):
        jobs.registry.register("late", succeed, payload=ValueSchema, result=ValueSchema)
    with pytest.raises(PoolAlreadyStarted):
        jobs.start_pool()


def test_register_refuses_schemas_that_accept_unknown_fields():
    class Lenient(Schema):
        class Meta:
            unknown = "include"

        value = fields.Integer()

    with pytest.raises(RegistrationError):
        Registry().register("lenient", succeed, payload=Lenient, result=ValueSchema)
    with pytest.raises(RegistrationError):
        KindOptions(max_attempts=0)


def test_timeout_fails_the_job(jobs, household):
    job_id = jobs.enqueue("hang", {"seconds": 30}, household_id=household.household_id)
    jobs.start_pool()
    job = wait_for(lambda: final(jobs, job_id))
    assert (job.status, job.error, job.attempt) == (Status.FAILED, "timed out", 1)


def test_timeout_with_attempts_left_is_retried_then_fails(jobs, household):
    job_id = jobs.enqueue("hang_retried", {"seconds": 30}, household_id=household.household_id)
    jobs.start_pool()
    job = wait_for(lambda: final(jobs, job_id))
    assert (job.status, job.error, job.attempt) == (Status.FAILED, "timed out", 2)


def test_attempts_exhausted_fails_with_internal_error(jobs, household):
    job_id = jobs.enqueue("flaky", {"fail_times": 5}, household_id=household.household_id)
    jobs.start_pool()
    job = wait_for(lambda: final(jobs, job_id))
    assert (job.status, job.error, job.attempt, job.max_attempts) == (
        Status.FAILED,
        "internal error",
        3,
        3,
    )


def test_a_retry_waits_for_its_backoff(jobs, store, household):
    job_id = jobs.enqueue("flaky", {"fail_times": 1}, household_id=household.household_id)
    lease = Lease(job_id, "test-owner", 1)
    now = utc_now()

    claimed = claim(store, owner="test-owner", limit=10)
    assert [job.id for job in claimed] == [job_id]
    assert store.write(
        store.jobs.transition, Transition(lease, to=Status.QUEUED, delay_seconds=3600)
    )
    job = jobs.get(job_id)
    assert (job.status, job.result, job.lease_owner) == (Status.QUEUED, None, None)
    assert (
        to_text(now + timedelta(minutes=59))
        < job.run_at
        < to_text(utc_now() + timedelta(hours=1, seconds=1))
    )
    # Not due: a claim now takes nothing; a claim after run_at takes it.
    assert claim(store, owner="o", limit=5) == []
    later = now + timedelta(hours=2)
    assert [j.attempt for j in claim(store, owner="o", limit=5, now=later)] == [2]


def test_stop_waits_for_running_jobs_that_finish_in_time(jobs, household, gates):
    job_id = jobs.enqueue(
        "wait_for_gate", {"url": gates.url("g")}, household_id=household.household_id
    )
    pool = jobs.start_pool()
    wait_for(lambda: gates.arrivals("g") == 1)
    stopping = gevent.spawn(pool.stop, 60)
    wait_for(lambda: pool.producer.stopping.is_set())
    gates.open("g")
    report = stopping.get(timeout=60)
    assert (report.finished, report.requeued, report.failed) == (1, (), ())
    assert jobs.get(job_id).status == Status.SUCCEEDED


def test_stop_records_handlers_that_do_not_finish_in_time(jobs, household):
    once = jobs.enqueue("sleep", {"seconds": 60}, household_id=household.household_id)
    retried = jobs.enqueue("sleep_retried", {"seconds": 60}, household_id=household.household_id)
    pool = jobs.start_pool()
    wait_for(lambda: {jobs.get(once).status, jobs.get(retried).status} == {Status.RUNNING})
    report = pool.stop(timeout=0.1)
    assert report.finished == 0
    assert report.failed == (once,)
    assert report.requeued == (retried,)
    stopped = jobs.get(once)
    assert (stopped.status, stopped.error, stopped.lease_owner) == (
        Status.FAILED,
        "interrupted by restart",
        None,
    )
    # A kind of several attempts is re-queued with its attempt refunded: a
    # stop is not the job's failure.
    requeued = jobs.get(retried)
    assert (requeued.status, requeued.attempt, requeued.interruptions, requeued.lease_owner) == (
        Status.QUEUED,
        0,
        1,
        None,
    )
    # Nothing claims after stop.
    jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    gevent.sleep(0.2)
    assert jobs.list_jobs(status=Status.RUNNING) == []


def test_rescuer_requeues_or_fails_expired_leases_and_the_old_worker_cannot_write(
    jobs, store, household, caplog
):
    """The crash test: claim, never finish, rescue with a `now` past the lease."""

    once = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    retried = jobs.enqueue("flaky", {"fail_times": 0}, household_id=household.household_id)
    now = utc_now()
    claimed = claim(store, owner="dead-worker", limit=10, now=now)
    assert {job.id for job in claimed} == {once, retried}
    rescuer = watched_rescuer(store, lease_seconds=30.0)
    assert rescuer.run_once(now + timedelta(seconds=31)) == Recovered()  # not watched yet
    rescuer.clock.advance(30.0)
    assert rescuer.run_once(now + timedelta(seconds=29)) == Recovered()  # not expired yet
    with caplog.at_level(logging.INFO, logger="mealquest.jobs.runner.rescuer"):
        recovered = rescuer.run_once(now + timedelta(seconds=31))
    assert recovered == Recovered(requeued=(retried,), failed=(once,))
    # Each line names the claim whose lease expired (what explains a run
    # of the job again when that claim's process cannot tell it).
    assert sorted((r.job_id, r.claim) for r in caplog.records) == sorted(
        [(retried, "dead-worker"), (once, "dead-worker")]
    )
    assert (jobs.get(once).status, jobs.get(once).error) == (
        Status.FAILED,
        "interrupted by restart",
    )
    assert (jobs.get(retried).status, jobs.get(retried).attempt) == (Status.QUEUED, 0)
    stale = Lease(once, "dead-worker", 1)
    for to, values in (
        (Status.SUCCEEDED, {"result": "{}"}),
        (Status.FAILED, {"error": "x"}),
        (Status.QUEUED, {}),
    ):
        assert not store.write(store.jobs.transition, Transition(stale, to=to, **values))
    assert not store.write(store.jobs.publish, stale, result="{}")
    assert store.write(store.jobs.renew_leases, [stale], lease_seconds=30) == set()
    assert jobs.get(once).error == "interrupted by restart"


def _row_after(jobs, job_id):
    """What a transition leaves of a job, without the times that differ per statement."""
    job = jobs.get(job_id)
    return (
        job.status,
        job.result,
        job.error,
        job.attempt,
        job.interruptions,
        job.finished_at is not None,
        job.lease_owner,
        job.lease_expires_at is not None,
    )


def test_a_batch_of_transitions_ends_each_job_as_its_own_transition_does(jobs, store, household):
    """One statement for the completer's batch: every kind of outcome in it,
    a stale lease among them, matches `transition` job by job."""
    changes = [
        {"to": Status.SUCCEEDED, "result": '{"ok": 1}'},
        {"to": Status.FAILED, "error": "no recipe found"},
        {"to": Status.CANCELLED},
        {"to": Status.QUEUED, "delay_seconds": 600},
        {"to": Status.QUEUED},
        {"to": Status.QUEUED, "attempt": Attempt.REFUND},
        {"to": Status.QUEUED, "cancel": True},
        {"to": Status.QUEUED, "attempt": Attempt.REFUND, "cancel": True},
        {"to": Status.SUCCEEDED, "result": "{}", "stale": True},
    ]

    def run(batch: bool) -> list[tuple]:
        for _ in changes:
            jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
        claimed = claim(store, owner="worker-1", limit=len(changes))
        assert len(claimed) == len(changes)
        transitions = []
        for job, change in zip(claimed, changes, strict=True):
            store.write(store.jobs.publish, job.lease, result='{"partial": true}')
            if change.get("cancel"):
                store.write(store.jobs.cancel_job, job.id)
            lease = Lease(job.id, "someone-else", job.attempt) if change.get("stale") else job.lease
            options = {k: v for k, v in change.items() if k not in ("cancel", "stale")}
            transitions.append(Transition(lease, **options))
        if batch:
            matched = store.write(store.jobs.transition_many, transitions)
        else:
            matched = [
                store.write(
                    store.jobs.transition,
                    change,
                )
                for change in transitions
            ]
        assert matched == [not change.get("stale") for change in changes]
        rows = [(_row_after(jobs, job.id), jobs.get(job.id).run_at > job.run_at) for job in claimed]
        store.write(lambda tx: tx.execute("DELETE FROM jobs"))
        return rows

    one_by_one = run(batch=False)
    assert run(batch=True) == one_by_one
    # The retry with a delay moved its time; nothing else did.
    assert [moved for _, moved in one_by_one] == [i == 3 for i in range(len(changes))]
    assert [row[0] for row, _ in one_by_one] == [
        Status.SUCCEEDED,
        Status.FAILED,
        Status.CANCELLED,
        Status.QUEUED,
        Status.QUEUED,
        Status.QUEUED,
        Status.CANCELLED,
        Status.CANCELLED,
        Status.RUNNING,
    ]
    assert store.write(store.jobs.transition_many, []) == []
    with pytest.raises(ValueError, match="no transition"):
        store.write(
            store.jobs.transition_many,
            [Transition(Lease("x", "y", 1), to=Status.SUCCEEDED, attempt=Attempt.REFUND)] * 2,
        )


def test_a_batch_naming_a_job_twice_matches_only_the_lease_it_holds(jobs, store, household):
    """A stale lease of a job beside the job's current lease, in one batch
    with other jobs' outcomes: only the current one is recorded, wherever
    the stale one stands."""
    for order in ("stale first", "stale last"):
        for _ in range(3):
            jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
        twice, *others = claim(store, owner="worker-1", limit=3)
        stale = Transition(Lease(twice.id, "someone-else", twice.attempt), to=Status.SUCCEEDED)
        current = Transition(twice.lease, to=Status.FAILED, error="no recipe found")
        batch = [stale, current] if order == "stale first" else [current, stale]
        batch[1:1] = [Transition(other.lease, to=Status.SUCCEEDED, result="{}") for other in others]
        matched = store.write(store.jobs.transition_many, batch)
        assert matched == [change is not stale for change in batch], order
        assert (jobs.get(twice.id).status, jobs.get(twice.id).error) == (
            Status.FAILED,
            "no recipe found",
        )
        assert [jobs.get(other.id).status for other in others] == [Status.SUCCEEDED] * 2
        store.write(lambda tx: tx.execute("DELETE FROM jobs"))


def test_a_batch_naming_one_lease_twice_records_it_once(jobs, store, household):
    for _ in range(3):
        jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    twice, *others = claim(store, owner="worker-1", limit=3)
    batch = [Transition(twice.lease, to=Status.SUCCEEDED, result="{}")] * 2
    batch += [Transition(other.lease, to=Status.SUCCEEDED, result="{}") for other in others]
    assert store.write(store.jobs.transition_many, batch) == [True, False, True, True]
    assert {jobs.get(job.id).status for job in (twice, *others)} == {Status.SUCCEEDED}


def test_a_batch_larger_than_one_statement_records_every_outcome(jobs, store, household):
    from mealquest.jobs.service import JobRequest

    # With the stale lease, the job named twice goes alone and 1,001 go
    # together: past the rows one SQLite statement takes.
    count = 1_002
    jobs.enqueue_many(
        [JobRequest("succeed", {"value": 1}, household_id=household.household_id)] * count,
        within_quota=False,
    )
    claimed = claim(store, owner="worker-1", limit=count)
    assert len(claimed) == count
    batch = [Transition(job.lease, to=Status.SUCCEEDED, result="{}") for job in claimed]
    stale = Transition(Lease(claimed[-1].id, "someone-else", 1), to=Status.SUCCEEDED)
    assert store.write(store.jobs.transition_many, [*batch, stale]) == [True] * count + [False]
    assert len(jobs.list_jobs(status=Status.SUCCEEDED, limit=count + 1)) == count


@pytest.mark.sqlite_only("PostgreSQL's text holds no NUL at all")
def test_a_batch_stores_any_error_text_as_one_transition_does(jobs, store, household):
    for _ in range(3):
        jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    first, second, third = claim(store, owner="worker-1", limit=3)
    texts = ["nul\x00tail — ✓", "\x00"]
    matched = store.write(
        store.jobs.transition_many,
        [
            Transition(first.lease, to=Status.FAILED, error=texts[0]),
            Transition(second.lease, to=Status.FAILED, error=texts[1]),
        ],
    )
    assert matched == [True, True]
    assert [jobs.get(job.id).error for job in (first, second)] == texts
    # Text that is not Unicode fails the batch as it fails one transition: nothing written.
    for write in (
        lambda tx: store.jobs.transition(
            tx, Transition(third.lease, to=Status.FAILED, error="\udcff")
        ),
        lambda tx: store.jobs.transition_many(
            tx,
            [
                Transition(third.lease, to=Status.FAILED, error="\udcff"),
                Transition(first.lease, to=Status.SUCCEEDED, result="{}"),
            ],
        ),
    ):
        with pytest.raises(UnicodeEncodeError):
            store.write(write)
        assert jobs.get(third.id).status is Status.RUNNING


def test_a_handler_that_lost_its_lease_is_stopped_and_cannot_overwrite(
    jobs, store, household, gates
):
    job_id = jobs.enqueue(
        "wait_for_gate", {"url": gates.url("g")}, household_id=household.household_id
    )
    pool = jobs.start_pool()
    wait_for(lambda: gates.arrivals("g") == 1)
    # Another process's rescuer takes the job back (its view: the lease expired).
    recovered = rescue_all(store, now=utc_now() + timedelta(hours=1))
    assert recovered.failed == (job_id,)
    # The heartbeat finds the lease gone and stops the handler before the gate opens.
    wait_for(lambda: pool.active_jobs() == [])
    gates.open("g")
    job = jobs.get(job_id)
    assert (job.status, job.error, job.result) == (Status.FAILED, "interrupted by restart", None)


def test_heartbeat_renews_leases_of_running_jobs(make_app, household, gates):
    app = make_app(JOB_LEASE_SECONDS=1.0, JOB_HEARTBEAT_SECONDS=0.2, JOB_BLOCKED_EXIT_SECONDS=0.5)
    jobs = get_jobs(app)
    job_id = jobs.enqueue(
        "wait_for_gate", {"url": gates.url("g")}, household_id=household.household_id
    )
    jobs.start_pool()
    wait_for(lambda: gates.arrivals("g") == 1)
    first = datetime.fromisoformat(jobs.get(job_id).lease_expires_at)
    # Another process's rescuer watches it from here, and a whole lease of its
    # clock goes by: renewed meanwhile, the lease is not taken.
    rescuer = watched_rescuer(get_store(app), lease_seconds=1.0)
    assert rescuer.run_once() == Recovered()
    rescuer.clock.advance(1.0)
    # Renewed past the end of its first 1 s lease, and never rescued meanwhile.
    beyond = to_text(first + timedelta(seconds=1))
    wait_for(lambda: jobs.get(job_id).lease_expires_at > beyond)
    assert rescuer.run_once() == Recovered()
    gates.open("g")
    job = wait_for(lambda: final(jobs, job_id))
    assert (job.status, job.attempt) == (Status.SUCCEEDED, 1)


def test_pool_settings_reject_a_heartbeat_slower_than_the_lease():
    with pytest.raises(ValueError, match="heartbeat"):
        PoolSettings(lease_seconds=5, heartbeat_seconds=5)
    with pytest.raises(ValueError, match="worker"):
        PoolSettings(workers=0)


def test_a_pool_never_fails_running_jobs_of_another_live_owner_at_start(jobs, store, household):

    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    claim(store, owner="live-worker", limit=1, lease_seconds=300)
    pool = Pool(store, Registry(), PoolSettings(poll_seconds=0.05))
    pool.start()
    gevent.sleep(0.2)
    pool.stop(timeout=1)
    job = jobs.get(job_id)
    assert (job.status, job.lease_owner) == (Status.RUNNING, "live-worker")


def test_leases_are_renewed_while_stop_waits_for_a_job(make_app, household, gates):
    app = make_app(JOB_LEASE_SECONDS=0.6, JOB_HEARTBEAT_SECONDS=0.1, JOB_BLOCKED_EXIT_SECONDS=0.3)
    jobs, store = get_jobs(app), get_store(app)
    job_id = jobs.enqueue(
        "wait_for_gate", {"url": gates.url("g")}, household_id=household.household_id
    )
    pool = jobs.start_pool()
    wait_for(lambda: gates.arrivals("g") == 1)
    first = datetime.fromisoformat(jobs.get(job_id).lease_expires_at)
    beyond = to_text(first + timedelta(seconds=1.2))
    stopping = gevent.spawn(pool.stop, 60)
    rescuer = watched_rescuer(store, lease_seconds=0.6)

    def renewed_past_two_leases() -> bool:
        # Another process's rescuer keeps looking while the stopping pool
        # waits, a whole lease of its clock between looks.
        assert rescuer.run_once() == Recovered()
        rescuer.clock.advance(0.6)
        return jobs.get(job_id).lease_expires_at > beyond

    wait_for(renewed_past_two_leases, interval=0.05)
    assert not stopping.ready()
    gates.open("g")
    assert stopping.get(timeout=60).finished == 1
    job = jobs.get(job_id)
    assert (job.status, job.attempt) == (Status.SUCCEEDED, 1)


def test_a_finished_job_keeps_its_outcome_through_a_lock_longer_than_the_deadline(
    make_app, lock_holder, household, mealquest_logs, gates
):
    app = make_app(DB_BUSY_TIMEOUT_SECONDS=0.3)
    jobs = get_jobs(app)
    job_id = jobs.enqueue(
        "wait_for_gate", {"url": gates.url("g")}, household_id=household.household_id
    )
    jobs.start_pool()
    wait_for(lambda: gates.arrivals("g") == 1)
    lock_holder.hold()
    gates.open("g")  # the handler returns while the database stays locked
    wait_for(lambda: any("unavailable while recording" in r.getMessage() for r in mealquest_logs))
    lock_holder.release()
    job = wait_for(lambda: final(jobs, job_id))
    assert (job.status, job.attempt, job.error) == (Status.SUCCEEDED, 1, None)


def test_a_rescued_job_keeps_its_place_in_the_queue(jobs, store, household):
    rescued = jobs.enqueue("flaky", {"fail_times": 0}, household_id=household.household_id)
    claim(store, owner="dead", limit=1, lease_seconds=0)
    later = jobs.enqueue("flaky", {"fail_times": 0}, household_id=household.household_id)
    recovered = rescue_all(store, now=utc_now() + timedelta(seconds=1))
    assert recovered.requeued == (rescued,)
    claimed = claim(store, owner="a", limit=1)
    # Its attempt was refunded: the process died, not the job.
    assert [(job.id, job.attempt) for job in claimed] == [(rescued, 1)]
    assert jobs.get(later).status == Status.QUEUED


def test_jobs_claimed_by_a_write_in_flight_when_stop_began_go_back_untouched(
    jobs, store, household
):
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    pool = jobs.start_pool()
    pool.stop(timeout=1)
    # As the completer's claim would, landing after stop began.
    claimed = claim(store, owner=pool.owner, limit=1)
    assert [job.id for job in claimed] == [job_id]
    pool.producer.hand_out(claimed, 0.0)
    job = jobs.get(job_id)
    assert (job.status, job.attempt, job.lease_owner) == (Status.QUEUED, 0, None)
    assert pool.active_jobs() == []


@pytest.mark.parametrize("where", ["final", "partial", "partial_caught"])
def test_a_result_past_its_bound_fails_the_job_as_internal_error(make_app, household, logs, where):
    # A job's result is read by every poll of it and answered in every list:
    # one past 256 KiB of JSON is a handler's bug, never stored.
    app = make_app()
    jobs = get_jobs(app)
    huge = "x" * (257 * 1024)

    def handler(payload, ctx):
        if where == "final":
            return {"message": huge}
        try:
            ctx.publish({"message": huge})
        except Exception:
            if where == "partial":
                raise
        return {"message": "done anyway"}

    jobs.registry.register(
        "huge_result",
        handler,
        payload=EmptySchema,
        result=MessageSchema,
        options=KindOptions(max_attempts=3),
    )
    job_id = jobs.enqueue("huge_result", {}, household_id=household.household_id)
    jobs.start_pool()

    job = wait_for(lambda: final(jobs, job_id))
    assert (job.status, job.error, job.attempt) == (Status.FAILED, "internal error", 1)
    assert job.result is None
    told = [r.getMessage() for r in logs.records if r.levelno == logging.ERROR]
    assert any("past the bound" in line or "too large" in line for line in told), told
