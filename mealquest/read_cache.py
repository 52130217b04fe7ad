"""Answers of reads kept while the database is unchanged, for routes polled hard.

A household polls `GET /api/v1/jobs/{id}` until its job ends, and most polls
find nothing new. An entry is kept only while the store's change marker
(`Store.change_marker`: on SQLite, `PRAGMA data_version`, which counts every
commit of every other connection, in any process) stays what it was when the
entry was read, so a cached answer is exactly the one a read would give now:
a revoked token or a job's new state shows on the very next request, from
whichever process wrote it. Any commit drops every entry. A store without a
marker (PostgreSQL) reads every time.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from mealquest.db.driver import Store

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ReadCache(Generic[K, V]):
    """At most `max_entries` answers, the oldest dropped first."""

    def __init__(self, store: Store, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._store = store
        self._max_entries = max_entries
        self._marker: Hashable | None = None
        self._entries: dict[K, V] = {}

    def get(self, key: K, read: Callable[[], V], keep: Callable[[V], bool] | None = None) -> V:
        """The answer `read()` gives now, from the cache when nothing has committed
        since it was read; `read` must depend on nothing but the database and `key`.
        An answer `keep` refuses (a large one, say) is read every time."""
        # Taken before the read: a commit landing during the read leaves an
        # entry filed under the older marker, which the next call drops.
        marker = self._store.change_marker()
        if marker is None:
            return read()
        if marker == self._marker:
            try:
                return self._entries[key]
            except KeyError:
                pass
        else:
            self._marker = marker
            self._entries = {}
        value = read()
        # A read may yield to other greenlets (a busy database is retried);
        # if one of them saw a newer marker meanwhile, this answer may be older
        # than the entries now kept, and is not kept.
        if self._marker == marker and (keep is None or keep(value)):
            entries = self._entries
            if key not in entries and len(entries) >= self._max_entries:
                del entries[next(iter(entries))]
            entries[key] = value
        return value
