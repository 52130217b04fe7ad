"""The SQLite store, shaped so that no SQLite lock wait ever blocks the gevent hub.

`sqlite3` is a blocking C library that gevent cannot patch: a write waiting on
another process's lock from a greenlet would freeze every greenlet of the
process (and gunicorn kills a worker whose hub is blocked too long). So:

* every write runs whole (`BEGIN IMMEDIATE` ... `COMMIT`) inside one native
  writer thread, on the process's only writer connection; the calling
  greenlet waits cooperatively (`_WriterThread`);
* reads use their own connection with a tiny busy timeout and a cooperative
  retry, so a lock costs the hub milliseconds, not seconds;
* both give up at a deadline with `StoreUnavailable` (503 over HTTP);
* connections and the thread are made lazily in the process that uses them
  and refuse to be used after a `fork`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
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
# once the writer thread has had nothing to do for this long...
_CHECKPOINT_AFTER_WRITES = 100
_CHECKPOINT_IDLE_SECONDS = 0.002
# ...and SQLite's own checkpoint, in the COMMIT, only if the WAL reaches this
# many pages without such a pause (SQLite's default is 1,000).
_WAL_AUTOCHECKPOINT_PAGES = 4_000
_SQLITE_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class StoreError(Exception):
    """The store failed."""


class StoreUnavailable(StoreError):
    """The database stayed locked or unreachable past the deadline; try again later."""


class StoreUsedAcrossFork(StoreError):
    """A store opened in one process was used in another (after fork); open a new one."""


def is_busy(error: sqlite3.Error) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in _SQLITE_BUSY_CODES


def connect(path: str, *, synchronous: str, busy_timeout_ms: int) -> sqlite3.Connection:
    """Open a connection with the project's pragmas and explicit transactions.

    The busy timeout is set at open (sqlite3's own default is 5 s): setting the
    pragmas may already read the file, and must not wait longer than asked.
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

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        return self.conn.executemany(sql, rows)

    def after_commit(self, callback: Callable[[], None]) -> None:
        self.after_commit_callbacks.append(callback)


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
    watcher's callback.
    """

    def __init__(
        self, on_idle: Callable[[], None] | None = None, idle_seconds: float = 0.0
    ) -> None:
        # `on_idle` runs in the thread once no call has come for `idle_seconds`.
        self._on_idle = on_idle
        self._idle_seconds = idle_seconds
        self._hub = get_hub()
        self._requests: deque[tuple[Waiter, Callable[[], Any]] | None] = deque()
        self._results: deque[tuple[Waiter, bool, Any]] = deque()
        self._work = _native_lock()
        self._work.acquire()
        self._pending = 0
        self._done = self._hub.loop.async_()
        # Keeps the loop alive only while a call is pending (a gevent.wait()
        # must not hang on an idle writer).
        self._done.ref = False
        self._done.start(self._deliver)
        _start_native_thread(self._serve, ())

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn()` in the thread; the calling greenlet waits (other greenlets run).

        Only from the native thread whose hub made this writer, as with gevent's
        ThreadPool: the result comes back through that hub."""
        if get_hub() is not self._hub:
            raise StoreError("the store's writer is used from another native thread")
        waiter = Waiter(self._hub)
        self._requests.append((waiter, fn))
        self._pending += 1
        self._done.ref = True
        self._wake()
        ok, value = waiter.get()
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
        while True:
            if self._on_idle is None:
                self._work.acquire()
            elif not self._work.acquire(timeout=self._idle_seconds):
                self._on_idle()
                self._work.acquire()
            while self._requests:
                request = self._requests.popleft()
                if request is None:
                    return
                waiter, fn = request
                try:
                    outcome = (waiter, True, fn())
                except BaseException as error:
                    outcome = (waiter, False, error)
                self._results.append(outcome)
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


class Store:
    """One process's access to the database: a writer thread and a reader connection."""

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
        self._writes_since_checkpoint = 0  # the writer thread's own count

    # -- writes -----------------------------------------------------------------

    def write(
        self, fn: Callable[Concatenate[Transaction, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run `fn(tx, ...)` as one write transaction in the writer thread.

        The transaction commits if `fn` returns and rolls back if it raises;
        either way nothing of it spans a greenlet switch.
        """
        self._check_process()
        if self._writer is None:
            self._writer = _WriterThread(self._checkpoint_when_idle, _CHECKPOINT_IDLE_SECONDS)
        deadline = time.monotonic() + self.busy_timeout_seconds
        result, callbacks = self._writer.call(lambda: self._run_write(fn, args, kwargs, deadline))
        for callback in callbacks:
            callback()
        return result

    def _run_write(
        self, fn: Callable[..., T], args: tuple, kwargs: dict, deadline: float
    ) -> tuple[T, list[Callable[[], None]]]:
        # Runs in the native writer thread: no gevent calls here.
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StoreUnavailable(StoreUnavailable.__doc__)
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
        except sqlite3.OperationalError as error:
            if is_busy(error):
                raise StoreUnavailable(StoreUnavailable.__doc__) from None
            raise
        tx = Transaction(conn)
        try:
            result = fn(tx, *args, **kwargs)
            conn.execute("COMMIT")
            self._writes_since_checkpoint += 1
        except BaseException as error:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(error, sqlite3.OperationalError) and is_busy(error):
                # Nothing was committed; the lock is the problem, not the write.
                raise StoreUnavailable(StoreUnavailable.__doc__) from error
            raise
        return result, tx.after_commit_callbacks

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
        """
        # Runs in the native writer thread: no gevent calls here.
        if self._writes_since_checkpoint < _CHECKPOINT_AFTER_WRITES or self._writer_conn is None:
            return
        self._writes_since_checkpoint = 0
        try:
            self._writer_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:
            logger.exception("WAL checkpoint failed; SQLite's own checkpoint remains")

    def _close_writer_conn(self) -> None:
        # In the writer thread, so that `_checkpoint_when_idle` never sees it closed.
        if self._writer_conn is not None:
            self._writer_conn.close()
            self._writer_conn = None

    # -- reads ------------------------------------------------------------------

    def read(self, fn: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args) -> T:
        """Run the pure read `fn(conn, ...)` on the reader connection.

        A busy database is retried cooperatively (the hub runs between tries)
        until the deadline; `fn` may therefore run more than once.
        """
        self._check_process()
        deadline = time.monotonic() + self.busy_timeout_seconds
        delay = 0.001
        while True:
            conn = None
            try:
                # Opening is retried too: setting its pragmas may find the file locked.
                conn = self._reader()
                return fn(conn, *args)
            except sqlite3.OperationalError as error:
                if not is_busy(error):
                    raise
                if conn is not None and conn.in_transaction:
                    conn.execute("ROLLBACK")
                if time.monotonic() + delay > deadline:
                    raise StoreUnavailable(StoreUnavailable.__doc__) from None
                gevent.sleep(delay)
                delay = min(delay * 2, 0.05)

    def data_version(self) -> int:
        """SQLite's counter that changes when another connection commits (microseconds)."""
        return self.read(lambda conn: conn.execute("PRAGMA data_version").fetchone()[0])

    def _reader(self) -> sqlite3.Connection:
        self._check_process()
        if self._reader_conn is None:
            conn = connect(
                self.path, synchronous=self.synchronous, busy_timeout_ms=_READ_BUSY_TIMEOUT_MS
            )
            conn.execute("PRAGMA query_only = ON")
            self._reader_conn = conn
        return self._reader_conn

    # -- lifecycle --------------------------------------------------------------

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise StoreUsedAcrossFork(StoreUsedAcrossFork.__doc__)

    def close(self) -> None:
        """Close both connections and stop the writer thread (same process only)."""
        if os.getpid() != self._pid:
            return
        if self._writer is not None:
            self._writer.call(self._close_writer_conn)
            self._writer.stop()
            self._writer = None
        if self._reader_conn is not None:
            self._reader_conn.close()
            self._reader_conn = None
