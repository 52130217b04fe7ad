"""Names the job whose handler blocked the event loop.

A handler that blocks the hub (a CPU loop, a blocking C call) stops every
greenlet of its process: heartbeats, HTTP requests, the other jobs. gevent's
monitor thread notices a hub that has not switched for `max_blocking_time`
and reports the greenlet that held it; this turns that report into one
ERROR line with the job's id and kind, so the poison job can be found. What
happens to the jobs if the process is then killed (gunicorn's timeout) is
the interruption policy's business.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from typing import Any

import gevent
from gevent import events
from gevent._monitor import MonitorWarning
from gevent.hub import get_hub

from mealquest.jobs.executor import Executor

logger = logging.getLogger(__name__)

_executors: weakref.WeakSet[Executor] = weakref.WeakSet()
_subscribed = False


def watch(executor: Executor, max_blocking_seconds: float) -> None:
    """Report handlers of `executor` that block the hub longer than the limit.

    Call from the hub's own thread (the monitor installs its tracer there).
    """
    global _subscribed
    _executors.add(executor)
    if not _subscribed:
        events.subscribers.append(_on_event)
        _subscribed = True
    # Read by the monitor on every round: one process, one threshold.
    gevent.config.max_blocking_time = max_blocking_seconds
    hub = get_hub()
    if hub.periodic_monitoring_thread is None:
        # Our ERROR line replaces gevent's stack dump on stderr.
        gevent.config.print_blocking_reports = False
        gevent.config.monitor_thread = True
        with warnings.catch_warnings():
            # Memory monitoring wants psutil; only the blocking report is used.
            warnings.simplefilter("ignore", MonitorWarning)
            hub.start_periodic_monitoring_thread()


def _on_event(event: Any) -> None:
    # Runs in gevent's monitor thread while the hub is blocked: read only.
    if not isinstance(event, events.EventLoopBlocked):
        return
    for executor in list(_executors):
        entry = executor.job_of(event.greenlet)
        if entry is not None:
            logger.error(
                "job's handler blocked the event loop for over %.1fs "
                "(a CPU loop or a blocking call: run such work in the hub's thread pool)",
                event.blocking_time,
                extra=entry.extra,
            )
            return
