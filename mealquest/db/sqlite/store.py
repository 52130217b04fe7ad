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
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

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
from mealquest.db.sqlite.hub_writes import HubWrites
from mealquest.db.sqlite.writer import WriterThread

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

# A read on the hub thread may hold the hub this long per try before retrying.
_READ_BUSY_TIMEOUT_MS = 10
# `forget_deleted`: each try waits this long for readers, then retries after
# this pause.
_FORGET_BUSY_MS = 100
_FORGET_RETRY_SECONDS = 0.05
# `write_now` writes on the hub only where a COMMIT does not sync: with WAL,
# NORMAL and OFF append to the WAL and return.
_SYNCLESS_COMMITS = frozenset({"NORMAL", "OFF"})
# A caller of `SqliteStore.write` waits this much past the write's deadline for its
# answer (the function and the COMMIT run after the lock wait ends), then
# gives up with StoreWriterUnresponsive. The thread does not start a COMMIT
# later than half of it past the deadline, so a caller that gave up is not
# committed behind its back unless the COMMIT itself hangs.
_ANSWER_MARGIN_SECONDS = 2.0


@dataclass(slots=True)
class _Write:
    """One caller's `SqliteStore.write`, queued for the writer thread."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    deadline: float


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
        self._writer_conn: sqlite3.Connection | None = None
        # The hub's own writes (`write_now`; hub thread only).
        self._hub = HubWrites(path, self.synchronous)
        # Counts of the hub's and the thread's writes, and the checkpoints.
        self.checkpoints = Checkpoints()
        self._reader_conn: sqlite3.Connection | None = None
        # Counts the reader connections opened: a new one's `data_version`
        # starts afresh, so a change marker names its connection too.
        self._readers_opened = 0
        # Set by the writer thread when a write meets a storage fault, cleared
        # when a write that changed something commits (see `_end_write_fault`).
        self._write_fault: StorageFault | None = None
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
        return self._write_fault

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
                _Write(fn, args, kwargs, deadline),
                self.busy_timeout_seconds + _ANSWER_MARGIN_SECONDS,
            )
        except StoreUnavailable as error:
            if not isinstance(error, StoreBusy):
                self._write_faults.failed(error)
            raise
        if self._write_faults.since is not None and self._write_fault is None:
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
            or self._write_fault is not None
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
        fault = self._write_fault
        if fault is None:
            self.write(_take_write_lock)
            return
        if fault.disk_full and not has_room(self.path):
            raise StorageFault(fault.name, fault.reason)
        self.write(_rewrite_header)

    def _run_writes(self, writes: list[_Write]) -> list[tuple[bool, Any]]:
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

    def _outcome(self, write: _Write) -> tuple[bool, Any]:
        # In the writer thread: one write in its own transaction.
        try:
            return True, self._run_write(write.fn, write.args, write.kwargs, write.deadline)
        except BaseException as error:
            return False, error

    def _run_group(
        self, writes: list[_Write], live: list[int], outcomes: list[tuple[bool, Any] | None]
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
        changes = conn.total_changes if self._write_fault is not None else 0
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
                if time.monotonic() > write.deadline + _ANSWER_MARGIN_SECONDS / 2:
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
            rewrote_header = rewrote_header or write.fn is _rewrite_header
            done.append((index, result, tx))
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as error:
            self._roll_back(conn)
            self._write_failed(error)
            return False
        if self._write_fault is not None:
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
            if self._writer_conn is None:
                conn = connect(
                    self.path, synchronous=self.synchronous, busy_timeout_ms=busy_timeout_ms
                )
                # See `mealquest.db.sqlite.checkpoints`.
                conn.execute(f"PRAGMA wal_autocheckpoint = {checkpoints.WAL_AUTOCHECKPOINT_PAGES}")
                self._writer_conn = conn
            conn = self._writer_conn
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
        changes = conn.total_changes if self._write_fault is not None else 0
        try:
            result = fn(tx, *args, **kwargs)
            if time.monotonic() > deadline + _ANSWER_MARGIN_SECONDS / 2:
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
        if self._write_fault is not None:
            self._end_write_fault(conn, changes, fn is _rewrite_header)
        self.checkpoints.thread_wrote(conn, 1)
        return result, tx.after_commit_callbacks

    def _write_failed(self, error: sqlite3.Error) -> StoreUnavailable | None:
        """The StoreUnavailable a write's sqlite error means, if any (writer thread)."""
        if is_busy(error):
            # Nothing was committed; the lock is the problem, not the write.
            return StoreBusy()
        fault = storage_fault(error)
        if fault is not None:
            self._write_fault = fault
            # A connection opened read-only, or that met an I/O error, may stay
            # so: the next write opens a fresh one (about 0.1 ms, during faults only).
            self._close_writer_conn()
        return fault

    def _roll_back(self, conn: sqlite3.Connection) -> None:
        # In the writer thread, after a failed write.
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except Exception:
            # A connection that cannot roll back (closed under us, or broken by
            # an I/O error) is in an unknown state: the next write opens a new one.
            self._close_writer_conn()

    def _end_write_fault(
        self, conn: sqlite3.Connection, changes: int, rewrote_header: bool
    ) -> None:
        # In the writer thread, after a commit while a storage fault is recorded.
        # A commit that changed nothing wrote nothing and proves nothing.
        if not rewrote_header and conn.total_changes == changes:
            return
        fault = self._write_fault
        if fault is not None and fault.disk_full and not has_room(self.path):
            return
        self._write_fault = None

    def forget_deleted(self, timeout_seconds: float) -> bool:
        """Checkpoint the WAL and truncate it to nothing, in the writer thread,
        tried again until no reader's snapshot holds it back or
        `timeout_seconds` pass: the WAL keeps the pages of rows deleted since
        the last restart of its file, as they were before the delete."""
        self._check_process()
        deadline = time.monotonic() + timeout_seconds
        while True:
            if self._writer_thread().call(self._truncate_wal, self.busy_timeout_seconds):
                return True
            if time.monotonic() >= deadline:
                return False
            gevent.sleep(_FORGET_RETRY_SECONDS)

    def _writer_thread(self) -> WriterThread:
        if self._writer is None:
            self._writer = WriterThread(
                self._checkpoint_when_idle, checkpoints.IDLE_SECONDS, self._run_writes
            )
        return self._writer

    def _truncate_wal(self) -> bool:
        # In the writer thread, between transactions: a short busy wait, so
        # that writes queued behind it are not held.
        if self._writer_conn is None:
            self._writer_conn = connect(
                self.path, synchronous=self.synchronous, busy_timeout_ms=_FORGET_BUSY_MS
            )
        conn = self._writer_conn
        try:
            conn.execute(f"PRAGMA busy_timeout = {_FORGET_BUSY_MS}")
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as error:
            if is_busy(error):
                return False
            raise
        return busy == 0 and os.path.getsize(self.path + "-wal") == 0

    def _checkpoint_when_idle(self) -> None:
        """In a pause of the writer thread's (see `mealquest.db.sqlite.checkpoints`).
        A failure is the thread's to log (from the hub), and SQLite's own
        checkpoint remains."""
        # Runs in the native writer thread: no gevent calls here.
        self.checkpoints.when_idle(self._writer_conn)

    @property
    def hub_writes(self) -> int:
        """The writes `write_now` made on the hub (for the tests)."""
        return self.checkpoints.hub_writes

    def _close_writer_conn(self) -> None:
        # In the writer thread, so that `_checkpoint_when_idle` never sees it closed.
        conn, self._writer_conn = self._writer_conn, None
        if conn is not None:
            with suppress(sqlite3.Error):
                conn.close()

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
                self._close_writer_conn()
            else:
                with suppress(StoreUnavailable):
                    self._writer.call(
                        self._close_writer_conn,
                        self.busy_timeout_seconds + _ANSWER_MARGIN_SECONDS,
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
