"""The process's one watcher, on both databases: the reads it makes grow with
the jobs that change, not with the streams that watch them."""

from __future__ import annotations

import time

import gevent
import pytest

from mealquest.jobs.service.watcher import JOB, JobWatcher

pytestmark = pytest.mark.both_databases

WATCHES_PER_JOB = 3


def settle(watcher: JobWatcher, until, what: str, seconds: float = 30) -> None:
    """Let the watcher's greenlet run until `until()` holds."""
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, what
        gevent.sleep(0.01)


def hearing_changes(store) -> None:
    """On PostgreSQL with LISTEN, wait until the store's listener listens.
    Until then the store can only say "anything may have changed" at each
    tick, and each tick reads every watched job: a listener slow to connect
    (a loaded machine) made those reads look like the change's."""
    if getattr(store, "listen", False):
        store.job_changes(None)
        deadline = time.monotonic() + 30
        while not store._started_listener().listening:
            assert time.monotonic() < deadline, "the store's listener never listened"
            gevent.sleep(0.01)


def test_one_change_among_many_watched_jobs_is_one_read_for_all_their_watches(
    store, jobs, household
):
    ids = [
        jobs.enqueue("succeed", {"value": n}, household_id=household.household_id, delay=3600)
        for n in range(100)
    ]
    hearing_changes(store)
    # Polling everything is off for the test: only what the store says changed is read.
    watcher = JobWatcher(
        store, change_check_seconds=0.01, poll_seconds=3600, heartbeat_seconds=3600
    )
    try:
        watches = [watcher.watch(job_id, 1) for job_id in ids for _ in range(WATCHES_PER_JOB)]
        settle(watcher, lambda: watcher.reads >= 1 and not watcher._pending, "first read")
        before = watcher.reads
        # Nothing changed: nothing reaches any inbox, however long it looks.
        gevent.sleep(0.3)
        assert all(watch.inbox.empty() for watch in watches)

        jobs.cancel(ids[7])
        mine = [w for w in watches if w.job_id == ids[7]]
        settle(watcher, lambda: all(not w.inbox.empty() for w in mine), "the change")
        gevent.sleep(0.3)  # anything more it would read, it reads now

        assert watcher.reads - before <= 2  # one read for every watch of every job
        for watch in mine:
            what, job = watch.inbox.get_nowait()
            assert what == JOB
            assert job.status.value == "cancelled"
            assert watch.inbox.empty()
            assert watch.version == job.version
        assert all(w.inbox.empty() for w in watches if w.job_id != ids[7])
    finally:
        watcher.stop()
