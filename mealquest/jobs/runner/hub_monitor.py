"""Names the job whose handler blocked the event loop.

A handler that blocks the hub (a CPU loop, a blocking C call) stops every
greenlet of its process: heartbeats, HTTP requests, the other jobs. A native
monitor thread notices a hub that has not switched for `max_blocking_time`
and reports the greenlet that held it; this turns that report into one
ERROR line with the job's id and kind, so the poison job can be found. What
happens to the jobs if the process is then killed (gunicorn's timeout) is
the interruption policy's business.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import gevent
from gevent import events
from gevent._monitor import PeriodicMonitoringThread
from gevent.hub import Hub, get_hub

from mealquest.jobs.runner.running import Running

logger = logging.getLogger(__name__)

# The job a greenlet runs, if any (a pool's `Slots.job_of`).
JobOf = Callable[[object], Running | None]

_lookups: list[JobOf] = []
_subscribed = False


class BlockedHubMonitor(PeriodicMonitoringThread):  # type: ignore[misc]  # gevent is untyped
    """gevent's monitor thread, reporting a blocked hub by its greenlet alone.

    gevent's own report holds the stack of every thread, read through
    `sys._current_frames()`. On CPython 3.11 that call can freeze the whole
    process for good: it holds the interpreter's lock on its list of threads
    while it allocates, a garbage collection may start there, and freeing a
    thread-local object takes that same lock again (CPython issue 106883;
    3.12 no longer collects inside the call). The monitor makes its report
    exactly when a handler misbehaves, and a test process froze in it. The
    greenlet is all the job's ERROR line needs; the event's report is empty.
    """

    def monitor_blocking(self, hub: Hub) -> tuple[Any, list[str]] | None:
        blocked = self._greenlet_tracer.did_block_hub(hub)
        if not blocked:
            return None
        greenlet = blocked[1]
        events.notify(
            events.EventLoopBlocked(greenlet, gevent.config.max_blocking_time, [], hub=hub)
        )
        return greenlet, []


def watch(job_of: JobOf, max_blocking_seconds: float) -> None:
    """Report the handlers `job_of` knows that block the hub longer than the limit.

    Call from the hub's own thread (the monitor installs its tracer there).
    A monitor gevent already runs (`GEVENT_MONITOR_THREAD_ENABLE`) is kept:
    its reports reach this module too.
    """
    global _subscribed
    _lookups.append(job_of)
    if not _subscribed:
        events.subscribers.append(_on_event)
        _subscribed = True
    # Read by the monitor on every round: one process, one threshold.
    gevent.config.max_blocking_time = max_blocking_seconds
    hub = get_hub()
    if hub.periodic_monitoring_thread is None:
        hub.periodic_monitoring_thread = BlockedHubMonitor(hub)


def _on_event(event: Any) -> None:
    # Runs in the monitor thread while the hub is blocked: read only.
    if not isinstance(event, events.EventLoopBlocked):
        return
    for job_of in list(_lookups):
        entry = job_of(event.greenlet)
        if entry is not None:
            logger.error(
                "job's handler blocked the event loop for over %.1fs "
                "(a CPU loop or a blocking call: run such work in the hub's thread pool)",
                event.blocking_time,
                extra=entry.extra,
            )
            return
