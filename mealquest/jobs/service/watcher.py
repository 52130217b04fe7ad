"""One watcher per process: reads the jobs that changed, for every stream and long poll.

Each open event stream and each long poll of a job is a `Watch` on one job,
with the version its client has and an inbox. One greenlet per process looks
for changes and hands each changed job to the inboxes of its watches, so the
database's reads grow with the jobs that change, not with the watches:

* it asks the store, every `change_check_seconds`, which jobs were written
  since its last look (`Store.job_changes`: on SQLite whether anything
  committed, from `PRAGMA data_version`; on PostgreSQL the ids other
  processes' writes named on their NOTIFY channel, or, without LISTEN,
  every job at each poll), and reads back whole only the watched jobs whose
  version moved (`changed_jobs`: one statement per 500 watched jobs, a
  primary-key probe each);
* those reads take at most a tenth of the process's time: after a read that
  took t, the next waits at least 10 t (a burst of commits then costs one
  read per gap, however many streams wait);
* every `poll_seconds` it reads every watched job anyway, whatever the store
  said: a notification lost to a reconnect or a failed trailing NOTIFY
  delays a change by that much at most;
* every `poll_seconds` it checks that every watch's credential is still
  live (one statement for all household tokens, which also leaves out a
  suspended or erased household's; an operator's session each) and ends the
  watches whose credential was revoked; it does the same for the watches a
  change is about to reach, before it reaches them. So a suspension or an
  erasure reaches open streams and held long polls within a poll;
* every `heartbeat_seconds` it runs the heartbeat callbacks (the held
  requests' places renewal).

`close_all` (the worker is stopping) ends every watch at once and refuses new
ones, so no open stream or long poll holds a graceful restart. A watch's
`on_end` lets its stream drop a write that its reader holds up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass, field

import gevent
from gevent.event import Event
from gevent.queue import Empty, Queue

from mealquest.db.driver import Store
from mealquest.db.errors import StoreError
from mealquest.jobs.errors import JobsError
from mealquest.model.jobs import Job

logger = logging.getLogger(__name__)

# What an inbox receives: ("job", the job as it now is), ("gone", None: the
# job was deleted), or ("ended", why: the worker stops, or the credential
# was revoked).
JOB, GONE, ENDED = "job", "gone", "ended"
STOPPING, REVOKED = "the worker is stopping", "the credential was revoked"
# After a read that took t, the next waits at least this many times t.
READ_GAP_FACTOR = 10
# A watched job whose read failed is read again after this long at most.
_RETRY_SECONDS = 1.0


class WatcherClosed(JobsError):
    """This process is stopping: it takes no new watches."""


@dataclass(frozen=True)
class Credential:
    """What a watch's client authenticated with: a household token's digest,
    or a dashboard session's digest."""

    kind: str  # TOKEN or SESSION
    digest: str


TOKEN, SESSION = "token", "session"


@dataclass(eq=False)
class Watch:
    """One client's watch of one job: the version it has, and its inbox."""

    job_id: str
    version: int
    credential: Credential | None = None
    inbox: Queue = field(default_factory=Queue)
    ended: str | None = None
    # Called with why, from the greenlet that ends the watch.
    on_end: Callable[[str], None] | None = None

    def end(self, why: str) -> None:
        if self.ended is None:
            self.ended = why
            self.inbox.put((ENDED, why))
            if self.on_end is not None:
                self.on_end(why)


class JobWatcher:
    """The process's watcher (see the module). Greenlet code only."""

    def __init__(
        self,
        store: Store,
        *,
        change_check_seconds: float,
        poll_seconds: float,
        heartbeat_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.change_check_seconds = change_check_seconds
        self.poll_seconds = poll_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.clock = clock
        self.closed = False
        self.reads = 0  # changed_jobs reads made (for tests and the bench)
        self._watches: dict[str, set[Watch]] = {}
        self._pending: set[str] = set()  # watched jobs to read at the next look
        self._heartbeats: list[Callable[[], None]] = []
        self._wanted = Event()
        self._greenlet: gevent.Greenlet | None = None

    # -- watches ------------------------------------------------------------------------

    def watch(
        self,
        job_id: str,
        version: int,
        credential: Credential | None = None,
        inbox: Queue | None = None,
    ) -> Watch:
        """A watch of the job from `version`: its inbox gets every later version.
        With `inbox`, into that one (watches of several jobs, read as one: a batch)."""
        if self.closed:
            raise WatcherClosed()
        watch = Watch(job_id, version, credential)
        if inbox is not None:
            watch.inbox = inbox
        self._watches.setdefault(job_id, set()).add(watch)
        # Read once whatever the store says: the job may have changed between
        # the client's read and this watch.
        self._pending.add(job_id)
        self._wanted.set()
        if self._greenlet is None or self._greenlet.dead:
            self._greenlet = gevent.spawn(self._run)
        return watch

    def unwatch(self, watch: Watch) -> None:
        watches = self._watches.get(watch.job_id)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._watches[watch.job_id]

    def watching(self) -> int:
        return sum(len(watches) for watches in self._watches.values())

    def on_heartbeat(self, callback: Callable[[], None]) -> None:
        """Run `callback` at every heartbeat while anything is watched."""
        self._heartbeats.append(callback)

    def close_all(self) -> None:
        """End every watch and take no more (the worker is stopping)."""
        self.closed = True
        for watches in list(self._watches.values()):
            for watch in list(watches):
                watch.end(STOPPING)
        self._wanted.set()

    # -- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        mark: Hashable | None = None
        next_read = next_poll = next_heartbeat = next_credentials = 0.0
        while not self.closed:
            if not self._watches:
                self._wanted.clear()
                self._wanted.wait()
                mark = None  # what happened meanwhile is unknown: read everything
                continue
            try:
                mark, changed = self.store.job_changes(mark)
            except StoreError:
                changed = None
            now = self.clock()
            if changed is None or now >= next_poll:
                self._pending.update(self._watches)
                next_poll = now + self.poll_seconds
            else:
                self._pending.update(job_id for job_id in changed if job_id in self._watches)
            if self._pending and now >= next_read:
                took = self._read()
                next_read = self.clock() + READ_GAP_FACTOR * took
            if now >= next_credentials:
                self._end_revoked([w for watches in self._watches.values() for w in watches])
                next_credentials = now + self.poll_seconds
            if now >= next_heartbeat:
                self._heartbeat()
                next_heartbeat = now + self.heartbeat_seconds
            gevent.sleep(self.change_check_seconds)

    def _read(self) -> float:
        """Read the pending watched jobs whose version moved, and hand them out;
        how long the read took."""
        started = self.clock()
        pending, self._pending = self._pending, set()
        versions = {
            job_id: min(watch.version for watch in self._watches[job_id])
            for job_id in pending
            if self._watches.get(job_id)
        }
        if not versions:
            return 0.0
        try:
            changed = self.store.read(self.store.jobs.changed_jobs, versions)
        except StoreError:
            logger.warning("could not read the watched jobs; reading them again shortly")
            self._pending |= set(versions)
            return _RETRY_SECONDS / READ_GAP_FACTOR
        self.reads += 1
        receiving = [
            watch
            for job_id in changed
            for watch in self._watches.get(job_id, ())
            if watch.ended is None
        ]
        self._end_revoked(receiving)
        for job_id, job in changed.items():
            for watch in list(self._watches.get(job_id, ())):
                if watch.ended is not None:
                    continue
                if job is None:
                    watch.inbox.put((GONE, None))
                elif job.version > watch.version:
                    watch.version = job.version
                    watch.inbox.put((JOB, job))
        return self.clock() - started

    def _heartbeat(self) -> None:
        for callback in self._heartbeats:
            try:
                callback()
            except StoreError:
                logger.warning("a stream heartbeat could not reach the database")
            except Exception:
                logger.exception("a stream heartbeat failed")

    def _end_revoked(self, watches: Collection[Watch]) -> None:
        """End the watches whose credential is no longer live."""
        tokens = {
            w.credential.digest for w in watches if w.credential and w.credential.kind == TOKEN
        }
        sessions = {
            w.credential.digest for w in watches if w.credential and w.credential.kind == SESSION
        }
        try:
            live = set()
            if tokens:
                live = self.store.read(self.store.households.live_token_digests, tokens)
            for digest in sessions:  # operators: a few at most
                if self.store.read(self.store.sessions.session_operator, digest) is not None:
                    live.add(digest)
        except StoreError:
            return  # checked again at the next heartbeat
        for watch in watches:
            if watch.credential is not None and watch.credential.digest not in live:
                watch.end(REVOKED)

    def stop(self) -> None:
        """End the loop (tests and app teardown); watches end as at `close_all`."""
        self.close_all()
        if self._greenlet is not None:
            self._greenlet.kill(block=True, timeout=2)

    def is_watched(self, job_id: str) -> bool:
        return job_id in self._watches


def wait_for_version(
    watcher: JobWatcher, job: Job, timeout: float, credential: Credential | None = None
) -> bool:
    """Wait until `job` has a version after its own, `credential` is no longer
    live, `timeout` seconds pass, or the watcher closes; whether the caller
    must read again (a newer version, the job's deletion, or the credential's
    end, which the read refuses)."""
    watch = watcher.watch(job.id, job.version, credential)
    try:
        try:
            kind, why = watch.inbox.get(timeout=timeout)
        except Empty:
            return False
        return kind in (JOB, GONE) or why == REVOKED
    finally:
        watcher.unwatch(watch)
