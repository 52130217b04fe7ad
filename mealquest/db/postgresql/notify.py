"""LISTEN/NOTIFY as an optional wake-up between processes and hosts.

Polling is the guarantee; a notification only lets an idle process look for
work sooner, or a stream watcher read a changed job sooner. Two parts:

* `Notifier`: an enqueue sends `NOTIFY mealquest_jobs` in its transaction
  (delivered at commit), but at most once per `NOTIFY_INTERVAL_SECONDS` per
  process. Every NOTIFY takes a cluster-wide lock at commit, so one per
  insert would serialise all enqueues. An enqueue that falls inside the
  interval asks for one trailing NOTIFY at the interval's end instead, so a
  burst costs two notifications and no listener waits for its poll. Writes
  that change jobs households watch (claims, partial results, outcomes,
  cancels) name them on `mealquest_job_changes` the same way, at most once
  per interval per process, the ids of a burst gathered into the trailing
  one: a watcher then reads those jobs only. A channel of its own, so that
  idle pools do not wake for them.
* `Listener`: one dedicated connection per process that LISTENs and counts
  the enqueues it hears (the store's `data_version`), and keeps the last
  job changes it heard. Off with `listen=False` (PgBouncer in transaction
  mode cannot LISTEN).

The listener runs in a `threading.Thread` looked up when it starts: a
greenlet in a gevent-patched process, a native thread otherwise, so it never
blocks a hub. The trailing NOTIFY is a greenlet scheduled on the hub of the
committing thread.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import gevent

from mealquest.db.driver import Transaction
from mealquest.db.errors import StoreError

logger = logging.getLogger(__name__)

CHANNEL = "mealquest_jobs"
CHANGES_CHANNEL = "mealquest_job_changes"
NOTIFY_INTERVAL_SECONDS = 0.1
# A payload naming any job: too many ids for one notification (PostgreSQL
# takes payloads under 8,000 bytes).
ANY_JOB = "*"
_PAYLOAD_BYTES = 7_900
# Job changes a listener keeps; a reader further behind reads every job.
_CHANGES_KEPT = 1_000
# The listener's longest wait between checks for `stop()`.
_LISTEN_WAKE_SECONDS = 0.25
_RECONNECT_FIRST_SECONDS = 0.1
_RECONNECT_MAX_SECONDS = 5.0


# The store's `write`, for the trailing NOTIFY's transaction of its own.
Write = Callable[[Callable[[Transaction], object]], object]


class Notifier:
    """One process's rate limit on NOTIFY."""

    def __init__(self, write: Write, interval: float = NOTIFY_INTERVAL_SECONDS) -> None:
        self.write = write
        self.interval = interval
        self.sent = 0  # NOTIFY statements issued (in transactions that may roll back)
        self._last = -float("inf")
        self._trailing: gevent.Greenlet | None = None  # the pending trailing NOTIFY
        self._lock = threading.Lock()
        # Job changes: the same rate, and the ids committed since the last one.
        self._changes_last = -float("inf")
        self._changes_pending: set[str] = set()
        self._changes_trailing: gevent.Greenlet | None = None

    def enqueued(self, tx: Transaction) -> bool:
        """Tell listening processes, when `tx` commits, that a job was enqueued;
        True if `tx` carries the NOTIFY."""
        with self._lock:
            now = time.monotonic()
            send = now - self._last >= self.interval
            if send:
                self._last = now
                self.sent += 1
        if send:
            tx.execute(f"NOTIFY {CHANNEL}")
        else:
            # Only once the enqueue is committed is there something to announce.
            tx.after_commit(self._schedule_trailing)
        return send

    def _schedule_trailing(self) -> None:
        with self._lock:
            if self._trailing is not None:
                return
            delay = max(self._last + self.interval - time.monotonic(), 0.0)
            # A greenlet on the committing thread's hub: the worker's own in a
            # gevent process; elsewhere it runs whenever that hub does.
            self._trailing = gevent.spawn_later(delay, self._trail, self._last)

    def _trail(self, last_when_scheduled: float) -> None:
        with self._lock:
            self._trailing = None
            if self._last != last_when_scheduled:
                return  # an enqueue committed since carried one
            self._last = time.monotonic()
            self.sent += 1
        try:
            self.write(lambda tx: tx.execute(f"NOTIFY {CHANNEL}"))
        except StoreError:
            # Polling finds the job; nothing else depends on this wake-up.
            logger.warning("could not send the trailing job notification")

    def changed(self, tx: Transaction, job_ids: Iterable[str]) -> bool:
        """Name the jobs `tx` changed to listening processes when it commits (or
        in the trailing notification, once committed); True if `tx` carries it."""
        ids = set(job_ids)
        if not ids:
            return False
        with self._lock:
            now = time.monotonic()
            send = now - self._changes_last >= self.interval
            if send:
                self._changes_last = now
                self.sent += 1
        if send:
            tx.execute("SELECT pg_notify(%s, %s)", (CHANGES_CHANNEL, changes_payload(ids)))
        else:
            tx.after_commit(lambda: self._schedule_changes(ids))
        return send

    def _schedule_changes(self, ids: set[str]) -> None:
        with self._lock:
            self._changes_pending |= ids
            if self._changes_trailing is not None:
                return
            delay = max(self._changes_last + self.interval - time.monotonic(), 0.0)
            self._changes_trailing = gevent.spawn_later(delay, self._trail_changes)

    def _trail_changes(self) -> None:
        with self._lock:
            self._changes_trailing = None
            ids, self._changes_pending = self._changes_pending, set()
            self._changes_last = time.monotonic()
            self.sent += 1
        if not ids:
            return
        payload = changes_payload(ids)
        try:
            self.write(
                lambda tx: tx.execute("SELECT pg_notify(%s, %s)", (CHANGES_CHANNEL, payload))
            )
        except StoreError:
            # The watchers' polling finds the changes; nothing else depends on this.
            logger.warning("could not send the trailing job-change notification")

    def cancel(self) -> None:
        with self._lock:
            trailing, self._trailing = self._trailing, None
            changes, self._changes_trailing = self._changes_trailing, None
        for greenlet in (trailing, changes):
            if greenlet is not None:
                greenlet.kill(block=False)


def changes_payload(job_ids: Collection[str]) -> str:
    """The ids as one notification carries them: comma-separated, or `ANY_JOB`
    when they would not fit."""
    payload = ",".join(sorted(job_ids))
    return payload if len(payload) <= _PAYLOAD_BYTES else ANY_JOB


class Listener:
    """A connection of its own that LISTENs and counts notifications.

    Each (re)connect counts too: notifications sent while it was not
    listening are lost, so the reader must look for due jobs once.
    """

    def __init__(self, url: str, connect_kwargs: Mapping[str, Any]) -> None:
        self.url = url
        self.connect_kwargs = dict(connect_kwargs)
        self.count = 0
        self.listening = False
        # Job changes heard: (number, ids or None for any job), the last few;
        # `generation` changes at every (re)connect and loss, after which
        # changes may have gone unheard.
        self.generation = 0
        self.changes_heard = 0
        self.changes: deque[tuple[int, frozenset[str] | None]] = deque(maxlen=_CHANGES_KEPT)
        # A channel of this listener's own, on which `stop` wakes it.
        self.stop_channel = f"mealquest_stop_{secrets.token_hex(8)}"
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mealquest-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0, wake: Callable[[str], None] | None = None) -> None:
        """Stop listening and wait for the listener to have closed its connection.

        `wake(channel)`, if given, sends a notification on the channel: the
        listener then leaves its wait at once rather than at its next check
        (`_LISTEN_WAKE_SECONDS`), so a process that closes its store is not
        held up by it. Not while it is not listening: the database may be
        away, and the wait is short then anyway."""
        self._stopped.set()
        if self._thread.ident is None:  # a start cut short never ran it
            return
        if wake is not None and self.listening:
            try:
                wake(self.stop_channel)
            except Exception:
                logger.debug("could not wake the listener to stop; it stops at its next check")
        self._thread.join(timeout)

    def _changed(self) -> None:
        self.count += 1
        self.generation += 1

    def _heard(self, channel: str, payload: str) -> None:
        if channel == self.stop_channel:
            return  # `stop`'s wake: the loop ends at its check
        if channel != CHANGES_CHANNEL:
            self.count += 1
            return
        self.changes_heard += 1
        ids = None if payload == ANY_JOB else frozenset(payload.split(","))
        self.changes.append((self.changes_heard, ids))

    def changed_since(
        self, since: tuple[int, int] | None
    ) -> tuple[tuple[int, int], set[str] | None]:
        """A mark of what was heard, and the jobs named since `since` (None: any
        job may have changed unheard: a reconnect, a mark too old, or none)."""
        mark = (self.generation, self.changes_heard)
        if since is None or since[0] != mark[0] or not self.listening:
            return mark, None
        ids: set[str] = set()
        heard = [entry for entry in list(self.changes) if entry[0] > since[1]]
        if len(heard) < mark[1] - since[1]:
            return mark, None  # some were dropped from the kept ones
        for _number, named in heard:
            if named is None:
                return mark, None
            ids |= named
        return mark, ids

    def _run(self) -> None:
        import psycopg

        delay = _RECONNECT_FIRST_SECONDS
        while not self._stopped.is_set():
            try:
                with psycopg.connect(self.url, **self.connect_kwargs) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    conn.execute(f"LISTEN {CHANGES_CHANNEL}")
                    conn.execute(f"LISTEN {self.stop_channel}")
                    self.listening = True
                    self._changed()
                    delay = _RECONNECT_FIRST_SECONDS
                    while not self._stopped.is_set():
                        for notification in conn.notifies(timeout=_LISTEN_WAKE_SECONDS):
                            self._heard(notification.channel, notification.payload)
                            if self._stopped.is_set():
                                break
            except psycopg.Error as error:
                # The error text may quote the host; the class says enough.
                logger.warning(
                    "job notifications interrupted (%s); polling until they are back",
                    type(error).__name__,
                )
            except Exception:
                logger.exception("job notification listener failed; polling until it is back")
            self.listening = False
            self._changed()
            self._stopped.wait(delay)
            delay = min(delay * 2, _RECONNECT_MAX_SECONDS)
