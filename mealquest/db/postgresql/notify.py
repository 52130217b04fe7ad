"""LISTEN/NOTIFY as an optional wake-up between processes and hosts.

Polling is the guarantee; a notification only lets an idle process look for
work sooner. Two parts:

* `Notifier`: an enqueue sends `NOTIFY mealquest_jobs` in its transaction
  (delivered at commit), but at most once per `NOTIFY_INTERVAL_SECONDS` per
  process. Every NOTIFY takes a cluster-wide lock at commit, so one per
  insert would serialise all enqueues. An enqueue that falls inside the
  interval asks for one trailing NOTIFY at the interval's end instead, so a
  burst costs two notifications and no listener waits for its poll.
* `Listener`: one dedicated connection per process that LISTENs and counts
  what it hears; the count is the store's `data_version`. Off with
  `listen=False` (PgBouncer in transaction mode cannot LISTEN).

The listener runs in a `threading.Thread` looked up when it starts: a
greenlet in a gevent-patched process, a native thread otherwise, so it never
blocks a hub. The trailing NOTIFY is a greenlet scheduled on the hub of the
committing thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import gevent

from mealquest.db.driver import Transaction
from mealquest.db.errors import StoreError

logger = logging.getLogger(__name__)

CHANNEL = "mealquest_jobs"
NOTIFY_INTERVAL_SECONDS = 0.1
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

    def cancel(self) -> None:
        with self._lock:
            trailing, self._trailing = self._trailing, None
        if trailing is not None:
            trailing.kill(block=False)


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
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mealquest-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stopped.set()
        if self._thread.ident is not None:  # a start cut short never ran it
            self._thread.join(timeout)

    def _changed(self) -> None:
        self.count += 1

    def _run(self) -> None:
        import psycopg

        delay = _RECONNECT_FIRST_SECONDS
        while not self._stopped.is_set():
            try:
                with psycopg.connect(self.url, **self.connect_kwargs) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening = True
                    self._changed()
                    delay = _RECONNECT_FIRST_SECONDS
                    while not self._stopped.is_set():
                        for _notification in conn.notifies(timeout=_LISTEN_WAKE_SECONDS):
                            self._changed()
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
