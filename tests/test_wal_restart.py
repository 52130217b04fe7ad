"""The writer thread's idle checkpoints under the hub's own writes: they catch
up while the hub writes on, and only the last few writes' pages are copied
with the hub waiting, which is what restarts the WAL.

Real SQLite files and the real `Checkpoints`; the hub's writes land "during"
a checkpoint by running as its result row is read (the checkpoint has copied
by then, so they are exactly what it left behind).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mealquest.db.sqlite.checkpoints import (
    AFTER_WRITES,
    CATCH_UP_PASSES,
    HUB_WRITES_LEFT_TO_RESTART,
    HUB_WRITES_UNCHECKPOINTED,
    Checkpoints,
)
from mealquest.db.sqlite.connection import connect


class Wal:
    """A WAL database file, the hub's connection and the writer thread's."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.hub = connect(self.path, synchronous="NORMAL", busy_timeout_ms=0)
        self.hub.execute("PRAGMA journal_mode = WAL")
        self.hub.execute("PRAGMA wal_autocheckpoint = 0")
        self.hub.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, body TEXT)")
        self.thread = connect(self.path, synchronous="NORMAL", busy_timeout_ms=1000)
        self.thread.execute("PRAGMA wal_autocheckpoint = 0")
        self.checkpoints = Checkpoints()

    def hub_write(self) -> None:
        """One write on the hub, counted as `SqliteStore.write_now` counts it."""
        assert self.checkpoints.hub_may_write()
        self.hub.execute("BEGIN IMMEDIATE")
        self.hub.execute("INSERT INTO rows (body) VALUES (?)", ("x" * 500,))
        self.hub.execute("COMMIT")
        self.checkpoints.hub_wrote()

    def thread_write(self) -> None:
        """One write in the writer thread, counted as the thread counts it."""
        self.thread.execute("BEGIN IMMEDIATE")
        self.thread.execute("INSERT INTO rows (body) VALUES ('t')")
        self.thread.execute("COMMIT")
        self.checkpoints.thread_wrote(self.thread, 1)

    def during_checkpoints(self, effect: Callable[[], None]) -> None:
        """Run `effect` once each checkpoint of the thread's has copied."""

        def row_factory(cursor: sqlite3.Cursor, row: tuple) -> sqlite3.Row:
            if cursor.description[0][0] == "busy":  # PRAGMA wal_checkpoint's row
                effect()
            return sqlite3.Row(cursor, row)

        self.thread.row_factory = row_factory

    def frames(self) -> int:
        """The frames in the WAL now (as a checkpoint counts them, copying them)."""
        return int(self.hub.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1])

    def close(self) -> None:
        self.hub.close()
        self.thread.close()


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[Wal]:
    opened = Wal(tmp_path / "wal.sqlite3")
    yield opened
    opened.close()


def never() -> bool:
    return False


def test_a_checkpoint_the_hub_wrote_a_few_times_through_has_its_next_write_restart_the_wal(wal):
    for _ in range(AFTER_WRITES):
        wal.hub_write()
    wal.during_checkpoints(lambda: [wal.hub_write() for _ in range(3)])

    wal.checkpoints.when_idle(wal.thread, never)

    # Three writes were left: the hub's next write goes to the thread...
    assert not wal.checkpoints.hub_may_write()
    wal.during_checkpoints(lambda: None)
    wal.thread_write()
    # ...which copied them with nothing appended meanwhile: the WAL starts over.
    assert wal.checkpoints.hub_may_write()
    assert wal.checkpoints.since_checkpoint() == 0
    wal.hub_write()
    assert wal.frames() <= 4  # one write's pages, not the WAL of a hundred


def test_checkpoints_follow_each_other_while_the_hub_writes_on_and_it_never_waits(wal):
    for _ in range(AFTER_WRITES):
        wal.hub_write()
    passes, counts = [], []

    def hub_writes_through() -> None:
        passes.append(1)
        # Past the count that sends the hub's writes to the thread: the
        # thread is checkpointing, so they stay on the hub meanwhile.
        wal.checkpoints.hub_writes += HUB_WRITES_UNCHECKPOINTED
        counts.append(wal.checkpoints.hub_may_write())
        for _ in range(HUB_WRITES_LEFT_TO_RESTART + 1):
            wal.hub_write()

    wal.during_checkpoints(hub_writes_through)

    wal.checkpoints.when_idle(wal.thread, never)

    assert len(passes) == CATCH_UP_PASSES
    assert all(counts)
    # Never caught up: past its count, the hub's next write goes to the
    # thread, whose checkpoint after it copies the rest (the old backstop).
    assert not wal.checkpoints.hub_may_write()


def test_the_last_checkpoint_catching_up_ends_the_wait_at_once(wal):
    for _ in range(AFTER_WRITES):
        wal.hub_write()
    left = iter([HUB_WRITES_LEFT_TO_RESTART * 4, HUB_WRITES_LEFT_TO_RESTART * 2, 0])
    wal.during_checkpoints(lambda: [wal.hub_write() for _ in range(next(left, 0))])

    wal.checkpoints.when_idle(wal.thread, never)

    # The third copied everything: nothing is left for a thread's write.
    assert next(left, None) is None
    assert wal.checkpoints.hub_may_write()
    assert wal.checkpoints.since_checkpoint() == 0
    wal.hub_write()
    assert wal.frames() <= 4


def test_a_call_waiting_for_the_thread_cuts_the_catching_up_short(wal):
    for _ in range(AFTER_WRITES):
        wal.hub_write()
    passes = []

    def hub_writes_through() -> None:
        passes.append(1)
        for _ in range(HUB_WRITES_LEFT_TO_RESTART + 1):
            wal.hub_write()

    wal.during_checkpoints(hub_writes_through)

    wal.checkpoints.when_idle(wal.thread, lambda: True)

    assert len(passes) == 1
    assert wal.checkpoints.hub_may_write()  # its count is low: the hub writes on
