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

from collections.abc import Callable, Collection
from dataclasses import replace

from mealquest.db.driver import Reads, Transaction
from mealquest.model.jobs import ClaimRequest, Job

# A claim counts on up to this share of its batch from each household when
# it chooses how many households to take (`household_share`).
_HOUSEHOLDS_A_BATCH_COUNTS_ON = 4

# How often a sweep looks for households held by their partitions, and how
# long a hold lasts at most: the longest a job that falls due in a
# held household, or a partition whose rate frees with time, waits for a
# claim to look at that household again (each driver's `holds`).
HOLD_SECONDS = 1.0

# A look for a due job under partition limits reads up to this many due jobs
# (oldest first) before it reads the households not held instead: past that
# many held back, its cost is the households', not each job held back.
DUE_READ_FIRST = 64

# One statement's claim of the jobs of one priority.
ClaimOnePriority = Callable[[Transaction, ClaimRequest], list[Job]]
# Whether a job of one of the kinds is queued and due (in the claim's transaction).
AnyDue = Callable[[Reads, Collection[str]], bool]


def by_priority(
    claim_one_priority: ClaimOnePriority, any_due: AnyDue, tx: Transaction, request: ClaimRequest
) -> list[Job]:
    """Up to `request.limit` jobs, best priority first, each priority's jobs in
    the order `claim_one_priority` gives them. `request.kind_limits` (how
    many of a kind this claim may take) is spent across the statements.

    A statement that left room runs again only if `any_due(tx, kinds)`,
    asked about the kinds with room left, finds a due job still queued: the
    claim statement is far dearer, and most claims that leave room have
    taken every due job."""
    claimed: list[Job] = []
    room = dict(request.kind_limits)
    while len(claimed) < request.limit:
        batch = claim_one_priority(
            tx, replace(request, limit=request.limit - len(claimed), kind_limits=dict(room))
        )
        if not batch:
            break
        claimed += batch
        for job in batch:
            if job.kind in room:
                room[job.kind] -= 1
        if len(claimed) < request.limit and request.now is None:
            open_kinds = [kind for kind in request.kinds if room.get(kind, 1) > 0]
            if not any_due(tx, open_kinds):
                break
    return claimed


def household_share(limit: int) -> int:
    """How many of a household's queued jobs a claim of `limit` counts on
    when it chooses how many households to take: a quarter of the batch,
    rounded up.

    A claim takes the households in turn until their queued jobs, each
    household's counted up to this share, fill the batch, and fills the
    batch from those households as if claimed one job at a time. On
    PostgreSQL a household is one claim's until it commits (the claim locks
    its queue row, `SKIP LOCKED`): a claim of 32 that took all twenty
    households with due jobs left every claim made at the same moment by
    another process nothing to take, so a second process drained no faster
    than one. Taking four households of eight jobs instead leaves the next
    ones to the other claims, and each household still takes its turn:
    the next claim ranks the households served now after the others. Where
    households have few jobs queued, a claim takes as many households as
    fill its batch, as before.
    """
    return -(-limit // _HOUSEHOLDS_A_BATCH_COUNTS_ON)
