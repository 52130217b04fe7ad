"""Pausing and resuming a kind for the whole deployment: what `flask jobs pause`
and `resume` and the dashboard's buttons call.

A pause is one row that every claim statement of every process reads, so
each process's next claim after the pause commits (an idle pool's at its
poll, at the latest) leaves the kind's queued jobs queued; its running jobs
finish as they would, and their retries wait too. Resuming deletes the row,
and the jobs are claimed in their usual order. Each is recorded in the
audit log in its own transaction, whoever took it (`operator` None: the CLI).
"""

from __future__ import annotations

import enum

from mealquest import audit
from mealquest.db.driver import Reads, Store, Transaction
from mealquest.jobs.errors import UnknownKind
from mealquest.jobs.registry import Registry
from mealquest.model.jobs import Job, PartitionLimits, PartitionState, PausedKind
from mealquest.model.operators import Operator


class Change(enum.Enum):
    """What a pause or a resume did."""

    PAUSED = "paused: no process claims its jobs until it is resumed; running ones finish"
    ALREADY_PAUSED = "already paused"
    RESUMED = "resumed: its queued jobs are claimed again"
    NOT_PAUSED = "not paused"


def pause(store: Store, registry: Registry, kind: str, operator: Operator | None) -> Change:
    """Pause a kind this release registers (UnknownKind otherwise: a typo must
    not pause nothing quietly), with its audit entry in the same transaction."""
    if registry.get(kind) is None:
        raise UnknownKind(f"{str(UnknownKind()).rstrip('.')}: {kind}")

    def write(tx: Transaction) -> bool:
        paused = store.flow.pause_kind(
            tx, kind, operator_id=None if operator is None else operator.id
        )
        audit.insert(tx, store, operator, "pause", f"kind {kind}", int(paused))
        return paused

    return Change.PAUSED if store.write(write) else Change.ALREADY_PAUSED


def resume(store: Store, kind: str, operator: Operator | None) -> Change:
    """Resume a paused kind (any: one a later release no longer registers too)."""

    def write(tx: Transaction) -> bool:
        resumed = store.flow.resume_kind(tx, kind)
        audit.insert(tx, store, operator, "resume", f"kind {kind}", int(resumed))
        return resumed

    return Change.RESUMED if store.write(write) else Change.NOT_PAUSED


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
    return store.read(read_partition_hold, store, registry, job)


def read_partition_hold(
    conn: Reads, store: Store, registry: Registry, job: Job
) -> tuple[PartitionLimits, PartitionState] | None:
    """`partition_hold`, read on `conn` (a read that reads more beside it)."""
    kind = registry.get(job.kind)
    limits = kind.options.partition_limits if kind is not None else None
    if limits is None or job.partition_key is None:
        return None
    state = store.flow.partition_state(conn, job.kind, job.partition_key)
    full = limits.max_running is not None and state.running >= limits.max_running
    spent = limits.rate is not None and state.blocked_until is not None
    return (limits, state) if full or spent else None
