"""The PostgreSQL driver's SQL, function by function, against a real server.

Each test gets a fresh migrated database, reached directly and through the
test PgBouncer in transaction mode (the store set for it). Times are the database's: the
tests read its clock (`now()`) and pass `now` only where the function lets a
test stand at another moment (a rescue past a lease, a claim in the future).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.rows import dict_row

from mealquest.clock import to_text
from mealquest.db.postgresql import households, jobs, recipes
from mealquest.db.postgresql.store import PostgresStore, PostgresTransaction
from mealquest.households import SYSTEM_HOUSEHOLD_ID, UnknownHousehold, UnknownToken
from mealquest.model.jobs import (
    MAX_INTERRUPTIONS,
    MESSAGE_INTERRUPTED,
    Attempt,
    Lease,
    OnInterrupt,
    Recovered,
    Status,
)
from mealquest.recipes.parse import ParsedRecipe
from tests.support.postgres import (
    fresh_database,
    require_pgbouncer_url,
    require_postgres_url,
    through_pgbouncer,
)

LEASE = 30.0


@pytest.fixture(params=["postgresql", "pgbouncer"])
def route(request):
    """How the tests reach the server: directly, or through PgBouncer."""
    if request.param == "pgbouncer":
        require_pgbouncer_url()
    return request.param


@pytest.fixture
def pg_url(route):
    with fresh_database(require_postgres_url(), migrated=True) as url:
        yield through_pgbouncer(url) if route == "pgbouncer" else url


@pytest.fixture
def make_store(pg_url, route):
    stores = []

    def make(**options):
        pooler = "transaction" if route == "pgbouncer" else "none"
        options = {"busy_timeout_seconds": 5, "listen": False, "pooler": pooler, **options}
        store = PostgresStore(pg_url, **options)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def store(make_store):
    return make_store(pool_size=4)


@pytest.fixture
def household(store) -> int:
    return store.write(households.create_household, name="Smiths", token_sha256="a" * 64)[0]


def enqueue(store, household, kind="succeed", *, on_interrupt=OnInterrupt.FAIL, max_attempts=1):
    job_id = uuid.uuid4().hex
    store.write(
        jobs.insert_job,
        job_id=job_id,
        household_id=household,
        kind=kind,
        payload="{}",
        max_attempts=max_attempts,
        on_interrupt=on_interrupt,
    )
    return job_id


def claim(store, *, kinds=("succeed",), limit=10, owner="worker-1", now=None):
    return store.write(
        jobs.claim, owner=owner, lease_seconds=LEASE, limit=limit, kinds=kinds, now=now
    )


def db_now(store):
    return store.read(lambda conn: conn.execute("SELECT now() AS now").fetchone()["now"])


def get(store, job_id):
    return store.read(jobs.get_job, job_id)


def set_run_at(store, job_id, seconds_from_now):
    store.write(
        lambda tx: tx.execute(
            "UPDATE jobs SET run_at = now() + make_interval(secs => %s) WHERE id = %s",
            (float(seconds_from_now), job_id),
        )
    )


# -- enqueue and read -------------------------------------------------------------------------


def test_an_inserted_job_is_queued_due_now_with_times_as_fixed_width_utc_text(store, household):
    job_id = enqueue(store, household, max_attempts=3, on_interrupt=OnInterrupt.REQUEUE)

    job = get(store, job_id)
    assert job.status is Status.QUEUED
    assert (job.attempt, job.max_attempts, job.interruptions) == (0, 3, 0)
    assert job.on_interrupt is OnInterrupt.REQUEUE
    assert job.household_id == household
    assert job.run_at == job.created_at == job.updated_at
    assert len(job.created_at) == len("2025-01-01T00:00:00.000000Z")
    assert job.created_at.endswith("Z")
    assert job.started_at is job.finished_at is job.lease_owner is None


def test_get_job_is_scoped_to_the_household(store, household):
    other = store.write(households.create_household, name="Joneses", token_sha256="b" * 64)[0]
    job_id = enqueue(store, household)

    assert store.read(jobs.get_job, job_id, household).id == job_id
    assert store.read(jobs.get_job, job_id, other) is None
    assert store.read(jobs.get_job, "no-such-job") is None


def test_list_jobs_newest_first_filtered_and_paged(store, household):
    other = store.write(households.create_household, name="Joneses", token_sha256="b" * 64)[0]
    first, second, third = (enqueue(store, household) for _ in range(3))
    enqueue(store, other)
    enqueue(store, household, kind="fail_with_failure")
    claim(store, limit=1)  # `first` runs

    mine = store.read(jobs.list_jobs, household_id=household, kind="succeed")
    assert [job.id for job in mine] == [third, second, first]
    page = store.read(jobs.list_jobs, household_id=household, kind="succeed", limit=2)
    rest = store.read(
        jobs.list_jobs, household_id=household, kind="succeed", before_seq=page[-1].seq
    )
    assert [job.id for job in page + rest] == [third, second, first]
    running = store.read(jobs.list_jobs, household_id=household, status=Status.RUNNING)
    assert [job.id for job in running] == [first]
    assert len(store.read(jobs.list_jobs)) == 5


# -- claim ------------------------------------------------------------------------------------


def test_claim_takes_due_jobs_oldest_first_by_run_at_then_insertion(store, household):
    a, b, c, d = (enqueue(store, household) for _ in range(4))
    set_run_at(store, c, -60)  # due earliest
    set_run_at(store, d, 3600)  # not due

    claimed = claim(store, limit=10)

    assert [job.id for job in claimed] == [c, a, b]
    assert all(job.status is Status.RUNNING and job.attempt == 1 for job in claimed)
    assert all(job.lease_owner == "worker-1" for job in claimed)
    assert get(store, d).status is Status.QUEUED


def test_claim_honours_the_limit_and_the_kinds(store, household):
    a, b = enqueue(store, household), enqueue(store, household)
    other = enqueue(store, household, kind="sleep")

    assert [job.id for job in claim(store, limit=1)] == [a]
    assert claim(store, kinds=("nothing-here",)) == []
    assert claim(store, kinds=()) == []
    assert claim(store, limit=0) == []
    assert [job.id for job in claim(store, kinds=("succeed", "sleep"))] == [b, other]


# Directly only: through a transaction pooler no statement is prepared.
@pytest.mark.parametrize("route", ["postgresql"], indirect=True)
def test_the_claim_statement_is_planned_once_per_connection_not_at_every_claim(
    make_store, household
):
    one_connection = make_store(pool_size=1)

    def setting_of(conn):
        return conn.execute("SELECT current_setting('plan_cache_mode') AS mode").fetchone()["mode"]

    try:
        before = one_connection.read(setting_of)
        for _ in range(12):
            enqueue(one_connection, household)
            assert len(claim(one_connection, limit=1)) == 1

        def plans_and_setting(conn):
            plans = conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE '%%household_queues%%'"
            ).fetchall()
            return plans, setting_of(conn)

        plans, setting = one_connection.read(plans_and_setting)
    finally:
        one_connection.close()
    # psycopg prepares a statement after its fifth run: the runs after it reuse one plan.
    assert len(plans) == 1
    assert plans[0]["custom_plans"] == 0
    assert plans[0]["generic_plans"] >= 7
    # Set for the claim's transaction only, not for what the connection runs next.
    assert setting == before != "force_generic_plan"


@pytest.mark.parametrize(
    ("zone", "due"),
    [
        ("America/New_York", datetime(1, 1, 1, 1, tzinfo=UTC)),
        ("Asia/Tokyo", datetime(9999, 12, 31, 22, tzinfo=UTC)),
    ],
)
def test_a_time_at_the_calendars_edge_reads_back_whatever_the_clients_time_zone(
    make_store, household, monkeypatch, zone, due
):
    # In a session of another zone, these would read as a year before 1 or
    # after 9999, which no datetime holds: every read of the job, and every
    # claim that takes it, would fail.
    monkeypatch.setenv("PGTZ", zone)
    zoned = make_store(pool_size=1)
    try:
        job_id = uuid.uuid4().hex
        zoned.write(
            jobs.insert_job,
            job_id=job_id,
            household_id=household,
            kind="succeed",
            payload="{}",
            max_attempts=1,
            on_interrupt=OnInterrupt.FAIL,
            run_at=due,
        )
        assert zoned.read(jobs.get_job, job_id).run_at == to_text(due)
    finally:
        zoned.close()


def test_claim_reads_the_database_clock_for_its_times(store, household):
    enqueue(store, household)

    def claim_and_read_now(tx):
        claimed = jobs.claim(tx, owner="w", lease_seconds=LEASE, limit=1, kinds=["succeed"])
        return claimed, tx.execute("SELECT now() AS now").fetchone()["now"]

    [job], now = store.write(claim_and_read_now)

    # The claim's own transaction time, to the microsecond: no host clock took part.
    assert job.started_at == job.updated_at == to_text(now)
    assert job.lease_expires_at == to_text(now + timedelta(seconds=LEASE))


def test_claim_with_a_moment_in_the_future_takes_jobs_not_yet_due(store, household):
    later = enqueue(store, household)
    set_run_at(store, later, 3600)
    assert claim(store) == []

    [job] = claim(store, now=db_now(store) + timedelta(hours=2))

    assert job.id == later


def test_two_open_claims_of_one_household_never_wait_and_take_disjoint_jobs(
    store, pg_url, household
):
    queued = {enqueue(store, household) for _ in range(4)}
    first = raw_transaction(store, pg_url)
    second = raw_transaction(store, pg_url)
    try:
        mine = jobs.claim(first, owner="a", lease_seconds=LEASE, limit=2, kinds=["succeed"])
        # The household's row is the first claim's until it commits: the
        # second skips the household rather than wait (its statement_timeout
        # would fail it), and takes nothing.
        assert jobs.claim(second, owner="b", lease_seconds=LEASE, limit=10, kinds=["succeed"]) == []
        first.conn.execute("COMMIT")
        theirs = jobs.claim(second, owner="b", lease_seconds=LEASE, limit=10, kinds=["succeed"])
        second.conn.execute("COMMIT")
    finally:
        first.conn.close()
        second.conn.close()

    assert len(mine) == 2
    assert len(theirs) == 2
    assert {job.id for job in mine} | {job.id for job in theirs} == queued
    assert {get(store, job.id).lease_owner for job in mine} == {"a"}
    assert {get(store, job.id).lease_owner for job in theirs} == {"b"}


def test_claims_made_at_once_take_the_next_households_in_turn_not_nothing(store, pg_url, household):
    """Several processes claim at once: each claim skips the households the
    others hold and takes the next ones in turn, so they work side by side."""
    others = [
        store.write(households.create_household, name=name, token_sha256=digest * 64)[0]
        for name, digest in (("Joneses", "b"), ("Lees", "c"))
    ]
    in_turn = [household, *others]
    for owner in in_turn:
        enqueue(store, owner)
        enqueue(store, owner)
    claims = [raw_transaction(store, pg_url) for _ in in_turn]
    try:
        taken = [
            jobs.claim(tx, owner=f"p{n}", lease_seconds=LEASE, limit=1, kinds=["succeed"])
            for n, tx in enumerate(claims)
        ]
        for tx in claims:
            tx.conn.execute("COMMIT")
    finally:
        for tx in claims:
            tx.conn.close()

    assert [[job.household_id for job in batch] for batch in taken] == [[h] for h in in_turn]


def test_a_claim_never_deadlocks_with_a_transaction_holding_a_household_it_wants(
    store, pg_url, household
):
    """A completer's transaction re-queues (or enqueues a follow-up) for one
    household, locking its queue row, then claims; meanwhile another claim
    holds a second household's row. Waiting for each other would deadlock."""
    other = store.write(households.create_household, name="Joneses", token_sha256="b" * 64)[0]
    enqueue(store, household)
    enqueue(store, other)
    completer = raw_transaction(store, pg_url)
    producer = raw_transaction(store, pg_url)
    try:
        # The completer's follow-up for `other` locks that household's row.
        jobs.insert_job(
            completer,
            job_id=uuid.uuid4().hex,
            household_id=other,
            kind="succeed",
            payload="{}",
            max_attempts=1,
            on_interrupt=OnInterrupt.FAIL,
        )
        # The producer's claim takes `household` and skips `other` at once.
        taken = jobs.claim(producer, owner="p", lease_seconds=LEASE, limit=2, kinds=["succeed"])
        # The completer's claim skips `household`, the producer's now, and
        # takes from its own: neither waits, so neither can deadlock.
        its_own = jobs.claim(completer, owner="c", lease_seconds=LEASE, limit=2, kinds=["succeed"])
        producer.conn.execute("COMMIT")
        completer.conn.execute("COMMIT")
    finally:
        completer.conn.close()
        producer.conn.close()

    assert {job.household_id for job in taken} == {household}
    assert {job.household_id for job in its_own} == {other}
    assert len(its_own) == 2


def lock_waits(store) -> int:
    return store.read(
        lambda conn: conn.execute(
            # A row lock's waiter waits on the holder's transaction id, a
            # lock of no database: the claim's own connection is named instead.
            "SELECT count(*) AS n FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid) "
            "WHERE NOT l.granted AND a.datname = current_database()"
        ).fetchone()["n"]
    )


def raw_transaction(store, url):
    # As the store's own transactions are: nothing prepared, settings for the
    # transaction only (the same through PgBouncer as directly).
    conn = psycopg.connect(url, autocommit=True, row_factory=dict_row, prepare_threshold=None)
    conn.execute("BEGIN")
    conn.execute("SET LOCAL statement_timeout = '5s'")
    return PostgresTransaction(conn, store)


# -- fenced writes ----------------------------------------------------------------------------


def claimed_job(store, household, **options):
    job_id = enqueue(store, household, **options)
    [job] = [job for job in claim(store, kinds=("succeed",)) if job.id == job_id]
    return job


def test_publish_and_owns_hold_only_for_the_current_lease(store, household):
    job = claimed_job(store, household)
    stale = [
        Lease(job.id, "someone-else", job.attempt),
        Lease(job.id, job.lease_owner, job.attempt + 1),
    ]

    assert store.write(jobs.publish, job.lease, result='{"step": 1}')
    assert store.write(jobs.owns, job.lease)
    for lease in stale:
        assert not store.write(jobs.publish, lease, result='{"step": "stale"}')
        assert not store.write(jobs.owns, lease)
    assert get(store, job.id).result == {"step": 1}


def test_a_stale_lease_changes_nothing(store, household):
    job = claimed_job(store, household)
    stale = Lease(job.id, "someone-else", job.attempt)
    before = get(store, job.id)

    assert not store.write(jobs.transition, stale, to=Status.SUCCEEDED, result="{}")
    assert not store.write(jobs.transition, stale, to=Status.FAILED, error="boom")
    assert not store.write(jobs.transition, stale, to=Status.QUEUED, attempt=Attempt.REFUND)
    assert store.write(jobs.renew_leases, [stale], lease_seconds=LEASE) == set()
    assert store.write(jobs.interrupt, [stale]) == Recovered()

    assert get(store, job.id) == before


def test_transition_to_succeeded_stores_the_result_and_clears_the_lease(store, household):
    job = claimed_job(store, household)

    assert store.write(jobs.transition, job.lease, to=Status.SUCCEEDED, result='{"ok": true}')

    done = get(store, job.id)
    assert done.status is Status.SUCCEEDED
    assert done.result == {"ok": True}
    assert done.finished_at is not None
    assert done.error is None
    assert done.lease_owner is done.lease_expires_at is None
    # Final: the same lease can write nothing more.
    assert not store.write(jobs.transition, job.lease, to=Status.FAILED, error="late")


def test_transition_to_failed_stores_the_error(store, household):
    job = claimed_job(store, household)

    assert store.write(jobs.transition, job.lease, to=Status.FAILED, error="no recipe found")

    done = get(store, job.id)
    assert (done.status, done.error, done.attempt) == (Status.FAILED, "no recipe found", 1)
    assert done.finished_at is not None


def test_a_retry_spends_the_attempt_and_waits_its_delay(store, household):
    job = claimed_job(store, household, max_attempts=3)
    store.write(jobs.publish, job.lease, result='{"partial": true}')

    assert store.write(jobs.transition, job.lease, to=Status.QUEUED, delay_seconds=600)

    retried = get(store, job.id)
    assert retried.status is Status.QUEUED
    assert retried.attempt == 1
    assert retried.result is None
    assert retried.lease_owner is None
    assert retried.run_at > job.run_at
    assert claim(store) == []
    [again] = claim(store, now=db_now(store) + timedelta(seconds=601))
    assert again.attempt == 2


def test_a_retry_without_delay_keeps_its_place(store, household):
    job = claimed_job(store, household, max_attempts=3)

    assert store.write(jobs.transition, job.lease, to=Status.QUEUED)

    assert get(store, job.id).run_at == job.run_at


def test_a_refund_puts_the_job_back_as_if_it_never_started(store, household):
    job = claimed_job(store, household)

    assert store.write(jobs.transition, job.lease, to=Status.QUEUED, attempt=Attempt.REFUND)

    back = get(store, job.id)
    assert (back.status, back.attempt, back.run_at) == (Status.QUEUED, 0, job.run_at)
    assert [again.attempt for again in claim(store)] == [1]


def test_a_refund_only_goes_back_to_the_queue(store, household):
    job = claimed_job(store, household)
    for status in (Status.SUCCEEDED, Status.FAILED):
        with pytest.raises(ValueError, match="no transition"):
            store.write(jobs.transition, job.lease, to=status, attempt=Attempt.REFUND)
    with pytest.raises(ValueError, match="no transition"):
        store.write(jobs.transition, job.lease, to=Status.RUNNING)
    assert get(store, job.id).status is Status.RUNNING


def test_renew_extends_only_the_leases_still_held(store, household):
    job = claimed_job(store, household)
    other = claimed_job(store, household)
    store.write(jobs.transition, other.lease, to=Status.SUCCEEDED, result="{}")

    renewed = store.write(jobs.renew_leases, [job.lease, other.lease], lease_seconds=600)

    assert renewed == {(job.id, job.attempt)}
    assert get(store, job.id).lease_expires_at > job.lease_expires_at
    assert store.write(jobs.renew_leases, [], lease_seconds=600) == set()


# -- interruptions ----------------------------------------------------------------------------


def test_a_requeue_job_comes_back_refunded_until_its_third_interruption(store, household):
    job_id = enqueue(store, household, max_attempts=2, on_interrupt=OnInterrupt.REQUEUE)
    for interruption in range(1, MAX_INTERRUPTIONS + 1):
        [job] = claim(store)
        assert job.attempt == 1  # every interrupted attempt was refunded
        recovered = store.write(jobs.interrupt, [job.lease])
        after = get(store, job_id)
        assert after.interruptions == interruption
        if interruption < MAX_INTERRUPTIONS:
            assert recovered == Recovered(requeued=(job_id,))
            assert (after.status, after.attempt, after.run_at) == (
                Status.QUEUED,
                0,
                job.run_at,
            )
    assert recovered == Recovered(failed=(job_id,))
    assert (after.status, after.error) == (Status.FAILED, MESSAGE_INTERRUPTED)


def test_an_attempt_that_ends_resets_the_interruptions_in_a_row(store, household):
    job_id = enqueue(store, household, max_attempts=3, on_interrupt=OnInterrupt.REQUEUE)
    [job] = claim(store)
    store.write(jobs.interrupt, [job.lease])
    [job] = claim(store)
    store.write(jobs.transition, job.lease, to=Status.QUEUED)  # a retry, spent

    assert get(store, job_id).interruptions == 0


def test_a_fail_job_fails_at_its_first_interruption(store, household):
    job = claimed_job(store, household, on_interrupt=OnInterrupt.FAIL)
    store.write(jobs.publish, job.lease, result='{"partial": 1}')

    assert store.write(jobs.interrupt, [job.lease]) == Recovered(failed=(job.id,))

    failed = get(store, job.id)
    assert (failed.status, failed.error, failed.attempt) == (
        Status.FAILED,
        MESSAGE_INTERRUPTED,
        1,
    )
    assert failed.result == {"partial": 1}  # what it had published stays


def test_rescue_takes_back_expired_leases_except_those_kept(store, household):
    requeue = claimed_job(store, household, max_attempts=2, on_interrupt=OnInterrupt.REQUEUE)
    fail = claimed_job(store, household, on_interrupt=OnInterrupt.FAIL)
    kept = claimed_job(store, household, on_interrupt=OnInterrupt.FAIL)

    # Leases are still live now: nothing to rescue.
    assert store.write(jobs.rescue_expired) == Recovered()

    past_the_leases = db_now(store) + timedelta(seconds=LEASE + 1)
    recovered = store.write(jobs.rescue_expired, keep=[kept.lease], now=past_the_leases)

    assert recovered == Recovered(requeued=(requeue.id,), failed=(fail.id,))
    assert get(store, requeue.id).status is Status.QUEUED
    assert get(store, fail.id).error == MESSAGE_INTERRUPTED
    assert get(store, kept.id).status is Status.RUNNING
    # The kept job's lease is another attempt's once it is re-claimed: keep
    # fences on the attempt too.
    stale_keep = Lease(kept.id, kept.lease_owner, kept.attempt + 1)
    assert store.write(jobs.rescue_expired, keep=[stale_keep], now=past_the_leases) == Recovered(
        failed=(kept.id,)
    )


# -- polling reads ----------------------------------------------------------------------------


def test_has_due_job_sees_only_due_queued_jobs_of_the_kinds(store, household):
    assert not store.read(jobs.has_due_job, ["succeed"])
    job_id = enqueue(store, household)
    set_run_at(store, job_id, 3600)
    assert not store.read(jobs.has_due_job, ["succeed"])
    set_run_at(store, job_id, -1)
    assert store.read(jobs.has_due_job, ["succeed"])
    assert not store.read(jobs.has_due_job, ["sleep"])
    assert not store.read(jobs.has_due_job, [])


def test_queued_of_other_kinds_counts_what_this_process_cannot_run(store, household):
    enqueue(store, household, kind="new_kind")
    enqueue(store, household, kind="new_kind")
    enqueue(store, household, kind="another")
    enqueue(store, household)

    assert store.read(jobs.queued_of_other_kinds, ["succeed"]) == {"another": 1, "new_kind": 2}
    assert store.read(jobs.queued_of_other_kinds, []) == {
        "another": 1,
        "new_kind": 2,
        "succeed": 1,
    }


# -- households -------------------------------------------------------------------------------


def test_households_and_their_live_tokens(store):
    smiths, first_token = store.write(
        households.create_household, name="Smiths", token_sha256="a" * 64
    )
    second_token = store.write(households.insert_token, household_id=smiths, token_sha256="b" * 64)
    joneses, _ = store.write(households.create_household, name="Joneses", token_sha256="c" * 64)

    store.write(households.revoke_token, first_token)

    listed = store.read(households.list_households)
    assert [(h.id, h.name, tokens) for h, tokens in listed] == [
        (SYSTEM_HOUSEHOLD_ID, "system", 0),  # the migrations' own
        (smiths, "Smiths", 1),
        (joneses, "Joneses", 1),
    ]
    assert store.read(households.household_for_token_digest, "a" * 64) is None
    assert store.read(households.household_for_token_digest, "b" * 64).id == smiths
    assert second_token != first_token
    with pytest.raises(UnknownToken):
        store.write(households.revoke_token, first_token)


def test_a_token_for_an_unknown_household_is_refused_leaving_the_transaction_usable(store):
    def attempt(tx):
        with pytest.raises(UnknownHousehold):
            households.insert_token(tx, household_id=999, token_sha256="d" * 64)
        return households.insert_household(tx, name="Still fine")

    store.write(attempt)

    assert [h.name for h, _ in store.read(households.list_households)] == ["system", "Still fine"]


# -- recipes ----------------------------------------------------------------------------------


def parsed(title="Soup"):
    return ParsedRecipe(
        title=title,
        ingredients=["water", "salt"],
        instructions=["boil"],
        yields="2 servings",
        total_time_minutes=10,
        image_url=None,
        author=None,
    )


def test_a_recipe_is_upserted_per_job(store, household):
    job_id = enqueue(store, household, kind="recipe_import")
    first = store.write(
        recipes.upsert_for_job,
        household_id=household,
        job_id=job_id,
        source_url="https://example.test/soup",
        parsed=parsed(),
    )
    again = store.write(
        recipes.upsert_for_job,
        household_id=household,
        job_id=job_id,
        source_url="https://example.test/soup",
        parsed=parsed("Better soup"),
    )

    assert again.id == first.id
    assert again.seq == first.seq
    assert again.title == "Better soup"
    assert again.ingredients == ["water", "salt"]
    assert store.read(recipes.get_recipe, first.id, household) == again


def test_recipes_are_scoped_to_the_household_and_listed_newest_first(store, household):
    other = store.write(households.create_household, name="Joneses", token_sha256="b" * 64)[0]
    made = [
        store.write(
            recipes.upsert_for_job,
            household_id=household,
            job_id=enqueue(store, household, kind="recipe_import"),
            source_url="https://example.test/",
            parsed=parsed(f"Dish {index}"),
        )
        for index in range(3)
    ]

    assert store.read(recipes.get_recipe, made[0].id, other) is None
    page = store.read(recipes.list_recipes, household_id=household, before_seq=None, limit=2)
    rest = store.read(
        recipes.list_recipes, household_id=household, before_seq=page[-1].seq, limit=2
    )
    assert [r.title for r in page + rest] == ["Dish 2", "Dish 1", "Dish 0"]
    assert store.read(recipes.list_recipes, household_id=other, before_seq=None, limit=5) == []


def test_the_schema_refuses_a_recipe_list_that_is_not_a_json_array(store, household):
    def insert(tx, ingredients):
        tx.execute(
            "INSERT INTO recipes (id, household_id, title, ingredients, instructions, "
            "source_url, created_at, updated_at) "
            "VALUES (%s, %s, 't', %s, '[]', 'https://x.test', now(), now())",
            (uuid.uuid4().hex, household, ingredients),
        )

    for bad in ('{"a": 1}', "not json"):
        with pytest.raises(psycopg.DataError if bad == "not json" else psycopg.IntegrityError):
            store.write(insert, bad)
    store.write(insert, json.dumps(["ok"]))
