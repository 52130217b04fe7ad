"""What lets a household see its job live, one of each per process: the
watcher that every event stream and long poll waits on, the households'
places for open streams, and the reader of queued jobs' standings.

A household may hold `MEALQUEST_STREAM_MAX_PER_HOUSEHOLD` streams open at
once across every process and host: each open stream has a row
(`job_streams`), taken in the transaction that counts the household's live
ones, released when the stream ends, and renewed by its process at every
heartbeat. A process that dies leaves its rows unrenewed: they stop counting
after three heartbeats, and a later renewal anywhere deletes them.
"""

from __future__ import annotations

import logging
import math
import secrets
from dataclasses import dataclass

from flask import Flask, current_app

from mealquest.db.driver import Store
from mealquest.db.errors import StoreError
from mealquest.jobs.errors import TooManyStreams
from mealquest.jobs.service import get_jobs
from mealquest.jobs.standing import Standings
from mealquest.jobs.watcher import JobWatcher

logger = logging.getLogger(__name__)

LIVE_KEY = "mealquest.jobs.live"
# A stream's row counts for this many heartbeats after its last renewal.
_HEARTBEATS_COUNTED = 3


class StreamPlaces:
    """This process's streams' places in their households' limits."""

    def __init__(
        self, store: Store, *, at_most: int, heartbeat_seconds: float, max_seconds: float
    ) -> None:
        self.store = store
        self.at_most = at_most
        self.max_seconds = max_seconds
        self.stale_after_seconds = _HEARTBEATS_COUNTED * heartbeat_seconds
        # This process's own id for its rows: a fresh random one per boot.
        self.owner = secrets.token_hex(16)
        self.open = 0

    def take(self, household_id: int) -> str:
        """A place for one more of the household's streams: its id, or
        `TooManyStreams` with when its oldest stream ends."""
        stream_id = secrets.token_hex(16)
        oldest = self.store.write(
            self.store.streams.open_stream,
            stream_id=stream_id,
            household_id=household_id,
            owner=self.owner,
            at_most=self.at_most,
            stale_after_seconds=self.stale_after_seconds,
        )
        if oldest is not None:
            raise TooManyStreams(max(1, math.ceil(self.max_seconds - oldest)))
        self.open += 1
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
    places: StreamPlaces
    standings: Standings
    # How long a stream (or a long poll) is held at most, and how often an
    # idle stream sends a comment.
    max_seconds: float
    heartbeat_seconds: float


def init_app(app: Flask) -> Live:
    """Make the app's watcher, places and standings; nothing starts until a
    stream or a long poll first watches a job, in the process serving it."""
    config = app.config
    jobs = get_jobs(app)
    store = jobs.store
    heartbeat = float(config["STREAM_HEARTBEAT_SECONDS"])
    max_seconds = float(config["STREAM_MAX_SECONDS"])
    places = StreamPlaces(
        store,
        at_most=int(config["STREAM_MAX_PER_HOUSEHOLD"]),
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
    )
    app.extensions[LIVE_KEY] = live
    return live


def get_live(app: Flask | None = None) -> Live:
    live: Live = (app or current_app).extensions[LIVE_KEY]
    return live
