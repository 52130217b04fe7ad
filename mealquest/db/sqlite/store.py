"""The SQLite driver's store, shaped so that no SQLite lock wait ever blocks the gevent hub.

`sqlite3` is a blocking C library that gevent cannot patch: a write waiting on
another process's lock from a greenlet would freeze every greenlet of the
process (and gunicorn kills a worker whose hub is blocked too long). So:

* every write runs whole (`BEGIN IMMEDIATE` ... `COMMIT`) inside one native
  writer thread (`mealquest.db.sqlite.writer`), on the process's writer
  connection; the calling greenlet waits cooperatively. The one exception,
  `write_now` (a single enqueue), runs on the hub only when it cannot wait
  there: the lock free at once, the thread idle, no sync at commit;
* reads use their own connection with a tiny busy timeout and a cooperative
  retry, so a lock costs the hub milliseconds, not seconds;
* both give up at a deadline with `StoreUnavailable` (503 over HTTP), and so
  do storage faults (a full disk, a read-only file, an I/O error): callers
  see one "try again later" error, never a raw `sqlite3` one for these;
* connections and the thread are made lazily in the process that uses them
  and refuse to be used after a `fork`.

Which `StoreUnavailable` a caller gets says what happened:

* `StoreBusy`: another connection held the lock past the deadline; nothing
  of the write was committed;
* `StorageFault`: the storage refused the operation; nothing was committed.
  Logged once at ERROR when a run of them starts, counted while it lasts
  and summarised when it ends (`FaultLog`), not once per caller;
* `StoreWriterUnresponsive`: the writer thread gave no answer by the write's
  deadline plus a margin; the write may still commit (see `SqliteStore.write`);
* `StoreWriterDied`: the writer thread is dead; no write of this process can
  succeed again (`SqliteStore.broken`), the process must be restarted.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Hashable
from contextlib import suppress
from typing import Concatenate, ParamSpec, TypeVar

import gevent

from mealquest.db.driver import (
    AuditStatements,
    BatchStatements,
    FlowStatements,
    HistoryStatements,
    HouseholdStatements,
    JobStatements,
    OperationStatements,
    OperatorStatements,
    PeriodicStatements,
    ProcessStatements,
    Reads,
    RecipeStatements,
    RetentionStatements,
    SessionStatements,
    SignalStatements,
    StreamStatements,
    Transaction,
)
from mealquest.db.errors import (
    StorageFault,
    StoreBusy,
    StoreUnavailable,
    StoreUsedAcrossFork,
)
from mealquest.db.migrations import AppliedMigration, Ledger, Migration
from mealquest.db.options import SYNCHRONOUS_MODES
from mealquest.db.sqlite import (
    audit,
    batches,
    checkpoints,
    flow,
    history,
    households,
    jobs,
    migrate,
    operations,
    operators,
    periodic,
    processes,
    recipes,
    retention,
    sessions,
    signals,
    streams,
)
from mealquest.db.sqlite.checkpoints import Checkpoints
from mealquest.db.sqlite.connection import SqliteTransaction as SqliteTransaction
from mealquest.db.sqlite.connection import (
    connect,
    has_room,
    is_busy,
    storage_fault,
)
from mealquest.db.sqlite.faults import FaultLog
from mealquest.db.sqlite.group_commit import ANSWER_MARGIN_SECONDS, ThreadWrites, Write
from mealquest.db.sqlite.hub_writes import HubWrites
from mealquest.db.sqlite.writer import WriterThread

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

# A read on the hub thread may hold the hub this long per try before retrying.
_READ_BUSY_TIMEOUT_MS = 10
# `forget_deleted` retries after this pause (each try waits
# `group_commit.FORGET_BUSY_MS` for readers).
_FORGET_RETRY_SECONDS = 0.05
# `write_now` writes on the hub only where a COMMIT does not sync: with WAL,
# NORMAL and OFF append to the WAL and return.
_SYNCLESS_COMMITS = frozenset({"NORMAL", "OFF"})


class SqliteStore:
    """One process's access to an SQLite database: a writer thread and a reader
    connection. The SQLite driver's store (see `mealquest.db.driver.Store`)."""

    name = "sqlite"

    def __init__(
        self, path: str, *, synchronous: str = "NORMAL", busy_timeout_seconds: float = 5.0
    ) -> None:
        if synchronous.upper() not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}")
        self.path = path
        self.synchronous = synchronous.upper()
        self.busy_timeout_seconds = float(busy_timeout_seconds)
        self._pid = os.getpid()
        self._writer: WriterThread | None = None
        # The hub's own writes (`write_now`; hub thread only).
        self._hub = HubWrites(path, self.synchronous)
        # Counts of the hub's and the thread's writes, and the checkpoints.
        self.checkpoints = Checkpoints()
        # The writer thread's connection, transactions and fault.
        self._thread = ThreadWrites(path, self.synchronous, self.checkpoints, _rewrite_header)
        self._reader_conn: sqlite3.Connection | None = None
        # Counts the reader connections opened: a new one's `data_version`
        # starts afresh, so a change marker names its connection too.
        self._readers_opened = 0
        self._write_faults = FaultLog("writes")
        self._read_faults = FaultLog("reads")

    # -- the driver's SQL, migrations and description -----------------------------

    migrations_dir = migrate.MIGRATIONS_DIR
    jobs: JobStatements = jobs
    batches: BatchStatements = batches
    households: HouseholdStatements = households
    recipes: RecipeStatements = recipes
    periodic: PeriodicStatements = periodic
    retention: RetentionStatements = retention
    operators: OperatorStatements = operators
    sessions: SessionStatements = sessions
    operations: OperationStatements = operations
    flow: FlowStatements = flow
    processes: ProcessStatements = processes
    streams: StreamStatements = streams
    signals: SignalStatements = signals
    audit: AuditStatements = audit
    history: HistoryStatements = history

    def describe(self) -> str:
        """The database as messages name it."""
        return self.path

    def exists(self) -> bool:
        """Whether there is a database to read (looking never creates the file)."""
        return os.path.exists(self.path)

    def applied_migrations(self) -> dict[int, AppliedMigration]:
        return self.read(migrate.applied)

    def upgrade(self, target: int | None = None) -> list[Migration]:
        """Apply pending migrations (the foreground's job: it may wait on locks)."""
        return migrate.upgrade(self.path, self.migrations_dir, target=target)

    def migration_status(self) -> Ledger:
        """The ledger as this code sees it."""
        return migrate.status(self.path, self.migrations_dir)

    @property
    def broken(self) -> bool:
        """Whether the writer thread has died: every write raises StoreWriterDied
        until the process is restarted (a supervisor should restart it)."""
        writer = self._writer
        return writer is not None and writer.died is not None

    @property
    def write_fault(self) -> StorageFault | None:
        """The storage fault the last writes met, until a write commits again."""
        return self._thread.fault

    # -- writes -----------------------------------------------------------------

    def write(
        self,
        fn: Callable[Concatenate[Transaction, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run `fn(tx, ...)` as one write transaction in the writer thread.

        The transaction commits if `fn` returns and rolls back if it raises;
        either way nothing of it spans a greenlet switch. The caller waits at
        most the busy timeout plus a margin: StoreBusy and StorageFault say
        nothing was committed; StoreWriterUnresponsive that the answer did not
        come in time (a write whose COMMIT hangs that long may still commit);
        StoreWriterDied that this process can no longer write.

        Group commit: writes that other greenlets asked for while the writer
        thread was busy run together in one transaction, each inside its own
        savepoint, and share one COMMIT (one WAL append and sync instead of
        one per write: see `_run_writes`). Each still returns only once its
        own changes have committed, its `after_commit` callbacks run only
        then, and one that raises rolls back only its own changes. `fn` sees
        the changes of the writes grouped before it, as it would had they
        committed just before; it must leave nothing behind but its SQL and
        its callbacks, since a group that the storage fails is run again,
        write by write.
        """
        self._check_process()
        deadline = time.monotonic() + self.busy_timeout_seconds
        try:
            result, callbacks = self._writer_thread().call_grouped(
                Write(fn, args, kwargs, deadline),
                self.busy_timeout_seconds + ANSWER_MARGIN_SECONDS,
            )
        except StoreUnavailable as error:
            if not isinstance(error, StoreBusy):
                self._write_faults.failed(error)
            raise
        if self._write_faults.since is not None and self._thread.fault is None:
            self._write_faults.ended()
        for callback in callbacks:
            callback()
        written: T = result
        return written

    def write_now(
        self,
        fn: Callable[Concatenate[Transaction, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """`write` for a short write a caller waits for (a single enqueue): run
        at once on the calling thread, without the hop to the writer thread
        and back (about half of an enqueue's time), when nothing can make it
        wait there.

        That is when the writer thread has no write of this process queued or
        running, no storage fault is recorded, commits do not sync (WAL with
        `synchronous` NORMAL or OFF) and the lock is free at once: its busy
        timeout is 0, so another process's lock (or our writer thread's) is
        never waited for on the hub. Otherwise, and whenever SQLite refuses
        any part of it, the write is rolled back and made by `write`, which
        waits, groups, and records faults as always. `fn` may therefore run
        twice, as a grouped write's may. An exception of `fn`'s own is raised
        as `write` raises it, with nothing committed.
        """
        self._check_process()
        writer = self._writer
        if (
            writer is None
            or not writer.idle_for_this_hub()
            or self._thread.fault is not None
            or self.synchronous not in _SYNCLESS_COMMITS
            # A WAL that long is the thread's to checkpoint, in its COMMIT if
            # it has no pause: until then writes go there.
            or not self.checkpoints.hub_may_write()
        ):
            return self.write(fn, *args, **kwargs)
        done, result, callbacks = self._hub.attempt(fn, args, kwargs)
        if not done:
            return self.write(fn, *args, **kwargs)
        if self.checkpoints.hub_wrote():
            # Once: the thread checkpoints at its next pause, though no call came.
            writer.nudge()
        for callback in callbacks:
            callback()
        written: T = result
        return written

    def check_writable(self) -> None:
        """Raise StoreUnavailable unless a write can commit now; cheap enough for /healthz.

        Normally it takes the write lock and lets it go: in WAL mode a read
        would answer even while another process holds the lock, and nothing
        is written. That proves nothing about the disk, so while writes meet
        a storage fault it checks for free room first (a disk-full fault) and
        then really writes: page 1 of the database, by setting `user_version`
        to its own value. That write committing ends the fault.
        """
        fault = self._thread.fault
        if fault is None:
            self.write(_take_write_lock)
            return
        if fault.disk_full and not has_room(self.path):
            raise StorageFault(fault.name, fault.reason)
        self.write(_rewrite_header)

    def forget_deleted(self, timeout_seconds: float) -> bool:
        """Checkpoint the WAL and truncate it to nothing, in the writer thread,
        tried again until no reader's snapshot holds it back or
        `timeout_seconds` pass: the WAL keeps the pages of rows deleted since
        the last restart of its file, as they were before the delete."""
        self._check_process()
        deadline = time.monotonic() + timeout_seconds
        while True:
            if self._writer_thread().call(self._thread.truncate_wal, self.busy_timeout_seconds):
                return True
            if time.monotonic() >= deadline:
                return False
            gevent.sleep(_FORGET_RETRY_SECONDS)

    def _writer_thread(self) -> WriterThread:
        if self._writer is None:
            self._writer = WriterThread(
                self._thread.checkpoint_when_idle, checkpoints.IDLE_SECONDS, self._thread.run_writes
            )
        return self._writer

    @property
    def hub_writes(self) -> int:
        """The writes `write_now` made on the hub (for the tests)."""
        return self.checkpoints.hub_writes

    # -- reads ------------------------------------------------------------------

    def read(
        self, fn: Callable[Concatenate[Reads, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run the pure read `fn(conn, ...)` on the reader connection.

        A busy database is retried cooperatively (the hub runs between tries)
        until the deadline; `fn` may therefore run more than once. A storage
        fault is StorageFault.
        """
        self._check_process()
        deadline = time.monotonic() + self.busy_timeout_seconds
        delay = 0.001
        while True:
            conn = None
            try:
                # Opening is retried too: setting its pragmas may find the file locked.
                conn = self._reader()
                result = fn(conn, *args, **kwargs)
            except sqlite3.Error as error:
                if not is_busy(error):
                    fault = storage_fault(error, query_only=True)
                    if fault is None:
                        raise
                    self._close_reader_conn()
                    self._read_faults.failed(fault)
                    raise fault from None
                self._roll_back_reader(conn)
                if time.monotonic() + delay > deadline:
                    raise StoreBusy() from None
                gevent.sleep(delay)
                delay = min(delay * 2, 0.05)
            else:
                if self._read_faults.since is not None:
                    self._read_faults.ended()
                return result

    def data_version(self) -> int:
        """SQLite's counter that changes when another connection commits (microseconds)."""
        return self.read(_data_version)

    def change_marker(self) -> tuple[int, int]:
        """Equal to an earlier marker only if nothing has committed since it was
        taken: the reader connection's `PRAGMA data_version` (which counts every
        other connection's commits, this process's writer's too) and which
        reader connection counted them."""
        return self.read(self._marker_of)

    def job_changes(self, since: Hashable | None, /) -> tuple[Hashable, Collection[str] | None]:
        """The change marker, and whether anything committed since `since`: SQLite
        counts commits, not the rows they changed, so any commit may have
        changed any job (None) and none leaves them all as they were."""
        marker = self.change_marker()
        return marker, (() if since == marker else None)

    def _marker_of(self, conn: Reads, /) -> tuple[int, int]:
        return self._readers_opened, _data_version(conn)

    def _reader(self) -> sqlite3.Connection:
        self._check_process()
        if self._reader_conn is None:
            conn = connect(
                self.path, synchronous=self.synchronous, busy_timeout_ms=_READ_BUSY_TIMEOUT_MS
            )
            conn.execute("PRAGMA query_only = ON")
            self._reader_conn = conn
            self._readers_opened += 1
        return self._reader_conn

    def _roll_back_reader(self, conn: sqlite3.Connection | None) -> None:
        try:
            if conn is not None and conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            self._close_reader_conn()

    def _close_reader_conn(self) -> None:
        conn, self._reader_conn = self._reader_conn, None
        if conn is not None:
            with suppress(sqlite3.Error):
                conn.close()

    # -- lifecycle --------------------------------------------------------------

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise StoreUsedAcrossFork()

    def for_runner(self) -> SqliteStore:
        """This store: one writer thread serves the process's every write."""
        return self

    def close(self) -> None:
        """Close both connections and stop the writer thread (same process only)."""
        if os.getpid() != self._pid:
            return
        if self._writer is not None:
            if self.broken:
                # The thread is gone; its connection is nobody's now.
                self._thread.close_conn()
            else:
                with suppress(StoreUnavailable):
                    self._writer.call(
                        self._thread.close_conn,
                        self.busy_timeout_seconds + ANSWER_MARGIN_SECONDS,
                    )
            self._writer.stop()
            self._writer = None
        self._hub.close()
        self._close_reader_conn()


def _data_version(conn: Reads, /) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def _take_write_lock(tx: Transaction, /) -> None:
    # BEGIN IMMEDIATE has taken the lock; the statement only completes the transaction.
    tx.execute("SELECT 1")


def _rewrite_header(tx: Transaction, /) -> None:
    # A real write that changes nothing: page 1 is rewritten, into the WAL.
    version = tx.execute("PRAGMA user_version").fetchone()[0]
    tx.execute(f"PRAGMA user_version = {int(version)}")
