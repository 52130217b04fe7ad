"""The PostgreSQL store through a real PgBouncer in transaction mode.

PgBouncer gives a client a server connection for one transaction at a time
(an autocommit statement is a transaction), and hands out the connection
released last first. So a test can choose which server connection the
store meets next: another client that holds a transaction open takes the
one the store just used, and the store's next statement runs on another.
That is how prepared statements and session settings break through it, and
what `pooler="transaction"` must survive.
"""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest

from mealquest.db.errors import StoreUnavailable
from mealquest.db.postgresql import migrate
from mealquest.db.postgresql.store import PostgresStore
from tests.support.postgres import (
    fresh_database,
    require_pgbouncer_url,
    require_postgres_url,
    through_pgbouncer,
)


@pytest.fixture
def bouncer_url():
    require_pgbouncer_url()
    with fresh_database(require_postgres_url(), migrated=True) as url:
        yield through_pgbouncer(url)


@pytest.fixture
def make_store(bouncer_url):
    stores = []

    def make(**options):
        options = {"busy_timeout_seconds": 5, "pool_size": 1, "listen": False, **options}
        store = PostgresStore(bouncer_url, **options)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def other_client(bouncer_url):
    """Another client of the same PgBouncer, as any other service's could be."""
    with psycopg.connect(bouncer_url, autocommit=True, prepare_threshold=None) as conn:
        yield conn


def answer_many_times(store, statement, times=8):
    """Run `statement` (a `SELECT %s::int + 1`) often enough for psycopg to prepare it."""
    return [
        store.read(lambda conn, n=n: conn.execute(statement, (n,)).fetchone()["answer"])
        for n in range(times)
    ]


def statement_of_its_own() -> str:
    # A text no other test runs, so no server connection has it prepared already.
    return f"SELECT %s::int + 1 AS answer /* {uuid.uuid4().hex} */"


def test_without_the_pooler_setting_a_prepared_statement_meets_another_server_connection(
    make_store, other_client
):
    store = make_store()
    statement = statement_of_its_own()
    assert answer_many_times(store, statement) == list(range(1, 9))

    other_client.execute("BEGIN")
    other_client.execute("SELECT 1")  # holds the server connection the store used
    try:
        outcome = store.read(lambda conn: conn.execute(statement, (41,)).fetchone()["answer"])
    except psycopg.Error as error:
        outcome = error
    finally:
        other_client.execute("ROLLBACK")
    # The statement's name means nothing there, or another statement: an error at
    # best, another client's statement run with these parameters at worst.
    assert outcome != 42


def test_with_the_transaction_pooler_no_statement_is_prepared(make_store, other_client):
    store = make_store(pooler="transaction")
    statement = statement_of_its_own()
    assert answer_many_times(store, statement) == list(range(1, 9))

    other_client.execute("BEGIN")
    other_client.execute("SELECT 1")
    try:
        answer = store.read(lambda conn: conn.execute(statement, (41,)).fetchone()["answer"])
        prepared = store.read(
            lambda conn: conn.execute("SELECT count(*) AS n FROM pg_prepared_statements")
        ).fetchone()["n"]
    finally:
        other_client.execute("ROLLBACK")
    assert answer == 42
    assert prepared == 0


def settings(conn):
    return conn.execute(
        "SELECT current_setting('statement_timeout') AS timeout, "
        "current_setting('TimeZone') AS zone"
    ).fetchone()


def test_with_the_transaction_pooler_every_transaction_carries_the_settings(
    make_store, other_client
):
    store = make_store(pooler="transaction", busy_timeout_seconds=4)
    store.read(settings)  # the store's connection is open
    # Session settings of another client stay on the server connection it used,
    # the one the store meets next.
    other_client.execute("SET statement_timeout = '1min'")
    other_client.execute("SET TimeZone = 'Asia/Tokyo'")

    read = store.read(settings)
    written = store.write(settings)

    assert dict(read) == dict(written) == {"timeout": "4s", "zone": "UTC"}
    # Set for the store's transactions only: nothing of them stays behind.
    assert other_client.execute("SHOW statement_timeout").fetchone()[0] == "1min"


def test_through_pgbouncer_a_statement_past_the_deadline_is_cancelled(make_store):
    store = make_store(pooler="transaction", busy_timeout_seconds=0.3)
    outcome = {}

    def sleep_past_the_deadline():
        try:
            store.read(lambda conn: conn.execute("SELECT pg_sleep(60)"))
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=sleep_past_the_deadline, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the statement was not cancelled at its deadline"
    assert isinstance(outcome.get("error"), StoreUnavailable)
    # The client connection serves on.
    assert store.read(settings)["zone"] == "UTC"


def test_the_transaction_pooler_cannot_listen():
    with pytest.raises(ValueError, match="LISTEN"):
        PostgresStore("postgresql://u:p@127.0.0.1:1/db", pooler="transaction", listen=True)
    with pytest.raises(ValueError, match="pooler"):
        PostgresStore("postgresql://u:p@127.0.0.1:1/db", pooler="session")


def test_migrations_run_through_pgbouncer_two_at_once():
    require_pgbouncer_url()
    with fresh_database(require_postgres_url()) as url:
        bouncer = through_pgbouncer(url)
        errors = []

        def upgrade():
            try:
                migrate.upgrade(bouncer)
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=upgrade) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        ledger = migrate.status(bouncer)
        assert ledger.pending == ()
        assert len(ledger.states) == len(migrate.discover(migrate.MIGRATIONS_DIR))
