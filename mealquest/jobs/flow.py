"""Pausing and resuming a kind for the whole deployment: what `flask jobs pause`
and `resume` and the dashboard's buttons call.

A pause is one row that every claim statement of every process reads, so
each process's next claim after the pause commits (an idle pool's at its
poll, at the latest) leaves the kind's queued jobs queued; its running jobs
finish as they would, and their retries wait too. Resuming deletes the row,
and the jobs are claimed in their usual order.
"""

from __future__ import annotations

import enum

from mealquest.db.driver import Store
from mealquest.jobs.errors import UnknownKind
from mealquest.jobs.registry import Registry
from mealquest.model.jobs import Job, PartitionLimits, PartitionState, PausedKind


class Change(enum.Enum):
    """What a pause or a resume did."""

    PAUSED = "paused: no process claims its jobs until it is resumed; running ones finish"
    ALREADY_PAUSED = "already paused"
    RESUMED = "resumed: its queued jobs are claimed again"
    NOT_PAUSED = "not paused"


def pause(store: Store, registry: Registry, kind: str, *, operator_id: int | None = None) -> Change:
    """Pause a kind this release registers (UnknownKind otherwise: a typo must
    not pause nothing quietly); `operator_id` is who did, None from the CLI."""
    if registry.get(kind) is None:
        raise UnknownKind(f"{str(UnknownKind()).rstrip('.')}: {kind}")
    paused = store.write(store.flow.pause_kind, kind, operator_id=operator_id)
    return Change.PAUSED if paused else Change.ALREADY_PAUSED


def resume(store: Store, kind: str) -> Change:
    """Resume a paused kind (any: one a later release no longer registers too)."""
    return Change.RESUMED if store.write(store.flow.resume_kind, kind) else Change.NOT_PAUSED


def paused(store: Store) -> list[PausedKind]:
    """The paused kinds, as the database holds them now."""
    return store.read(store.flow.paused_kinds)


def partition_hold(
    store: Store, registry: Registry, job: Job
) -> tuple[PartitionLimits, PartitionState] | None:
    """The job's kind's partition limits and its partition's state, when they
    hold the job back now (at its limit of running jobs, or its rate spent);
    None when its kind has no limits or its partition has room. A probe of
    the partition's running jobs and one of its rate ledger."""
    kind = registry.get(job.kind)
    limits = kind.options.partition_limits if kind is not None else None
    if limits is None or job.partition_key is None:
        return None
    state = store.read(store.flow.partition_state, job.kind, job.partition_key)
    full = limits.max_running is not None and state.running >= limits.max_running
    spent = limits.rate is not None and state.blocked_until is not None
    return (limits, state) if full or spent else None
