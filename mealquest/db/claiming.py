"""What both drivers' claims share: a batch filled priority by priority.

A driver's claim statement takes the jobs of one priority, the best among
the due jobs it may take, households in turn (so fairness only ever
weighs jobs of the same priority). A batch that priority could not fill is
filled from the next one by the same statement again, in the same
transaction: the jobs just claimed are no longer queued, so it finds the
next priority. The loop ends when the batch is full, when a statement takes
nothing, or when no due job of a kind with room is left queued (one index
probe, where the statement costs far more), so it runs once per priority
present at most.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from mealquest.jobs.model import Job

ClaimOnePriority = Callable[..., list[Job]]
# Whether a job of one of the kinds is queued and due (in the claim's transaction).
AnyDue = Callable[[Any, Collection[str]], bool]


def by_priority(
    claim_one_priority: ClaimOnePriority,
    any_due: AnyDue,
    tx: Any,
    *,
    limit: int,
    kinds: Collection[str],
    kind_limits: Mapping[str, int] | None = None,
    **arguments: Any,
) -> list[Job]:
    """Up to `limit` jobs, best priority first, each priority's jobs in the
    order `claim_one_priority` gives them. `kind_limits` (how many of a kind
    this claim may take) is spent across the statements.

    A statement that left room runs again only if `any_due(tx, kinds)`,
    asked about the kinds with room left, finds a due job still queued: the
    claim statement is far dearer, and most claims that leave room have
    taken every due job."""
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
        if len(claimed) < limit and arguments.get("now") is None:
            open_kinds = [kind for kind in kinds if room.get(kind, 1) > 0]
            if not any_due(tx, open_kinds):
                break
    return claimed
