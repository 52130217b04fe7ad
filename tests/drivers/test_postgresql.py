"""What only the PostgreSQL driver's statements must do: plans, time zones,
and claims made at once by several processes that never wait on each other."""

from __future__ import annotations

import json
import math
import os
import uuid
from datetime import UTC, datetime, timedelta

import gevent
import psycopg
import pytest
from gevent.event import Event
from psycopg.rows import dict_row

from mealquest.clock import to_text
from mealquest.db.errors import StoreUnavailable, WriteOutcomeUnknown
from mealquest.db.postgresql import households, jobs
from mealquest.db.postgresql.job_rows import from_server_text
from mealquest.db.postgresql.store import PostgresStore
from mealquest.db.postgresql.transaction import PostgresTransaction
from mealquest.model.jobs import ClaimRequest, Job, NewJob, OnInterrupt
from tests.drivers.conftest import LEASE, claim, enqueue, get
from tests.support.postgres import (
    fresh_database,
    require_pgbouncer_url,
    require_postgres_url,
    through_pgbouncer,
)


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
            NewJob(
                job_id=job_id,
                household_id=household,
                kind="succeed",
                payload="{}",
                max_attempts=1,
                on_interrupt=OnInterrupt.FAIL,
                run_at=due,
            ),
        )
        assert zoned.read(jobs.get_job, job_id).run_at == to_text(due)
    finally:
        zoned.close()


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Tokyo"])
def test_a_claims_jobs_hold_the_times_a_read_of_them_finds_whatever_the_clients_style(
    make_store, household, monkeypatch, zone
):
    # A claim reads its rows' times as the server's text: whatever zone and
    # date style the client's environment asks for, the store's sessions
    # write them in UTC and the ISO style, and each reads as `to_text` has it.
    monkeypatch.setenv("PGTZ", zone)
    monkeypatch.setenv("PGDATESTYLE", "SQL, DMY")
    styled = make_store(pool_size=1)
    fractions = [0, 10, 120_000, 500_000, 123_456, 999_999]
    dues = [datetime(2001, 2, 3, 4, 5, 6, micro, tzinfo=UTC) for micro in fractions]
    dues.append(datetime(1, 1, 1, 1, tzinfo=UTC))
    try:
        for due in dues:
            enqueue(styled, household, run_at=due)
        claimed = styled.write(
            jobs.claim,
            ClaimRequest(owner="w", lease_seconds=LEASE, limit=len(dues), kinds=["succeed"]),
        )
        assert sorted(job.run_at for job in claimed) == sorted(to_text(due) for due in dues)
        for job in claimed:
            assert job.started_at is not None
            assert job.lease_expires_at is not None
            assert job == styled.read(jobs.get_job, job.id)
    finally:
        styled.close()


def test_a_time_in_another_style_or_zone_is_refused_not_misread():
    assert from_server_text("2026-12-07 02:51:00+00") == "2026-12-07T02:51:00.000000Z"
    assert from_server_text("0001-01-01 00:00:00.00001+00") == "0001-01-01T00:00:00.000010Z"
    for other in ("07/12/2026 02:51:00.5 UTC", "2026-12-07 03:51:00.5+01", "2026-12-07"):
        with pytest.raises(ValueError, match="ISO style and UTC"):
            from_server_text(other)


def test_claim_reads_the_database_clock_for_its_times(store, household):
    enqueue(store, household)

    def claim_and_read_now(tx):
        claimed = jobs.claim(
            tx, ClaimRequest(owner="w", lease_seconds=LEASE, limit=1, kinds=["succeed"])
        )
        return claimed, tx.execute("SELECT now() AS now").fetchone()["now"]

    [job], now = store.write(claim_and_read_now)

    # The claim's own transaction time, to the microsecond: no host clock took part.
    assert job.started_at == job.updated_at == to_text(now)
    assert job.lease_expires_at == to_text(now + timedelta(seconds=LEASE))


def test_two_open_claims_of_one_household_never_wait_and_take_disjoint_jobs(
    store, pg_url, household
):
    queued = {enqueue(store, household) for _ in range(4)}
    first = raw_transaction(store, pg_url)
    second = raw_transaction(store, pg_url)
    try:
        mine = jobs.claim(
            first, ClaimRequest(owner="a", lease_seconds=LEASE, limit=2, kinds=["succeed"])
        )
        # The household's row is the first claim's until it commits: the
        # second skips the household rather than wait (its statement_timeout
        # would fail it), and takes nothing.
        assert (
            jobs.claim(
                second, ClaimRequest(owner="b", lease_seconds=LEASE, limit=10, kinds=["succeed"])
            )
            == []
        )
        first.conn.execute("COMMIT")
        theirs = jobs.claim(
            second, ClaimRequest(owner="b", lease_seconds=LEASE, limit=10, kinds=["succeed"])
        )
        second.conn.execute("COMMIT")
    finally:
        first.conn.close()
        second.conn.close()

    assert len(mine) == 2
    assert len(theirs) == 2
    assert {job.id for job in mine} | {job.id for job in theirs} == queued
    assert {get(store, job.id).lease_owner for job in mine} == {"a"}
    assert {get(store, job.id).lease_owner for job in theirs} == {"b"}


def claims_held_open_at_once(store, pg_url, limits: list[int]) -> list[list[Job]]:
    """A claim of each limit, each in a transaction of its own, all open
    until the last has claimed (as several processes' claims made at once):
    what each took."""
    claims = [raw_transaction(store, pg_url) for _ in limits]
    try:
        taken = [
            jobs.claim(
                tx,
                ClaimRequest(owner=f"p{n}", lease_seconds=LEASE, limit=limit, kinds=["succeed"]),
            )
            for n, (tx, limit) in enumerate(zip(claims, limits, strict=True))
        ]
        for tx in claims:
            tx.conn.execute("COMMIT")
    finally:
        for tx in claims:
            tx.conn.close()
    return taken


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
    taken = claims_held_open_at_once(store, pg_url, [1] * len(in_turn))

    assert [[job.household_id for job in batch] for batch in taken] == [[h] for h in in_turn]


def test_claims_made_at_once_over_households_with_many_jobs_each_take_households_of_their_own(
    store, pg_url, household
):
    """A claim of 8 over eight households with jobs to spare takes four of
    them, not all eight: a second process's claim made meanwhile takes the
    other four, so two processes drain faster than one."""
    every = [
        household,
        *(
            store.write(households.create_household, name=f"H{n}", token_sha256=d * 64)[0]
            for n, d in enumerate("bcdefgh")
        ),
    ]
    for owner in every:
        for _ in range(4):
            enqueue(store, owner)
    taken = claims_held_open_at_once(store, pg_url, [8, 8])

    assert [len(batch) for batch in taken] == [8, 8]
    assert [{job.household_id for job in batch} for batch in taken] == [
        set(every[:4]),
        set(every[4:]),
    ]


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
            NewJob(
                job_id=uuid.uuid4().hex,
                household_id=other,
                kind="succeed",
                payload="{}",
                max_attempts=1,
                on_interrupt=OnInterrupt.FAIL,
            ),
        )
        # The producer's claim takes `household` and skips `other` at once.
        taken = jobs.claim(
            producer, ClaimRequest(owner="p", lease_seconds=LEASE, limit=2, kinds=["succeed"])
        )
        # The completer's claim skips `household`, the producer's now, and
        # takes from its own: neither waits, so neither can deadlock.
        its_own = jobs.claim(
            completer, ClaimRequest(owner="c", lease_seconds=LEASE, limit=2, kinds=["succeed"])
        )
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
    return PostgresTransaction(conn, store.notifier)


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


def test_a_commit_whose_answer_is_lost_is_a_write_of_unknown_outcome(store, pg_url):
    # Whether the server committed is unknown to a client whose connection
    # broke while its COMMIT was sent: callers must be told so (the runner
    # then puts back what such a claim may have taken), not "nothing written".
    def lose_the_answer(tx):
        pid = tx.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    with pytest.raises(WriteOutcomeUnknown):
        store.write(lose_the_answer)
    # The pool replaced the connection: the store writes again.
    assert store.write(lambda tx: tx.execute("SELECT 1 AS one").fetchone()["one"]) == 1


def test_the_runners_store_has_connections_no_request_can_take(make_store, household):
    store = make_store(pool_size=1, runner_pool_size=2, busy_timeout_seconds=0.3)
    runner = store.for_runner()
    assert store.for_runner() is runner
    assert (runner.pool_size, runner.pooler, runner.listen) == (2, store.pooler, store.listen)
    released, holding = Event(), Event()

    def hold(conn):
        holding.set()
        released.wait()

    request = gevent.spawn(store.read, hold)
    try:
        holding.wait(timeout=10)
        with pytest.raises(StoreUnavailable):
            store.read(lambda conn: conn.execute("SELECT 1"))
        job = enqueue(runner, household)
        assert get(runner, job).id == job
    finally:
        released.set()
        request.join()
    store.close()  # closes the runner's pool too; a later call makes another
    assert runner._pool is None
    assert store.for_runner() is not runner


def test_a_connection_found_read_only_is_replaced_and_writes_go_on(make_store, pg_url, route):
    # After a failover a pooled connection may sit on a server that became a
    # standby: every write on it is refused for good. Such a write is
    # StoreUnavailable (503, try again), and its connection is closed, so
    # that the pool's next ones reach a server that writes. Here the server
    # makes its new sessions read-only, as a standby's are, and then stops.
    if route == "pgbouncer":
        pytest.skip("PgBouncer keeps its own server connections: the database's setting is its")
    store = make_store(pool_size=3)
    name = psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')

    def write(tx):
        return tx.execute("INSERT INTO households (name) VALUES ('x') RETURNING id").fetchone()

    try:
        for _ in range(3):  # every connection the pool opened meanwhile is read-only
            with pytest.raises(StoreUnavailable):
                store.write(write)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SET default_transaction_read_only = off")
            admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')

    # Each read-only connection met is replaced: within the pool's size, a
    # write succeeds; a pool that kept them would fail every write for good.
    done = []
    for _ in range(3 + 1):
        try:
            done.append(store.write(write))
            break
        except StoreUnavailable:
            continue
    assert len(done) == 1


# -- several hosts, dead sockets --------------------------------------------------------------


def test_a_url_of_several_hosts_is_described_by_its_hosts_never_its_password():
    store = PostgresStore(
        "postgresql://mealquest:s3cret@db1.internal:5433,db2.internal/mealquest"
        "?target_session_attrs=read-write"
    )
    assert store.describe() == "postgresql://db1.internal:5433,db2.internal:5432/mealquest"
    single = PostgresStore("postgresql://mealquest:s3cret@db.internal/mealquest")
    assert single.describe() == "postgresql://db.internal:5432/mealquest"


def test_a_connections_socket_finds_a_vanished_server_within_the_dead_socket_seconds(pg_url):
    import socket

    store = PostgresStore(pg_url, dead_socket_seconds=9)
    try:
        with psycopg.connect(pg_url, **store.connect_kwargs()) as conn:
            sock = socket.socket(fileno=os.dup(conn.fileno()))
            try:
                idle = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
                interval = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
                count = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert idle + interval * count <= 9
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 9000
            finally:
                sock.close()
    finally:
        store.close()


@pytest.mark.parametrize("route", ["postgresql"], indirect=True)
def test_the_duration_bucket_is_the_bounds_tables_by_arithmetic(store):
    # The bucket the table's bounds give (the greatest lower bound at or
    # below the duration), against the function the triggers call, for
    # every bound, the doubles on either side of it, and 12,000 durations
    # spread over the buckets' whole range.
    bounds = [
        row["lower_seconds"]
        for row in store.read(
            lambda conn: conn.execute(
                "SELECT lower_seconds FROM job_duration_buckets ORDER BY bucket"
            ).fetchall()
        )
    ]
    durations = [None, -1.0, 0.0, 1e9]
    for bound in bounds:
        durations += [math.nextafter(bound, -math.inf), bound, math.nextafter(bound, math.inf)]
    durations += [10 ** (-3 + 8 * i / 12_000) for i in range(12_001)]

    def expected(seconds):
        if seconds is None or not seconds >= 0:
            return 0
        return max(bucket for bucket, lower in enumerate(bounds) if lower <= seconds)

    got = store.read(
        lambda conn: conn.execute(
            "SELECT job_duration_bucket(d) AS bucket "
            "FROM unnest(%s::double precision[]) WITH ORDINALITY AS t(d, n) ORDER BY n",
            (durations,),
        ).fetchall()
    )

    assert [row["bucket"] for row in got] == [expected(seconds) for seconds in durations]


@pytest.mark.parametrize("route", ["postgresql"], indirect=True)
def test_the_duration_bucket_is_inlined_into_the_statement_that_calls_it(store):
    # The triggers call it for every job a statement moves: a SQL function
    # the planner does not inline is set up and run apart at each call (it
    # cost about 10 us a claimed job). Inlined, the plan shows its body and
    # names none of the bucket's functions.
    # Called as the triggers call it: a costly argument, which the planner
    # will not repeat for a function that names it more than once.
    plan = store.read(
        lambda conn: conn.execute(
            "EXPLAIN (VERBOSE, FORMAT JSON) "
            "SELECT job_duration_bucket(extract(epoch FROM ended - began)::float8) "
            "FROM (VALUES (now() - interval '2 seconds', now())) AS t(began, ended)"
        ).fetchone()
    )
    assert "job_duration_bucket" not in json.dumps(plan)


@pytest.mark.parametrize("route", ["postgresql"], indirect=True)
def test_no_trigger_runs_before_a_jobs_row_is_updated(store):
    # A BEFORE row trigger, whatever its WHEN, makes every UPDATE of the
    # table lock each row first and log that lock to the WAL: a claim's, an
    # outcome's and a lease renewal's rows, about 100 WAL bytes a job
    # (migration 0024). The version's trigger runs after the row instead.
    before_row = store.read(
        lambda conn: conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'jobs'::regclass "
            "AND NOT tgisinternal AND tgtype & 1 = 1 AND tgtype & 2 = 2"
        ).fetchall()
    )
    assert before_row == []


# Directly only: through a transaction pooler no statement is prepared, and
# each claim is planned with the statistics of its moment.
@pytest.mark.parametrize("route", ["postgresql"], indirect=True)
@pytest.mark.parametrize("statistics", ["none", "of one job"])
def test_a_claim_planned_before_a_burst_reads_no_more_jobs_after_it(
    make_store, household, statistics
):
    # The claim's plan is made once per connection, when psycopg prepares it
    # (its sixth run), with the statistics of that moment, on a table of a
    # few jobs. Then 5,000 are queued at once, and before autovacuum has
    # looked at them a claim of ten must still walk the indexes in the
    # claim's order, not read every due job and sort them (such a plan cost
    # 1.5 ms of a 2.2 ms claim at 12,000 queued).
    one_connection = make_store(pool_size=1)
    try:
        enqueue(one_connection, household)
        # No statistics yet (a new database before autovacuum's first look:
        # the bench's drains, a service's first burst), or those of a table
        # of one job (a burst after a quiet spell): each misled the planner
        # its own way.
        if statistics != "none":
            one_connection.write(lambda tx: tx.execute("ANALYZE jobs"))
        for _ in range(8):
            assert len(claim(one_connection, limit=1)) == 1
            enqueue(one_connection, household)
        one_connection.write(
            lambda tx: tx.execute(
                "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, "
                "on_interrupt, run_at, created_at, updated_at) "
                "SELECT md5(i::text), %s, 'succeed', '{}', 'queued', 1, 'fail', "
                "now(), now(), now() FROM generate_series(1, 5000) AS i",
                (household,),
            )
        )

        def tuples_read(tx):
            # The backend's counts not yet sent to the statistics (earlier
            # transactions' too): the claim's are the difference.
            return tx.execute(
                "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) AS tuples "
                "FROM pg_stat_xact_user_tables WHERE relname = 'jobs'"
            ).fetchone()["tuples"]

        def claim_and_count(tx):
            before = tuples_read(tx)
            claimed = jobs.claim(
                tx, ClaimRequest(owner="w", lease_seconds=LEASE, limit=10, kinds=("succeed",))
            )
            return claimed, tuples_read(tx) - before

        claimed, tuples = one_connection.write(claim_and_count)
    finally:
        one_connection.close()
    assert len(claimed) == 10
    # The ten jobs, each found, locked and updated through indexes (143
    # tuples fetched here), never the 5,000 one by one (5,169 before).
    assert tuples < 500, tuples
