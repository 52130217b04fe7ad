"""The claim on SQLite: up to `limit` due jobs in one statement a priority.

Households with due jobs of the claim's priority take turns: the one with
the fewest running jobs first, then the one served longest ago (of those one
claim served, the one served fewer jobs so far), then the one whose oldest
job is oldest; within a household, oldest first. A claim takes as few
households in turn as fill its batch, counting on up to a quarter of it
from each (`claiming.household_share`), and fills the batch from them as
if claimed one job at a time, each claim counting as a running job of its
household. Cost: the households with running jobs plus about `limit`
households and `limit` jobs each, through indexes; never the finished rows
or the households with nothing queued.

Only the kinds this process can run, and none that is paused: during a
rolling deploy that adds a kind, older processes leave its jobs queued for
the newer ones. `kind_limits` caps how many of a kind this claim takes (the
process's room for it); `kind_caps` how many of a kind may run in the whole
deployment (counted exactly: SQLite writes one transaction at a time);
`partitions` what each partition of a kind may do: a job whose partition is
at a limit is passed over before households and jobs are chosen (so it
hides no other job), and a batch takes no more of a partition than it has
room for (`mealquest.db.partitions`).

Each part of the statement is built by a function of its own below; the
statement's frame (`_CLAIM`) says how they fit.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from mealquest.db import claiming
from mealquest.db import partitions as flow
from mealquest.db.driver import Reads, Transaction
from mealquest.db.sqlite import holds
from mealquest.db.sqlite import partitions as limits_sql
from mealquest.db.sqlite.job_rows import (
    COLUMNS,
    NEXT_VERSION,
    RUNNING_JOBS,
    moment_of,
    moment_text,
)
from mealquest.model.jobs import MIN_PRIORITY, ClaimRequest, Job, PartitionLimits

# The order households take turns in (columns of `household_queues` and the running count).
_TURN = "running, served_at, served_jobs, head_run_at, head_seq"
# Suspended households' jobs wait: a test on each job the claim considers,
# against the few suspended households (read once per statement, through
# their partial index), so a suspended household neither is chosen nor sets
# the claim's priority.
_NOT_SUSPENDED = "household_id NOT IN (SELECT id FROM households WHERE suspended_at IS NOT NULL)"

# The statement. INDEXED BY and the `+` keep the plan an ordered walk of the
# households' turn index and a read of the running rows only, whatever
# ANALYZE found: with statistics SQLite would rather skip-scan and sort every
# household, or group the whole table by household; and a household's queued
# and running jobs are read through their partial indexes, not through
# (household_id, kind, seq), which holds its whole history.
_CLAIM = """
WITH {ctes}ranked(household_id, running, queued, place) AS (
    SELECT household_id, running, queued, row_number() OVER (ORDER BY {turn}) FROM (
        SELECT * FROM (
            SELECT q.household_id, 0 AS running, q.served_at, q.served_jobs,
           q.head_run_at, q.head_seq, q.queued
            FROM household_queues AS q INDEXED BY household_queues_turn
            WHERE +q.head_run_at <= :now AND {not_held}
            AND NOT EXISTS (SELECT 1 FROM jobs AS r INDEXED BY jobs_running
                            WHERE r.household_id = q.household_id AND r.status = 'running')
            AND EXISTS (SELECT 1 FROM jobs AS j INDEXED BY jobs_household_queued
                        WHERE j.household_id = q.household_id AND j.{due})
            ORDER BY q.served_at, q.served_jobs, q.head_run_at, q.head_seq LIMIT :limit
        )
        UNION ALL
        SELECT q.household_id, b.running, q.served_at, q.served_jobs,
           q.head_run_at, q.head_seq, q.queued
        FROM (SELECT household_id, count(*) AS running FROM jobs INDEXED BY jobs_running
              WHERE status = 'running' GROUP BY household_id) AS b
        JOIN household_queues AS q ON q.household_id = b.household_id
        WHERE q.head_run_at <= :now AND {not_held}
        AND EXISTS (SELECT 1 FROM jobs AS j INDEXED BY jobs_household_queued
                        WHERE j.household_id = q.household_id AND j.{due})
    )
    ORDER BY {turn} LIMIT :limit
),
candidates(household_id, running, place) AS (
    SELECT household_id, running, place FROM (
        SELECT household_id, running, place,
               sum(min(queued, :share)) OVER (ORDER BY place) - min(queued, :share) AS ahead
        FROM ranked
    ) WHERE ahead < :limit
),
picks AS (
    SELECT j.seq, j.kind, j.partition_key, j.run_at, c.place,
           c.running + row_number() OVER (PARTITION BY j.household_id ORDER BY j.run_at, j.seq)
           AS turn
    FROM candidates AS c JOIN jobs AS j ON j.seq IN (
        SELECT seq FROM jobs INDEXED BY jobs_household_queued
        WHERE household_id = c.household_id AND {due}
        ORDER BY run_at, seq LIMIT :limit
    )
)
UPDATE jobs SET status = 'running', attempt = attempt + 1, lease_owner = :owner,
    lease_expires_at = :lease_expires_at, started_at = :moment, updated_at = :moment,
    waiting_signal = NULL,
    {next_version}
WHERE seq IN (SELECT seq FROM ({ranked}) ORDER BY turn, place LIMIT :limit)
RETURNING {columns}"""


def claim(tx: Transaction, request: ClaimRequest) -> list[Job]:
    """Up to `request.limit` due jobs: by priority (lower first), each
    priority's households in turn (`mealquest.db.claiming`)."""
    due = functools.partial(has_due_job, partitions=request.partitions)
    return claiming.by_priority(_claim_one_priority, due, tx, request)


@dataclass(frozen=True)
class _Scope:
    """What one claim may take: its kinds (named `:k0`, `:k1`...), the test of a
    due job of them before the partitions' limits, and those limits (None:
    no queued job of a limited kind has one)."""

    kinds: list[str]
    unblocked: str
    limits: limits_sql.Limits | None
    limited: list[str]
    params: dict[str, object]


def _claim_one_priority(tx: Transaction, request: ClaimRequest) -> list[Job]:
    """Claim up to `limit` due queued jobs of `kinds` in one statement, all of
    one priority: the best among the due jobs this claim may take (see the
    module)."""
    limit = request.limit
    kinds = [kind for kind in request.kinds if request.kind_limits.get(kind, limit) > 0]
    if not kinds or limit <= 0:
        return []
    moment = moment_of(request.now)
    scope = _scope(tx, kinds, request.partitions, moment)
    holds.sweep(tx, moment, request.kind_caps, scope.limits, scope.limited)
    most, most_params = _most_of_kind(kinds, request.kind_limits, request.kind_caps)
    statement = _statement(scope, request.kind_caps, most)
    params = {
        "owner": request.owner,
        "lease_expires_at": moment_text(moment + timedelta(seconds=request.lease_seconds)),
        "moment": moment_text(moment),
        "now": moment_text(moment),
        "limit": limit,
        "share": claiming.household_share(limit),
        **scope.params,
        **most_params,
    }
    if scope.limits is None:
        rows = tx.execute(statement, params).fetchall()
    else:
        rows = _tier_by_tier(tx, statement, {**params, **scope.limits.params}, scope.unblocked)
    # RETURNING gives no order; hand jobs out in the claim's.
    claimed = sorted(
        (Job.from_row(row) for row in rows), key=lambda job: (job.priority, job.run_at, job.seq)
    )
    if scope.limits is not None:
        limits_sql.record_starts(tx, claimed, request.partitions, moment)
    return claimed


def _scope(
    tx: Transaction,
    kinds: list[str],
    partitions: Mapping[str, PartitionLimits],
    moment: datetime,
) -> _Scope:
    names = {f"k{index}": kind for index, kind in enumerate(kinds)}
    due = (
        "status = 'queued' AND run_at <= :now "
        f"AND kind IN ({', '.join(f':{name}' for name in names)}) AND {_NOT_SUSPENDED} "
        "AND kind NOT IN (SELECT kind FROM paused_kinds)"
    )
    limited, due, unpartitioned = _unless_unpartitioned(
        tx, flow.limited_kinds(kinds, partitions), due
    )
    limits = limits_sql.limits(limited, partitions, moment) if limited else None
    return _Scope(kinds, due, limits, limited, {**names, **unpartitioned})


def _statement(scope: _Scope, kind_caps: Mapping[str, int], most: str) -> str:
    """The claim statement of the scope: its CTEs (the partitions' limits,
    the kinds at their cap, the claim's priority) and its test of a due job."""
    due = scope.unblocked
    if scope.limits is not None:
        due += limits_sql.BLOCKED_FILTER
    ctes = scope.limits.ctes if scope.limits is not None else ""
    full = _full_kinds(scope.kinds, kind_caps)
    if full:
        ctes += full
        due += " AND kind NOT IN (SELECT kind FROM full_kinds)"
    ctes += _tier(scope, due)
    return _CLAIM.format(
        ctes=ctes,
        due=f"{due} AND priority = (SELECT priority FROM tier)",
        ranked=_ranked(scope, most),
        turn=_TURN,
        not_held=holds.NOT_HELD,
        next_version=NEXT_VERSION,
        columns=COLUMNS,
    )


def _full_kinds(kinds: list[str], kind_caps: Mapping[str, int]) -> str:
    """Kinds at their deployment cap, as a CTE: left out before households and
    jobs are chosen, so they cannot hide a household's other jobs."""
    full = [
        f"SELECT :k{index} WHERE (SELECT count(*) FROM {RUNNING_JOBS} WHERE status = 'running' "
        f"AND kind = :k{index}) >= :cap{index}"
        for index, kind in enumerate(kinds)
        if kind in kind_caps
    ]
    return f"full_kinds(kind) AS ({' UNION ALL '.join(full)}),\n" if full else ""


def _tier(scope: _Scope, due: str) -> str:
    """The claim's priority, as a CTE: the first in the claim index's order
    (priority, run_at, seq) that is due and claimable. With limits per
    partition, the priorities are tried one after another instead
    (`_tier_by_tier`): that walk would pass over, one entry at a time, every
    job of a partition at its limit that comes first."""
    if scope.limits is not None:
        return "tier(priority) AS (SELECT :tier),\n"
    return (
        f"tier(priority) AS (SELECT priority FROM jobs INDEXED BY jobs_claim WHERE {due} "
        "ORDER BY priority LIMIT 1),\n"
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
            f"FROM picks AS p{scope.limits.joins}) WHERE partition_key IS NULL OR nth <= room)"
        )
    if not most:
        return f"SELECT seq, turn, place FROM {picked}"
    return (
        f"SELECT seq, turn, place FROM (SELECT seq, turn, place, {most} AS most, "
        "row_number() OVER (PARTITION BY kind ORDER BY turn, place) AS nth "
        f"FROM {picked}) WHERE nth <= most"
    )


def _most_of_kind(
    kinds: list[str], limits: Mapping[str, int], caps: Mapping[str, int]
) -> tuple[str, dict[str, object]]:
    """The most a claim may take of each capped kind, as an SQL expression of
    `kind`: the process's room for it (`limits`), and the deployment's cap
    less the kind's running jobs (`caps`; exact, since SQLite writes one
    transaction at a time). Empty when no kind is capped."""
    cases: list[str] = []
    params: dict[str, object] = {}
    for index, kind in enumerate(kinds):
        bounds = []
        if kind in limits:
            bounds.append(f":most{index}")
            params[f"most{index}"] = int(limits[kind])
        if kind in caps:
            bounds.append(
                f"(:cap{index} - (SELECT count(*) FROM {RUNNING_JOBS} "
                f"WHERE status = 'running' AND kind = :k{index}))"
            )
            params[f"cap{index}"] = int(caps[kind])
        if bounds:
            cases.append(f"WHEN :k{index} THEN min({', '.join(bounds)}, :limit)")
    return (f"CASE kind {' '.join(cases)} ELSE :limit END" if cases else ""), params


def _unless_unpartitioned(
    tx: Reads, limited: list[str], due: str
) -> tuple[list[str], str, dict[str, str]]:
    """The kinds whose partition limits a claim must apply, and its `due`
    condition: none, when no queued job of `limited` has a partition (one
    probe of a small partial index), so that the claim needs neither the
    limits' statements nor the tier probes. `due` then leaves out such jobs,
    as the limits would have weighed them: one enqueued meanwhile (another
    transaction, on a server that allows it) waits for the next claim. The
    third value holds the parameters the new `due` names."""
    if not limited:
        return limited, due, {}
    params = {f"lk{index}": kind for index, kind in enumerate(limited)}
    names = ", ".join(f":{name}" for name in params)
    row = tx.execute(
        "SELECT 1 FROM jobs INDEXED BY jobs_queued_partitioned WHERE status = 'queued' "
        f"AND partition_key IS NOT NULL AND kind IN ({names}) LIMIT 1",
        params,
    ).fetchone()
    if row is not None:
        return limited, due, {}
    return [], f"{due} AND (partition_key IS NULL OR kind NOT IN ({names}))", params


def _tier_by_tier(
    tx: Transaction, statement: str, params: dict[str, object], due: str
) -> list[Any]:
    """The claim statement's rows at the best priority it takes any job of:
    each priority of the due jobs (`due`, the partitions' limits aside),
    best first, each found by one probe of the claim index, until one
    yields jobs. A priority whose every due job is in a partition at its
    limit yields none, and the next has its turn. So no claim reads the
    jobs of a partition at its limit one by one to find its priority."""
    after = MIN_PRIORITY - 1
    while True:
        tier = tx.execute(
            f"SELECT priority FROM jobs INDEXED BY jobs_claim WHERE {due} "
            "AND priority > :after ORDER BY priority LIMIT 1",
            {**params, "after": after},
        ).fetchone()
        if tier is None:
            return []
        rows = tx.execute(statement, {**params, "tier": tier["priority"]}).fetchall()
        if rows:
            return rows
        after = tier["priority"]


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
    moment = moment_of(None)
    kinds = list(kinds)
    names = {f"k{index}": kind for index, kind in enumerate(kinds)}
    limited, unpartitioned, unpartitioned_params = _unless_unpartitioned(
        conn, flow.limited_kinds(kinds, partitions or {}), ""
    )
    limits = limits_sql.limits(limited, partitions or {}, moment) if limited else None
    due = (
        f"status = 'queued' AND run_at <= :now "
        f"AND kind IN ({', '.join(f':{name}' for name in names)})"
    )
    claimable = (
        f"kind NOT IN (SELECT kind FROM paused_kinds){unpartitioned}"
        f"{limits_sql.BLOCKED_FILTER if limits is not None else ''}"
    )
    params = {
        "now": moment_text(moment),
        "first": claiming.DUE_READ_FIRST,
        **names,
        **(limits.params if limits is not None else {}),
        **unpartitioned_params,
    }
    if limits is None:
        row = conn.execute(f"SELECT 1 FROM jobs WHERE {due} AND {claimable} LIMIT 1", params)
        return row.fetchone() is not None
    head = f"WITH {limits.ctes.rstrip().rstrip(',')} "
    first = conn.execute(
        f"{head}SELECT 1 FROM (SELECT kind, partition_key FROM jobs INDEXED BY jobs_due_by_kind "
        f"WHERE {due} LIMIT :first) WHERE {claimable} LIMIT 1",
        params,
    ).fetchone()
    if first is not None:
        return True
    row = conn.execute(
        f"{head}SELECT 1 FROM household_queues AS q WHERE q.head_run_at <= :now "
        f"AND {holds.NOT_HELD} AND EXISTS (SELECT 1 FROM jobs INDEXED BY jobs_household_queued "
        f"WHERE household_id = q.household_id AND {due} AND {claimable}) LIMIT 1",
        params,
    ).fetchone()
    return row is not None
