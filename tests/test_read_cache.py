"""ReadCache: an answer is given again only while nothing has committed since it was read."""

from __future__ import annotations

import sqlite3

import gevent
import gevent.event
import pytest

from mealquest.households import create_household
from mealquest.read_cache import ReadCache

pytestmark = pytest.mark.both_databases


def household_names(store):
    """The households the tests made (the migrations make one of their own)."""
    return store.read(
        lambda conn: [
            row["name"]
            for row in conn.execute(
                "SELECT name FROM households WHERE name LIKE 'The %' ORDER BY id"
            )
        ]
    )


def add_household_elsewhere(db_path, name):
    """A commit by another connection, as another process or `flask` command makes."""
    other = sqlite3.connect(db_path, isolation_level=None)
    try:
        other.execute(
            "INSERT INTO households (name, created_at) VALUES (?, '2024-01-01T00:00:00.000000Z')",
            (name,),
        )
    finally:
        other.close()


class CountedRead:
    """The names of the store's households, read from it, counting the reads."""

    def __init__(self, store):
        self.store = store
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return household_names(self.store)


def test_an_answer_is_exactly_what_a_read_gives_now_after_every_commit(store):
    cache = ReadCache(store, 8)
    read = CountedRead(store)
    assert cache.get("names", read) == []
    for name in ("The Smiths", "The Joneses"):
        create_household(store, name)
        assert cache.get("names", read) == household_names(store)
    assert cache.get("names", read) == ["The Smiths", "The Joneses"]


def test_while_nothing_commits_sqlite_reads_once_and_postgresql_every_time(store):
    cache = ReadCache(store, 8)
    read = CountedRead(store)
    for _ in range(5):
        assert cache.get("names", read) == []
    # PostgreSQL has no cheap counter of every commit: it is always asked.
    assert read.reads == (1 if store.name == "sqlite" else 5)


def test_each_key_is_read_for_itself(store):
    cache = ReadCache(store, 8)
    answers = {key: cache.get(key, lambda key=key: key.upper()) for key in ("a", "b")}
    assert answers == {"a": "A", "b": "B"}
    assert cache.get("a", lambda: "read again") == ("A" if store.name == "sqlite" else "read again")


@pytest.mark.sqlite_only("the read cache is SQLite's: on PostgreSQL every request reads")
def test_a_commit_by_another_process_drops_every_answer(store, db_path):
    cache = ReadCache(store, 8)
    read = CountedRead(store)
    assert cache.get("names", read) == []
    add_household_elsewhere(db_path, "The Lees")
    assert cache.get("names", read) == ["The Lees"]
    assert read.reads == 2


@pytest.mark.sqlite_only("the read cache is SQLite's: on PostgreSQL every request reads")
def test_a_commit_landing_during_the_read_leaves_no_stale_answer(store, db_path):
    cache = ReadCache(store, 8)

    def read_then_another_process_commits():
        names = household_names(store)
        add_household_elsewhere(db_path, "The Lees")
        return names

    assert cache.get("names", read_then_another_process_commits) == []
    assert cache.get("names", lambda: household_names(store)) == ["The Lees"]


@pytest.mark.sqlite_only("the read cache is SQLite's: on PostgreSQL every request reads")
def test_a_reopened_reader_connection_is_not_taken_for_an_unchanged_database(store, db_path):
    # A new connection counts commits afresh, from the same first value as
    # the last one did, so the marker names its connection too.
    first = store.change_marker()
    store.close()
    add_household_elsewhere(db_path, "The Lees")
    second = store.change_marker()
    assert second != first
    assert second[1] == first[1]  # the counter alone would have said "unchanged"


@pytest.mark.sqlite_only("the read cache is SQLite's: on PostgreSQL every request reads")
def test_an_answer_read_while_another_greenlet_saw_a_commit_is_not_kept(store):
    cache = ReadCache(store, 8)
    read_started = gevent.event.Event()
    read_may_end = gevent.event.Event()

    def slow_read():
        value = household_names(store)
        read_started.set()
        read_may_end.wait(10)
        return value

    slow = gevent.spawn(cache.get, "names", slow_read)
    assert read_started.wait(10)
    create_household(store, "The Smiths")
    # Another greenlet reads after the commit and keeps its fresh answer.
    assert cache.get("other", lambda: "fresh") == "fresh"
    read_may_end.set()
    assert slow.get(timeout=10) == []  # the caller gets what it read
    # ... but the cache did not keep that older answer beside the fresh one.
    assert cache.get("names", lambda: household_names(store)) == ["The Smiths"]
    assert cache.get("other", lambda: "read again") == "fresh"


@pytest.mark.sqlite_only("the read cache is SQLite's: on PostgreSQL every request reads")
def test_at_most_max_entries_are_kept_the_oldest_dropped_first(store):
    cache = ReadCache(store, 2)
    for key in ("a", "b", "c"):
        assert cache.get(key, lambda key=key: key) == key
    assert cache.get("a", lambda: "read again") == "read again"
    assert cache.get("c", lambda: "read again") == "c"


@pytest.mark.sqlite_only("the read cache is SQLite's: on PostgreSQL every request reads")
def test_an_answer_keep_refuses_is_read_every_time(store):
    cache = ReadCache(store, 8)
    read = CountedRead(store)
    for _ in range(3):
        assert cache.get("names", read, keep=lambda names: len(names) > 0) == []
    assert read.reads == 3
    create_household(store, "The Smiths")
    for _ in range(3):
        assert cache.get("names", read, keep=lambda names: len(names) > 0) == ["The Smiths"]
    assert read.reads == 4


def test_max_entries_must_be_positive(store):
    with pytest.raises(ValueError, match="max_entries"):
        ReadCache(store, 0)
