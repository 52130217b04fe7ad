"""The native thread that runs one process's SQLite writes, for its greenlets.

A write waiting on another process's lock would freeze every greenlet of
the process if it ran on the hub (sqlite3 is a blocking C library gevent
cannot patch), so each process's writes run, one after another, in this
thread; the calling greenlet waits cooperatively for the answer.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

import gevent
from gevent.hub import Waiter, get_hub
from gevent.monkey import get_original

from mealquest.db.errors import (
    StorageFault,
    StoreError,
    StoreWriterDied,
    StoreWriterUnresponsive,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Writes that arrive while the thread is busy share one transaction (see
# `SqliteStore._run_writes`), this many at most: the lock is held for all
# of them, and an enqueue's write is about 10-20 us.
GROUP_LIMIT = 64

_start_native_thread = get_original("_thread", "start_new_thread")
_native_lock = get_original("_thread", "allocate_lock")


class WriterThread:
    """One native thread that runs calls in order for the greenlets of one hub.

    Why not `gevent.threadpool.ThreadPool(1)`: measured here, its hop cost
    40-70 us per call (a result object, an async watcher and a greenlet per
    task) around a write transaction of about 6 us, and every enqueue, claim
    and completion pays one. This does the same with one request queue, one
    native lock used as a wake-up, and one async watcher: about 20 us.

    The only gevent call made from the native thread is the async watcher's
    `send()`, which libev makes for exactly that (gevent's own threadpool
    uses it); results are handed to their greenlets by the hub, in the
    watcher's callback. So is what the thread has to report (a failed idle
    task, its own death): logged from the hub, since logging takes locks
    that are gevent's in a patched process.

    Supervised: a call's exception goes to its caller; an exception of the
    idle task is logged at ERROR and the thread serves on; anything else
    that ends the thread is logged at ERROR, sets `died`, and every waiting
    and later call raises StoreWriterDied at once. A caller never waits past
    its own timeout either way.

    Grouped calls (`call_grouped`): the items of the grouped calls waiting
    next to each other in the queue when the thread comes to them (those
    that arrived while it was busy) go to `run_group` together, at most
    `GROUP_LIMIT` at once, which answers each item's outcome: how the
    store makes concurrent writes share one transaction and one commit.
    """

    def __init__(
        self,
        on_idle: Callable[[Callable[[], bool]], None] | None = None,
        idle_seconds: float = 0.0,
        run_group: Callable[[list[Any]], list[tuple[bool, Any]]] | None = None,
    ) -> None:
        # `on_idle` runs in the thread once no call has come for `idle_seconds`,
        # given a probe of whether one has come since (to cut a long task short).
        self._on_idle = on_idle
        self._idle_seconds = idle_seconds
        self._run_group = run_group
        self._hub = get_hub()
        # (waiter, a function to call, False) or (waiter, an item for `run_group`, True).
        self._requests: deque[tuple[Waiter, Any, bool] | None] = deque()
        self._results: deque[tuple[Waiter, bool, Any]] = deque()
        # What the thread asks the hub to log: (message, error).
        self._notices: deque[tuple[str, BaseException]] = deque()
        # The exception that ended the thread, once it has.
        self.died: BaseException | None = None
        self._work = _native_lock()
        self._work.acquire()
        self._pending = 0
        self._done = self._hub.loop.async_()
        # Keeps the loop alive only while a call is pending (a gevent.wait()
        # must not hang on an idle writer).
        self._done.ref = False
        self._done.start(self._deliver)
        _start_native_thread(self._serve, ())

    def call(self, fn: Callable[[], T], timeout: float) -> T:
        """Run `fn()` in the thread; the calling greenlet waits (other greenlets run).

        Raises StoreWriterUnresponsive if no answer comes within `timeout`
        seconds (`fn` may still run later), StoreWriterDied if the thread is dead.

        Only from the native thread whose hub made this writer, as with gevent's
        ThreadPool: the result comes back through that hub."""
        result: T = self._call(fn, False, timeout)
        return result

    def call_grouped(self, item: Any, timeout: float) -> Any:
        """Have `run_group` run `item`, with the grouped calls queued beside it;
        waits, answers and raises as `call` does."""
        assert self._run_group is not None
        return self._call(item, True, timeout)

    def _call(self, task: Any, grouped: bool, timeout: float) -> Any:
        if self.died is not None:
            raise StoreWriterDied()
        if get_hub() is not self._hub:
            raise StoreError("the store's writer is used from another native thread")
        waiter = Waiter(self._hub)
        self._requests.append((waiter, task, grouped))
        self._pending += 1
        self._done.ref = True
        self._wake()
        # update=True: timed from now, not from the loop's cached time.
        timer = self._hub.loop.timer(timeout)
        timer.start(self._give_up, waiter, update=True)
        try:
            ok, value = waiter.get()
        finally:
            timer.close()
        if not ok:
            raise value
        return value

    def idle_for_this_hub(self) -> bool:
        """Whether no call is queued or running and the caller is this writer's
        hub's thread: a write made there now meets no write of ours."""
        return not self._pending and self.died is None and get_hub() is self._hub

    def _calls_waiting(self) -> bool:
        # In the thread: a call the hub queued since it last looked.
        return bool(self._requests)

    def nudge(self) -> None:
        """Have the idle task run at the thread's next pause, though no call
        came (writes made elsewhere, on the hub, want their checkpoint)."""
        self._wake()

    def stop(self) -> None:
        """End the thread once the calls queued so far have run; the caller has
        no call in flight (their results could no longer be delivered)."""
        self._requests.append(None)
        self._wake()
        self._done.close()

    def _wake(self) -> None:
        # Already released: the thread is awake and drains the whole queue before sleeping.
        with suppress(RuntimeError):
            self._work.release()

    def _serve(self) -> None:
        # The native thread: runs calls, posts results; no other gevent call.
        try:
            while True:
                if self._on_idle is None:
                    self._work.acquire()
                elif not self._work.acquire(timeout=self._idle_seconds):
                    try:
                        self._on_idle(self._calls_waiting)
                    except Exception as error:
                        self._notify("the store's writer thread: its idle task failed", error)
                    self._work.acquire()
                while self._requests:
                    request = self._requests.popleft()
                    if request is None:
                        return
                    waiter, task, grouped = request
                    if grouped:
                        self._serve_group(waiter, task)
                        continue
                    try:
                        outcome = (waiter, True, task())
                    except BaseException as error:
                        outcome = (waiter, False, error)
                    self._results.append(outcome)
                    self._done.send()
        except BaseException as error:
            # Set before the notice, so that a call made once the hub has it
            # (or already now) fails at once instead of queueing for nobody.
            self.died = error
            with suppress(Exception):
                self._notify("the store's writer thread died; this process cannot write", error)

    def _serve_group(self, waiter: Waiter, item: Any) -> None:
        # In the thread: this grouped call and those queued right behind it.
        waiters, items = [waiter], [item]
        while len(items) < GROUP_LIMIT and self._requests:
            following = self._requests[0]
            if following is None or not following[2]:
                break
            self._requests.popleft()
            waiters.append(following[0])
            items.append(following[1])
        assert self._run_group is not None
        try:
            outcomes = self._run_group(items)
        except BaseException as error:
            outcomes = [(False, error)] * len(items)
        for waiter_of, (ok, value) in zip(waiters, outcomes, strict=True):
            self._results.append((waiter_of, ok, value))
        self._done.send()

    def _notify(self, message: str, error: BaseException) -> None:
        # In the thread: the hub logs it (see `_deliver`).
        self._notices.append((message, error))
        self._done.send()

    def _deliver(self) -> None:
        # In the hub: hand each result to its waiting greenlet (a killed
        # greenlet's Waiter just keeps it).
        while self._results:
            waiter, ok, value = self._results.popleft()
            self._pending -= 1
            if not self._pending:
                self._done.ref = False
            waiter.switch((ok, value))
        if self._notices:
            self._report()

    def _report(self) -> None:
        # In the hub; rare, so a greenlet does the logging (a handler's lock
        # must not be waited for in the hub).
        while self._notices:
            message, error = self._notices.popleft()
            gevent.spawn(_log_notice, message, error)
        if self.died is not None:
            # Calls queued before the thread died will never run: fail them now.
            while self._requests:
                request = self._requests.popleft()
                if request is not None:
                    self._pending -= 1
                    request[0].switch((False, StoreWriterDied()))
            self._done.ref = False

    def _give_up(self, waiter: Waiter) -> None:
        # In the hub, at a caller's timeout. A result already posted still wins
        # (a hub held up past the timeout may run this callback first).
        self._deliver()
        if waiter.greenlet is not None:
            waiter.switch((False, StoreWriterUnresponsive()))


def _log_notice(message: str, error: BaseException) -> None:
    if isinstance(error, sqlite3.Error | StorageFault):
        # SQLite's own message may name the file: its error name only.
        name = getattr(error, "sqlite_errorname", None) or getattr(error, "name", None)
        logger.error("%s: %s (%s)", message, type(error).__name__, name)
    else:
        logger.error(message, exc_info=(type(error), error, error.__traceback__))
