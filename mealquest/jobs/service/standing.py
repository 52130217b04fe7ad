"""Where a queued job stands: the `queue` object of its answer.

`{"position", "ahead_in_household", "estimated_start_at", "waiting_for"}`
while the job is queued, null once it runs. How exact each figure is:

* `position`: the due jobs claims take before it, played one claim at a time
  from the database's state when it is read (`mealquest.db.standing`): with
  nothing else changing, each claim of a job ahead lowers it by exactly one.
  Every kind counts (a process claims only the kinds it has handlers for,
  and passes over a kind at its cap); `POSITION_COUNTED` means that many or
  more. A job not yet due counts every due job.
* `ahead_in_household`: how many of those are its household's: exact.
* `estimated_start_at`: an estimate: now, plus the jobs that must end before
  a slot is free for it (those ahead, and those running in the slots that
  serve its kind, less those slots), times the kind's mean run time over its
  latest finished jobs, shared among those slots; never before its `run_at`.
  Null while no live process handles its kind, or no job of its kind has
  finished to judge by.
* `waiting_for`: one reason, the first that holds of `paused`, `no_worker`,
  `dependencies`, `scheduled` / `retry`, `rate_limit`, `kind_cap`, `turn` (see
  `waiting_for`).

The figures change as other jobs are claimed, which is no write to this
job: they are as of the moment the answer was made, and a new version of
the job (what a conditional request and the event stream follow) comes only
with the job's own writes.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from mealquest.clock import from_text, to_text
from mealquest.db.driver import Reads, Store
from mealquest.jobs.registry import Registry
from mealquest.jobs.service import flow
from mealquest.model.jobs import WAITING_RUN_AT, Job, Status
from mealquest.model.processes import ProcessEntry
from mealquest.model.queue import Standing

# Positions are counted exactly up to this; this many means this many or more.
POSITION_COUNTED = 100
# How long a process keeps what it read of the live processes, and of each
# kind's run time: both change slowly, and every answer about a queued job
# needs them.
PROCESSES_KEPT_SECONDS = 1.0
RUN_TIME_KEPT_SECONDS = 10.0

Clock = Callable[[], float]

# A job due this late waits for the jobs it depends on.
_WAITING = to_text(WAITING_RUN_AT)


class WaitingFor(enum.StrEnum):
    """Why a queued job is not running yet."""

    PAUSED = "paused"
    """An operator paused its kind."""
    NO_WORKER = "no_worker"
    """No live process has a handler for its kind."""
    DEPENDENCIES = "dependencies"
    """It waits for jobs it depends on (or, a batch's callback, its batch) to end."""
    SCHEDULED = "scheduled"
    """Its `run_at` is ahead (it has not run yet)."""
    RETRY = "retry"
    """Its `run_at` is ahead: it waits out a retry's backoff."""
    RATE_LIMIT = "rate_limit"
    """Its partition is at its limit."""
    KIND_CAP = "kind_cap"
    """Its kind runs as many jobs as the deployment allows (`max_running`)."""
    HOUSEHOLD = "household"
    """It waits for its household's answer (`queue.signal` names it), or
    for its wait to time out."""
    TURN = "turn"
    """Due: other jobs go first."""


# Waits no run time can estimate the end of.
_NOT_ESTIMATED = (WaitingFor.PAUSED, WaitingFor.DEPENDENCIES, WaitingFor.HOUSEHOLD)


@dataclass(frozen=True)
class _Read:
    """What `Standings` reads of the database for queued jobs' objects."""

    standings: dict[str, Standing]
    paused: frozenset[str]
    # The jobs (by id) that their partition's limits hold back now.
    partition_held: frozenset[str]


@dataclass(frozen=True)
class QueueFacts:
    """What was read for one queued job, beside the job: its standing, the kinds
    live processes handle, and its kind's deployment-wide cap as this
    process registered the kind (None: none, or not a kind of this release)."""

    standing: Standing
    live_kinds: frozenset[str]
    kind_cap: int | None = None
    # An operator paused its kind; its partition's limits hold it back now.
    paused: bool = False
    partition_held: bool = False


def waiting_for(job: Job, facts: QueueFacts) -> WaitingFor:
    """The first reason that holds, in the order that holds a job longest:
    what no time cures (an operator's pause, no process for its kind), then
    its time, then what a due job meets at its claim (its partition's limit,
    its kind's cap), then its turn."""
    if facts.paused:
        return WaitingFor.PAUSED
    if job.kind not in facts.live_kinds:
        return WaitingFor.NO_WORKER
    if job.waiting_signal is not None:
        return WaitingFor.HOUSEHOLD
    if job.run_at >= _WAITING:
        return WaitingFor.DEPENDENCIES
    if job.run_at > facts.standing.now:
        return WaitingFor.RETRY if job.attempt > 0 else WaitingFor.SCHEDULED
    if facts.partition_held:
        return WaitingFor.RATE_LIMIT
    if facts.kind_cap is not None and facts.standing.kind_running >= facts.kind_cap:
        return WaitingFor.KIND_CAP
    return WaitingFor.TURN


def estimated_start(
    job: Job, standing: Standing, serving: Sequence[ProcessEntry], run_seconds: float | None
) -> str | None:
    """When the job may start (see the module), or None."""
    slots = sum(process.slots for process in serving)
    if slots == 0 or run_seconds is None:
        return None
    busy = sum(process.busy for process in serving)
    # The jobs that must end before a slot is free for this one.
    ahead = max(0, standing.position + busy + 1 - slots)
    start = from_text(standing.now) + timedelta(seconds=ahead * run_seconds / slots)
    return max(to_text(start), job.run_at)


class Standings:
    """One process's reader of queued jobs' `queue` objects."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        stale_after_seconds: float,
        clock: Clock = time.monotonic,
    ) -> None:
        self.store = store
        self.registry = registry
        # A process's entry not renewed for this long (a lease) is gone.
        self.stale_after_seconds = stale_after_seconds
        self.clock = clock
        self._processes: tuple[float, list[ProcessEntry]] | None = None
        self._run_seconds: dict[str, tuple[float, float | None]] = {}

    def queues(self, jobs: Sequence[Job]) -> dict[str, dict[str, Any]]:
        """The `queue` object of each queued job of `jobs`, by id (the others have none)."""
        queued = [job for job in jobs if job.status is Status.QUEUED]
        if not queued:
            return {}
        processes = self.live_processes()
        live_kinds = frozenset(kind for process in processes for kind in process.kinds)
        caps = self.registry.deployment_caps()
        read = self.store.read(self._read, queued)
        queues = {}
        for job in queued:
            standing = read.standings.get(job.id)
            if standing is None:
                continue
            facts = QueueFacts(
                standing,
                live_kinds,
                caps.get(job.kind),
                paused=job.kind in read.paused,
                partition_held=job.id in read.partition_held,
            )
            reason = waiting_for(job, facts)
            serving = [process for process in processes if job.kind in process.kinds]
            queues[job.id] = {
                "position": standing.position,
                "ahead_in_household": standing.ahead_in_household,
                "estimated_start_at": (
                    estimated_start(job, standing, serving, self.run_seconds(job.kind))
                    if serving and reason not in _NOT_ESTIMATED
                    else None
                ),
                "waiting_for": str(reason),
                "signal": job.waiting_signal,
            }
        return queues

    def queue(self, job: Job) -> dict[str, Any] | None:
        return self.queues([job]).get(job.id)

    def _read(self, conn: Reads, queued: Sequence[Job]) -> _Read:
        """What the queued jobs' objects need from the database, in one call of
        the store (on PostgreSQL, one connection taken from the pool, not one
        for each part)."""
        standings = self.store.jobs.queue_standings(conn, queued, at_most=POSITION_COUNTED)
        held = frozenset(
            job.id
            for job in queued
            if job.id in standings
            and job.run_at <= standings[job.id].now
            and flow.read_partition_hold(conn, self.store, self.registry, job) is not None
        )
        paused = frozenset(entry.kind for entry in self.store.flow.paused_kinds(conn))
        return _Read(standings, paused, held)

    def live_processes(self) -> list[ProcessEntry]:
        now = self.clock()
        kept = self._processes
        if kept is None or now - kept[0] >= PROCESSES_KEPT_SECONDS:
            read = self.store.read(
                self.store.processes.live_processes, stale_after_seconds=self.stale_after_seconds
            )
            kept = self._processes = (now, read)
        return kept[1]

    def run_seconds(self, kind: str) -> float | None:
        now = self.clock()
        kept = self._run_seconds.get(kind)
        if kept is None or now - kept[0] >= RUN_TIME_KEPT_SECONDS:
            kept = self._run_seconds[kind] = (
                now,
                self.store.read(self.store.jobs.kind_run_seconds, kind),
            )
        return kept[1]
