"""A short write made on the calling (hub) thread itself: `SqliteStore.write_now`.

The hop to the writer thread and back is about half of a single enqueue's
time. Where nothing can make a write wait on the hub (the lock is free at
once: the connection's busy timeout is 0; commits do not sync), it is made
here instead; whenever SQLite refuses any part of it, it is rolled back and
the caller sends it to the writer thread, which waits, groups and records
faults as always. The hub's connection never checkpoints: its syncs would
hold every greenlet (`mealquest.db.sqlite.checkpoints`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from mealquest.db.sqlite.connection import SqliteTransaction, connect


class HubWrites:
    """The hub's own writer connection, and its writes (hub thread only)."""

    def __init__(self, path: str, synchronous: str) -> None:
        self.path = path
        self.synchronous = synchronous
        self.conn: sqlite3.Connection | None = None

    def attempt(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[bool, Any, list[Callable[[], None]]]:
        """`fn(tx, ...)` committed on the hub: (True, its result, its after-commit
        callbacks); (False, None, []) when SQLite refused any part of it, with
        nothing committed. An exception of `fn`'s own is raised, rolled back."""
        try:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            return False, None, []
        tx = SqliteTransaction(conn)
        try:
            result = fn(tx, *args, **kwargs)
            conn.execute("COMMIT")
        except sqlite3.Error:
            self._roll_back(conn)
            return False, None, []
        except BaseException:
            self._roll_back(conn)
            raise
        return True, result, tx.after_commit_callbacks

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with suppress(sqlite3.Error):
                conn.close()

    def _connection(self) -> sqlite3.Connection:
        if self.conn is None:
            conn = connect(self.path, synchronous=self.synchronous, busy_timeout_ms=0)
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            self.conn = conn
        return self.conn

    def _roll_back(self, conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            # In an unknown state: the next write opens a new one.
            self.conn = None
            with suppress(sqlite3.Error):
                conn.close()
