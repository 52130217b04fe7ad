"""Group commit in the SQLite store: writes queued while the writer is busy share one commit,
yet each caller returns only once its own write has committed and fails only by its own error."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import gevent
import pytest

from mealquest.db.sqlite.store import SqliteStore, SqliteTransaction
from tests.conftest import wait_for

pytestmark = pytest.mark.sqlite_only("the SQLite writer thread's group commit")

NOW = "2025-01-01T00:00:00.000000Z"


class Boom(Exception):
    pass


def insert_household(tx: SqliteTransaction, name: str) -> int:
    return tx.execute(
        "INSERT INTO households (name, created_at) VALUES (?, ?) RETURNING id", (name, NOW)
    ).fetchone()[0]


def committed_names(path: str) -> list[str]:
    """The households another connection sees committed (any thread: plain sqlite3)."""
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT name FROM households WHERE id <> 0")]
    finally:
        conn.close()


def queue_behind_a_busy_writer(
    store: SqliteStore, writes: list[tuple[Callable[..., Any], tuple]]
) -> list[gevent.Greenlet]:
    """Hold the writer thread in a write until every one of `writes` is queued, then let it go:
    they arrive while the writer is busy, as concurrent requests do under load."""
    entered, gate = threading.Event(), threading.Event()

    def held(tx: SqliteTransaction) -> None:
        entered.set()
        gate.wait(30)  # a native wait, in the writer thread

    first = gevent.spawn(store.write, held)
    wait_for(entered.is_set)
    queued = []

    def call(fn: Callable[..., Any], args: tuple) -> Any:
        # Nothing yields between this and the request joining the writer's queue.
        queued.append(fn)
        return store.write(fn, *args)

    greenlets = [gevent.spawn(call, fn, args) for fn, args in writes]
    wait_for(lambda: len(queued) == len(writes))
    gate.set()
    gevent.joinall([first, *greenlets], timeout=30)
    assert first.successful()
    assert all(g.ready() for g in greenlets)
    return greenlets


def test_writes_queued_while_the_writer_is_busy_share_one_commit(store, db_path):
    seen: dict[int, list[str]] = {}
    answered: dict[int, list[str]] = {}

    def write(tx: SqliteTransaction, n: int) -> int:
        # Another connection, now: which of the writes before this one have committed.
        seen[n] = committed_names(db_path)
        insert_household(tx, f"h{n}")
        tx.after_commit(lambda: answered.setdefault(n, committed_names(db_path)))
        return n

    greenlets = queue_behind_a_busy_writer(store, [(write, (n,)) for n in range(8)])

    assert [g.value for g in greenlets] == list(range(8))
    # One transaction: no write of the group saw an earlier one committed...
    assert all(names == [] for names in seen.values()), seen
    # ...and each caller had its own row committed when it was answered.
    for n in range(8):
        assert f"h{n}" in answered[n]
    assert sorted(committed_names(db_path)) == sorted(f"h{n}" for n in range(8))


def test_a_failing_write_in_a_group_rolls_back_only_its_own_changes(store, db_path):
    called: list[int] = []

    def write(tx: SqliteTransaction, n: int) -> int:
        tx.after_commit(lambda: called.append(n))
        insert_household(tx, f"h{n}")
        if n == 2:
            raise Boom(n)
        if n == 5:
            # A statement SQLite refuses (NOT NULL), after this write's first insert.
            tx.execute("INSERT INTO households (name, created_at) VALUES (NULL, ?)", (NOW,))
        return n

    greenlets = queue_behind_a_busy_writer(store, [(write, (n,)) for n in range(8)])

    assert isinstance(greenlets[2].exception, Boom)
    assert isinstance(greenlets[5].exception, sqlite3.IntegrityError)
    ok = [0, 1, 3, 4, 6, 7]
    assert [greenlets[n].value for n in ok] == ok
    assert sorted(committed_names(db_path)) == [f"h{n}" for n in ok]
    # Callbacks only for the writes that committed.
    assert sorted(called) == ok


def test_after_commit_callbacks_run_after_the_shared_commit_in_the_callers_order(store, db_path):
    order: list[tuple[int, int]] = []

    def write(tx: SqliteTransaction, n: int) -> None:
        insert_household(tx, f"h{n}")
        tx.after_commit(lambda: order.append((n, len(committed_names(db_path)))))

    queue_behind_a_busy_writer(store, [(write, (n,)) for n in range(6)])

    # In the order the writes were asked for, each seeing the whole group committed.
    assert order == [(n, 6) for n in range(6)]


def test_a_storage_fault_in_a_group_runs_its_writes_again_one_by_one(store, db_path):
    """A fault of the storage, not of one write, fails the transaction: nothing of it
    commits, and every write runs again alone, so no caller fails by another's write."""
    runs: dict[int, int] = {}

    def write(tx: SqliteTransaction, n: int) -> int:
        runs[n] = runs.get(n, 0) + 1
        insert_household(tx, f"h{n}")
        if n == 3 and runs[n] == 1:
            error = sqlite3.OperationalError("disk I/O error")
            error.sqlite_errorcode = sqlite3.SQLITE_IOERR  # as SQLite's own would carry
            error.sqlite_errorname = "SQLITE_IOERR"
            raise error
        return n

    greenlets = queue_behind_a_busy_writer(store, [(write, (n,)) for n in range(6)])

    assert [g.value for g in greenlets] == list(range(6))
    # Each row once: the group's first transaction was rolled back whole.
    assert sorted(committed_names(db_path)) == [f"h{n}" for n in range(6)]
    assert runs[3] == 2
    assert store.write_fault is None


def test_a_write_alone_still_commits_by_itself(store, db_path):
    seen: list[list[str]] = []

    def write(tx: SqliteTransaction, n: int) -> None:
        seen.append(committed_names(db_path))
        insert_household(tx, f"h{n}")

    for n in range(3):
        store.write(write, n)
    assert seen == [[], ["h0"], ["h0", "h1"]]


@pytest.mark.parametrize("count", [70])
def test_a_group_is_bounded_and_every_write_is_answered(store, db_path, count):
    greenlets = queue_behind_a_busy_writer(
        store, [(insert_household, (f"h{n}",)) for n in range(count)]
    )
    assert all(g.successful() for g in greenlets)
    assert len(committed_names(db_path)) == count
