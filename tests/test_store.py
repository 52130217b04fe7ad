"""The store: writes in one native thread, cooperative waits, deadlines, isolation, fork."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time

import gevent
import pytest

from mealquest.db.errors import (
    StoreUnavailable,
    StoreUsedAcrossFork,
    StoreWriterDied,
    StoreWriterUnresponsive,
)
from mealquest.db.sqlite import migrate
from mealquest.db.sqlite.checkpoints import AFTER_WRITES as _CHECKPOINT_AFTER_WRITES
from mealquest.db.sqlite.checkpoints import (
    HUB_WRITES_UNCHECKPOINTED as _HUB_WRITES_UNCHECKPOINTED,
)
from mealquest.db.sqlite.store import (
    SqliteStore,
)
from mealquest.extensions import get_store
from mealquest.jobs.service import get_jobs
from tests.conftest import wait_for
from tests.support import sql
from tests.support.write_lock import LockHolder

pytestmark = pytest.mark.sqlite_only(
    "SQLite's store itself: its writer thread, cooperative waits and fork checks"
)

NOW = "2025-01-01T00:00:00.000000Z"


class Ticker:
    """A greenlet counting 10 ms ticks while the block runs: it ticks only if
    the hub is free, so a frozen process shows as no ticks."""

    def __init__(self) -> None:
        self.ticks = 0
        self._greenlet: gevent.Greenlet | None = None

    def _tick(self) -> None:
        while True:
            gevent.sleep(0.01)
            self.ticks += 1

    def __enter__(self) -> Ticker:
        self._greenlet = gevent.spawn(self._tick)
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._greenlet is not None
        self._greenlet.kill()


def insert_household(tx, name):
    return tx.execute(
        "INSERT INTO households (name, created_at) VALUES (?, ?) RETURNING id", (name, NOW)
    ).fetchone()[0]


def household_names(store):
    return store.read(
        lambda conn: [
            r[0] for r in conn.execute("SELECT name FROM households WHERE id <> 0 ORDER BY id")
        ]
    )


# -- contract ---------------------------------------------------------------------------------


def test_write_commits_and_returns_the_function_result(store):
    household_id = store.write(insert_household, "Smiths")
    assert isinstance(household_id, int)
    assert household_names(store) == ["Smiths"]


def test_write_rolls_back_and_reraises_when_the_function_raises(store):
    class Boom(Exception):
        pass

    def insert_then_raise(tx):
        insert_household(tx, "gone")
        raise Boom("no")

    with pytest.raises(Boom):
        store.write(insert_then_raise)
    assert household_names(store) == []
    # The writer connection is usable again afterwards.
    store.write(insert_household, "kept")
    assert household_names(store) == ["kept"]


def test_write_takes_the_write_lock_at_begin(store, db_path):
    """BEGIN IMMEDIATE: while a write function runs, no other connection can write."""

    def try_other_writer(tx):
        other = sqlite3.connect(db_path, isolation_level=None, timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            return str(error)
        finally:
            other.close()
        return "other writer got the lock"

    assert store.write(try_other_writer) == "database is locked"


def test_write_runs_in_a_native_thread_and_after_commit_in_the_caller(store):
    seen = {}

    def write(tx):
        seen["thread"] = threading.get_ident()
        tx.after_commit(
            lambda: seen.setdefault("callback", (threading.get_ident(), gevent.getcurrent()))
        )
        insert_household(tx, "x")

    store.write(write)
    assert seen["thread"] != threading.get_ident()
    assert seen["callback"] == (threading.get_ident(), gevent.getcurrent())


def test_after_commit_callbacks_of_a_rolled_back_write_never_run(store):
    called = []

    def write(tx):
        tx.after_commit(lambda: called.append(1))
        raise ValueError("rolled back")

    with pytest.raises(ValueError, match="rolled back"):
        store.write(write)
    assert called == []


def test_foreign_keys_are_on_for_writes_and_reads(store):
    def orphan_token(tx):
        tx.execute(
            "INSERT INTO api_tokens (household_id, token_sha256, created_at) VALUES (?, ?, ?)",
            (999, "0" * 64, NOW),
        )

    with pytest.raises(sqlite3.IntegrityError):
        store.write(orphan_token)
    assert store.write(lambda tx: tx.execute("PRAGMA foreign_keys").fetchone()[0]) == 1
    assert store.read(lambda conn: conn.execute("PRAGMA foreign_keys").fetchone()[0]) == 1


def test_the_store_keeps_temporary_tables_in_memory_and_migrations_do_not(store, db_path):
    # 2 is MEMORY: a statement's sorts and subqueries are not set up in a file
    # each time it runs (the claim cost five times as much that way).
    assert store.write(lambda tx: tx.execute("PRAGMA temp_store").fetchone()[0]) == 2
    assert store.read(lambda conn: conn.execute("PRAGMA temp_store").fetchone()[0]) == 2
    # A migration's CREATE INDEX sorts a whole table: that may spill to a file.
    conn = migrate._open(db_path)
    try:
        assert conn.execute("PRAGMA temp_store").fetchone()[0] == 0
    finally:
        conn.close()


def test_reads_cannot_write(store):
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        store.read(lambda conn: conn.execute("DELETE FROM households"))


def test_synchronous_is_configurable_and_checked(db_path):
    store = SqliteStore(db_path, synchronous="full")
    try:
        assert store.write(lambda tx: tx.execute("PRAGMA synchronous").fetchone()[0]) == 2
    finally:
        store.close()
    with pytest.raises(ValueError, match="synchronous"):
        SqliteStore(db_path, synchronous="SOMETIMES")


def test_data_version_changes_when_another_connection_commits(store, db_path):
    before = store.data_version()
    assert store.data_version() == before
    other = sqlite3.connect(db_path, isolation_level=None)
    try:
        other.execute("INSERT INTO households (name, created_at) VALUES ('other', ?)", (NOW,))
    finally:
        other.close()
    assert store.data_version() != before


def test_the_app_store_follows_the_app_config(make_app, db_path):
    app = make_app(DB_SYNCHRONOUS="FULL", DB_BUSY_TIMEOUT_SECONDS=0.3)
    store = get_store(app)
    assert store.path == db_path
    assert store.synchronous == "FULL"
    assert store.busy_timeout_seconds == pytest.approx(0.3)


# -- another process holds the lock -----------------------------------------------------------


def test_a_write_waits_for_another_process_without_freezing_the_process(make_app, lock_holder):
    store = get_store(make_app(DB_BUSY_TIMEOUT_SECONDS=60.0))
    lock_holder.hold()
    state = {"ticks": 0, "write_done": False, "released_while_waiting": None, "reads": 0}

    def ticker():
        while not state["write_done"]:
            gevent.sleep(0.02)
            state["ticks"] += 1
            if state["ticks"] % 10 == 0:
                # WAL: reads go on while another process holds the write lock.
                state["reads"] += len(household_names(store)) + 1
            if state["ticks"] == 100:
                # About 2 s in: the write must still be waiting, then the lock goes.
                state["released_while_waiting"] = not state["write_done"]
                lock_holder.release()

    ticking = gevent.spawn(ticker)
    try:
        household_id = store.write(insert_household, "waited")
        state["write_done"] = True
    finally:
        ticking.kill()

    assert state["released_while_waiting"] is True
    assert state["ticks"] >= 100
    assert state["reads"] >= 10
    assert household_names(store) == ["waited"]
    assert isinstance(household_id, int)


def test_a_lock_held_past_the_deadline_is_store_unavailable(make_app, lock_holder):
    store = get_store(make_app(DB_BUSY_TIMEOUT_SECONDS=0.3))
    store.write(insert_household, "before")
    lock_holder.hold()
    with Ticker() as ticker:
        with pytest.raises(StoreUnavailable):
            store.write(insert_household, "refused")
        # Several writes queued behind each other all end with the clear error too.
        waiting = [gevent.spawn(store.write, insert_household, f"q{n}") for n in range(3)]
        gevent.joinall(waiting, timeout=30)
        assert all(isinstance(g.exception, StoreUnavailable) for g in waiting)
    assert ticker.ticks > 5
    assert household_names(store) == ["before"]

    lock_holder.release()
    store.write(insert_household, "after")
    assert household_names(store) == ["before", "after"]


def test_a_single_enqueue_is_written_on_the_hub_only_while_nothing_could_make_it_wait(
    make_app, household, lock_holder
):
    app = make_app(DB_BUSY_TIMEOUT_SECONDS=60.0)
    jobs, store = get_jobs(app), get_store(app)

    def enqueue(value: int) -> str:
        return jobs.enqueue("succeed", {"value": value}, household_id=household.household_id)

    made = [enqueue(0)]  # the writer thread's first write
    made.append(enqueue(1))
    assert store.hub_writes == 1

    # Another process holds the lock: the enqueue waits in the writer thread,
    # the hub free meanwhile, and is made once the lock goes.
    lock_holder.hold()
    with Ticker() as ticker:
        waiting = gevent.spawn(enqueue, 2)
        wait_for(lambda: ticker.ticks >= 20)
        assert not waiting.ready()
        lock_holder.release()
        made.append(waiting.get(timeout=30))

    # The writer thread busy with a write of ours: the enqueue queues behind
    # it (and commits with the writes grouped there), never beside it.
    holding, release = threading.Event(), threading.Event()

    def hold(tx):
        holding.set()
        release.wait(30)  # natively, in the writer thread

    holder = gevent.spawn(store.write, hold)
    wait_for(holding.is_set)
    behind = gevent.spawn(enqueue, 3)
    wait_for(lambda: store._writer._pending == 2)  # queued behind `hold`
    assert not behind.ready()
    release.set()
    holder.get(timeout=10)
    made.append(behind.get(timeout=10))

    assert store.hub_writes == 1
    made.append(enqueue(4))  # the lock free again: on the hub
    assert store.hub_writes == 2
    assert sorted(row["id"] for row in sql.rows(store, "SELECT id FROM jobs")) == sorted(made)


def test_writes_on_the_hub_are_checkpointed_by_the_writer_thread(make_app, household):
    app = make_app(JOB_MAX_PENDING_PER_HOUSEHOLD=1_000)
    jobs, store = get_jobs(app), get_store(app)
    for _ in range(_CHECKPOINT_AFTER_WRITES):
        store.write(lambda tx: tx.execute("SELECT 1"))
    # The thread checkpointed in its pause, and sleeps until a call comes.
    wait_for(lambda: store.checkpoints.since_checkpoint() == 0)

    for value in range(_CHECKPOINT_AFTER_WRITES):
        jobs.enqueue("succeed", {"value": value}, household_id=household.household_id)

    assert store.hub_writes == _CHECKPOINT_AFTER_WRITES
    # No call came, yet it checkpoints again, as after its own writes.
    wait_for(lambda: store.checkpoints.since_checkpoint() == 0)

    # A WAL left uncheckpointed that long (the thread had no pause): the next
    # enqueue goes to the thread, whose COMMIT may checkpoint, never the hub's.
    store.checkpoints.hub_writes += _HUB_WRITES_UNCHECKPOINTED
    jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    assert store.hub_writes == _CHECKPOINT_AFTER_WRITES + _HUB_WRITES_UNCHECKPOINTED
    # Which checkpointed the WAL: the hub writes again.
    assert store.checkpoints.hub_may_write()
    assert store.checkpoints.since_checkpoint() == 0
    jobs.enqueue("succeed", {"value": 2}, household_id=household.household_id)
    assert store.hub_writes == _CHECKPOINT_AFTER_WRITES + _HUB_WRITES_UNCHECKPOINTED + 1
    # Nor does a COMMIT on the hub ever run SQLite's own checkpoint.
    assert store._hub.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0


def test_a_read_kept_out_by_a_lock_retries_cooperatively_until_the_deadline(tmp_path):
    # WAL readers are never kept out, so this uses a rollback-journal file,
    # where another process's EXCLUSIVE lock blocks reads too.
    path = str(tmp_path / "journal.sqlite3")
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("CREATE TABLE t (x INTEGER)")
    setup.execute("INSERT INTO t VALUES (1)")
    setup.close()
    store = SqliteStore(path, busy_timeout_seconds=0.3)
    holder = LockHolder(path, mode="EXCLUSIVE")
    try:
        with Ticker() as ticker:
            holder.hold()
            with pytest.raises(StoreUnavailable):
                store.read(lambda conn: conn.execute("SELECT x FROM t").fetchall())
        assert ticker.ticks > 5
        holder.release()
        assert store.read(lambda conn: conn.execute("SELECT x FROM t").fetchone()[0]) == 1
    finally:
        holder.stop()
        store.close()


def test_a_queued_write_waits_for_the_lock_only_until_its_own_deadline(make_app):
    """The deadline covers the time a write spent queued behind others, not just the lock wait."""
    store = get_store(make_app(DB_BUSY_TIMEOUT_SECONDS=30.0))
    entered = threading.Event()
    gate = threading.Event()

    def busy_timeout(tx):
        return tx.execute("PRAGMA busy_timeout").fetchone()[0]

    def held(tx):
        entered.set()
        gate.wait(30)  # a native wait, in the writer thread
        return busy_timeout(tx)

    first = gevent.spawn(store.write, held)
    wait_for(entered.is_set)
    queued_at = time.monotonic()
    second = gevent.spawn(store.write, busy_timeout)
    wait_for(lambda: time.monotonic() > queued_at + 2.0)
    gate.set()
    gevent.joinall([first, second], timeout=30, raise_error=True)
    assert first.value <= 30_000
    assert second.value <= 28_000


# -- isolation between greenlets --------------------------------------------------------------


def test_concurrent_writes_never_mix_transactions(store):
    class Rollback(Exception):
        pass

    def write(tx, n):
        for part in range(3):
            insert_household(tx, f"{n}-{part}")
        if n % 2:
            raise Rollback(n)
        return n

    greenlets = [gevent.spawn(store.write, write, n) for n in range(60)]
    gevent.joinall(greenlets, timeout=60)

    assert all(g.ready() for g in greenlets)
    for n, g in enumerate(greenlets):
        if n % 2:
            assert isinstance(g.exception, Rollback)
        else:
            assert g.value == n
    expected = sorted(f"{n}-{part}" for n in range(0, 60, 2) for part in range(3))
    assert sorted(household_names(store)) == expected


def test_writes_interleaved_with_reads_see_only_committed_rows(store):
    seen = []

    def reader():
        for _ in range(50):
            names = household_names(store)
            # A transaction's three rows are seen together or not at all.
            prefixes = {}
            for name in names:
                prefix = name.split("-")[0]
                prefixes[prefix] = prefixes.get(prefix, 0) + 1
            seen.append(all(count == 3 for count in prefixes.values()))
            gevent.sleep(0)

    def write(tx, n):
        for part in range(3):
            insert_household(tx, f"{n}-{part}")

    reading = gevent.spawn(reader)
    writers = [gevent.spawn(store.write, write, n) for n in range(20)]
    gevent.joinall([reading, *writers], timeout=60, raise_error=True)
    assert seen
    assert all(seen)


# -- fork -------------------------------------------------------------------------------------


def test_the_store_refuses_use_after_fork(store):
    store.write(insert_household, "parent")
    assert household_names(store) == ["parent"]

    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 0
        try:
            store.read(lambda conn: conn.execute("SELECT 1").fetchone())
            code |= 1
        except StoreUsedAcrossFork:
            pass
        except BaseException:
            code |= 2
        try:
            store.write(insert_household, "child")
            code |= 4
        except StoreUsedAcrossFork:
            pass
        except BaseException:
            code |= 8
        try:
            store.close()  # a no-op in another process: it must not touch the parent's
        except BaseException:
            code |= 16
        os._exit(code)

    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's store is untouched and the child wrote nothing.
    store.write(insert_household, "parent again")
    assert household_names(store) == ["parent", "parent again"]


def test_wait_for_lets_greenlets_run():
    done = []
    gevent.spawn(lambda: done.append(True))
    assert wait_for(lambda: done) == [True]


# -- supervision: the writer thread and its connection ----------------------------------------


class Sabotage(Exception):
    """Raised by a test's own callback inside the writer thread."""


class Fatal(BaseException):
    """Raised by a test's own callback to end the writer thread."""


def settle(greenlet: gevent.Greenlet) -> gevent.Greenlet:
    """Wait for a store call spawned by the test; a call that never returns fails the test."""
    greenlet.join(timeout=30)
    assert greenlet.ready(), "the store call never returned"
    return greenlet


def sabotage_checkpoint(tx, effect):
    """Make the idle checkpoint's row go through `effect` (a row factory on our connection)."""

    def row_factory(cursor, row):
        if cursor.description[0][0] == "busy":  # PRAGMA wal_checkpoint's row
            effect()
        return sqlite3.Row(cursor, row)

    tx.conn.row_factory = row_factory


def checkpoint_soon(store):
    # The writer checkpoints in its first pause after this many writes.
    for n in range(_CHECKPOINT_AFTER_WRITES):
        store.write(insert_household, f"h{n}")


def test_a_failed_rollback_reopens_the_connection(store):
    def close_then_raise(tx):
        insert_household(tx, "gone")
        tx.conn.close()  # the ROLLBACK after this raise cannot run
        raise Sabotage("no")

    with pytest.raises(Sabotage):
        settle(gevent.spawn(store.write, close_then_raise)).get()
    assert store.write(insert_household, "kept")
    assert household_names(store) == ["kept"]


def test_a_failed_commit_and_rollback_reopen_the_connection(store):
    def close_and_return(tx):
        insert_household(tx, "gone")
        tx.conn.close()

    with pytest.raises(sqlite3.ProgrammingError):
        settle(gevent.spawn(store.write, close_and_return)).get()
    assert store.write(insert_household, "kept")
    assert household_names(store) == ["kept"]
    assert not store.broken


def test_a_failing_idle_checkpoint_is_logged_and_the_writer_serves_on(store, logs):
    def fail():
        raise Sabotage("checkpoint sabotaged")

    store.write(sabotage_checkpoint, fail)
    checkpoint_soon(store)
    wait_for(lambda: any(r.levelno == logging.ERROR for r in logs.records))
    [record] = [r for r in logs.records if r.levelno == logging.ERROR]
    assert "idle task failed" in record.getMessage()
    assert record.exc_info is not None
    assert record.exc_info[0] is Sabotage

    assert settle(gevent.spawn(store.write, insert_household, "after")).get()
    assert not store.broken
    assert household_names(store)[-1] == "after"


def test_a_dead_writer_thread_is_logged_and_every_write_fails_at_once(app, store, logs):
    entered = threading.Event()
    gate = threading.Event()

    def die():
        entered.set()
        gate.wait(30)  # a native wait, in the writer thread, while a write queues
        raise Fatal("writer thread ended")

    store.write(sabotage_checkpoint, die)
    checkpoint_soon(store)
    wait_for(entered.is_set)
    calling = []

    def queued_write():
        calling.append(True)
        return store.write(insert_household, "queued")

    queued = gevent.spawn(queued_write)
    wait_for(lambda: calling)  # it has run until it waits for the writer thread
    gate.set()

    # Queued and later writes fail at once with a clear error, not at their deadline.
    assert isinstance(settle(queued).exception, StoreWriterDied)
    assert store.broken
    later = settle(gevent.spawn(store.write, insert_household, "later"))
    assert isinstance(later.exception, StoreWriterDied)
    assert isinstance(later.exception, StoreUnavailable)
    [record] = [r for r in logs.records if r.getMessage().startswith("the store's writer thread")]
    assert record.levelno == logging.ERROR
    assert "died" in record.getMessage()
    assert record.exc_info is not None
    assert record.exc_info[0] is Fatal

    answer = app.test_client().get("/healthz")
    assert answer.status_code == 503
    assert answer.get_json()["error"]["code"] == "unavailable"
    assert "Retry-After" in answer.headers
    # Reads go on; nothing queued was written.
    assert "queued" not in household_names(store)


def test_a_write_without_an_answer_by_its_deadline_gives_up_and_is_rolled_back(make_app):
    store = get_store(make_app(DB_BUSY_TIMEOUT_SECONDS=0.3))
    gate = threading.Event()

    def held(tx):
        insert_household(tx, "held")
        gate.wait(60)  # a native wait, in the writer thread, until the test says

    try:
        stuck = settle(gevent.spawn(store.write, held))
        assert isinstance(stuck.exception, StoreWriterUnresponsive)
        assert not gate.is_set()
    finally:
        gate.set()
    # The writer comes back; the write its caller gave up on was not committed.
    assert settle(gevent.spawn(store.write, insert_household, "after")).get()
    assert household_names(store) == ["after"]
    assert not store.broken
