"""Another process holding SQLite's write lock on a file, for as long as a test says."""

from __future__ import annotations

import subprocess
import sys

_HOLDER = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN " + sys.argv[2])
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
print("released", flush=True)
sys.stdin.readline()
"""


class LockHolder:
    """A real `python -c` subprocess that takes `BEGIN IMMEDIATE` (or `mode`) on `path`.

    `hold()` returns once the child says it holds the lock (it prints a line);
    `release()` returns once it says the lock is free. `stop()` kills it.
    """

    def __init__(self, path: str, mode: str = "IMMEDIATE") -> None:
        self.path = path
        self.mode = mode  # EXCLUSIVE also keeps readers out of a rollback-journal file
        self.process: subprocess.Popen[str] | None = None

    def hold(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, self.path, self.mode],
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
