"""The gunicorn worker side: the job pool's life in a worker process.

`gunicorn.conf.py` imports this module only inside its hook functions, so it
is imported in a worker after the gevent worker has monkey-patched and
re-initialised the hub (and never in the master, which must hold nothing of
ours across fork). What happens when:

* `post_worker_init` -> `start_worker`: refuses a database behind the
  migrations (the worker exits with gunicorn's boot-error status, which stops
  the master) and serves one ahead of them with a warning (a newer release
  migrated it during a rolling deploy), starts this process's job pool
  unless `JOB_POOL_IN_WEB` is off, and spawns a watcher that begins the
  pool's drain as soon as the worker stops serving. The gevent worker waits,
  on SIGTERM, only for HTTP requests and runs no hook at that moment, so the
  watcher is what lets running jobs use the graceful timeout instead of
  whatever is left of it at exit. A pool that finds it cannot go on calls
  back, and the worker stops serving the same way: drained, then replaced by
  the master. In every worker, a pool or none, another watcher ends the
  open event streams and long polls as soon as the worker stops serving:
  the gevent worker waits for every request in flight before it exits, and
  a stream would otherwise hold it for the whole graceful timeout.
* `worker_int` -> `interrupt_worker` (SIGINT/SIGQUIT, quick shutdown): stop
  the pool at once, recording its running jobs.
* `worker_exit` -> `stop_worker`: waits for the drain (starting it if the
  worker exits some other way) and logs what it had to stop.

The drain is bounded by gunicorn's `graceful_timeout`, after which the
master SIGKILLs the worker, and by `timeout`, since a worker past its main
loop no longer tells the master it is alive.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gevent
from gevent.greenlet import Greenlet

from mealquest.db import database_errors, migrations
from mealquest.db.driver import Store
from mealquest.db.postgresql.waiting import BlockingPsycopg
from mealquest.extensions import get_store
from mealquest.jobs.runner.pool import Pool, StopReport
from mealquest.jobs.service import get_jobs
from mealquest.jobs.service.live import get_live
from mealquest.serving import collector, flask_app

logger = logging.getLogger(__name__)

# At most this share of the graceful timeout goes to handlers stopped at its end.
_KILL_GRACE_SHARE = 0.2
# Kept back from gunicorn's graceful timeout for recording what had to be
# stopped, and exiting before the master's SIGKILL.
STOP_MARGIN_SECONDS = 1.0
# How often the watcher looks at `worker.alive` (a Python attribute: no I/O).
_WATCH_SECONDS = 0.1
# How often a web-only worker looks whether its store can still write (an
# attribute: no I/O).
_STORE_WATCH_SECONDS = 1.0
# gunicorn's Arbiter.WORKER_BOOT_ERROR: a worker exiting with it stops the master.
_WORKER_BOOT_ERROR = 3
# Any other failing status: the master replaces the worker.
_WORKER_START_FAILED = 1


@dataclass
class _WorkerPool:
    """This worker's pool and its drain (a module global: one per process)."""

    pool: Pool
    stopper: Greenlet | None = None
    deadline: float = 0.0


_current: _WorkerPool | None = None


def start_worker(worker: Any) -> None:
    """post_worker_init: check the database, start the pool, watch for the stop."""
    global _current
    app = flask_app(worker.wsgi)
    if app.config["WAIT_MAX_PER_PROCESS"] is None:
        # Held requests may take half of this worker's connections, never all.
        get_live(app).places.per_process = max(1, int(worker.cfg.worker_connections) // 2)
    gevent.spawn(_end_streams_at_stop, worker, app)
    try:
        migrations.require_migrated(get_store(app))
        if not app.config["JOB_POOL_IN_WEB"]:
            # Web-only: jobs run in `flask jobs work` processes. No pool's
            # watchdog looks at the store here, so this worker watches it.
            logger.info("job pool not started in this web worker (JOB_POOL_IN_WEB is off)")
            gevent.spawn(_watch_store, worker, get_store(app))
            collector.settle()  # as below
            return
        pool = get_jobs(app).start_pool(on_fatal=_stop_serving(worker))
    except (migrations.MigrationError, BlockingPsycopg) as error:
        # Neither passes by itself: stop the server with one clear line.
        logger.error("refusing to serve: %s", error)
        sys.exit(_WORKER_BOOT_ERROR)
    except database_errors() as error:
        # Passing (a lock past the deadline, a server restarting): exit so the
        # master boots another worker. The boot-error status would stop the
        # whole server.
        logger.error("worker could not start its job pool: %s", type(error).__name__)
        sys.exit(_WORKER_START_FAILED)
    _current = _WorkerPool(pool)
    gevent.spawn(_watch, worker)
    # Everything made so far (the app, its modules, the pool) lives as long
    # as the worker: out of the collector's way, a full collection no longer
    # walks it. Measured (trivial route, 32 connections): 3,500 -> 5,400
    # requests/s a server, p99 about halved.
    collector.settle()


def _end_streams_at_stop(worker: Any, app: Any) -> None:
    """When the worker stops serving, end its streams and long polls at once."""
    while worker.alive:
        gevent.sleep(_WATCH_SECONDS)
    get_live(app).watcher.close_all()


def _watch_store(worker: Any, store: Store) -> None:
    """A web-only worker whose store can never write again (SQLite's writer
    thread died) would answer 503 to every write until it is restarted: it
    stops serving, as a pool that cannot go on makes it, and the master
    boots a replacement."""
    while worker.alive:
        if store.broken:
            logger.error("the store can no longer write; restarting this web worker")
            worker.alive = False
            return
        gevent.sleep(_STORE_WATCH_SECONDS)


def _stop_serving(worker: Any) -> Callable[[str], None]:
    """The pool's `on_fatal`: it has logged why it cannot go on (at ERROR).
    Clearing `alive` is what SIGTERM does in a gevent worker: it stops
    accepting and finishes its requests, the watcher drains the pool within
    the graceful timeout, and the master boots a replacement."""

    def on_fatal(reason: str) -> None:
        worker.alive = False

    return on_fatal


def _watch(worker: Any) -> None:
    # gunicorn clears `alive` on SIGTERM, SIGQUIT, SIGINT and after max_requests.
    while worker.alive:
        gevent.sleep(_WATCH_SECONDS)
    _begin_stop(worker, quick=False)


def interrupt_worker(worker: Any) -> None:
    """worker_int: a quick shutdown; record running jobs now instead of waiting."""
    _begin_stop(worker, quick=True)


def _begin_stop(worker: Any, *, quick: bool) -> None:
    current = _current
    if current is None or current.stopper is not None:
        return
    budget = min(float(worker.cfg.graceful_timeout), float(worker.cfg.timeout))
    # The stop's kill grace and its record must fit in the budget too, or the
    # master's SIGKILL comes before the stopped jobs are recorded.
    grace = min(current.pool.settings.kill_grace_seconds, budget * _KILL_GRACE_SHARE)
    timeout = 0.0 if quick else max(0.0, budget - STOP_MARGIN_SECONDS - grace)
    current.deadline = time.monotonic() + timeout + grace + STOP_MARGIN_SECONDS
    logger.info("worker stopping: running jobs get up to %.1fs to finish", timeout)
    current.stopper = gevent.spawn(current.pool.stop, timeout, kill_grace=grace)


def stop_worker(worker: Any) -> StopReport | None:
    """worker_exit: wait for the drain to record everything, and log what it did.

    Runs in the worker's main greenlet after the gevent worker's loop ended;
    the hub still runs greenlets while this waits, which the drain needs.
    """
    current = _current
    if current is None:
        return None
    _begin_stop(worker, quick=False)  # exits without SIGTERM (parent died) start it here
    assert current.stopper is not None
    current.stopper.join(timeout=max(0.0, current.deadline - time.monotonic()))
    if not current.stopper.ready():
        logger.error("the job pool did not stop in time; its jobs' leases will expire")
        return None
    if not current.stopper.successful():
        logger.error("stopping the job pool failed", exc_info=current.stopper.exception)
        return None
    report: StopReport = current.stopper.value
    logger.info(
        "worker exit: %d jobs finished, %d re-queued, %d interrupted by restart",
        report.finished,
        len(report.requeued),
        len(report.failed),
    )
    return report
