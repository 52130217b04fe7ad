"""What the runner tells the metrics: one call where each outcome is recorded.

Nothing here may fail a job: every function only counts, and the rescue's
kind lookup is a read that is skipped (counted as kind `unknown`) when the
database cannot answer.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from mealquest.db.driver import Store
from mealquest.db.errors import StoreError
from mealquest.jobs.outcome import Outcome
from mealquest.jobs.registry import Registry
from mealquest.jobs.runner.running import Running
from mealquest.metrics.registry import JOB_RESCUES, JOB_RUN_DURATION, JOB_RUNS, JOB_WAIT
from mealquest.model.jobs import Job, Recovered, Status

logger = logging.getLogger(__name__)

INTERRUPTED = "interrupted"
SNOOZED = "snoozed"
# An attempt that ends queued again is a retry (its attempt spent or, after a
# storage fault, refunded) unless its handler snoozed it; the other outcomes
# are named by their status.
_OUTCOMES = {Status.QUEUED: "retried"}


def _outcome_label(outcome: Outcome) -> str:
    if outcome.snoozed:
        return SNOOZED
    return _OUTCOMES.get(outcome.to, str(outcome.to))


@functools.cache
def _runs(kind: str, outcome: str) -> Any:
    """The run counter of a kind and outcome. Kept: `labels()` checks and
    locks on every call, a tenth of what a no-op job costs its worker.
    Bounded by the registered kinds times the outcomes."""
    return JOB_RUNS.labels(kind=kind, outcome=outcome)


@functools.cache
def _run_duration(kind: str) -> Any:
    return JOB_RUN_DURATION.labels(kind=kind)


@functools.cache
def _wait(kind: str) -> Any:
    return JOB_WAIT.labels(kind=kind)


def started(job: Job) -> None:
    """A claimed job starts: how long it waited, from its due time (`run_at`:
    its enqueue, unless delayed or a retry's backoff) to its claim, both by
    the database's clock as the claim stored them."""
    if job.started_at is None:
        return
    try:
        waited = datetime.fromisoformat(job.started_at) - datetime.fromisoformat(job.run_at)
    except ValueError:  # not a time as the drivers write them: nothing to count
        return
    _wait(job.kind).observe(max(0.0, waited.total_seconds()))


def attempt_recorded(entry: Running, outcome: Outcome, registry: Registry) -> None:
    """A handler's attempt ended and its outcome is stored: count it, and how
    long the handler ran (from the start the executor gave its timeout)."""
    kind = entry.job.kind
    _runs(kind, _outcome_label(outcome)).inc()
    registered = registry.get(kind)
    if registered is not None:
        started = entry.deadline - registered.options.timeout_seconds
        _run_duration(kind).observe(max(0.0, time.monotonic() - started))


def given_up(kind: str, outcome: Outcome) -> None:
    """A handler that would not die was given up on and its job recorded
    (failed, or cancelled if a cancel had reached it)."""
    JOB_RUNS.labels(kind=kind, outcome=_outcome_label(outcome)).inc()


def interrupted(entries: Iterable[Running], recovered: Recovered) -> None:
    """A stopping pool recorded these of its jobs as interrupted."""
    ids = set(recovered.requeued) | set(recovered.failed)
    cancelled = set(recovered.cancelled)
    for entry in entries:
        if entry.job.id in ids:
            JOB_RUNS.labels(kind=entry.job.kind, outcome=INTERRUPTED).inc()
        elif entry.job.id in cancelled:
            JOB_RUNS.labels(kind=entry.job.kind, outcome=str(Status.CANCELLED)).inc()


def rescued(store: Store, recovered: Recovered) -> None:
    """The rescuer took back these jobs whose lease expired (rare: the read of
    their kinds costs nothing in the common case of none)."""
    ids = recovered.requeued + recovered.failed
    if not (ids or recovered.cancelled):
        return
    JOB_RESCUES.inc(len(ids) + len(recovered.cancelled))
    try:
        kinds = store.read(store.operations.kinds_of, ids + recovered.cancelled)
    except StoreError:
        logger.warning("could not read the kinds of rescued jobs for the metrics")
        kinds = {}
    for job_id in ids:
        JOB_RUNS.labels(kind=kinds.get(job_id, "unknown"), outcome=INTERRUPTED).inc()
    for job_id in recovered.cancelled:
        JOB_RUNS.labels(kind=kinds.get(job_id, "unknown"), outcome=str(Status.CANCELLED)).inc()
