"""What lets a household see its job live, one of each per process: the
watcher that every event stream and long poll waits on, the places of held
requests, and the reader of queued jobs' standings.

A held request is an event stream or a long poll (`?wait=`): each holds a
connection and a greenlet for up to `MEALQUEST_STREAM_MAX_SECONDS`, so both
are bounded together, twice:

* a household may hold `MEALQUEST_STREAM_MAX_PER_HOUSEHOLD` at once across
  every process and host: each has a row (`job_streams`), taken in the
  transaction that counts the household's live ones, released when the
  request ends, and renewed by its process at every heartbeat. A process
  that dies leaves its rows unrenewed: they stop counting after three
  heartbeats, and a later renewal anywhere deletes them;
* a process holds `MEALQUEST_WAIT_MAX_PER_PROCESS` at once (by default half
  of gunicorn's `worker_connections`), however many households ask, so that
  held requests never take the connections a plain request needs.

Over either, a stream is refused (`429 too_many_streams`, `503`) and a long
poll is not held: it answers at once, as the same request without `wait`.
"""

from __future__ import annotations

import logging
import math
import secrets
from dataclasses import dataclass

from flask import Flask, current_app

from mealquest.db.driver import Store
from mealquest.db.errors import StoreError
from mealquest.jobs.errors import ProcessHoldsTooMany, TooManyStreams
from mealquest.jobs.service import get_jobs
from mealquest.jobs.service.standing import Standings
from mealquest.jobs.service.watcher import JobWatcher

logger = logging.getLogger(__name__)

LIVE_KEY = "mealquest.jobs.service.live"
# A stream's row counts for this many heartbeats after its last renewal.
_HEARTBEATS_COUNTED = 3
# When a stream refused for the process's cap is told to come back.
_PROCESS_RETRY_SECONDS = 5


# Without gunicorn's own figure (`flask run`, tests): its default
# `worker_connections`, of which held requests may take half.
DEFAULT_WORKER_CONNECTIONS = 1000


class HeldPlaces:
    """This process's held requests' places in their households' limits and
    in its own."""

    def __init__(
        self,
        store: Store,
        *,
        at_most: int,
        per_process: int,
        heartbeat_seconds: float,
        max_seconds: float,
    ) -> None:
        self.store = store
        self.at_most = at_most
        self.per_process = per_process
        self.max_seconds = max_seconds
        self.stale_after_seconds = _HEARTBEATS_COUNTED * heartbeat_seconds
        # This process's own id for its rows: a fresh random one per boot.
        self.owner = secrets.token_hex(16)
        self.open = 0

    def take(self, household_id: int) -> str:
        """A place for one more of the household's held requests: its id;
        `ProcessHoldsTooMany` when this process holds its most, or
        `TooManyStreams` with when the household's oldest one ends."""
        if self.open >= self.per_process:
            raise ProcessHoldsTooMany(_PROCESS_RETRY_SECONDS)
        # Counted before the write, which yields to other requests' takes.
        self.open += 1
        stream_id = secrets.token_hex(16)
        try:
            oldest = self.store.write(
                self.store.streams.open_stream,
                stream_id=stream_id,
                household_id=household_id,
                owner=self.owner,
                at_most=self.at_most,
                stale_after_seconds=self.stale_after_seconds,
            )
        except BaseException:
            self.open -= 1
            raise
        if oldest is not None:
            self.open -= 1
            raise TooManyStreams(max(1, math.ceil(self.max_seconds - oldest)))
        return stream_id

    def release(self, stream_id: str) -> None:
        self.open -= 1
        try:
            self.store.write(self.store.streams.close_stream, stream_id)
        except StoreError:
            logger.warning("could not release a stream's place; it lapses unrenewed")

    def renew(self) -> None:
        """At each heartbeat: keep this process's rows counted."""
        if self.open:
            self.store.write(
                self.store.streams.renew_streams,
                self.owner,
                stale_after_seconds=self.stale_after_seconds,
            )


@dataclass(frozen=True)
class Live:
    watcher: JobWatcher
    places: HeldPlaces
    standings: Standings
    # How long a stream (or a long poll) is held at most, how often an idle
    # stream sends a comment, and how long a stream's write may wait on its
    # reader.
    max_seconds: float
    heartbeat_seconds: float
    send_timeout_seconds: float


def init_app(app: Flask) -> Live:
    """Make the app's watcher, places and standings; nothing starts until a
    stream or a long poll first watches a job, in the process serving it."""
    config = app.config
    jobs = get_jobs(app)
    store = jobs.store
    heartbeat = float(config["STREAM_HEARTBEAT_SECONDS"])
    max_seconds = float(config["STREAM_MAX_SECONDS"])
    per_process = config["WAIT_MAX_PER_PROCESS"]
    places = HeldPlaces(
        store,
        at_most=int(config["STREAM_MAX_PER_HOUSEHOLD"]),
        # Under gunicorn, its post-fork hook sets it from `worker_connections`.
        per_process=int(per_process or DEFAULT_WORKER_CONNECTIONS // 2),
        heartbeat_seconds=heartbeat,
        max_seconds=max_seconds,
    )
    watcher = JobWatcher(
        store,
        change_check_seconds=float(config["JOB_CHANGE_CHECK_SECONDS"]),
        poll_seconds=float(config["JOB_POLL_SECONDS"]),
        heartbeat_seconds=heartbeat,
    )
    watcher.on_heartbeat(places.renew)
    live = Live(
        watcher,
        places,
        Standings(store, jobs.registry, stale_after_seconds=float(config["JOB_LEASE_SECONDS"])),
        max_seconds,
        heartbeat,
        float(config["STREAM_SEND_TIMEOUT_SECONDS"]),
    )
    app.extensions[LIVE_KEY] = live
    return live


def get_live(app: Flask | None = None) -> Live:
    live: Live = (app or current_app).extensions[LIVE_KEY]
    return live
