"""What both drivers' claims share: a batch filled priority by priority.

A driver's claim statement takes the jobs of one priority, the best among
the due jobs it may take, households in turn (so fairness only ever
weighs jobs of the same priority). A batch that priority could not fill is
filled from the next one by the same statement again, in the same
transaction: the jobs just claimed are no longer queued, so it finds the
next priority. The loop ends when the batch is full or a statement takes
nothing, so it runs once per priority present at most.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from mealquest.jobs.model import Job

ClaimOnePriority = Callable[..., list[Job]]


def by_priority(
    claim_one_priority: ClaimOnePriority,
    tx: Any,
    *,
    limit: int,
    kinds: Collection[str],
    kind_limits: Mapping[str, int] | None = None,
    **arguments: Any,
) -> list[Job]:
    """Up to `limit` jobs, best priority first, each priority's jobs in the
    order `claim_one_priority` gives them. `kind_limits` (how many of a kind
    this claim may take) is spent across the statements."""
    claimed: list[Job] = []
    room = dict(kind_limits or {})
    while len(claimed) < limit:
        batch = claim_one_priority(
            tx, limit=limit - len(claimed), kinds=kinds, kind_limits=room, **arguments
        )
        if not batch:
            break
        claimed += batch
        for job in batch:
            if job.kind in room:
                room[job.kind] -= 1
    return claimed
