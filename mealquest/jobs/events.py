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
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from gevent.queue import Empty

from mealquest.jobs.watcher import JOB, JobWatcher, Watch
from mealquest.model.jobs import FINAL_STATUSES, Job

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


class EventStream:
    """The stream's bytes, from `job` as read when it opened (see the module).

    Its watch is let go and `on_close` called once, whether the stream ended
    by itself, its client went away, or the server never started sending it
    (the WSGI server calls `close`)."""

    def __init__(
        self,
        job: Job,
        watch: Watch,
        watcher: JobWatcher,
        *,
        render: Render,
        send_first: bool,
        heartbeat_seconds: float,
        max_seconds: float,
        on_close: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.watch = watch
        self.watcher = watcher
        self.on_close = on_close
        self.closed = False
        self._events = self._run(
            job, render, send_first, heartbeat_seconds, clock() + max_seconds, clock
        )

    def __iter__(self) -> Iterator[bytes]:
        return self._events

    def close(self) -> None:
        self._events.close()
        self._let_go()

    def _let_go(self) -> None:
        if not self.closed:
            self.closed = True
            self.watcher.unwatch(self.watch)
            self.on_close()

    def _run(
        self,
        job: Job,
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
