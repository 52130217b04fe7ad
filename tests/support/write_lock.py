"""Another process holding the database's write lock, for as long as a test says.

On SQLite the file's own lock (`BEGIN IMMEDIATE`, or `mode`); on PostgreSQL
an `EXCLUSIVE` lock on the tables the runner writes, which lets reads
through and makes every write wait, as SQLite's lock does.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from typing import Any

_SQLITE_HOLDER = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN " + sys.argv[2])
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
print("released", flush=True)
sys.stdin.readline()
"""

_POSTGRES_HOLDER = r"""
import psycopg, sys
conn = psycopg.connect(sys.argv[1], autocommit=True, connect_timeout=10)
conn.execute("BEGIN")
conn.execute("LOCK TABLE jobs, processes IN EXCLUSIVE MODE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
print("released", flush=True)
sys.stdin.readline()
"""


class LockHolder:
    """A real `python -c` subprocess that takes `BEGIN IMMEDIATE` (or `mode`) on
    the SQLite file `path`, or the tables' lock on the PostgreSQL URL `path`.

    `hold()` returns once the child says it holds the lock (it prints a line);
    `release()` returns once it says the lock is free. `stop()` kills it. A
    holder may hold again after a release (a child of its own each time).
    """

    def __init__(self, path: str, mode: str = "IMMEDIATE") -> None:
        self.path = path
        self.mode = mode  # EXCLUSIVE also keeps readers out of a rollback-journal file
        self.process: subprocess.Popen[str] | None = None

    @classmethod
    def of(cls, database: Mapping[str, Any]) -> LockHolder:
        """The holder for a test's database (its app configuration)."""
        return cls(database.get("DATABASE_URL") or database["DATABASE"])

    def hold(self) -> None:
        self.stop()
        program = _POSTGRES_HOLDER if self.path.startswith("postgres") else _SQLITE_HOLDER
        self.process = subprocess.Popen(
            [sys.executable, "-c", program, self.path, self.mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line == "locked\n", f"lock holder did not take the lock: {line!r}"

    def release(self) -> None:
        assert self.process is not None
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line == "released\n", f"lock holder did not release the lock: {line!r}"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()
            for stream in (self.process.stdin, self.process.stdout):
                if stream is not None:
                    stream.close()
