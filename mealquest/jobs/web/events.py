"""A job's or a batch's event stream, as `text/event-stream` (server-sent events).

What a stream sends: at once an event named for what it follows (`job`,
`batch`) with its object as data and `id: <version>` (unless the client's
`Last-Event-ID` already has that version: states supersede each other, so
the latest is all a reconnect needs), then one such event per later version,
a comment line whenever `heartbeat` seconds pass without one, and after the
final state an event `end`; then it ends. It also ends, without `end`, when
its worker stops, after `max_seconds`, when its credential is revoked, or
when what it follows is deleted: a client reconnects (a browser's
`EventSource` does by itself, with its `Last-Event-ID`), and finds it, a
refusal, or a 404.

A job's stream watches the job; a batch's watches each of its jobs into one
inbox, and reads the batch again when any of them changes (`follow`): the
rest of the stream is the same code for both.

The stream is the request's own greenlet waiting on its watch's inbox (one
process-wide watcher feeds every inbox: `mealquest.jobs.service.watcher`), so an idle
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
import re
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, Protocol

import gevent
from flask import Response, request
from gevent.queue import Empty, Queue
from marshmallow import ValidationError

from mealquest.jobs.service.live import Live
from mealquest.jobs.service.watcher import JOB, JobWatcher, Watch
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
_last_event_id = re.compile(LAST_EVENT_ID_PATTERN)


class Followed(Protocol):
    """What a stream follows: a job or a batch."""

    @property
    def id(self) -> str: ...

    @property
    def version(self) -> int: ...

    @property
    def status(self) -> Any: ...


# The data of an event: the object, as the stream's reader may see it.
Render = Callable[[Any], Any]
# After an item of the watches' inbox (what, value), what the stream follows
# as it now is; None ends the stream.
Follow = Callable[[Queue, str, Any], Any]


def event(name: str, data: Any, event_id: int | None = None) -> bytes:
    """One event: its id, its name, its data as one line of JSON."""
    lines = [] if event_id is None else [f"id: {event_id}"]
    lines += [f"event: {name}", "data: " + json.dumps(data, separators=(",", ":"))]
    return ("\n".join(lines) + "\n\n").encode()


def end_event(followed: Followed) -> bytes:
    return event("end", {"id": followed.id, "status": str(followed.status)}, followed.version)


def is_final(job: Job) -> bool:
    return job.status in FINAL_STATUSES


def follow_job(_inbox: Queue, what: str, value: Any) -> Job | None:
    """A job's stream: the job the watcher read; the job gone, the worker
    stopping or the credential revoked end it."""
    return value if what == JOB else None


def last_event_id_parameter(what: str) -> dict[str, Any]:
    """The `Last-Event-ID` parameter of `what`'s event stream, in the document."""
    return {
        "name": LAST_EVENT_ID,
        "required": False,
        "description": (
            f"the `id` (the {what}'s version) of the last event the client has: the current "
            "state is sent only if it is newer"
        ),
        "schema": {"type": "string", "pattern": LAST_EVENT_ID_PATTERN},
    }


def last_seen_version() -> int | None:
    """The request's `Last-Event-ID`, checked (ValidationError naming the header)."""
    value = request.headers.get(LAST_EVENT_ID)
    if value is None:
        return None
    if not _last_event_id.fullmatch(value):
        raise ValidationError({LAST_EVENT_ID: ["must be an event's id: a version"]})
    return int(value)


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
    """The stream's bytes, from `first` as read when it opened (see the module):
    a job's by default; a batch's with `name`, `is_final` and `follow` of its own.

    Its watches are let go and `on_close` called once, whether the stream
    ended by itself, its client went away, or the server never started
    sending it (the WSGI server calls `close`)."""

    def __init__(
        self,
        first: Followed,
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
        name: str = "job",
        is_final: Callable[[Any], bool] = is_final,
        follow: Follow = follow_job,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # A job's stream has one watch; a batch's, one per job, into one inbox.
        self.watches = watch if isinstance(watch, list) else [watch]
        self.watch = self.watches[0]
        self.watcher = watcher
        self.on_close = on_close
        self.closed = False
        self.name, self.render, self.is_final, self.follow = name, render, is_final, follow
        # The greenlet writing this stream's last chunk, while the write lasts.
        self._writing: Any = None
        events = self._run(first, send_first, heartbeat_seconds, clock() + max_seconds, clock)
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
            logger.info("dropping a %s's event stream: %s", self.name, why)
            writing.throw(ReaderStalled(why))

    def _let_go(self) -> None:
        if not self.closed:
            self.closed = True
            for watch in self.watches:
                self.watcher.unwatch(watch)
            self.on_close()

    def _run(
        self,
        current: Followed,
        send_first: bool,
        heartbeat_seconds: float,
        deadline: float,
        clock: Callable[[], float],
    ) -> Generator[bytes, None, None]:
        try:
            if send_first:
                yield event(self.name, self.render(current), current.version)
            while not self.is_final(current):
                left = deadline - clock()
                if left <= 0:
                    return
                try:
                    what, value = self.watch.inbox.get(timeout=min(heartbeat_seconds, left))
                except Empty:
                    yield KEEP_ALIVE
                    continue
                found = self.follow(self.watch.inbox, what, value)
                if found is None:
                    return  # gone, the worker stops, or the credential was revoked
                if found.version > current.version:
                    current = found
                    yield event(self.name, self.render(current), current.version)
            yield end_event(current)
        finally:
            self._let_go()


def stream_response(
    live: Live,
    first: Followed,
    watch: Watch | list[Watch],
    *,
    render: Render,
    send_first: bool,
    on_close: Callable[[], None] = lambda: None,
    **following: Any,
) -> Response:
    """The request's answer: `first`'s event stream, on the process's watcher
    and with its stream settings (`following`: a batch's `name`, `is_final`
    and `follow`)."""
    stream = EventStream(
        first,
        watch,
        live.watcher,
        render=render,
        send_first=send_first,
        heartbeat_seconds=live.heartbeat_seconds,
        max_seconds=live.max_seconds,
        send_timeout_seconds=live.send_timeout_seconds,
        writes_each_chunk=served_by_gunicorn(request.environ),
        on_close=on_close,
        **following,
    )
    return Response(stream, mimetype=MEDIA_TYPE, headers=STREAM_HEADERS)
