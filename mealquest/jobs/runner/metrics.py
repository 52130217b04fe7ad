"""What the runner tells the metrics: each attempt's run and wait, kept and
applied in batches (`AttemptMetrics`), and the rarer outcomes at once.

Nothing here may fail a job: every function only counts, and the rescue's
kind lookup is a read that is skipped (counted as kind `unknown`) when the
database cannot answer.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from mealquest.db.driver import Store
from mealquest.db.errors import StoreError
from mealquest.jobs.registry import Registry
from mealquest.jobs.runner.outcome import Outcome
from mealquest.jobs.runner.running import Running
from mealquest.metrics.registry import JOB_RESCUES, JOB_RUN_DURATION, JOB_RUNS, JOB_WAIT
from mealquest.model.jobs import Job, Recovered, Status

logger = logging.getLogger(__name__)

INTERRUPTED = "interrupted"
SNOOZED = "snoozed"
# An attempt that ended to wait for the household's answer (`ctx.wait_for`).
WAITING = "waiting"
# An attempt that ends queued again is a retry (its attempt spent or, after a
# storage fault, refunded) unless its handler snoozed it; the other outcomes
# are named by their status.
_OUTCOMES = {Status.QUEUED: "retried"}


def _outcome_label(outcome: Outcome) -> str:
    if outcome.snoozed:
        return SNOOZED
    if outcome.waiting is not None:
        return WAITING
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


# How often a pool applies its attempts' runs and waits to the metrics, and
# how many it keeps at most in between (applied at once past that).
APPLY_SECONDS = 0.25
KEPT_AT_MOST = 10_000


class AttemptMetrics:
    """The runs and waits of one pool's attempts, kept as plain tuples and
    applied to the metrics in batches (`apply`, every `APPLY_SECONDS` and
    when the pool stops).

    Why: applied as each attempt started and ended, they took about 8 µs of
    the hub a no-op job, a tenth of its time there (measured by leaving them
    out); in batches, about half of that: each count is one `inc` per kind
    and outcome, and the observations run back to back. A process killed
    outright loses what it kept since the last batch: about a quarter of a
    second of its attempts' metrics. Hub code only, as the pool's roles are.
    """

    def __init__(self, registry: Registry, *, kept_at_most: int = KEPT_AT_MOST) -> None:
        self.registry = registry
        self.kept_at_most = kept_at_most
        # (kind, due time, start time) of each start, as the claim stored them.
        self._waits: list[tuple[str, str, str]] = []
        # (kind, outcome label, seconds the handler ran: None for a kind no
        # longer registered) of each recorded attempt.
        self._runs: list[tuple[str, str, float | None]] = []

    def started(self, job: Job) -> None:
        """A claimed job starts: how long it waited, from its due time (`run_at`:
        its enqueue, unless delayed or a retry's backoff) to its claim, both by
        the database's clock as the claim stored them."""
        if job.started_at is None:
            return
        self._waits.append((job.kind, job.run_at, job.started_at))
        if len(self._waits) >= self.kept_at_most:
            self.apply()

    def attempt_recorded(self, entry: Running, outcome: Outcome) -> None:
        """A handler's attempt ended and its outcome is stored: count it, and how
        long the handler ran (from the start the executor gave its timeout)."""
        kind = entry.job.kind
        registered = self.registry.get(kind)
        ran = None
        if registered is not None:
            started = entry.deadline - registered.options.timeout_seconds
            ran = max(0.0, time.monotonic() - started)
        self._runs.append((kind, _outcome_label(outcome), ran))
        if len(self._runs) >= self.kept_at_most:
            self.apply()

    def apply(self) -> None:
        """Hand what was kept to the metrics, and keep nothing."""
        waits, self._waits = self._waits, []
        runs, self._runs = self._runs, []
        for (kind, label), count in Counter((kind, label) for kind, label, _ in runs).items():
            _runs(kind, label).inc(count)
        for kind, _, ran in runs:
            if ran is not None:
                _run_duration(kind).observe(ran)
        for kind, run_at, started_at in waits:
            try:
                waited = datetime.fromisoformat(started_at) - datetime.fromisoformat(run_at)
            except ValueError:  # not a time as the drivers write them: nothing to count
                continue
            _wait(kind).observe(max(0.0, waited.total_seconds()))


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
