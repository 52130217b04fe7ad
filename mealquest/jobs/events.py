"""A job's event stream, as `text/event-stream` (server-sent events).

What a stream sends: at once an event `job` with the job's object as data
and `id: <version>` (unless the client's `Last-Event-ID` already has that
version: states supersede each other, so the latest is all a reconnect
needs), then one `job` event per later version, a comment line whenever
`heartbeat` seconds pass without one, and after the final state an event
`end`; then it ends. It also ends, without `end`, when its worker stops,
after `max_seconds`, when its credential is revoked, or when the job is
deleted: a client reconnects (a browser's `EventSource` does by itself, with
its `Last-Event-ID`), and finds the job, a refusal, or a 404.

The stream is the request's own greenlet waiting on its watch's inbox (one
process-wide watcher feeds every inbox: `mealquest.jobs.watcher`), so an idle
stream costs a greenlet and its socket, and no database read of its own.

A client that stops reading would hold the greenlet in the server's write
forever, and with it the watch (whose inbox grows with every version the job
publishes) and a graceful restart until gunicorn kills the worker. So each
write has `send_timeout_seconds`: past it, and at once when the watch ends
(the worker stops, the credential goes) while a write waits, `ReaderStalled`
is raised into the write, and gunicorn drops the connection as it drops one
whose client went away.
"""

from __future__ import annotations

import errno
import json
import logging
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import gevent
from gevent.queue import Empty

from mealquest.jobs.watcher import JOB, JobWatcher, Watch
from mealquest.model.jobs import FINAL_STATUSES, Job

logger = logging.getLogger(__name__)

MEDIA_TYPE = "text/event-stream"
# Sent with every stream: never cached, and passed on by nginx as it comes
# (`X-Accel-Buffering: no` turns its proxy buffering off for this answer).
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
LAST_EVENT_ID = "Last-Event-ID"
# A version as `Last-Event-ID` carries it back.
LAST_EVENT_ID_PATTERN = r"^[0-9]{1,18}$"
KEEP_ALIVE = b": keep-alive\n\n"

# The data of a `job` event: the job's object, as the stream's reader may see it.
Render = Callable[[Job], Any]


def event(name: str, data: Any, event_id: int | None = None) -> bytes:
    """One event: its id, its name, its data as one line of JSON."""
    lines = [] if event_id is None else [f"id: {event_id}"]
    lines += [f"event: {name}", "data: " + json.dumps(data, separators=(",", ":"))]
    return ("\n".join(lines) + "\n\n").encode()


def job_event(job: Job, render: Render) -> bytes:
    return event("job", render(job), job.version)


def end_event(job: Job) -> bytes:
    return event("end", {"id": job.id, "status": str(job.status)}, job.version)


def is_final(job: Job) -> bool:
    return job.status in FINAL_STATUSES


class ReaderStalled(BrokenPipeError):
    """Raised into a stream's write that its reader held up past the send
    timeout, or when its watch ended meanwhile. An EPIPE, which gunicorn
    takes for a client gone away: it closes the connection quietly."""

    def __init__(self, why: str) -> None:
        super().__init__(errno.EPIPE, why)


STALLED = "its reader took nothing for the send timeout"


def served_by_gunicorn(environ: dict[str, Any]) -> bool:
    """Whether gunicorn serves the request (it puts its socket in the environ)."""
    return "gunicorn.socket" in environ


class EventStream:
    """The stream's bytes, from `job` as read when it opened (see the module).

    Its watch is let go and `on_close` called once, whether the stream ended
    by itself, its client went away, or the server never started sending it
    (the WSGI server calls `close`)."""

    def __init__(
        self,
        job: Any,
        watch: Watch | list[Watch],
        watcher: JobWatcher,
        *,
        render: Render,
        send_first: bool,
        heartbeat_seconds: float,
        max_seconds: float,
        send_timeout_seconds: float,
        writes_each_chunk: bool,
        on_close: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # A job's stream has one watch; a batch's, one per job, into one inbox.
        self.watches = watch if isinstance(watch, list) else [watch]
        self.watch = self.watches[0]
        self.watcher = watcher
        self.on_close = on_close
        self.closed = False
        # The greenlet writing this stream's last chunk, while the write lasts.
        self._writing: Any = None
        events = self._run(job, render, send_first, heartbeat_seconds, clock() + max_seconds, clock)
        # Only a server that writes each chunk before it asks for the next
        # (gunicorn) is in the write between a yield and the next: under any
        # other consumer (a test client) the greenlet may be elsewhere.
        if writes_each_chunk:
            for each in self.watches:
                each.on_end = self._drop_soon
            events = self._sent_in_time(events, send_timeout_seconds)
        self._events = events

    def __iter__(self) -> Iterator[bytes]:
        return self._events

    def close(self) -> None:
        self._events.close()
        self._let_go()

    def _sent_in_time(
        self, chunks: Iterator[bytes], send_timeout_seconds: float
    ) -> Generator[bytes, None, None]:
        """Each chunk, with a timer for the server's write of it: between this
        generator's yield and its resumption, the request's greenlet is in
        that write."""
        loop = gevent.get_hub().loop
        for chunk in chunks:
            self._writing = gevent.getcurrent()
            timer = loop.timer(send_timeout_seconds)
            timer.start(self._drop, STALLED)
            try:
                yield chunk
            finally:
                timer.close()
                self._writing = None

    def _drop_soon(self, why: str) -> None:
        # From whichever greenlet ended the watch: the drop runs from the hub.
        if self._writing is not None:
            gevent.get_hub().loop.run_callback(self._drop, why)

    def _drop(self, why: str) -> None:
        """Raise `ReaderStalled` into the write in progress, if one is (hub)."""
        writing, self._writing = self._writing, None
        if writing is not None:
            logger.info("dropping a job's event stream: %s", why)
            writing.throw(ReaderStalled(why))

    def _let_go(self) -> None:
        if not self.closed:
            self.closed = True
            for watch in self.watches:
                self.watcher.unwatch(watch)
            self.on_close()

    def _run(
        self,
        job: Any,
        render: Render,
        send_first: bool,
        heartbeat_seconds: float,
        deadline: float,
        clock: Callable[[], float],
    ) -> Generator[bytes, None, None]:
        try:
            if send_first:
                yield job_event(job, render)
            if is_final(job):
                yield end_event(job)
                return
            while True:
                left = deadline - clock()
                if left <= 0:
                    return
                try:
                    kind, value = self.watch.inbox.get(timeout=min(heartbeat_seconds, left))
                except Empty:
                    yield KEEP_ALIVE
                    continue
                if kind != JOB:
                    return  # the job is gone, the worker stops, or the credential was revoked
                job = value
                yield job_event(job, render)
                if is_final(job):
                    yield end_event(job)
                    return
        finally:
            self._let_go()
