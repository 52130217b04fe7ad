"""A batch's event stream: as a job's (`mealquest.jobs.events`), with the
batch's object as each event's data, `id:` its version, and `end` once it
is finished.

It watches every job of the batch (and its callback) into one inbox, so the
process's one watcher still does all the reading of changes; a change to any
of them reads the batch again, and an event goes out only when its version
moved (two changes read together make one event)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from gevent.queue import Empty, Queue

from mealquest.jobs.events import KEEP_ALIVE, EventStream, event
from mealquest.jobs.watcher import ENDED, STOPPING, Credential, JobWatcher, Watch
from mealquest.model.batches import Batch, BatchStatus


def watch_batch(watcher: JobWatcher, batch: Batch, credential: Credential | None) -> list[Watch]:
    """One watch per job of the batch, all into one inbox."""
    inbox: Queue = Queue()
    watched = batch.members + ((batch.callback,) if batch.callback else ())
    watches: list[Watch] = []
    try:
        for member in watched:
            watches.append(watcher.watch(member.job_id, member.version, credential, inbox))
    except Exception:
        for watch in watches:
            watcher.unwatch(watch)
        raise
    return watches


def batch_changed(
    watcher: JobWatcher, batch: Batch, seconds: float, credential: Credential | None
) -> bool:
    """Wait until a job of the batch changes, the credential ends, or `seconds`
    pass; whether to read the batch again."""
    watches = watch_batch(watcher, batch, credential)
    try:
        try:
            kind, why = watches[0].inbox.get(timeout=seconds)
        except Empty:
            return False
        return bool(kind != ENDED or why != STOPPING)
    finally:
        for watch in watches:
            watcher.unwatch(watch)


# The data of a `batch` event: the batch's object.
BatchRender = Callable[[Batch], Any]


def batch_event(batch: Batch, render: BatchRender) -> bytes:
    return event("batch", render(batch), batch.version)


def end_event(batch: Batch) -> bytes:
    return event("end", {"id": batch.id, "status": str(batch.status)}, batch.version)


class BatchEventStream(EventStream):
    """The stream of `batch` as read when it opened; `read` reads it again
    (None: it is gone)."""

    def __init__(
        self, batch: Batch, *args: Any, read: Callable[[], Batch | None], **kwargs: Any
    ) -> None:
        self.read = read
        super().__init__(batch, *args, **kwargs)

    def _run(
        self,
        job: Any,
        render: Any,
        send_first: bool,
        heartbeat_seconds: float,
        deadline: float,
        clock: Callable[[], float],
    ) -> Generator[bytes, None, None]:
        batch: Batch = job
        try:
            if send_first:
                yield batch_event(batch, render)
            if batch.status is BatchStatus.FINISHED:
                yield end_event(batch)
                return
            while True:
                left = deadline - clock()
                if left <= 0:
                    return
                try:
                    kind, _value = self.watch.inbox.get(timeout=min(heartbeat_seconds, left))
                except Empty:
                    yield KEEP_ALIVE
                    continue
                if kind == ENDED:
                    return  # the worker stops, or the credential was revoked
                while not self.watch.inbox.empty():  # what else changed meanwhile
                    kind, _value = self.watch.inbox.get()
                    if kind == ENDED:
                        return
                found = self.read()
                if found is None:
                    return
                if found.version > batch.version:
                    batch = found
                    yield batch_event(batch, render)
                if batch.status is BatchStatus.FINISHED:
                    yield end_event(batch)
                    return
        finally:
            self._let_go()
