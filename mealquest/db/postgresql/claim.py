"""The claim on PostgreSQL: up to `limit` due jobs in one statement a priority.

Households with due jobs of the claim's priority take turns: the one with
the fewest running jobs first, then the one served longest ago (of those one
claim served, the one served fewer jobs so far), then the one whose oldest
job is oldest; within a household, oldest first. A claim takes as few
households in turn as fill its batch, counting on up to a quarter of it
from each (`claiming.household_share`), and fills the batch from them as
if claimed one job at a time, each claim counting as a running job of its
household. Cost: the households with running jobs plus about four times
`limit` households (`_HOUSEHOLDS_RANKED_PER_PLACE`) and `limit` jobs each,
through indexes; never the finished rows or the households with nothing
queued.

The claim locks the `household_queues` rows of the households it chose with
`SKIP LOCKED`, and their jobs likewise, so two claims never take the same
job and a claim never waits: another transaction may hold a household's row
(an enqueue, a retry or a rescue for it, whose triggers lock it, or a claim)
while it waits for a row this one holds, and waiting would deadlock. A
household skipped so is served by the next claim, and this one takes the
next households in turn instead. A claim takes only as many households as
fill its batch, so claims made at once (by several processes) each take
households of their own while the households it ranked (four times
`limit`) have some not held; one that finds every household it ranked held
takes nothing until its next claim.

Only the kinds this process can run: during a rolling deploy that adds a
kind, older processes leave its jobs queued. `kind_limits` caps how many of
a kind this claim takes (the process's room for it); `kind_caps` how many of
a kind may run in the whole deployment, and `partitions` what each partition
of a kind may do: for those kinds the claim first takes a transaction
advisory lock per kind, so claims that could take them count the running
jobs (and a partition's starts) one after another (a counted claim made
exact by a lock), and the claim statement counts after the lock. A job whose
partition is at a limit is passed over before households and jobs are chosen
(so it hides no other job), and a batch takes no more of a partition than it
has room for (`mealquest.db.partitions`). Paused kinds are never taken.

Each part of the statement is built by a function of its own below; the
statement's frame (`_CLAIM`) says how they fit.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from mealquest.db import claiming
from mealquest.db import partitions as flow
from mealquest.db.driver import Reads, Transaction
from mealquest.db.postgresql import holds
from mealquest.db.postgresql import partitions as limits_sql
from mealquest.db.postgresql.job_rows import NEXT_VERSION, NOW, as_text, to_job
from mealquest.db.postgresql.transaction import postgres_transaction
from mealquest.model.jobs import MIN_PRIORITY, ClaimRequest, Job, PartitionLimits

# Advisory locks (class, key) the claim takes for kinds with a deployment-wide cap.
_CAP_LOCK_CLASS = int.from_bytes(b"mqcp", "big") - (1 << 31)
# The order households take turns in (columns of `household_queues` and the running count).
_TURN = "running, served_at, served_jobs, head_run_at, head_seq"
# Suspended households' jobs wait: a test on each job the claim considers,
# against the few suspended households (read once per statement, through
# their partial index, as a hashed subplan), so a suspended household
# neither is chosen nor sets the claim's priority.
_NOT_SUSPENDED = "household_id NOT IN (SELECT id FROM households WHERE suspended_at IS NOT NULL)"
# A claim of `limit` jobs ranks this many times `limit` households and takes
# the first `limit` of them that no other claim holds: up to this many claims
# made at once (by several processes or hosts) each find households of their
# own instead of all choosing the same best ones and all but one taking nothing.
_HOUSEHOLDS_RANKED_PER_PLACE = 4
# A queued job of `kinds` with a partition: one probe of a small partial
# index, ordered by its key so that the planner walks the index rather than
# the table, whatever its statistics say.
_QUEUED_PARTITIONED = (
    "SELECT 1 FROM jobs WHERE status = 'queued' AND partition_key IS NOT NULL "
    "AND kind = ANY(%(kinds)s::text[]) ORDER BY kind LIMIT 1"
)
# Leaves out the queued jobs with a partition of the kinds a claim found none of.
_UNPARTITIONED = " AND (partition_key IS NULL OR kind <> ALL(%(unpartitioned)s::text[]))"

# The statement. Two forms keep the plan to the households served and their
# jobs, not the whole queue, while the statistics lag a burst of enqueues or
# say a few households hold every job: each EXISTS is a probe per household
# in its index's order (`OFFSET 0` stops the planner from joining it, which
# read every queued job; the order makes the household's index the way to
# its first due job), and the UPDATE finds its rows by primary key alone
# (its own `status` test let the planner read the queued jobs' index
# instead). The rows are queued: `picks` locked them so, after checking, and
# nobody changes them until this commits.
_CLAIM = """
WITH {ctes}idle AS (
    SELECT q.household_id, 0::bigint AS running, q.served_at, q.served_jobs,
           q.head_run_at, q.head_seq, q.queued
    FROM household_queues AS q
    WHERE q.head_run_at <= {now} AND {not_held}
    AND NOT EXISTS (SELECT 1 FROM jobs AS r
                    WHERE r.household_id = q.household_id AND r.status = 'running')
    AND EXISTS (SELECT 1 FROM jobs AS j WHERE j.household_id = q.household_id AND j.{due}
                ORDER BY j.run_at, j.seq LIMIT 1 OFFSET 0)
    ORDER BY q.served_at, q.served_jobs, q.head_run_at, q.head_seq LIMIT %(ranked)s
),
busy AS (
    SELECT q.household_id, b.running, q.served_at, q.served_jobs,
           q.head_run_at, q.head_seq, q.queued
    FROM (SELECT household_id, count(*) AS running FROM jobs
          WHERE status = 'running' GROUP BY household_id) AS b
    JOIN household_queues AS q ON q.household_id = b.household_id
    WHERE q.head_run_at <= {now} AND {not_held}
    AND EXISTS (SELECT 1 FROM jobs AS j WHERE j.household_id = q.household_id AND j.{due}
                ORDER BY j.run_at, j.seq LIMIT 1 OFFSET 0)
),
chosen AS MATERIALIZED (
    SELECT household_id, running, place,
           sum(least(queued, %(share)s)) OVER (ORDER BY place) - least(queued, %(share)s) AS ahead
    FROM (SELECT household_id, running, queued, row_number() OVER (ORDER BY {turn}) AS place
          FROM (SELECT * FROM idle UNION ALL SELECT * FROM busy) AS c
          ORDER BY {turn} LIMIT %(ranked)s) AS ranked
),
candidates AS (
    SELECT c.household_id, c.running, c.place
    FROM chosen AS c JOIN household_queues AS q USING (household_id)
    ORDER BY c.place LIMIT (SELECT count(*) FROM chosen WHERE ahead < %(limit)s)
    FOR UPDATE OF q SKIP LOCKED
),
picks AS (
    SELECT j.seq, j.kind, j.partition_key, j.run_at, c.place,
           c.running + row_number() OVER (PARTITION BY c.household_id ORDER BY j.run_at, j.seq)
           AS turn
    FROM candidates AS c CROSS JOIN LATERAL (
        SELECT seq, kind, partition_key, run_at FROM jobs
        WHERE household_id = c.household_id AND {due}
        ORDER BY run_at, seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED
    ) AS j
),
next AS (SELECT seq FROM ({ranked}) AS r ORDER BY turn, place LIMIT %(limit)s)
UPDATE jobs SET status = 'running', attempt = attempt + 1, lease_owner = %(owner)s,
    lease_expires_at = {now} + make_interval(secs => %(lease_seconds)s),
    started_at = {now}, updated_at = {now}, waiting_signal = NULL, {next_version}
WHERE jobs.seq = ANY(ARRAY(SELECT seq FROM next))
RETURNING {returning}"""


def claim(tx: Transaction, request: ClaimRequest) -> list[Job]:
    """Up to `request.limit` due jobs: by priority (lower first), each
    priority's households in turn (`mealquest.db.claiming`)."""
    due = functools.partial(has_due_job, partitions=request.partitions)
    claimed = claiming.by_priority(_claim_one_priority, due, tx, request)
    postgres_transaction(tx).notify_changed(job.id for job in claimed)
    return claimed


@dataclass(frozen=True)
class _Scope:
    """What one claim may take: its kinds, the deployment's caps of some, and
    the partitions' limits (None: no queued job of a limited kind has one)."""

    kinds: list[str]
    caps: dict[str, int]
    limits: limits_sql.Limits | None
    limited: list[str]
    unpartitioned: list[str]


def _claim_one_priority(tx: Transaction, request: ClaimRequest) -> list[Job]:
    """Claim up to `limit` due queued jobs of `kinds` in one statement, all of
    one priority: the best among the due jobs this claim may take (see the
    module)."""
    limit = request.limit
    kinds = [kind for kind in request.kinds if request.kind_limits.get(kind, limit) > 0]
    if not kinds or limit <= 0:
        return []
    limited = flow.limited_kinds(kinds, request.partitions)
    sweep_due, partitioned = _plan_by_indexes(tx, request.now, limited)
    scope = _locked_scope(tx, request, kinds, limited, partitioned)
    if sweep_due:
        holds.sweep(tx, request.now, request.kind_caps, scope.limits, scope.limited)
    statement, unblocked, filter_params = _statement(scope, request.kind_limits)
    params = {
        "now": request.now,
        "kinds": list(kinds),
        "limit": limit,
        "ranked": limit * _HOUSEHOLDS_RANKED_PER_PLACE,
        "share": claiming.household_share(limit),
        "owner": request.owner,
        "lease_seconds": float(request.lease_seconds),
        "unpartitioned": scope.unpartitioned,
        **filter_params,
    }
    if scope.limits is None:
        rows = tx.execute(statement, params).fetchall()
    else:
        rows = _tier_by_tier(tx, statement, {**params, **scope.limits.params}, unblocked)
    # RETURNING gives no order; hand jobs out in the claim's.
    claimed = sorted(
        (to_job(row) for row in rows), key=lambda job: (job.priority, job.run_at, job.seq)
    )
    if scope.limits is not None:
        limits_sql.record_starts(tx, claimed, request.partitions)
    return claimed


def _plan_by_indexes(tx: Transaction, now: Any, limited: list[str]) -> tuple[bool, bool]:
    """Plan the claim once per connection, walking the indexes in its order;
    and say whether a sweep of held households is due (`holds`), and whether
    a queued job of the `limited` kinds has a partition (`_QUEUED_PARTITIONED`):
    asked here, so that neither costs the claim a round trip of its own.

    The server's default weighs a generic plan against plans made for each
    claim's values, and for this statement kept planning every time (about
    2 ms of a 4 ms claim of four jobs). Its plan does not hinge on the
    values: each step is an index probe fenced by `OFFSET 0` or `LATERAL`.
    That plan is made with the statistics of its moment: often none, or
    those of a table of a few jobs, just before a burst. Costed so, a bitmap
    scan of every due job and a sort looked cheapest for the best priority,
    and a household's jobs read through another index and sorted as cheap
    as its queue's index in order; at 12,000 queued that was most of each
    claim's time. With sequential and bitmap scans and sorts priced out (a
    sort the query cannot do without is still made), the plan walks the
    indexes in the claim's order whatever the statistics say
    (tests/drivers/test_postgresql.py). Those prices put the plan's cost
    past JIT's threshold, and compiling it cost a second a claim: JIT is off
    (no claim runs long enough to gain from it). All for the rest of this
    transaction only."""
    row = tx.execute(
        "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), "
        "set_config('enable_seqscan', 'off', true), "
        "set_config('enable_bitmapscan', 'off', true), "
        "set_config('enable_sort', 'off', true), set_config('jit', 'off', true), "
        f"{holds.SWEEP_DUE} AS sweep_due, EXISTS ({_QUEUED_PARTITIONED}) AS partitioned",
        {"now": now, "hold_seconds": claiming.HOLD_SECONDS, "kinds": limited},
    ).fetchone()
    return bool(row["sweep_due"]), bool(row["partitioned"])


def _locked_scope(
    tx: Transaction,
    request: ClaimRequest,
    kinds: list[str],
    limited: list[str],
    partitioned: bool,
) -> _Scope:
    """The claim's scope, with an advisory lock taken for each kind whose
    running jobs it must count (a cap, or partitions' limits). `limited`:
    the kinds with partitions' limits; `partitioned`: whether a queued job of
    theirs has a partition."""
    caps = {kind: cap for kind, cap in request.kind_caps.items() if kind in kinds}
    # No queued job of a limited kind has a partition: the claim needs neither
    # the limits' statements nor their locks, and leaves out such a job
    # committed meanwhile (the next claim weighs it).
    unpartitioned = limited if limited and not partitioned else []
    if unpartitioned:
        limited = []
    # One order for every claim's locks, the kinds' caps and partitions alike.
    for kind in sorted(set(caps) | set(limited)):
        tx.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_CAP_LOCK_CLASS, kind)
        ).fetchall()
    limits = limits_sql.limits(limited, request.partitions, NOW) if limited else None
    return _Scope(kinds, caps, limits, limited, unpartitioned)


def _statement(scope: _Scope, kind_limits: Mapping[str, int]) -> tuple[str, str, dict[str, Any]]:
    """The claim statement, the test of the kinds it may take before the
    partitions' limits (for `_tier_by_tier`), and the parameters they add."""
    most, most_params = _most_of_kind(scope.kinds, kind_limits, scope.caps)
    queued = f"status = 'queued' AND run_at <= {NOW} AND {_NOT_SUSPENDED}"
    of_kinds = "kind = ANY(%(kinds)s::text[]) AND kind NOT IN (SELECT kind FROM paused_kinds)"
    if scope.unpartitioned:
        of_kinds += _UNPARTITIONED
    unblocked = of_kinds
    if scope.limits is not None:
        of_kinds += limits_sql.BLOCKED_FILTER
    ctes = scope.limits.ctes if scope.limits is not None else ""
    full = _full_kinds(scope)
    if full:
        ctes += full
        queued += " AND kind NOT IN (SELECT kind FROM full_kinds)"
    ctes += _tier(scope, queued, of_kinds)
    statement = _CLAIM.format(
        ctes=ctes,
        due=f"{queued} AND {of_kinds} AND priority = (SELECT priority FROM tier)",
        ranked=_ranked(scope, most),
        now=NOW,
        not_held=holds.NOT_HELD,
        turn=_TURN,
        next_version=NEXT_VERSION,
        returning=as_text("jobs"),
    )
    return statement, unblocked, most_params


def _full_kinds(scope: _Scope) -> str:
    """Kinds at their deployment cap, as a CTE: left out before households and
    jobs are chosen, so they cannot hide a household's other jobs."""
    full = [
        f"SELECT %(k{index})s::text WHERE (SELECT count(*) FROM jobs WHERE status = 'running' "
        f"AND kind = %(k{index})s) >= %(cap{index})s"
        for index, kind in enumerate(scope.kinds)
        if kind in scope.caps
    ]
    return f"full_kinds(kind) AS ({' UNION ALL '.join(full)}),\n" if full else ""


def _tier(scope: _Scope, queued: str, of_kinds: str) -> str:
    """The claim's priority, as a CTE: the first in the claim index's order
    (priority, run_at, seq) that is due and of a kind this claim takes.

    The kinds are tested outside an `OFFSET 0` subquery that walks that
    index: asked in one query, a planner without the table's statistics
    (which lag a burst of enqueues) read every due job through the kinds'
    index and sorted them, 4 ms at 8,000 queued. With limits per partition,
    the priorities are tried one after another instead (`_tier_by_tier`):
    that walk would pass over, one entry at a time, every job of a partition
    at its limit that comes first."""
    if scope.limits is not None:
        return "tier AS (SELECT %(tier)s::integer AS priority),\n"
    return (
        "tier AS (SELECT priority FROM (SELECT priority, kind, partition_key FROM jobs "
        f"WHERE {queued} ORDER BY priority, run_at, seq OFFSET 0) AS ordered "
        f"WHERE {of_kinds} LIMIT 1),\n"
    )


def _ranked(scope: _Scope, most: str) -> str:
    """The picked jobs the claim may take, with their turn and place: as many
    of a partition's jobs as it has room for, in the claim's order, then as
    many of each capped kind as the kinds' caps leave."""
    picked = "picks"
    if scope.limits is not None:
        picked = (
            "(SELECT seq, kind, turn, place FROM (SELECT p.seq, p.kind, p.partition_key, "
            f"p.turn, p.place, {scope.limits.room} AS room, row_number() OVER "
            "(PARTITION BY p.kind, p.partition_key ORDER BY p.turn, p.place) AS nth "
            f"FROM picks AS p{scope.limits.joins}) AS roomy "
            "WHERE partition_key IS NULL OR nth <= room)"
        )
    if not most:
        return f"SELECT seq, turn, place FROM {picked} AS picked"
    return (
        f"SELECT seq, turn, place FROM (SELECT seq, turn, place, {most} AS most, "
        "row_number() OVER (PARTITION BY kind ORDER BY turn, place) AS nth "
        f"FROM {picked} AS picked) AS p WHERE nth <= most"
    )


def _most_of_kind(
    kinds: list[str], limits: Mapping[str, int], caps: Mapping[str, int]
) -> tuple[str, dict[str, Any]]:
    """The most a claim may take of each capped kind, as an SQL expression of
    `kind`: the process's room for it (`limits`), and the deployment's cap
    less the kind's running jobs (`caps`). Empty when no kind is capped."""
    cases: list[str] = []
    params: dict[str, Any] = {}
    for index, kind in enumerate(kinds):
        bounds = []
        if kind in limits:
            bounds.append(f"%(most{index})s::bigint")
            params[f"most{index}"] = int(limits[kind])
        if kind in caps:
            bounds.append(
                f"%(cap{index})s::bigint - (SELECT count(*) FROM jobs "
                f"WHERE status = 'running' AND kind = %(k{index})s)"
            )
            params[f"cap{index}"] = int(caps[kind])
            params[f"k{index}"] = kind
        if bounds:
            params[f"k{index}"] = kind
            cases.append(f"WHEN %(k{index})s THEN least({', '.join(bounds)}, %(limit)s)")
    return (f"CASE kind {' '.join(cases)} ELSE %(limit)s END" if cases else ""), params


def _tier_by_tier(
    tx: Transaction, statement: str, params: dict[str, Any], of_kinds: str
) -> list[dict[str, Any]]:
    """The claim statement's rows at the best priority it takes any job of:
    each priority of the due jobs (of the kinds `of_kinds` admits, the
    partitions' limits aside),
    best first, each found by one probe of the claim index, until one
    yields jobs. A priority whose every due job is in a partition at its
    limit yields none, and the next has its turn. So no claim reads the
    jobs of a partition at its limit one by one to find its priority."""
    after = MIN_PRIORITY - 1
    while True:
        tier = tx.execute(
            "SELECT priority FROM (SELECT priority, kind FROM jobs "
            f"WHERE status = 'queued' AND run_at <= {NOW} AND priority > %(after)s::integer "
            "ORDER BY priority, run_at, seq OFFSET 0) AS ordered "
            f"WHERE {of_kinds} LIMIT 1",
            {**params, "after": after},
        ).fetchone()
        if tier is None:
            return []
        rows = tx.execute(statement, {**params, "tier": tier["priority"]}).fetchall()
        if rows:
            return rows
        after = tier["priority"]


def _any_queued_partitioned(conn: Reads, kinds: list[str]) -> bool:
    """Whether a queued job of `kinds` has a partition."""
    row = conn.execute(f"SELECT EXISTS ({_QUEUED_PARTITIONED}) AS partitioned", {"kinds": kinds})
    return bool(row.fetchone()["partitioned"])


def has_due_job(
    conn: Reads,
    kinds: Collection[str],
    *,
    partitions: Mapping[str, PartitionLimits] | None = None,
) -> bool:
    """Whether a due job of `kinds` is queued that a claim could take: not of
    a paused kind, nor (with `partitions`) of a partition at a limit, nor of
    a household held (`holds`); with limits, the households not held are
    read past `claiming.DUE_READ_FIRST` due jobs held back."""
    if not kinds:
        return False
    limited = flow.limited_kinds(kinds, partitions or {})
    unpartitioned = limited if limited and not _any_queued_partitioned(conn, limited) else []
    if unpartitioned:
        limited = []
    limits = limits_sql.limits(limited, partitions or {}, "now()") if limited else None
    due = "status = 'queued' AND run_at <= now() AND kind = ANY(%(kinds)s::text[])"
    claimable = (
        "kind NOT IN (SELECT kind FROM paused_kinds)"
        f"{_UNPARTITIONED if unpartitioned else ''}"
        f"{limits_sql.BLOCKED_FILTER if limits is not None else ''}"
    )
    params = {
        "kinds": list(kinds),
        "unpartitioned": unpartitioned,
        "first": claiming.DUE_READ_FIRST,
        "now": None,
        **(limits.params if limits is not None else {}),
    }
    if limits is None:
        row = conn.execute(
            f"SELECT EXISTS (SELECT 1 FROM jobs WHERE {due} AND {claimable}) AS due", params
        ).fetchone()
        return bool(row["due"])
    head = f"WITH {limits.ctes.rstrip().rstrip(',')} "
    row = conn.execute(
        f"{head}SELECT EXISTS (SELECT 1 FROM (SELECT kind, partition_key FROM jobs "
        f"WHERE {due} ORDER BY kind, run_at LIMIT %(first)s) AS first WHERE {claimable}) "
        f"OR EXISTS (SELECT 1 FROM household_queues AS q WHERE q.head_run_at <= now() "
        f"AND {holds.NOT_HELD} AND EXISTS (SELECT 1 FROM jobs "
        f"WHERE household_id = q.household_id AND {due} AND {claimable} "
        "ORDER BY run_at, seq OFFSET 0)) AS due",
        params,
    ).fetchone()
    return bool(row["due"])
