"""What both drivers' place-in-line reads share: claims simulated one at a time.

A queued job's `position` is how many due jobs claims take before it. The
claim statement's order (best priority first; within a priority, households
in turn: the fewest running jobs, then the one served longest ago, then the
one served fewer jobs, then the oldest head; within a household, oldest
first) depends on what earlier claims did (each claimed job runs, and its
household was just served), so the order is found by playing claims of one
job each from the database's state now, as a pool whose slots free one at a
time makes them, until the job's own claim: with nothing else changing,
each claim of a job ahead lowers the position by exactly one. A claim of
several jobs at once (a pool filling several free slots) ranks its batch
from the state before it, which can put a household's second job before
another household's first: the position then moves by that batch, give or
take a household's turn.

What it reads is bounded by `at_most`, not by the queue: per priority above
the job's, the households with running jobs (at most the deployment's
slots) and the first households with nothing running in turn order (a few
more than `at_most`: each of them is claimed from before any household with
a job running), each with its due jobs of that priority counted up to what
the play can take. A job with `at_most` or more due jobs ahead says
`at_most`. Every kind counts: a process takes only the kinds it has
handlers for, and a kind at its deployment-wide cap is passed over, so
where some kinds are not run or capped, the jobs ahead of other kinds are
taken sooner than counted.

A job not yet due (scheduled, or waiting out a retry's backoff) is claimed
after every job that is due now, so its position counts those (up to
`at_most`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mealquest.db.driver import Reads
from mealquest.model.jobs import Job
from mealquest.model.queue import Standing


@dataclass(frozen=True)
class HouseholdRow:
    """A household as the claim weighs it: its running jobs, when it was last
    served (None: not since its queue was last empty with nothing running),
    its jobs served since, its oldest queued job, and its due jobs of the
    priority read (counted up to what was asked)."""

    household_id: int
    running: int
    served_at: str | None
    served_jobs: int
    head_run_at: str
    head_seq: int
    due: int = 0


class StandingReads(Protocol):
    """The driver's reads the play needs, each one statement."""

    def next_priority(self, conn: Reads, after: int | None, up_to: int, now: str, /) -> int | None:
        """The best priority above `after` (None: any), at most `up_to`, of a due queued job."""
        ...

    def tier(
        self, conn: Reads, priority: int, now: str, idle: int, most: int, /
    ) -> list[HouseholdRow]:
        """Households with due jobs of `priority`: every one with running jobs,
        and the first `idle` of the others in turn order; `due` counted up to
        `most`."""
        ...

    def household(self, conn: Reads, household_id: int, /) -> HouseholdRow | None:
        """One household's turn, without `due` (None: nothing of it is queued)."""
        ...

    def household_due(
        self, conn: Reads, household_id: int, now: str, most: int, /
    ) -> list[tuple[str, int]]:
        """The household's first `most` due queued jobs in claim order (id, priority)."""
        ...

    def household_ahead(self, conn: Reads, job_id: str, now: str, most: int, /) -> int:
        """A lower bound, counted up to `most`, of the household's due jobs
        ahead of its queued job `job_id` in claim order: those due no later
        than it (the walk of its queue index stops at the job's own due
        time), so it reads about `most` rows however long the queue behind
        or ahead; 0 once the job is no longer queued."""
        ...

    def due_count(self, conn: Reads, now: str, most: int, household_id: int | None, /) -> int:
        """Due queued jobs (the household's, with one), counted up to `most`."""
        ...

    def kind_running(self, conn: Reads, kind: str, /) -> int: ...


@dataclass
class _Turn:
    """A household's place while claims are played: the claim's order key."""

    household_id: int
    running: int
    served: tuple[int, str]
    served_jobs: int
    head: tuple[str, int]
    due: int = 0
    taken: int = 0  # claimed in the tier being played
    targets: dict[int, list[str]] = field(default_factory=dict)  # taken count -> job ids

    def key(self) -> tuple[Any, ...]:
        return (self.running, self.served, self.served_jobs, self.head, self.household_id)


def _turn(row: HouseholdRow) -> _Turn:
    # Never served sorts first, as the claim's NULL (SQLite) or -infinity
    # (PostgreSQL) does; a time read from the table before any the play makes.
    served = (0, "") if row.served_at is None else (1, row.served_at)
    return _Turn(
        row.household_id, row.running, served, row.served_jobs, (row.head_run_at, row.head_seq)
    )


def standings(
    reads: StandingReads, conn: Reads, jobs: Sequence[Job], *, at_most: int, now: str
) -> dict[str, Standing]:
    """Each queued job's standing (see the module); `now` is the database's clock as stored."""
    queued = [job for job in jobs if job.status == "queued"]
    if not queued:
        return {}
    kinds: dict[str, int] = {}
    for job in queued:
        if job.kind not in kinds:
            kinds[job.kind] = reads.kind_running(conn, job.kind)
    found: dict[str, tuple[int, int]] = {}
    # The due jobs of each household, in claim order: where each job is among them.
    households: dict[int, list[tuple[str, int]]] = {}
    # Each due job, with its household's due jobs of better priority, and of
    # its priority before it.
    targets: list[tuple[Job, int, int]] = []
    for job in queued:
        if job.run_at > now:
            continue
        due = households.get(job.household_id)
        if due is None:
            if reads.household_ahead(conn, job.id, now, at_most) >= at_most:
                # Behind at least that many of its own household's (a job just
                # posted behind a long queue): its place says the bound, and
                # the household's whole queue is not read to say so.
                found[job.id] = (at_most, at_most)
                continue
            due = households[job.household_id] = reads.household_due(
                conn, job.household_id, now, 2 * at_most + 1
            )
        better = before = 0
        place = None
        for index, (job_id, priority) in enumerate(due):
            if job_id == job.id:
                place = index
                break
            if priority < job.priority:
                better += 1
            else:
                before += 1
        if place is None and len(due) <= 2 * at_most:
            # Claimed (or gone) since the job was read: it waits for nothing.
            found[job.id] = (0, 0)
            continue
        if place is None or place >= at_most:
            # Beyond what was read of its own household: at least that many ahead.
            found[job.id] = (at_most, at_most)
            continue
        targets.append((job, better, before))
    if targets:
        found.update(_play(reads, conn, targets, at_most=at_most, now=now))
    result: dict[str, Standing] = {}
    for job in queued:
        if job.id in found:
            position, in_household = found[job.id]
        else:  # not yet due: behind every job that is
            position = reads.due_count(conn, now, at_most, None)
            in_household = reads.due_count(conn, now, at_most, job.household_id)
        result[job.id] = Standing(position, in_household, kinds[job.kind], now)
    return result


def _play(
    reads: StandingReads,
    conn: Reads,
    targets: Iterable[tuple[Job, int, int]],
    *,
    at_most: int,
    now: str,
) -> dict[str, tuple[int, int]]:
    """Play claims one job at a time until each target's own claim, or `at_most`
    claims; each target is (job, its household's due jobs of better priority,
    of its priority before it)."""
    by_priority: dict[int, list[tuple[Job, int, int]]] = {}
    for target in targets:
        by_priority.setdefault(target[0].priority, []).append(target)
    last = max(by_priority)
    missing = {job.id for target in by_priority.values() for job, _, _ in target}
    ahead_in_household = {
        job.id: better + before for target in by_priority.values() for job, better, before in target
    }
    found: dict[str, tuple[int, int]] = {}
    turns: dict[int, _Turn] = {}
    served = itertools.count()
    steps = 0
    priority: int | None = None
    while steps < at_most and missing:
        priority = reads.next_priority(conn, priority, last, now)
        if priority is None:
            break
        # Enough households with nothing running to reach `at_most` claims,
        # beside those the play has made busy (each may have been read as idle).
        tier: dict[int, _Turn] = {}
        for row in reads.tier(conn, priority, now, at_most + steps + 1, at_most):
            turn = turns.setdefault(row.household_id, _turn(row))
            turn.due, turn.taken, turn.targets = row.due, 0, {}
            tier[row.household_id] = turn
        for job, _better, before in by_priority.get(priority, ()):
            found_turn = tier.get(job.household_id)
            if found_turn is None:
                found_turn = turns.get(job.household_id)
                if found_turn is None:
                    read = reads.household(conn, job.household_id)
                    if read is None:
                        continue  # nothing of it queued any more: claimed or gone
                    found_turn = turns[job.household_id] = _turn(read)
                found_turn.due, found_turn.taken, found_turn.targets = 0, 0, {}
                tier[job.household_id] = found_turn
            turn = found_turn
            # Its household's due jobs up to and including it.
            turn.due = max(turn.due, before + 1)
            turn.targets.setdefault(before, []).append(job.id)
        heap = [(turn.key(), household_id) for household_id, turn in tier.items() if turn.due > 0]
        heapq.heapify(heap)
        while heap and steps < at_most and missing:
            _, household_id = heapq.heappop(heap)
            turn = tier[household_id]
            for job_id in turn.targets.pop(turn.taken, ()):
                found[job_id] = (steps, ahead_in_household[job_id])
                missing.discard(job_id)
            steps += 1
            turn.taken += 1
            turn.due -= 1
            turn.running += 1
            turn.served = (2, f"{next(served):012d}")
            turn.served_jobs += 1
            if turn.due > 0:
                heapq.heappush(heap, (turn.key(), household_id))
        if priority >= last:
            break
    for job_id in missing:  # not reached: that many or more ahead
        found[job_id] = (at_most, min(ahead_in_household[job_id], at_most))
    return found
