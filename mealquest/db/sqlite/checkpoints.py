"""When an SQLite store's WAL is copied back into the database file.

SQLite's automatic checkpoint runs inside the COMMIT that crosses 1,000 WAL
pages and, with synchronous=NORMAL, fsyncs there: measured in the bench,
that put 2-5 ms into about one enqueue or claim in a hundred, which was the
99th percentile of enqueue-to-start latency. So the writer thread
checkpoints in its own pauses instead (PASSIVE: it never waits on a lock),
and SQLite's checkpoint is left only as a backstop for a writer that never
pauses. Not from another thread: while our writer appends, a checkpoint
never catches up and the WAL never restarts (measured: it grew past 500 MB
in 20,000 enqueues). Writes the hub makes itself (`write_now`) go to the
writer thread once too many of them went uncheckpointed, and the thread
checkpoints after such a write.

That checkpoint is what restarts the WAL under the hub's writes: its
callers wait, so nothing is appended while it copies, and the next write
starts the WAL over. It is kept short: an idle checkpoint the hub wrote
through is followed by another, each copying what the hub appended during
the one before, until what is left is a few writes' pages; only then do
the hub's writes go to the thread. Measured on 6,000 single enqueues in a
row: the hub waited 21 times, 21 ms each, for checkpoints that copied every
page since the last one (a quarter of the loop's time); catching up first,
checkpoints of 41, 23, 15, 8 and 5 ms (the hub wrote on) left a last
one of 0.2 ms, and 10,000 single enqueues ran 1.16x as fast (six interleaved
rounds, 1.10 to 1.22).

Two threads write, so each counter here is written by one thread only and
read by the other: the hub counts its writes, the writer thread its own and
the counts at its last whole checkpoint. A count read across threads is a
moment old at most, which only moves a checkpoint by a write.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import suppress

# Checkpoint after this many writes, once the writer thread has had nothing to
# do for `IDLE_SECONDS`. A checkpoint syncs the WAL and the database file
# (about 10 ms on a virtual disk), and a write that arrives meanwhile waits
# for it: after a 2 ms pause, one write in a hundred did (measured:
# enqueue-to-start p99 16 ms, against 3 ms with no idle checkpoints); a
# longer pause is seldom cut short. Under steady load, with writes always
# less than that apart, SQLite's own checkpoint takes over...
AFTER_WRITES = 100
IDLE_SECONDS = 0.05
# ...in the COMMIT, only if the WAL reaches this many pages without such a
# pause (SQLite's default is 1,000).
WAL_AUTOCHECKPOINT_PAGES = 4_000
# `write_now` leaves the hub to the writer thread once this many writes went
# uncheckpointed (about 10 WAL pages each: under SQLite's own checkpoint's
# 4,000, which then runs in the thread's COMMIT, never on the hub).
HUB_WRITES_UNCHECKPOINTED = 300
# An idle checkpoint during which the hub appended at most this many writes
# has the hub's next write go to the thread, which copies them with nothing
# appended meanwhile; more, and it checkpoints again (at most
# `CATCH_UP_PASSES` times, and not while calls wait for the thread).
HUB_WRITES_LEFT_TO_RESTART = 16
CATCH_UP_PASSES = 8


class Checkpoints:
    """The writes since the WAL was last copied back whole, and the checkpoints."""

    def __init__(self) -> None:
        self.hub_writes = 0  # the hub thread's own writes (`write_now`)
        self._thread_writes = 0  # the writer thread's
        # At the last whole checkpoint (the writer thread's).
        self._hub_writes_then = 0
        self._thread_writes_then = 0
        # Set by the writer thread once an idle checkpoint left only a few of
        # the hub's writes to copy: the hub's next write goes to the thread.
        self._restart_wanted = False
        # Set by the writer thread while its idle checkpoints run: the hub
        # writes on meanwhile, whatever its count (it would only wait for them).
        self._catching_up = False

    # -- the hub thread -------------------------------------------------------------

    def hub_wrote(self) -> bool:
        """Count a write of the hub's; whether it is the one past which the
        writer thread is to checkpoint at its next pause (to be nudged, once)."""
        self.hub_writes += 1
        return self.since_checkpoint() == AFTER_WRITES

    def hub_may_write(self) -> bool:
        """Whether the hub's writes went uncheckpointed for few enough, and the
        thread does not want the next one for the WAL's restart: otherwise
        writes go to the thread, which checkpoints after them."""
        if self._restart_wanted:
            return False
        return (
            self._catching_up or self.hub_writes - self._hub_writes_then < HUB_WRITES_UNCHECKPOINTED
        )

    # -- the writer thread ----------------------------------------------------------

    def thread_wrote(self, conn: sqlite3.Connection, count: int) -> None:
        """Count the thread's committed writes, and checkpoint now if the hub's
        went uncheckpointed too long (the hub waits for this write and so
        appends nothing). Nothing here may fail the write: SQLite's own
        checkpoint remains."""
        self._thread_writes += count
        if not self.hub_may_write():
            with suppress(sqlite3.Error):
                self.checkpoint(conn)
            self._restart_wanted = False

    def when_idle(self, conn: sqlite3.Connection | None, calls_waiting: Callable[[], bool]) -> None:
        """Checkpoint in a pause of the thread's, once enough writes came; again
        while the hub appended more than a few writes meanwhile (see the
        module), unless `calls_waiting()`: a write waiting for the thread is
        served first, and its own checkpoint follows it if the hub's need one."""
        if conn is None or self.since_checkpoint() < AFTER_WRITES:
            return
        self._catching_up = True
        try:
            for _ in range(CATCH_UP_PASSES):
                before = self.hub_writes
                self.checkpoint(conn)
                appended = self.hub_writes - before
                if appended == 0:
                    return  # all copied: the next write starts the WAL over
                if appended <= HUB_WRITES_LEFT_TO_RESTART:
                    self._restart_wanted = True
                    return
                if calls_waiting():
                    return
        finally:
            self._catching_up = False

    def checkpoint(self, conn: sqlite3.Connection) -> None:
        """A PASSIVE checkpoint: counted afresh only once the whole WAL is copied
        back (one the hub appended to meanwhile was not, and is checkpointed
        again)."""
        hub_writes, thread_writes = self.hub_writes, self._thread_writes
        busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if busy == 0 and frames == copied:
            self._hub_writes_then, self._thread_writes_then = hub_writes, thread_writes

    def since_checkpoint(self) -> int:
        """The writes, the hub's and the thread's, since the last whole checkpoint."""
        return (
            self.hub_writes + self._thread_writes - self._hub_writes_then - self._thread_writes_then
        )
