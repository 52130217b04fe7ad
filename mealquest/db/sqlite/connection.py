"""Opening SQLite connections with the service's pragmas, and reading SQLite's errors.

Which errors mean "the lock was not had" (`is_busy`) and which mean "the
storage refused" (`storage_fault`) decides what callers are told: a
`StoreBusy` or a `StorageFault`, never SQLite's own text, which may name the
file.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Any

from mealquest.db.errors import StorageFault
from mealquest.db.options import SYNCHRONOUS_MODES

_SQLITE_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
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


def has_room(path: str) -> bool:
    """Whether the file system holding `path` has room for writes again (True if unknown)."""
    try:
        stats = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return True
    # Blocks kept for root count for a process running as root.
    free = stats.f_bfree if os.geteuid() == 0 else stats.f_bavail
    return free * stats.f_frsize >= _ROOM_AFTER_DISK_FULL_BYTES


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
        # A deleted row's bytes are overwritten, not left in free space: an
        # erased household's data must not stay readable in the file.
        conn.execute("PRAGMA secure_delete = ON")
    except BaseException:
        conn.close()
        raise
    return conn


class SqliteTransaction:
    """An open write transaction (in the writer thread, or on the hub for `write_now`).

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
