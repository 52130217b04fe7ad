"""The SQLite store, shaped so that no SQLite lock wait ever blocks the gevent hub.

`sqlite3` is a blocking C library that gevent cannot patch: a write waiting on
another process's lock from a greenlet would freeze every greenlet of the
process (and gunicorn kills a worker whose hub is blocked too long). So:

* every write runs whole (`BEGIN IMMEDIATE` ... `COMMIT`) inside one native
  writer thread, on the process's only writer connection; the calling
  greenlet waits cooperatively (`_WriterThread`);
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
  and summarised when it ends (`_FaultLog`), not once per caller;
* `StoreWriterUnresponsive`: the writer thread gave no answer by the write's
  deadline plus a margin; the write may still commit (see `Store.write`);
* `StoreWriterDied`: the writer thread is dead; no write of this process can
  succeed again (`Store.broken`), the process must be restarted.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import cached_property
from types import ModuleType
from typing import Any, Concatenate, ParamSpec, TypeVar

import gevent
from gevent.hub import Waiter, get_hub
from gevent.monkey import get_original

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
# A read on the hub thread may hold the hub this long per try before retrying.
_READ_BUSY_TIMEOUT_MS = 10
# WAL checkpoints (see `Store._checkpoint_when_idle`): after this many writes,
# once the writer thread has had nothing to do for this long. A checkpoint
# syncs the WAL and the database file (about 10 ms on a virtual disk), and a
# write that arrives meanwhile waits for it: after a 2 ms pause, one write in
# a hundred did (measured: enqueue-to-start p99 16 ms, against 3 ms with no
# idle checkpoints); a longer pause is seldom cut short. Under steady load,
# with writes always less than that apart, SQLite's own checkpoint below
# takes over...
_CHECKPOINT_AFTER_WRITES = 100
_CHECKPOINT_IDLE_SECONDS = 0.05
# ...and SQLite's own checkpoint, in the COMMIT, only if the WAL reaches this
# many pages without such a pause (SQLite's default is 1,000).
_WAL_AUTOCHECKPOINT_PAGES = 4_000
_SQLITE_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
# Writes that arrive while the writer thread is busy share one transaction
# (see `Store._run_writes`), this many at most: the lock is held for all of
# them, and an enqueue's write is about 10-20 us.
_GROUP_LIMIT = 64
# A caller of `Store.write` waits this much past the write's deadline for its
# answer (the function and the COMMIT run after the lock wait ends), then
# gives up with StoreWriterUnresponsive. The thread does not start a COMMIT
# later than half of it past the deadline, so a caller that gave up is not
# committed behind its back unless the COMMIT itself hangs.
_ANSWER_MARGIN_SECONDS = 2.0
# SQLite's primary result codes that mean the storage cannot be used now, with
# the short reason logged and carried by StorageFault (never SQLite's text).
# Left out on purpose: SQLITE_CORRUPT and SQLITE_NOTADB (a damaged file does
# not heal by waiting, and is often local to one table or index: calling it
# "try again later" would have the runner put the same job back forever and
# tell clients to retry what cannot succeed; it stays a sqlite3 error, a 500
# with its traceback, which is what should bring an operator), and
# SQLITE_NOMEM (Python raises MemoryError for it: the process's problem).
_STORAGE_FAULTS = {
    sqlite3.SQLITE_FULL: "disk full",
    sqlite3.SQLITE_IOERR: "I/O error",
    sqlite3.SQLITE_READONLY: "read-only",
    sqlite3.SQLITE_CANTOPEN: "cannot open the database file",
    sqlite3.SQLITE_PROTOCOL: "file locking failed",
}
# A disk-full fault is over only once the file system has this much free
# again: after a checkpoint, a write can still squeeze into the WAL file's old
# frames on a full disk, and must not end the fault (and flap /healthz) alone.
_ROOM_AFTER_DISK_FULL_BYTES = 1 << 20
# While a run of storage faults lasts, how often it is reported again.
_FAULT_REPORT_SECONDS = 60.0


class StoreError(Exception):
    """The store failed."""


class StoreUnavailable(StoreError):
    """The database cannot be used now; try again later."""

    # Seconds a client is asked to wait before trying again (HTTP Retry-After).
    retry_after = 1


class StoreBusy(StoreUnavailable):
    """The database stayed locked past the deadline; nothing was written; try again later."""


class StorageFault(StoreUnavailable):
    """The database's storage refused the operation; nothing was written; try again later.

    `name` is SQLite's error name (`SQLITE_FULL`, `SQLITE_IOERR_WRITE`, ...)
    and `reason` a few words for it ("disk full"): both safe to log and show,
    unlike SQLite's own message, which is not carried.
    """

    retry_after = 5

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"storage fault: {reason} ({name})")
        self.name = name
        self.reason = reason

    @property
    def disk_full(self) -> bool:
        return self.name == "SQLITE_FULL"


class StoreWriterUnresponsive(StoreUnavailable):
    """The store's writer thread gave no answer by the deadline; the write may still commit."""

    retry_after = 5


class StoreWriterDied(StoreUnavailable):
    """The store's writer thread died: no write of this process can succeed; restart it."""

    retry_after = 5


class StoreUsedAcrossFork(StoreError):
    """A store opened in one process was used in another (after fork); open a new one."""


def is_busy(error: sqlite3.Error) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in _SQLITE_BUSY_CODES


def storage_fault(error: BaseException, *, query_only: bool = False) -> StorageFault | None:
    """The StorageFault that `error` means, or None if it is not one.

    `query_only`: the error came from a `PRAGMA query_only` connection, where a
    plain SQLITE_READONLY is the refusal of a write the caller should not have
    made, not the storage's.
    """
    code = getattr(error, "sqlite_errorcode", None)
    if not isinstance(error, sqlite3.Error) or code is None:
        return None
    reason = _STORAGE_FAULTS.get(code & 0xFF)
    if reason is None or (query_only and code == sqlite3.SQLITE_READONLY):
        return None
    name = getattr(error, "sqlite_errorname", None) or f"SQLite error {code}"
    return StorageFault(name, reason)


def _has_room(path: str) -> bool:
    """Whether the file system holding `path` has room for writes again (True if unknown)."""
    try:
        stats = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return True
    # Blocks kept for root count for a process running as root.
    free = stats.f_bfree if os.geteuid() == 0 else stats.f_bavail
    return free * stats.f_frsize >= _ROOM_AFTER_DISK_FULL_BYTES


class _FaultLog:
    """One run of failures of reads or of writes, told once, not once per caller.

    ERROR when it starts, a WARNING with the count every minute while it lasts
    and one when it ends. Used in greenlets only, never the writer thread.
    """

    def __init__(self, what: str) -> None:
        self.what = what  # "writes" or "reads"
        self.since: float | None = None
        self.refused = 0
        self._reported_at = 0.0

    def failed(self, error: StoreUnavailable) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = self._reported_at = now
            self.refused = 1
            logger.error(
                "store: %s fail: %s; refusing them as unavailable until that clears",
                self.what,
                str(error).rstrip("."),
            )
            return
        self.refused += 1
        if now - self._reported_at >= _FAULT_REPORT_SECONDS:
            self._reported_at = now
            logger.warning(
                "store: %s still failing (%s): %d refused in %.0fs",
                self.what,
                str(error).rstrip("."),
                self.refused,
                now - self.since,
            )

    def ended(self) -> None:
        assert self.since is not None
        logger.warning(
            "store: %s work again after %.1fs; %d refused meanwhile",
            self.what,
            time.monotonic() - self.since,
            self.refused,
        )
        self.since = None
        self.refused = 0


def connect(
    path: str, *, synchronous: str, busy_timeout_ms: int, temp_in_memory: bool = True
) -> sqlite3.Connection:
    """Open a connection with the project's pragmas and explicit transactions.

    The busy timeout is set at open (sqlite3's own default is 5 s): setting the
    pragmas may already read the file, and must not wait longer than asked.

    `temp_in_memory` keeps the temporary tables a statement builds (its
    sorts, materialized subqueries, RETURNING rows) in memory. In a
    temporary file (SQLite's default) each such table set up its page cache
    afresh, and the heap grew and shrank around it: the fair claim statement
    made seven `brk` calls and cost about 1 ms, against 0.2 ms in memory.
    Every statement of the running service is bounded (a LIMIT, an index
    order, the counts tables, or the jobs running), so its temporary tables
    stay small. A migration's CREATE INDEX sorts a whole table, so
    migrations pass False: that sort spills to a file instead of memory.
    """
    if synchronous.upper() not in SYNCHRONOUS_MODES:
        raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}")
    conn = sqlite3.connect(
        path,
        timeout=int(busy_timeout_ms) / 1000,
        isolation_level=None,
        check_same_thread=False,
    )
    try:
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        conn.execute(f"PRAGMA temp_store = {'MEMORY' if temp_in_memory else 'DEFAULT'}")
    except BaseException:
        conn.close()
        raise
    return conn


class Transaction:
    """An open write transaction inside the writer thread.

    Callbacks given to `after_commit` run in the calling greenlet once the
    transaction has committed, never inside the native thread: that is where
    gevent objects (the pool's wake event) may be signalled.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.after_commit_callbacks: list[Callable[[], None]] = []

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def after_commit(self, callback: Callable[[], None]) -> None:
        self.after_commit_callbacks.append(callback)


@dataclass(slots=True)
class _Write:
    """One caller's `Store.write`, queued for the writer thread."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    deadline: float


_start_native_thread = get_original("_thread", "start_new_thread")
_native_lock = get_original("_thread", "allocate_lock")


class _WriterThread:
    """One native thread that runs calls in order for the greenlets of one hub.

    Why not `gevent.threadpool.ThreadPool(1)`: measured here, its hop cost
    40-70 us per call (a result object, an async watcher and a greenlet per
    task) around a write transaction of about 6 us, and every enqueue, claim
    and completion pays one. This does the same with one request queue, one
    native lock used as a wake-up, and one async watcher: about 20 us.

    The only gevent call made from the native thread is the async watcher's
    `send()`, which libev makes for exactly that (gevent's own threadpool
    uses it); results are handed to their greenlets by the hub, in the
    watcher's callback. So is what the thread has to report (a failed idle
    task, its own death): logged from the hub, since logging takes locks
    that are gevent's in a patched process.

    Supervised: a call's exception goes to its caller; an exception of the
    idle task is logged at ERROR and the thread serves on; anything else
    that ends the thread is logged at ERROR, sets `died`, and every waiting
    and later call raises StoreWriterDied at once. A caller never waits past
    its own timeout either way.

    Grouped calls (`call_grouped`): the items of the grouped calls waiting
    next to each other in the queue when the thread comes to them (those
    that arrived while it was busy) go to `run_group` together, at most
    `_GROUP_LIMIT` at once, which answers each item's outcome: how the
    store makes concurrent writes share one transaction and one commit.
    """

    def __init__(
        self,
        on_idle: Callable[[], None] | None = None,
        idle_seconds: float = 0.0,
        run_group: Callable[[list[Any]], list[tuple[bool, Any]]] | None = None,
    ) -> None:
        # `on_idle` runs in the thread once no call has come for `idle_seconds`.
        self._on_idle = on_idle
        self._idle_seconds = idle_seconds
        self._run_group = run_group
        self._hub = get_hub()
        # (waiter, a function to call, False) or (waiter, an item for `run_group`, True).
        self._requests: deque[tuple[Waiter, Any, bool] | None] = deque()
        self._results: deque[tuple[Waiter, bool, Any]] = deque()
        # What the thread asks the hub to log: (message, error).
        self._notices: deque[tuple[str, BaseException]] = deque()
        # The exception that ended the thread, once it has.
        self.died: BaseException | None = None
        self._work = _native_lock()
        self._work.acquire()
        self._pending = 0
        self._done = self._hub.loop.async_()
        # Keeps the loop alive only while a call is pending (a gevent.wait()
        # must not hang on an idle writer).
        self._done.ref = False
        self._done.start(self._deliver)
        _start_native_thread(self._serve, ())

    def call(self, fn: Callable[[], T], timeout: float) -> T:
        """Run `fn()` in the thread; the calling greenlet waits (other greenlets run).

        Raises StoreWriterUnresponsive if no answer comes within `timeout`
        seconds (`fn` may still run later), StoreWriterDied if the thread is dead.

        Only from the native thread whose hub made this writer, as with gevent's
        ThreadPool: the result comes back through that hub."""
        return self._call(fn, False, timeout)

    def call_grouped(self, item: Any, timeout: float) -> Any:
        """Have `run_group` run `item`, with the grouped calls queued beside it;
        waits, answers and raises as `call` does."""
        assert self._run_group is not None
        return self._call(item, True, timeout)

    def _call(self, task: Any, grouped: bool, timeout: float) -> Any:
        if self.died is not None:
            raise StoreWriterDied(StoreWriterDied.__doc__)
        if get_hub() is not self._hub:
            raise StoreError("the store's writer is used from another native thread")
        waiter = Waiter(self._hub)
        self._requests.append((waiter, task, grouped))
        self._pending += 1
        self._done.ref = True
        self._wake()
        # update=True: timed from now, not from the loop's cached time.
        timer = self._hub.loop.timer(timeout)
        timer.start(self._give_up, waiter, update=True)
        try:
            ok, value = waiter.get()
        finally:
            timer.close()
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        """End the thread once the calls queued so far have run; the caller has
        no call in flight (their results could no longer be delivered)."""
        self._requests.append(None)
        self._wake()
        self._done.close()

    def _wake(self) -> None:
        # Already released: the thread is awake and drains the whole queue before sleeping.
        with suppress(RuntimeError):
            self._work.release()

    def _serve(self) -> None:
        # The native thread: runs calls, posts results; no other gevent call.
        try:
            while True:
                if self._on_idle is None:
                    self._work.acquire()
                elif not self._work.acquire(timeout=self._idle_seconds):
                    try:
                        self._on_idle()
                    except Exception as error:
                        self._notify("the store's writer thread: its idle task failed", error)
                    self._work.acquire()
                while self._requests:
                    request = self._requests.popleft()
                    if request is None:
                        return
                    waiter, task, grouped = request
                    if grouped:
                        self._serve_group(waiter, task)
                        continue
                    try:
                        outcome = (waiter, True, task())
                    except BaseException as error:
                        outcome = (waiter, False, error)
                    self._results.append(outcome)
                    self._done.send()
        except BaseException as error:
            # Set before the notice, so that a call made once the hub has it
            # (or already now) fails at once instead of queueing for nobody.
            self.died = error
            with suppress(Exception):
                self._notify("the store's writer thread died; this process cannot write", error)

    def _serve_group(self, waiter: Waiter, item: Any) -> None:
        # In the thread: this grouped call and those queued right behind it.
        waiters, items = [waiter], [item]
        while len(items) < _GROUP_LIMIT and self._requests:
            following = self._requests[0]
            if following is None or not following[2]:
                break
            self._requests.popleft()
            waiters.append(following[0])
            items.append(following[1])
        assert self._run_group is not None
        try:
            outcomes = self._run_group(items)
        except BaseException as error:
            outcomes = [(False, error)] * len(items)
        for waiter_of, (ok, value) in zip(waiters, outcomes, strict=True):
            self._results.append((waiter_of, ok, value))
        self._done.send()

    def _notify(self, message: str, error: BaseException) -> None:
        # In the thread: the hub logs it (see `_deliver`).
        self._notices.append((message, error))
        self._done.send()

    def _deliver(self) -> None:
        # In the hub: hand each result to its waiting greenlet (a killed
        # greenlet's Waiter just keeps it).
        while self._results:
            waiter, ok, value = self._results.popleft()
            self._pending -= 1
            if not self._pending:
                self._done.ref = False
            waiter.switch((ok, value))
        if self._notices:
            self._report()

    def _report(self) -> None:
        # In the hub; rare, so a greenlet does the logging (a handler's lock
        # must not be waited for in the hub).
        while self._notices:
            message, error = self._notices.popleft()
            gevent.spawn(_log_notice, message, error)
        if self.died is not None:
            # Calls queued before the thread died will never run: fail them now.
            while self._requests:
                request = self._requests.popleft()
                if request is not None:
                    self._pending -= 1
                    request[0].switch((False, StoreWriterDied(StoreWriterDied.__doc__)))
            self._done.ref = False

    def _give_up(self, waiter: Waiter) -> None:
        # In the hub, at a caller's timeout. A result already posted still wins
        # (a hub held up past the timeout may run this callback first).
        self._deliver()
        if waiter.greenlet is not None:
            waiter.switch((False, StoreWriterUnresponsive(StoreWriterUnresponsive.__doc__)))


def _log_notice(message: str, error: BaseException) -> None:
    if isinstance(error, sqlite3.Error | StorageFault):
        # SQLite's own message may name the file: its error name only.
        name = getattr(error, "sqlite_errorname", None) or getattr(error, "name", None)
        logger.error("%s: %s (%s)", message, type(error).__name__, name)
    else:
        logger.error(message, exc_info=(type(error), error, error.__traceback__))


class Store:
    """One process's access to an SQLite database: a writer thread and a reader
    connection. The SQLite driver's store (see `mealquest.db.driver.Store`)."""

    name = "sqlite"
    writes_one_at_a_time = True

    def __init__(
        self, path: str, *, synchronous: str = "NORMAL", busy_timeout_seconds: float = 5.0
    ) -> None:
        if synchronous.upper() not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}")
        self.path = path
        self.synchronous = synchronous.upper()
        self.busy_timeout_seconds = float(busy_timeout_seconds)
        self._pid = os.getpid()
        self._writer: _WriterThread | None = None
        self._writer_conn: sqlite3.Connection | None = None
        self._reader_conn: sqlite3.Connection | None = None
        # Counts the reader connections opened: a new one's `data_version`
        # starts afresh, so a change marker names its connection too.
        self._readers_opened = 0
        self._writes_since_checkpoint = 0  # the writer thread's own count
        # Set by the writer thread when a write meets a storage fault, cleared
        # when a write that changed something commits (see `_end_write_fault`).
        self._write_fault: StorageFault | None = None
        self._write_faults = _FaultLog("writes")
        self._read_faults = _FaultLog("reads")

    # -- the driver's SQL, migrations and description -----------------------------

    @cached_property
    def jobs(self) -> ModuleType:
        from mealquest.db.sqlite import jobs

        return jobs

    @cached_property
    def households(self) -> ModuleType:
        from mealquest.db.sqlite import households

        return households

    @cached_property
    def recipes(self) -> ModuleType:
        from mealquest.db.sqlite import recipes

        return recipes

    @cached_property
    def periodic(self) -> ModuleType:
        from mealquest.db.sqlite import periodic

        return periodic

    @cached_property
    def retention(self) -> ModuleType:
        from mealquest.db.sqlite import retention

        return retention

    @cached_property
    def operators(self) -> ModuleType:
        from mealquest.db.sqlite import operators

        return operators

    @cached_property
    def sessions(self) -> ModuleType:
        from mealquest.db.sqlite import sessions

        return sessions

    @cached_property
    def operations(self) -> ModuleType:
        from mealquest.db.sqlite import operations

        return operations

    @cached_property
    def migrations(self) -> ModuleType:
        from mealquest import migrations

        return migrations

    def describe(self) -> str:
        """The database as messages name it."""
        return self.path

    def exists(self) -> bool:
        """Whether there is a database to read (looking never creates the file)."""
        return os.path.exists(self.path)

    def upgrade(self, target: int | None = None) -> list[Any]:
        """Apply pending migrations (the foreground's job: it may wait on locks)."""
        return self.migrations.upgrade(self.path, self.migrations.MIGRATIONS_DIR, target=target)

    def migration_status(self) -> Any:
        """The ledger as this code sees it (`migrations.Ledger`)."""
        return self.migrations.status(self.path, self.migrations.MIGRATIONS_DIR)

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
        self, fn: Callable[Concatenate[Transaction, P], T], *args: P.args, **kwargs: P.kwargs
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
        if self._writer is None:
            self._writer = _WriterThread(
                self._checkpoint_when_idle, _CHECKPOINT_IDLE_SECONDS, self._run_writes
            )
        deadline = time.monotonic() + self.busy_timeout_seconds
        try:
            result, callbacks = self._writer.call_grouped(
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
        return result

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
        if fault.disk_full and not _has_room(self.path):
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
                outcomes[index] = (False, StoreBusy(StoreBusy.__doc__))
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
        done: list[tuple[int, Any, Transaction]] = []
        rewrote_header = False
        for index in live:
            write = writes[index]
            if time.monotonic() > write.deadline:
                # It waited for the lock past its deadline, as alone it would have.
                outcomes[index] = (False, StoreBusy(StoreBusy.__doc__))
                continue
            tx = Transaction(conn)
            try:
                conn.execute("SAVEPOINT grouped_write")
                result = write.fn(tx, *write.args, **write.kwargs)
                if time.monotonic() > write.deadline + _ANSWER_MARGIN_SECONDS / 2:
                    # Its caller is about to give up: do not commit behind its back.
                    raise StoreBusy(StoreBusy.__doc__)
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
        self._writes_since_checkpoint += len(done)
        if self._write_fault is not None:
            self._end_write_fault(conn, changes, rewrote_header)
        for index, result, tx in done:
            outcomes[index] = (True, (result, tx.after_commit_callbacks))
        return True

    def _begin(self, deadline: float) -> sqlite3.Connection:
        """The writer connection in a `BEGIN IMMEDIATE` transaction, the lock
        waited for until `deadline` at most (writer thread)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StoreBusy(StoreBusy.__doc__)
        # Wait for the lock only until this write's deadline: a write queued
        # behind others has already spent part of its time waiting its turn.
        busy_timeout_ms = max(1, int(remaining * 1000))
        try:
            if self._writer_conn is None:
                conn = connect(
                    self.path, synchronous=self.synchronous, busy_timeout_ms=busy_timeout_ms
                )
                # See `_checkpoint_when_idle`.
                conn.execute(f"PRAGMA wal_autocheckpoint = {_WAL_AUTOCHECKPOINT_PAGES}")
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
        self, fn: Callable[..., T], args: tuple, kwargs: dict, deadline: float
    ) -> tuple[T, list[Callable[[], None]]]:
        # Runs in the native writer thread: no gevent calls here.
        conn = self._begin(deadline)
        tx = Transaction(conn)
        # Only while a fault lasts: whether this write changes anything.
        changes = conn.total_changes if self._write_fault is not None else 0
        try:
            result = fn(tx, *args, **kwargs)
            if time.monotonic() > deadline + _ANSWER_MARGIN_SECONDS / 2:
                # Its caller is about to give up: do not commit behind its back.
                raise StoreBusy(StoreBusy.__doc__)
            conn.execute("COMMIT")
        except BaseException as error:
            self._roll_back(conn)
            if isinstance(error, sqlite3.Error):
                unavailable = self._write_failed(error)
                if unavailable is not None:
                    raise unavailable from None
            raise
        self._writes_since_checkpoint += 1
        if self._write_fault is not None:
            self._end_write_fault(conn, changes, fn is _rewrite_header)
        return result, tx.after_commit_callbacks

    def _write_failed(self, error: sqlite3.Error) -> StoreUnavailable | None:
        """The StoreUnavailable a write's sqlite error means, if any (writer thread)."""
        if is_busy(error):
            # Nothing was committed; the lock is the problem, not the write.
            return StoreBusy(StoreBusy.__doc__)
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
        if fault is not None and fault.disk_full and not _has_room(self.path):
            return
        self._write_fault = None

    def _checkpoint_when_idle(self) -> None:
        """Copy the WAL back into the database file while no write is waiting.

        SQLite's automatic checkpoint runs inside the COMMIT that crosses 1,000
        WAL pages and, with synchronous=NORMAL, fsyncs there: measured in the
        bench, that put 2-5 ms into about one enqueue or claim in a hundred,
        which was the 99th percentile of enqueue-to-start latency. So the
        writer thread checkpoints in its own pauses instead (PASSIVE: it never
        waits on a lock), and SQLite's checkpoint is left only as a backstop
        for a writer that never pauses. Not from another thread: while our
        writer appends, a checkpoint never catches up and the WAL never
        restarts (measured: it grew past 500 MB in 20,000 enqueues).

        A failure is the thread's to log (from the hub), and SQLite's own
        checkpoint remains.
        """
        # Runs in the native writer thread: no gevent calls here.
        if self._writes_since_checkpoint < _CHECKPOINT_AFTER_WRITES or self._writer_conn is None:
            return
        self._writes_since_checkpoint = 0
        self._writer_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _close_writer_conn(self) -> None:
        # In the writer thread, so that `_checkpoint_when_idle` never sees it closed.
        conn, self._writer_conn = self._writer_conn, None
        if conn is not None:
            with suppress(sqlite3.Error):
                conn.close()

    # -- reads ------------------------------------------------------------------

    def read(self, fn: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args) -> T:
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
                result = fn(conn, *args)
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
                    raise StoreBusy(StoreBusy.__doc__) from None
                gevent.sleep(delay)
                delay = min(delay * 2, 0.05)
            else:
                if self._read_faults.since is not None:
                    self._read_faults.ended()
                return result

    def data_version(self) -> int:
        """SQLite's counter that changes when another connection commits (microseconds)."""
        return self.read(lambda conn: conn.execute("PRAGMA data_version").fetchone()[0])

    def change_marker(self) -> tuple[int, int]:
        """Equal to an earlier marker only if nothing has committed since it was
        taken: the reader connection's `PRAGMA data_version` (which counts every
        other connection's commits, this process's writer's too) and which
        reader connection counted them."""
        return self.read(self._marker_of)

    def _marker_of(self, conn: sqlite3.Connection) -> tuple[int, int]:
        return self._readers_opened, conn.execute("PRAGMA data_version").fetchone()[0]

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
            raise StoreUsedAcrossFork(StoreUsedAcrossFork.__doc__)

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
        self._close_reader_conn()


def _take_write_lock(tx: Transaction) -> None:
    # BEGIN IMMEDIATE has taken the lock; the statement only completes the transaction.
    tx.execute("SELECT 1")


def _rewrite_header(tx: Transaction) -> None:
    # A real write that changes nothing: page 1 is rewritten, into the WAL.
    version = tx.execute("PRAGMA user_version").fetchone()[0]
    tx.execute(f"PRAGMA user_version = {int(version)}")
