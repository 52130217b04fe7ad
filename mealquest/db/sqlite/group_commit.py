"""The writer thread's side of an SQLite store: its connection, its
transactions and group commit, and the storage fault it met.

Writes that other greenlets asked for while the thread was busy run together
in one transaction, each inside its own savepoint, and share one COMMIT (one
WAL append and sync instead of one per write: see `run_writes`). Everything
here runs in the native writer thread (`mealquest.db.sqlite.writer`): no
gevent calls. The fault it records is read by the hub (`SqliteStore`), and
written here only.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar

from mealquest.db.driver import Transaction
from mealquest.db.errors import StorageFault, StoreBusy, StoreUnavailable
from mealquest.db.sqlite import checkpoints
from mealquest.db.sqlite.checkpoints import Checkpoints
from mealquest.db.sqlite.connection import (
    SqliteTransaction,
    connect,
    has_room,
    is_busy,
    storage_fault,
)

T = TypeVar("T")

# A caller of `SqliteStore.write` waits this much past the write's deadline for its
# answer (the function and the COMMIT run after the lock wait ends), then
# gives up with StoreWriterUnresponsive. The thread does not start a COMMIT
# later than half of it past the deadline, so a caller that gave up is not
# committed behind its back unless the COMMIT itself hangs.
ANSWER_MARGIN_SECONDS = 2.0
# `truncate_wal` waits this long for readers.
FORGET_BUSY_MS = 100


@dataclass(slots=True)
class Write:
    """One caller's `SqliteStore.write`, queued for the writer thread."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    deadline: float


class ThreadWrites:
    """The writer thread's connection and writes (see the module)."""

    def __init__(
        self,
        path: str,
        synchronous: str,
        checkpoints: Checkpoints,
        rewrite_header: Callable[[Transaction], None],
    ) -> None:
        self.path = path
        self.synchronous = synchronous
        self.checkpoints = checkpoints
        # A write of this function proves the storage writable again.
        self.rewrite_header = rewrite_header
        self.conn: sqlite3.Connection | None = None
        # Set when a write meets a storage fault, cleared when a write that
        # changed something commits (see `_end_write_fault`).
        self.fault: StorageFault | None = None

    def run_writes(self, writes: list[Write]) -> list[tuple[bool, Any]]:
        """Each write's outcome, `(True, (result, callbacks))` or `(False, error)`.

        A write alone runs in a transaction of its own, as it always did. A
        group shares one: each write inside a savepoint, rolled back to if it
        raises, released if it returns, then one COMMIT for all that returned.
        A write whose deadline passed while the group waited for the lock is
        StoreBusy without running. What fails the transaction rather than one
        write (the lock not had, a storage fault, a savepoint that will not
        roll back, a failed COMMIT) rolls the whole group back and runs each
        write again alone, so that each caller meets the storage's answer
        itself and none is failed by another's write.
        """
        # Runs in the native writer thread: no gevent calls here.
        if len(writes) == 1:
            return [self._outcome(writes[0])]
        outcomes: list[tuple[bool, Any] | None] = [None] * len(writes)
        now = time.monotonic()
        live = []
        for index, write in enumerate(writes):
            if write.deadline <= now:
                outcomes[index] = (False, StoreBusy())
            else:
                live.append(index)
        if live and not self._run_group(writes, live, outcomes):
            for index in live:
                outcomes[index] = self._outcome(writes[index])
        return [outcome for outcome in outcomes if outcome is not None]

    def _outcome(self, write: Write) -> tuple[bool, Any]:
        # In the writer thread: one write in its own transaction.
        try:
            return True, self._run_write(write.fn, write.args, write.kwargs, write.deadline)
        except BaseException as error:
            return False, error

    def _run_group(
        self, writes: list[Write], live: list[int], outcomes: list[tuple[bool, Any] | None]
    ) -> bool:
        """Run the `live` writes in one transaction, filling in their outcomes;
        False if the transaction failed as a whole (then nothing of it committed)."""
        # In the writer thread.
        try:
            # The lock is waited for until the earliest deadline: no caller waits
            # past its own for an answer. If it is not had by then, the writes run
            # alone, each waiting until its own deadline (the earliest's is over).
            conn = self._begin(min(writes[index].deadline for index in live))
        except Exception:
            return False
        changes = conn.total_changes if self.fault is not None else 0
        done: list[tuple[int, Any, SqliteTransaction]] = []
        rewrote_header = False
        for index in live:
            write = writes[index]
            if time.monotonic() > write.deadline:
                # It waited for the lock past its deadline, as alone it would have.
                outcomes[index] = (False, StoreBusy())
                continue
            tx = SqliteTransaction(conn)
            try:
                conn.execute("SAVEPOINT grouped_write")
                result = write.fn(tx, *write.args, **write.kwargs)
                if time.monotonic() > write.deadline + ANSWER_MARGIN_SECONDS / 2:
                    # Its caller is about to give up: do not commit behind its back.
                    raise StoreBusy()
                conn.execute("RELEASE grouped_write")
            except BaseException as error:
                if isinstance(error, sqlite3.Error) and (
                    is_busy(error) or storage_fault(error) is not None
                ):
                    self._roll_back(conn)
                    return False
                try:
                    conn.execute("ROLLBACK TO grouped_write")
                    conn.execute("RELEASE grouped_write")
                except sqlite3.Error:
                    self._roll_back(conn)
                    return False
                outcomes[index] = (False, error)
                continue
            rewrote_header = rewrote_header or write.fn is self.rewrite_header
            done.append((index, result, tx))
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as error:
            self._roll_back(conn)
            self._write_failed(error)
            return False
        if self.fault is not None:
            self._end_write_fault(conn, changes, rewrote_header)
        self.checkpoints.thread_wrote(conn, len(done))
        for index, result, tx in done:
            outcomes[index] = (True, (result, tx.after_commit_callbacks))
        return True

    def _begin(self, deadline: float) -> sqlite3.Connection:
        """The writer connection in a `BEGIN IMMEDIATE` transaction, the lock
        waited for until `deadline` at most (writer thread)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StoreBusy()
        # Wait for the lock only until this write's deadline: a write queued
        # behind others has already spent part of its time waiting its turn.
        busy_timeout_ms = max(1, int(remaining * 1000))
        try:
            if self.conn is None:
                conn = connect(
                    self.path, synchronous=self.synchronous, busy_timeout_ms=busy_timeout_ms
                )
                # See `mealquest.db.sqlite.checkpoints`.
                conn.execute(f"PRAGMA wal_autocheckpoint = {checkpoints.WAL_AUTOCHECKPOINT_PAGES}")
                self.conn = conn
            conn = self.conn
            conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as error:
            unavailable = self._write_failed(error)
            if unavailable is None:
                raise
            raise unavailable from None
        return conn

    def _run_write(
        self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], deadline: float
    ) -> tuple[T, list[Callable[[], None]]]:
        # Runs in the native writer thread: no gevent calls here.
        conn = self._begin(deadline)
        tx = SqliteTransaction(conn)
        # Only while a fault lasts: whether this write changes anything.
        changes = conn.total_changes if self.fault is not None else 0
        try:
            result = fn(tx, *args, **kwargs)
            if time.monotonic() > deadline + ANSWER_MARGIN_SECONDS / 2:
                # Its caller is about to give up: do not commit behind its back.
                raise StoreBusy()
            conn.execute("COMMIT")
        except BaseException as error:
            self._roll_back(conn)
            if isinstance(error, sqlite3.Error):
                unavailable = self._write_failed(error)
                if unavailable is not None:
                    raise unavailable from None
            raise
        if self.fault is not None:
            self._end_write_fault(conn, changes, fn is self.rewrite_header)
        self.checkpoints.thread_wrote(conn, 1)
        return result, tx.after_commit_callbacks

    def _write_failed(self, error: sqlite3.Error) -> StoreUnavailable | None:
        """The StoreUnavailable a write's sqlite error means, if any (writer thread)."""
        if is_busy(error):
            # Nothing was committed; the lock is the problem, not the write.
            return StoreBusy()
        fault = storage_fault(error)
        if fault is not None:
            self.fault = fault
            # A connection opened read-only, or that met an I/O error, may stay
            # so: the next write opens a fresh one (about 0.1 ms, during faults only).
            self.close_conn()
        return fault

    def _roll_back(self, conn: sqlite3.Connection) -> None:
        # In the writer thread, after a failed write.
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except Exception:
            # A connection that cannot roll back (closed under us, or broken by
            # an I/O error) is in an unknown state: the next write opens a new one.
            self.close_conn()

    def _end_write_fault(
        self, conn: sqlite3.Connection, changes: int, rewrote_header: bool
    ) -> None:
        # In the writer thread, after a commit while a storage fault is recorded.
        # A commit that changed nothing wrote nothing and proves nothing.
        if not rewrote_header and conn.total_changes == changes:
            return
        fault = self.fault
        if fault is not None and fault.disk_full and not has_room(self.path):
            return
        self.fault = None

    def truncate_wal(self) -> bool:
        # In the writer thread, between transactions: a short busy wait, so
        # that writes queued behind it are not held.
        if self.conn is None:
            self.conn = connect(
                self.path, synchronous=self.synchronous, busy_timeout_ms=FORGET_BUSY_MS
            )
        conn = self.conn
        try:
            conn.execute(f"PRAGMA busy_timeout = {FORGET_BUSY_MS}")
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as error:
            if is_busy(error):
                return False
            raise
        return busy == 0 and os.path.getsize(self.path + "-wal") == 0

    def checkpoint_when_idle(self, calls_waiting: Callable[[], bool]) -> None:
        """In a pause of the writer thread's (see `mealquest.db.sqlite.checkpoints`),
        cut short once `calls_waiting()`. A failure is the thread's to log
        (from the hub), and SQLite's own checkpoint remains."""
        # Runs in the native writer thread: no gevent calls here.
        self.checkpoints.when_idle(self.conn, calls_waiting)

    def close_conn(self) -> None:
        # In the writer thread, so that `checkpoint_when_idle` never sees it closed.
        conn, self.conn = self.conn, None
        if conn is not None:
            with suppress(sqlite3.Error):
                conn.close()
