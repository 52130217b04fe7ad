"""Answers of reads kept while the database is unchanged, for routes polled hard.

A household polls `GET /api/v1/jobs/{id}` until its job ends, and most polls
find nothing new. An entry is kept only while the store's change marker
(`Store.change_marker`: on SQLite, `PRAGMA data_version`, which counts every
commit of every other connection, in any process) stays what it was when the
entry was read, so a cached answer is exactly the one a read would give now:
a revoked token or a job's new state shows on the very next request, from
whichever process wrote it. Any commit drops every entry. A store without a
marker (PostgreSQL) reads every time. A cache made with `ttl_seconds` also
reads again an entry that old, for answers that time changes as well (a
queued job's place in line: a job falling due, an estimate from now).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from mealquest.db.driver import Store

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ReadCache(Generic[K, V]):
    """At most `max_entries` answers, the oldest dropped first."""

    def __init__(
        self,
        store: Store,
        max_entries: int,
        *,
        ttl_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._store = store
        self._max_entries = max_entries
        self._ttl = ttl_seconds
        self._clock = clock
        self._marker: Hashable | None = None
        # Each answer, with when it was read (0 without a ttl).
        self._entries: dict[K, tuple[V, float]] = {}

    def get(self, key: K, read: Callable[[], V], keep: Callable[[V], bool] | None = None) -> V:
        """The answer `read()` gives now, from the cache when nothing has committed
        since it was read; `read` must depend on nothing but the database and `key`.
        An answer `keep` refuses (a large one, say) is read every time."""
        # Taken before the read: a commit landing during the read leaves an
        # entry filed under the older marker, which the next call drops.
        marker = self._store.change_marker()
        if marker is None:
            return read()
        now = self._clock() if self._ttl is not None else 0.0
        if marker == self._marker:
            entry = self._entries.get(key)
            if entry is not None and (self._ttl is None or now - entry[1] < self._ttl):
                return entry[0]
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
            entries[key] = (value, now)
        return value
