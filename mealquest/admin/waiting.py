"""Why a queued job waits, as the job's page says it: its kind is paused, its
partition is at its limit of running jobs or at its rate, or it waits for
its household's answer.

Read when the page is, from the pause table, the partition's running jobs
(their partial index) and its rate ledger's row: a few probes, whatever
the queue holds.
"""

from __future__ import annotations

from mealquest.db.driver import Store
from mealquest.jobs.registry import Registry
from mealquest.jobs.service import flow
from mealquest.masking import mask
from mealquest.model.jobs import Job, Status


def why_waiting(store: Store, registry: Registry, job: Job) -> str | None:
    """A sentence saying what holds a queued job back, or None (nothing this
    page knows of: its turn, its due time or a free slot)."""
    if job.status is not Status.QUEUED:
        return None
    if job.waiting_signal is not None:
        return (
            f"It waits for its household's answer (signal {job.waiting_signal}); "
            f"at {job.run_at} it goes on without one."
        )
    paused = {entry.kind: entry for entry in store.read(store.flow.paused_kinds)}
    if job.kind in paused:
        return f"Its kind is paused (since {paused[job.kind].paused_at}): no process claims it."
    hold = flow.partition_hold(store, registry, job)
    if hold is None:
        return None
    limits, state = hold
    partition = mask(job.partition_key or "")
    if limits.max_running is not None and state.running >= limits.max_running:
        return (
            f"Its partition {partition} has {state.running} jobs running, "
            f"its limit of {limits.max_running}."
        )
    assert limits.rate is not None
    return (
        f"Its partition {partition} started {limits.rate.count} jobs in "
        f"{limits.rate.per_seconds:g} s, as many as its rate allows; "
        f"it may start more at {state.blocked_until}."
    )
