"""The PostgreSQL store: transactions, deadlines, a free hub, fork, and LISTEN/NOTIFY.

What needs a gevent-patched process (psycopg's cooperative waits, the
backstop timer) runs in a subprocess under `python -m gevent.monkey`: the
tests' own process is not patched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import uuid

import psycopg
import pytest

from mealquest.db.errors import StoreError, StoreUnavailable, StoreUsedAcrossFork
from mealquest.db.postgresql import households, jobs, notify
from mealquest.db.postgresql.notify import CHANNEL, Notifier
from mealquest.db.postgresql.store import PostgresStore
from mealquest.model.jobs import NewJob, OnInterrupt
from tests.conftest import wait_for
from tests.support import postgres as postgres_support
from tests.support.postgres import fresh_database, require_postgres_url
from tests.support.processes import REPO
from tests.support.servers import free_port


@pytest.fixture
def pg_url():
    with fresh_database(require_postgres_url(), migrated=True) as url:
        yield url


@pytest.fixture
def make_store(pg_url):
    stores = []

    def make(url=pg_url, **options):
        options = {"busy_timeout_seconds": 5, "pool_size": 4, "listen": False, **options}
        store = PostgresStore(url, **options)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def store(make_store):
    return make_store()


def names(store):
    return store.read(
        lambda conn: [
            row["name"]
            for row in conn.execute("SELECT name FROM households WHERE id <> 0 ORDER BY id")
        ]
    )


def run_python(tmp_path, code, *, patched, env=None, timeout=60):
    """Run `code` in a new interpreter, under `python -m gevent.monkey` when `patched`."""
    script = tmp_path / f"script_{uuid.uuid4().hex[:8]}.py"
    script.write_text(textwrap.dedent(code))
    launcher = ["-m", "gevent.monkey"] if patched else []
    return subprocess.run(
        [sys.executable, *launcher, str(script)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def call_in_thread(fn, timeout=30.0):
    """Run `fn()` in a thread; what it returned or raised, failing if it never returns."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the call did not return within {timeout}s"
    return outcome


# -- transactions -----------------------------------------------------------------------------


def test_write_commits_what_fn_did_and_returns_its_result(store):
    household_id = store.write(households.insert_household, name="Smiths")

    assert isinstance(household_id, int)
    assert names(store) == ["Smiths"]


def test_a_write_that_raises_rolls_back_and_runs_no_callback(store):
    ran = []

    def insert_then_fail(tx):
        households.insert_household(tx, name="Smiths")
        tx.after_commit(lambda: ran.append("callback"))
        raise RuntimeError("handler bug")

    with pytest.raises(RuntimeError, match="handler bug"):
        store.write(insert_then_fail)

    assert names(store) == []
    assert ran == []


def test_after_commit_callbacks_run_once_the_write_is_visible(store, make_store):
    other = make_store()
    seen = []

    def insert(tx):
        households.insert_household(tx, name="Smiths")
        tx.after_commit(lambda: seen.append(names(other)))

    store.write(insert)

    assert seen == [["Smiths"]]


def test_a_statement_that_failed_inside_fn_cannot_commit_silently(store):
    def swallow_a_failure(tx):
        households.insert_household(tx, name="Smiths")
        # The failed insert aborts the transaction: COMMIT would roll back quietly.
        with contextlib.suppress(psycopg.IntegrityError):
            tx.execute("INSERT INTO households (name, created_at) VALUES ('', now())")

    with pytest.raises(StoreError, match="rolled back"):
        store.write(swallow_a_failure)

    assert names(store) == []
    store.write(households.insert_household, name="Joneses")  # the connection is usable
    assert names(store) == ["Joneses"]


def test_reads_take_positional_and_keyword_arguments(store):
    store.write(households.insert_household, name="Smiths")

    def named(conn, prefix, *, suffix):
        return [prefix + name + suffix for name in names_of(conn)]

    assert store.read(named, "<", suffix=">") == ["<Smiths>"]


def names_of(conn):
    return [
        row["name"] for row in conn.execute("SELECT name FROM households WHERE id <> 0 ORDER BY id")
    ]


def test_concurrent_writes_each_get_a_connection_of_their_own(store, pg_url):
    # Two threads, each inside a write at the same time: one waits on a row
    # the other holds, so they cannot share a connection or a transaction.
    store.write(households.insert_household, name="Smiths")
    first_inside = threading.Event()
    release_first = threading.Event()

    def first(tx):
        tx.execute("UPDATE households SET name = 'first' WHERE name = 'Smiths'")
        first_inside.set()
        assert release_first.wait(20)
        return tx.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]

    def second(tx):
        return tx.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]

    one = threading.Thread(target=lambda: results.append(store.write(first)))
    results = []
    one.start()
    assert first_inside.wait(20)
    other_pid = store.write(second)
    release_first.set()
    one.join(20)

    assert results
    assert results[0] != other_pid
    assert names(store) == ["first"]


# -- configuration and laziness ---------------------------------------------------------------


def test_a_url_of_another_scheme_is_refused():
    with pytest.raises(StoreError, match="postgresql://"):
        PostgresStore("sqlite:///x.sqlite3")


def test_an_invalid_url_is_refused_without_quoting_it():
    store = PostgresStore("postgresql://user:s3cret-pw@127.0.0.1:5432/db?bogus_option=1")
    try:
        with pytest.raises(StoreError, match="URL is not valid") as raised:
            store.read(lambda conn: None)
        assert "s3cret-pw" not in str(raised.value)
        assert "bogus" not in str(raised.value)
    finally:
        store.close()


def test_making_a_store_connects_to_nothing_and_importing_it_loads_no_psycopg(tmp_path):
    # A port nothing listens on: only using the store would notice.
    PostgresStore(f"postgresql://u:p@127.0.0.1:{free_port()}/db").close()

    ran = run_python(
        tmp_path,
        """
        import sys
        import mealquest.db.postgresql.households, mealquest.db.postgresql.jobs
        import mealquest.db.postgresql.migrate, mealquest.db.postgresql.recipes
        from mealquest.db.postgresql.store import PostgresStore
        PostgresStore("postgresql://u:p@127.0.0.1:1/db")
        print(sorted(name for name in sys.modules if name.startswith("psycopg")))
        """,
        patched=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"


def test_the_store_refuses_use_after_fork(store):
    store.write(households.insert_household, name="parent")

    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 0
        for bit, call in (
            (1, lambda: store.read(names_of)),
            (2, lambda: store.write(households.insert_household, name="child")),
            (4, lambda: store.data_version()),
        ):
            try:
                call()
                code |= bit
            except StoreUsedAcrossFork:
                pass
            except BaseException:
                code |= 8
        try:
            store.close()  # a no-op in another process
        except BaseException:
            code |= 16
        os._exit(code)

    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.write(households.insert_household, name="parent again")
    assert names(store) == ["parent", "parent again"]


def test_a_closed_store_opens_again_when_used(store):
    store.write(households.insert_household, name="Smiths")
    store.close()

    assert names(store) == ["Smiths"]


# -- deadlines --------------------------------------------------------------------------------


def test_a_port_nobody_listens_on_is_unavailable_within_the_deadline(make_store):
    store = make_store(f"postgresql://u:p@127.0.0.1:{free_port()}/db", busy_timeout_seconds=0.5)

    outcome = call_in_thread(lambda: store.write(households.insert_household, name="x"))

    assert isinstance(outcome.get("error"), StoreUnavailable)


def test_a_server_that_never_answers_is_unavailable_within_the_deadline(make_store):
    with socket.socket() as silent:
        # Accepts connections (the kernel completes them) and never says a word.
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        store = make_store(f"postgresql://u:p@127.0.0.1:{port}/db", busy_timeout_seconds=0.5)

        outcome = call_in_thread(lambda: store.read(names_of))

    assert isinstance(outcome.get("error"), StoreUnavailable)


def test_a_statement_past_the_deadline_is_cancelled_and_the_connection_kept(make_store):
    store = make_store(busy_timeout_seconds=0.3, pool_size=1)
    pid = store.read(lambda conn: conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"])

    outcome = call_in_thread(lambda: store.read(lambda conn: conn.execute("SELECT pg_sleep(60)")))

    assert isinstance(outcome.get("error"), StoreUnavailable)
    # The server cancelled the statement: the same connection serves on.
    assert (
        store.read(lambda conn: conn.execute("SELECT pg_backend_pid() AS pid").fetchone())["pid"]
        == pid
    )


def test_the_pools_warnings_name_the_error_without_its_text(make_store, caplog):
    store = make_store(f"postgresql://u:p@127.0.0.1:{free_port()}/db", busy_timeout_seconds=0.5)

    with caplog.at_level(logging.DEBUG):
        outcome = call_in_thread(lambda: store.read(names_of))

    assert isinstance(outcome.get("error"), StoreUnavailable)
    failed_connects = [r for r in caplog.records if r.name.startswith("psycopg")]
    assert failed_connects  # the pool did say that it could not connect...
    for record in failed_connects:
        assert "refused" not in record.getMessage().lower()  # ...but not the driver's words


def test_a_wrong_password_is_unavailable_and_never_written_anywhere(pg_url, make_store, caplog):
    wrong = pg_url.replace("://mealquest:", "://mealquest:Wr0ng-pa55word-", 1)
    assert wrong != pg_url
    store = make_store(wrong, busy_timeout_seconds=0.5)

    with caplog.at_level(logging.DEBUG):
        outcome = call_in_thread(lambda: store.read(names_of))

    error = outcome.get("error")
    assert isinstance(error, StoreUnavailable)
    assert "Wr0ng-pa55word" not in f"{error!s} {error!r} {error.__cause__!r}"
    assert "Wr0ng-pa55word" not in repr(store)
    for record in caplog.records:
        assert "Wr0ng-pa55word" not in record.getMessage()


class PrivateServer:
    """A PostgreSQL server of the test's own, started by `scripts/postgres`, which
    the test may stop and restart without disturbing other tests."""

    SCRIPT = REPO / "scripts" / "postgres"

    def __init__(self) -> None:
        # Directly under the temp folder: the server's user must reach it.
        self.directory = tempfile.mkdtemp(prefix="mq-pg-")
        self.url = self.run("start")

    def run(self, command):
        done = subprocess.run(
            [str(self.SCRIPT), command, self.directory],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def remove(self):
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.run("stop")
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture(scope="module")
def private_server():
    require_postgres_url()  # PostgreSQL tests run only where a server can be had
    server = PrivateServer()
    try:
        yield server
    finally:
        server.remove()


def answers(store):
    """Whether the store answers now; False when it is unavailable."""
    try:
        return store.read(lambda conn: conn.execute("SELECT 1 AS one").fetchone()["one"]) == 1
    except StoreUnavailable:
        return False


def test_the_store_is_unavailable_while_the_server_is_down_and_recovers_by_itself(
    private_server, make_store
):
    store = make_store(private_server.url, busy_timeout_seconds=1, pool_size=1)
    assert answers(store)

    private_server.run("stop")
    for _ in range(3):  # every call while it is down, each within its deadline
        outcome = call_in_thread(lambda: store.read(names_of))
        assert isinstance(outcome.get("error"), StoreUnavailable)
    private_server.run("start")

    wait_for(lambda: answers(store), timeout=20)


def test_the_store_recovers_by_itself_from_a_server_restart(private_server, make_store):
    store = make_store(private_server.url, busy_timeout_seconds=1, pool_size=1)
    assert answers(store)  # the pool now holds a connection the restart will cut

    private_server.run("restart")

    wait_for(lambda: answers(store), timeout=20)


# -- gevent -----------------------------------------------------------------------------------


def test_a_query_waiting_on_the_server_leaves_the_hub_free(pg_url, tmp_path):
    ran = run_python(
        tmp_path,
        """
        import os, sys, time
        import gevent, psycopg
        from mealquest.db.postgresql.store import PostgresStore

        url = os.environ["PG_URL"]
        store = PostgresStore(url, busy_timeout_seconds=10, pool_size=2, listen=False)
        holder = psycopg.connect(url, autocommit=True)
        holder.execute("SELECT pg_advisory_lock(4242)")
        ticks = 0

        def tick():
            global ticks
            while True:
                gevent.sleep(0.01)
                ticks += 1

        def waiting():
            row = holder.execute(
                "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()
            return row[0] > 0

        def wait_until(condition, what):
            deadline = time.monotonic() + 20
            while not condition():
                if time.monotonic() > deadline:
                    print("never:", what)
                    sys.exit(1)
                gevent.sleep(0.01)

        gevent.spawn(tick)
        # Held by the server until `holder` lets go.
        reader = gevent.spawn(
            store.read, lambda conn: conn.execute("SELECT pg_advisory_lock(4242)").fetchone()
        )
        wait_until(waiting, "the read waits on the lock")
        start = ticks
        wait_until(lambda: ticks >= start + 10, "ticks while the read waits")
        assert not reader.ready()
        holder.execute("SELECT pg_advisory_unlock(4242)")
        reader.join(20)
        assert reader.successful(), reader.exception
        # Waited on the hub itself, not through the patched `select.poll`.
        print(store.read(lambda conn: type(conn).__name__), "hub free")
        """,
        patched=True,
        env={"PG_URL": pg_url},
    )

    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.strip() == "HubConnection hub free"


def test_a_server_that_stops_answering_mid_query_is_unavailable(pg_url, tmp_path):
    # The backend is frozen (SIGSTOP): no statement_timeout can fire, the
    # kernel still acknowledges every packet; only the store's own timer ends the wait.
    pid_file = tmp_path / "backend.pid"
    try:
        ran = run_python(
            tmp_path,
            """
            import os, signal
            from mealquest.db.postgresql.store import PostgresStore
            from mealquest.db.errors import StoreUnavailable

            store = PostgresStore(
                os.environ["PG_URL"], busy_timeout_seconds=0.5, pool_size=1, listen=False
            )
            pid = store.read(lambda c: c.execute("SELECT pg_backend_pid() AS p").fetchone()["p"])
            with open(os.environ["PID_FILE"], "w") as file:
                file.write(str(pid))
            os.kill(pid, signal.SIGSTOP)
            try:
                store.read(lambda c: c.execute("SELECT 1").fetchone())
                print("answered")
            except StoreUnavailable:
                print("unavailable")
            finally:
                os.kill(pid, signal.SIGCONT)
            after = store.read(lambda c: c.execute("SELECT pg_backend_pid() AS p").fetchone()["p"])
            print("replaced" if after != pid else "same connection")
            """,
            patched=True,
            env={"PG_URL": pg_url, "PID_FILE": str(pid_file)},
            timeout=30,
        )
    finally:
        # Whatever happened in there, never leave a backend frozen.
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGCONT)

    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.split() == ["unavailable", "replaced"]


COOPERATIVE_CHECK = """
import sys
from mealquest.db.postgresql.waiting import BlockingPsycopg, require_cooperative_psycopg
try:
    require_cooperative_psycopg()
except BlockingPsycopg as error:
    print(error)
    sys.exit(3)
print("cooperative")
"""


def test_psycopg_imported_after_patching_waits_cooperatively(tmp_path):
    ran = run_python(tmp_path, "import psycopg, psycopg_pool\n" + COOPERATIVE_CHECK, patched=True)

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "cooperative"


@pytest.mark.parametrize(
    "before",
    [
        "import psycopg\nfrom gevent import monkey\nmonkey.patch_all()\n",
        "import psycopg_pool\nfrom gevent import monkey\nmonkey.patch_all()\n",
        "import psycopg\n",  # never patched
    ],
    ids=["psycopg-first", "pool-first", "unpatched"],
)
def test_psycopg_imported_before_patching_is_refused_in_one_line(tmp_path, before):
    ran = run_python(tmp_path, before + COOPERATIVE_CHECK, patched=False)

    assert ran.returncode == 3, ran.stdout + ran.stderr
    [line] = ran.stdout.strip().splitlines()
    assert "imported before gevent patched" in line


def test_the_store_refuses_to_open_in_a_patched_process_with_blocking_psycopg(tmp_path):
    ran = run_python(
        tmp_path,
        """
        import psycopg
        from gevent import monkey
        monkey.patch_all()
        from mealquest.db.postgresql.store import PostgresStore
        from mealquest.db.postgresql.waiting import BlockingPsycopg
        try:
            PostgresStore("postgresql://u:p@127.0.0.1:1/db").read(lambda conn: None)
        except BlockingPsycopg:
            print("refused")
        """,
        patched=False,
    )

    assert ran.stdout.strip() == "refused", ran.stderr


# -- LISTEN/NOTIFY ----------------------------------------------------------------------------


@pytest.fixture
def household(store):
    return store.write(households.create_household, name="Smiths", token_sha256="a" * 64)[0]


def enqueue(store, household):
    store.write(
        jobs.insert_job,
        NewJob(
            job_id=uuid.uuid4().hex,
            household_id=household,
            kind="succeed",
            payload="{}",
            max_attempts=1,
            on_interrupt=OnInterrupt.FAIL,
        ),
    )


class Heard:
    """A connection of the test's own, listening on the jobs channel."""

    def __init__(self, url):
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(f"LISTEN {CHANNEL}")
        self.url = url

    def until_marker(self):
        """Every notification up to a marker sent now (delivery keeps commit order)."""
        with psycopg.connect(self.url, autocommit=True) as other:
            other.execute(f"NOTIFY {CHANNEL}, 'marker'")
        heard = []
        for notification in self.conn.notifies(timeout=20):
            if notification.payload == "marker":
                return heard
            heard.append(notification)
        raise AssertionError("the marker never came")

    def close(self):
        self.conn.close()


@pytest.fixture
def heard(pg_url):
    listener = Heard(pg_url)
    yield listener
    listener.close()


def test_a_burst_of_enqueues_sends_one_notify_per_interval(store, household, heard):
    store.notifier = Notifier(store.write, interval=3600)  # the whole burst in one interval
    try:
        for _ in range(20):
            enqueue(store, household)

        assert len(heard.until_marker()) == 1
        assert store.notifier.sent == 1
    finally:
        store.notifier.cancel()


def test_an_enqueue_inside_the_interval_gets_a_trailing_notify(store, household, heard):
    store.notifier = Notifier(store.write, interval=0.05)
    enqueue(store, household)
    enqueue(store, household)  # inside the interval, or past it on a slow machine

    wait_for(lambda: store.notifier.sent == 2)
    assert len(heard.until_marker()) == 2


def test_a_notify_is_sent_only_if_the_enqueue_commits(store, household, heard):
    def enqueue_then_fail(tx):
        jobs.insert_job(
            tx,
            NewJob(
                job_id=uuid.uuid4().hex,
                household_id=household,
                kind="succeed",
                payload="{}",
                max_attempts=1,
                on_interrupt=OnInterrupt.FAIL,
            ),
        )
        raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        store.write(enqueue_then_fail)

    assert heard.until_marker() == []


def test_data_version_changes_when_another_process_enqueues(make_store, household):
    listening = make_store(listen=True)
    enqueuing = make_store()
    listening.data_version()
    wait_for(lambda: listening._listener.listening)
    before = listening.data_version()

    enqueue(enqueuing, household)

    wait_for(lambda: listening.data_version() != before)


def test_closing_the_store_wakes_its_listener_out_of_its_wait(make_store, monkeypatch):
    # A wait far longer than the stop's join: only the wake-up can end the
    # listener in time.
    monkeypatch.setattr(notify, "_LISTEN_WAKE_SECONDS", 60.0)
    listening = make_store(listen=True)
    listening.read(lambda conn: conn.execute("SELECT 1").fetchone())  # its pool open
    listening.data_version()
    wait_for(lambda: listening._listener.listening)
    listener = listening._listener

    listening.close()

    assert not listener._thread.is_alive()


def test_without_listen_no_connection_listens_and_data_version_still_moves(store, pg_url):
    first = store.data_version()

    wait_for(lambda: store.data_version() != first)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        listeners = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query ILIKE 'LISTEN%%'"
        ).fetchone()[0]
    assert listeners == 0
    assert store._listener is None


# -- the tests' own support -------------------------------------------------------------------


def test_without_a_server_tests_fail_under_ci_and_are_skipped_elsewhere(monkeypatch):
    monkeypatch.setattr(postgres_support, "POSTGRES_URL", None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="MEALQUEST_TEST_POSTGRES_URL"):
        postgres_support.require_postgres_url()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="scripts/postgres start"):
        postgres_support.require_postgres_url()


def test_a_database_handed_out_again_is_as_new():
    server = require_postgres_url()
    with fresh_database(server, migrated=True) as first:
        left_open = psycopg.connect(first, autocommit=True)
        left_open.execute("INSERT INTO households (name, created_at) VALUES ('x', now())")

    with fresh_database(server, migrated=True) as second, psycopg.connect(second) as conn:
        assert second == first  # the same database, emptied
        # Only what the migrations insert: the system household.
        assert conn.execute("SELECT id, name FROM households").fetchall() == [(0, "system")]
        new_id = conn.execute(
            "INSERT INTO households (name, created_at) VALUES ('y', now()) RETURNING id"
        ).fetchone()[0]
        assert new_id == 1
    with pytest.raises(psycopg.OperationalError):
        left_open.execute("SELECT 1")  # cut when its test ended
    left_open.close()
