"""Every SQL statement of the job runner on PostgreSQL, as plain functions.

The same semantics as the SQLite driver's, statement for statement: writes
take a `Transaction` (inside `PostgresStore.write`), reads a
connection (inside `PostgresStore.read`). Every write after the claim is
fenced on the lease (the job still `running`, owned by this worker's boot
id, at this attempt); a write that matches no row returns False.

Every time comes from the database's clock (`now()`, the transaction's
start), never from a host: hosts' clocks differ, and a lease written by one
host is judged by another. `now` arguments exist only so tests can stand at
another moment (a rescue past a lease, a claim in the future), as River's
driver allows.

Lists of leases and kinds travel as arrays, so each function is one
statement whatever their number, and one prepared plan.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from mealquest.clock import to_text
from mealquest.db import claiming, listing, outcomes, standing
from mealquest.db import partitions as flow
from mealquest.db.driver import Reads, Transaction
from mealquest.db.postgresql import partitions as limits_sql
from mealquest.db.postgresql import standing as standing_reads
from mealquest.db.postgresql.transaction import postgres_transaction
from mealquest.model.households import Household
from mealquest.model.jobs import (
    MAX_INTERRUPTIONS,
    MESSAGE_INTERRUPTED,
    MIN_PRIORITY,
    Attempt,
    ClaimRequest,
    HeldLease,
    Job,
    Lease,
    LogLine,
    NewJob,
    PartitionLimits,
    Recovered,
    Status,
    Transition,
    check_transition,
)
from mealquest.model.queue import Standing

_COLUMNS = (
    "id, seq, household_id, kind, payload, status, result, error, attempt, max_attempts, "
    "run_at, lease_owner, lease_expires_at, created_at, updated_at, started_at, finished_at, "
    "on_interrupt, interruptions, priority, unique_key, cancel_requested_at, snoozes, "
    "partition_key, version"
)
# Every statement that changes what a household sees of a job sets its next
# version itself (the migration's trigger catches any other write).
_NEXT_VERSION = "version = jobs.version + 1"
# The claim's order: priority (lower first), then due time, then insertion order.
CLAIM_ORDER = "priority, run_at, seq"
_TIMES = (
    "run_at",
    "lease_expires_at",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "cancel_requested_at",
)
# The moment a statement acts at: the transaction's start, or a test's.
_NOW = "coalesce(%(now)s::timestamptz, now())"


def _job(row: dict[str, Any]) -> Job:
    """A row as `Job` has it on every driver: times as fixed-width UTC text."""
    values = dict(row)
    for column in _TIMES:
        if values[column] is not None:
            values[column] = to_text(values[column])
    return Job.from_row(values)


def _lease_arrays(leases: Iterable[Lease]) -> dict[str, list[Any]]:
    leases = list(leases)
    return {
        "ids": [lease.job_id for lease in leases],
        "owners": [lease.owner for lease in leases],
        "attempts": [lease.attempt for lease in leases],
    }


_LEASES = (
    "unnest(%(ids)s::text[], %(owners)s::text[], %(attempts)s::integer[]) "
    "AS lease(id, owner, attempt)"
)
_FENCE = (
    "id = %(job_id)s AND status = 'running' AND lease_owner = %(owner)s AND attempt = %(attempt)s"
)
_FENCE_ON_LEASES = (
    "jobs.id = lease.id AND jobs.status = 'running' AND jobs.lease_owner = lease.owner "
    "AND jobs.attempt = lease.attempt"
)
_CLEAR_LEASE = f"lease_owner = NULL, lease_expires_at = NULL, updated_at = now(), {_NEXT_VERSION}"


def _fence(lease: Lease) -> dict[str, Any]:
    return {"job_id": lease.job_id, "owner": lease.owner, "attempt": lease.attempt}


_INSERT = (
    "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, on_interrupt, "
    "priority, unique_key, unique_digest, partition_key, run_at, created_at, updated_at) "
    "VALUES (%(id)s, %(household_id)s, %(kind)s, %(payload)s, 'queued', %(max_attempts)s, "
    "%(on_interrupt)s, %(priority)s, %(unique_key)s, %(unique_digest)s, %(partition_key)s, "
    "coalesce(%(run_at)s::timestamptz, "
    "now() + make_interval(secs => coalesce(%(delay)s::double precision, 0))), now(), now()) "
    "ON CONFLICT (household_id, unique_key) WHERE unique_key IS NOT NULL DO NOTHING"
)


def _insert_params(job: NewJob) -> dict[str, Any]:
    return {
        "id": job.job_id,
        "household_id": job.household_id,
        "kind": job.kind,
        "payload": job.payload,
        "max_attempts": job.max_attempts,
        "on_interrupt": str(job.on_interrupt),
        "priority": job.priority,
        "unique_key": job.unique_key,
        "unique_digest": job.unique_digest,
        "partition_key": job.partition_key,
        "run_at": job.run_at,
        "delay": None if job.delay_seconds is None else float(job.delay_seconds),
    }


def insert_job(tx: Transaction, job: NewJob) -> bool:
    """Queue a job, due at its `run_at`, `delay_seconds` from the database's
    now, or now; listening processes hear of it when the transaction commits.

    With `unique_key`, nothing is inserted (False) when the household already
    has a job holding that key: the unique index decides (a concurrent insert
    of the same key waits for the other transaction, then inserts nothing).
    True when the job was inserted.
    """
    if tx.execute(_INSERT, _insert_params(job)).rowcount != 1:
        return False
    postgres_transaction(tx).notify_enqueued()
    return True


# `_INSERT` for many rows: each column's values as one array (`_insert_params`'
# names and the arrays' types), the rows inserted in the arrays' order.
_ARRAYS = (
    ("id", "text"),
    ("household_id", "bigint"),
    ("kind", "text"),
    ("payload", "text"),
    ("max_attempts", "integer"),
    ("on_interrupt", "text"),
    ("priority", "smallint"),
    ("partition_key", "text"),
    ("run_at", "timestamptz"),
    ("delay", "double precision"),
)
_INSERT_ARRAYS = (
    "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, on_interrupt, "
    "priority, partition_key, run_at, created_at, updated_at) "
    "SELECT r.id, r.household_id, r.kind, r.payload, 'queued', r.max_attempts, r.on_interrupt, "
    "r.priority, r.partition_key, "
    "coalesce(r.run_at, now() + make_interval(secs => coalesce(r.delay, 0))), "
    "now(), now() "
    f"FROM unnest({', '.join(f'%({name})s::{kind}[]' for name, kind in _ARRAYS)}) "
    f"WITH ORDINALITY AS r({', '.join(name for name, _ in _ARRAYS)}, position) "
    "ORDER BY r.position"
)


def insert_jobs(tx: Transaction, jobs: Sequence[NewJob]) -> None:
    """Queue jobs that hold no idempotency key, each as `insert_job` would,
    in their order, by one statement
    over arrays of their values. An `executemany`, pipelined, still ran the
    statement once a row: 1,000 rows took about 258 ms, against 149."""
    if any(job.unique_key is not None for job in jobs):
        raise ValueError("a job with an idempotency key needs insert_job's answer")
    if not jobs:
        return
    rows = [_insert_params(job) for job in jobs]
    tx.execute(_INSERT_ARRAYS, {name: [row[name] for row in rows] for name, _ in _ARRAYS})
    postgres_transaction(tx).notify_enqueued()


def release_unique_key(
    tx: Transaction, *, household_id: int, unique_key: str, older_than_seconds: float
) -> int:
    """Clear `unique_key` from the household's job that holds it, if that job was
    created more than `older_than_seconds` ago (its window is over)."""
    cursor = tx.execute(
        "UPDATE jobs SET unique_key = NULL, unique_digest = NULL "
        "WHERE household_id = %s AND unique_key = %s "
        "AND created_at < now() - make_interval(secs => %s)",
        (household_id, unique_key, float(older_than_seconds)),
    )
    return cursor.rowcount


def holder_of_key(tx: Transaction, *, household_id: int, unique_key: str) -> tuple[str, str] | None:
    """The (id, digest) of the household's job holding `unique_key`, if any
    (a statement of its own: it sees a concurrent insert that just committed)."""
    row = tx.execute(
        "SELECT id, unique_digest FROM jobs WHERE household_id = %s AND unique_key = %s",
        (household_id, unique_key),
    ).fetchone()
    return (row["id"], row["unique_digest"]) if row else None


def cancel_job(tx: Transaction, job_id: str, household_id: int | None = None) -> Job | None:
    """Cancel a job: a queued one is cancelled at once; a running one gets
    `cancel_requested_at` (its process stops it and records it cancelled).
    Final jobs are left as they are. Returns the job as it now is (None: no
    such job for that household). The update waits for a fenced write in
    flight on the row and then judges the row as that write left it."""
    cursor = tx.execute(
        "UPDATE jobs SET "
        "status = CASE status WHEN 'queued' THEN 'cancelled' ELSE status END, "
        "finished_at = CASE status WHEN 'queued' THEN now() ELSE finished_at END, "
        "cancel_requested_at = CASE status WHEN 'running' "
        "THEN coalesce(cancel_requested_at, now()) ELSE cancel_requested_at END, "
        f"updated_at = now(), {_NEXT_VERSION} "
        "WHERE id = %(id)s AND (status = 'queued' "
        "OR (status = 'running' AND cancel_requested_at IS NULL)) "
        "AND (%(household_id)s::bigint IS NULL OR household_id = %(household_id)s)",
        {"id": job_id, "household_id": household_id},
    )
    if cursor.rowcount:
        postgres_transaction(tx).notify_changed((job_id,))
    return get_job(tx, job_id, household_id)


def retry_job(tx: Transaction, job_id: str, household_id: int | None = None) -> Job | None:
    """Queue a failed or cancelled job again, due now, with a fresh attempt
    budget; other jobs are left as they are. Returns the job as it now is."""
    cursor = tx.execute(
        "UPDATE jobs SET status = 'queued', attempt = 0, interruptions = 0, snoozes = 0, "
        "result = NULL, "
        "error = NULL, started_at = NULL, finished_at = NULL, cancel_requested_at = NULL, "
        f"run_at = now(), updated_at = now(), {_NEXT_VERSION} "
        "WHERE id = %(id)s AND status IN ('failed', 'cancelled') "
        "AND (%(household_id)s::bigint IS NULL OR household_id = %(household_id)s)",
        {"id": job_id, "household_id": household_id},
    )
    postgres_transaction(tx).notify_enqueued()
    if cursor.rowcount:
        postgres_transaction(tx).notify_changed((job_id,))
    return get_job(tx, job_id, household_id)


def cancel_requested(tx: Transaction, leases: Iterable[Lease]) -> set[str]:
    """The ids of the given leased jobs whose cancel was requested."""
    arrays = _lease_arrays(leases)
    if not arrays["ids"]:
        return set()
    rows = tx.execute(
        f"SELECT jobs.id FROM jobs, {_LEASES} WHERE {_FENCE_ON_LEASES} "
        "AND jobs.cancel_requested_at IS NOT NULL",
        arrays,
    ).fetchall()
    return {row["id"] for row in rows}


# Advisory locks (class, key) the claim takes for kinds with a deployment-wide cap.
_CAP_LOCK_CLASS = int.from_bytes(b"mqcp", "big") - (1 << 31)


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


def _claim_one_priority(tx: Transaction, request: ClaimRequest) -> list[Job]:
    """Claim up to `limit` due queued jobs of `kinds` in one statement, all of
    one priority: the best among the due jobs this claim may take (found
    first, through the claim index). Households with due jobs of that
    priority take turns: the one with the fewest running jobs
    first, then the one served longest ago (of those one claim served, the
    one served fewer jobs so far), then the one whose oldest job is oldest; within
    a household, oldest first. A batch fills as if claimed one job at a
    time, each claim counting as a running job of its household. Cost: the
    households with running jobs plus about four times `limit` households
    (see `_HOUSEHOLDS_RANKED_PER_PLACE`) and `limit`
    jobs each, through indexes; never the finished rows or the households
    with nothing queued.

    The claim locks the `household_queues` rows of the households it chose
    with `SKIP LOCKED`, and their jobs likewise, so two claims never take the
    same job and a claim never waits: another transaction may hold a
    household's row (an enqueue, a retry or a rescue for it, whose triggers
    lock it, or a claim) while it waits for a row this one holds, and
    waiting would deadlock. A household skipped so is served by the next
    claim, and this one takes the next households in turn instead: up to
    four claims made at once (by several processes) each take households of
    their own; a fifth may find every household it ranked held, and then
    takes nothing until its next claim.
    Only the kinds
    this process can run: during a rolling deploy that adds a kind, older
    processes leave its jobs queued. `kind_limits` caps how many of a kind
    this claim takes (the process's room for it); `kind_caps` how many of a
    kind may run in the whole deployment, and `partitions` what each
    partition of a kind may do: for those kinds the claim first takes a
    transaction advisory lock per kind, so claims that could take them
    count the running jobs (and a partition's starts) one after another (a
    counted claim made exact by a lock), and the claim statement counts
    after the lock. A job whose partition is at a limit is passed over
    before households and jobs are chosen (so it hides no other job), and a
    batch takes no more of a partition than it has room for
    (`mealquest.db.partitions`). Paused kinds are never taken.
    """
    limit, kind_limits = request.limit, request.kind_limits
    kinds = [kind for kind in request.kinds if kind_limits.get(kind, limit) > 0]
    if not kinds or limit <= 0:
        return []
    # The statement is planned once per connection, not at every claim: the
    # server's default weighs a generic plan against plans made for each
    # claim's values, and for this statement kept planning every time (about
    # 2 ms of a 4 ms claim of four jobs). Its plan does not hinge on the
    # values: each step is an index probe fenced by `OFFSET 0` or `LATERAL`.
    # That plan is made with the statistics of its moment: often none, or
    # those of a table of a few jobs, just before a burst. Costed so, a
    # bitmap scan of every due job and a sort looked cheapest for the best
    # priority, and a household's jobs read through another index and
    # sorted as cheap as its queue's index in order; at 12,000 queued that
    # was most of each claim's time. With sequential and bitmap scans and
    # sorts priced out (a sort the query cannot do without is still made),
    # the plan walks the indexes in the claim's order whatever the
    # statistics say (tests/drivers/test_postgresql.py). Those prices put
    # the plan's cost past JIT's threshold, and compiling it cost a second
    # a claim: JIT is off (no claim runs long enough to gain from it). All
    # for the rest of this transaction only.
    tx.execute(
        "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), "
        "set_config('enable_seqscan', 'off', true), "
        "set_config('enable_bitmapscan', 'off', true), "
        "set_config('enable_sort', 'off', true), set_config('jit', 'off', true)"
    ).fetchall()
    caps = {kind: cap for kind, cap in request.kind_caps.items() if kind in kinds}
    limited = flow.limited_kinds(kinds, request.partitions)
    # No queued job of a limited kind has a partition: the claim needs neither
    # the limits' statements nor their locks, and leaves out such a job
    # committed meanwhile (the next claim weighs it).
    unpartitioned = limited if limited and not _any_queued_partitioned(tx, limited) else []
    if unpartitioned:
        limited = []
    # One order for every claim's locks, the kinds' caps and partitions alike.
    for kind in sorted(set(caps) | set(limited)):
        tx.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_CAP_LOCK_CLASS, kind)
        ).fetchall()
    limits = limits_sql.limits(limited, request.partitions, _NOW) if limited else None
    most, most_params = _most_of_kind(kinds, kind_limits, caps)
    picked = "picks"
    if limits is not None:
        # As many of a partition's jobs as it has room for, in the claim's
        # order; the kinds' caps count what is left.
        picked = (
            "(SELECT seq, kind, turn, place FROM (SELECT p.seq, p.kind, p.partition_key, "
            f"p.turn, p.place, {limits.room} AS room, row_number() OVER "
            "(PARTITION BY p.kind, p.partition_key ORDER BY p.turn, p.place) AS nth "
            f"FROM picks AS p{limits.joins}) AS roomy "
            "WHERE partition_key IS NULL OR nth <= room)"
        )
    ranked = f"SELECT seq, turn, place FROM {picked} AS picked"
    if most:
        ranked = (
            f"SELECT seq, turn, place FROM (SELECT seq, turn, place, {most} AS most, "
            "row_number() OVER (PARTITION BY kind ORDER BY turn, place) AS nth "
            f"FROM {picked} AS picked) AS p WHERE nth <= most"
        )
    queued = f"status = 'queued' AND run_at <= {_NOW} AND {_NOT_SUSPENDED}"
    of_kinds = "kind = ANY(%(kinds)s::text[]) AND kind NOT IN (SELECT kind FROM paused_kinds)"
    if unpartitioned:
        of_kinds += _UNPARTITIONED
    unblocked = of_kinds
    if limits is not None:
        of_kinds += limits_sql.BLOCKED_FILTER
    full = [
        f"SELECT %(k{index})s::text WHERE (SELECT count(*) FROM jobs WHERE status = 'running' "
        f"AND kind = %(k{index})s) >= %(cap{index})s"
        for index, kind in enumerate(kinds)
        if kind in caps
    ]
    full_kinds = limits.ctes if limits is not None else ""
    if full:
        # Kinds at their deployment cap, left out before households and jobs
        # are chosen, so they cannot hide a household's other jobs.
        full_kinds += f"full_kinds(kind) AS ({' UNION ALL '.join(full)}),\n"
        queued += " AND kind NOT IN (SELECT kind FROM full_kinds)"
    # The best priority of the jobs this claim may take: the first in the
    # claim index's order (priority, run_at, seq) that is due and of a kind
    # this claim takes. The kinds are tested outside an `OFFSET 0` subquery
    # that walks that index: asked in one query, a planner without the
    # table's statistics (which lag a burst of enqueues) read every due job
    # through the kinds' index and sorted them, 4 ms at 8,000 queued. With
    # limits per partition, the priorities are tried one after another
    # instead (`_tier_by_tier`): that walk would pass over, one entry at a
    # time, every job of a partition at its limit that comes first.
    full_kinds += (
        "tier AS (SELECT %(tier)s::integer AS priority),\n"
        if limits is not None
        else "tier AS (SELECT priority FROM (SELECT priority, kind, partition_key FROM jobs "
        f"WHERE {queued} ORDER BY priority, run_at, seq OFFSET 0) AS ordered "
        f"WHERE {of_kinds} LIMIT 1),\n"
    )
    due = f"{queued} AND {of_kinds}"
    due += " AND priority = (SELECT priority FROM tier)"
    # Two forms keep the plan to the households served and their jobs, not
    # the whole queue, while the statistics lag a burst of enqueues or say a
    # few households hold every job: each EXISTS is a probe per household in
    # its index's order (`OFFSET 0` stops the planner from joining it, which
    # read every queued job; the order makes the household's index the way
    # to its first due job), and the UPDATE finds its rows by primary key
    # alone (its own `status` test let the planner read the queued jobs'
    # index instead). The rows are queued: `picks` locked them so, after
    # checking, and nobody changes them until this commits.
    statement = f"""
WITH {full_kinds}idle AS (
    SELECT q.household_id, 0::bigint AS running, q.served_at, q.served_jobs,
           q.head_run_at, q.head_seq
    FROM household_queues AS q
    WHERE q.head_run_at <= {_NOW}
    AND NOT EXISTS (SELECT 1 FROM jobs AS r
                    WHERE r.household_id = q.household_id AND r.status = 'running')
    AND EXISTS (SELECT 1 FROM jobs AS j WHERE j.household_id = q.household_id AND j.{due}
                ORDER BY j.run_at, j.seq LIMIT 1 OFFSET 0)
    ORDER BY q.served_at, q.served_jobs, q.head_run_at, q.head_seq LIMIT %(ranked)s
),
busy AS (
    SELECT q.household_id, b.running, q.served_at, q.served_jobs,
           q.head_run_at, q.head_seq
    FROM (SELECT household_id, count(*) AS running FROM jobs
          WHERE status = 'running' GROUP BY household_id) AS b
    JOIN household_queues AS q ON q.household_id = b.household_id
    WHERE q.head_run_at <= {_NOW}
    AND EXISTS (SELECT 1 FROM jobs AS j WHERE j.household_id = q.household_id AND j.{due}
                ORDER BY j.run_at, j.seq LIMIT 1 OFFSET 0)
),
chosen AS MATERIALIZED (
    SELECT household_id, running, row_number() OVER (ORDER BY {_TURN}) AS place
    FROM (SELECT * FROM idle UNION ALL SELECT * FROM busy) AS c
    ORDER BY {_TURN} LIMIT %(ranked)s
),
candidates AS (
    SELECT c.household_id, c.running, c.place
    FROM chosen AS c JOIN household_queues AS q USING (household_id)
    ORDER BY c.place LIMIT %(limit)s
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
    lease_expires_at = {_NOW} + make_interval(secs => %(lease_seconds)s),
    started_at = {_NOW}, updated_at = {_NOW}, {_NEXT_VERSION}
WHERE jobs.seq = ANY(ARRAY(SELECT seq FROM next))
RETURNING {_qualified("jobs")}"""
    params = {
        "now": request.now,
        "kinds": list(kinds),
        "limit": limit,
        "ranked": limit * _HOUSEHOLDS_RANKED_PER_PLACE,
        "owner": request.owner,
        "lease_seconds": float(request.lease_seconds),
        "unpartitioned": unpartitioned,
        **most_params,
    }
    if limits is None:
        rows = tx.execute(statement, params).fetchall()
    else:
        rows = _tier_by_tier(tx, statement, {**params, **limits.params}, unblocked)
    # RETURNING gives no order; hand jobs out in the claim's.
    claimed = sorted(
        (_job(row) for row in rows), key=lambda job: (job.priority, job.run_at, job.seq)
    )
    if limits is not None:
        limits_sql.record_starts(tx, claimed, request.partitions)
    return claimed


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
            f"WHERE status = 'queued' AND run_at <= {_NOW} AND priority > %(after)s::integer "
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


def claim(tx: Transaction, request: ClaimRequest) -> list[Job]:
    """Up to `request.limit` due jobs: by priority (lower first), each
    priority's households in turn (`mealquest.db.claiming`)."""
    due = functools.partial(has_due_job, partitions=request.partitions)
    claimed = claiming.by_priority(_claim_one_priority, due, tx, request)
    postgres_transaction(tx).notify_changed(job.id for job in claimed)
    return claimed


def _qualified(table: str) -> str:
    return ", ".join(f"{table}.{column.strip()}" for column in _COLUMNS.split(","))


def publish(tx: Transaction, lease: Lease, *, result: str) -> bool:
    cursor = tx.execute(
        f"UPDATE jobs SET result = %(result)s, updated_at = now(), {_NEXT_VERSION} WHERE {_FENCE}",
        {"result": result, **_fence(lease)},
    )
    if cursor.rowcount != 1:
        return False
    postgres_transaction(tx).notify_changed((lease.job_id,))
    return True


def owns(tx: Transaction, lease: Lease) -> bool:
    """Whether the lease still holds, keeping it held until `tx` ends: the row
    lock makes a rescuer's update wait for the handler's fenced write, as
    SQLite's one writer does, instead of slipping in between."""
    row = tx.execute(
        f"SELECT 1 FROM jobs WHERE {_FENCE} FOR NO KEY UPDATE", _fence(lease)
    ).fetchone()
    return row is not None


def add_log_lines(tx: Transaction, job_id: str, lines: Sequence[LogLine]) -> None:
    tx.execute(
        "INSERT INTO job_logs (job_id, attempt, line, level, message, logged_at) "
        "SELECT %s, * FROM unnest(%s::int[], %s::int[], %s::text[], %s::text[], "
        "%s::timestamptz[])",
        (
            job_id,
            [x.attempt for x in lines],
            [x.line for x in lines],
            [x.level for x in lines],
            [x.message for x in lines],
            [x.logged_at for x in lines],
        ),
    )


def add_traceparents(tx: Transaction, traces: Sequence[tuple[str, str]]) -> None:
    if traces:
        tx.execute(
            "INSERT INTO job_traces (job_id, traceparent) "
            "SELECT * FROM unnest(%s::text[], %s::text[])",
            ([job_id for job_id, _ in traces], [value for _, value in traces]),
        )


def traceparents(conn: Reads, job_ids: Sequence[str]) -> dict[str, str]:
    rows = conn.execute(
        "SELECT job_id, traceparent FROM job_traces WHERE job_id = ANY(%s::text[])",
        (list(job_ids),),
    ).fetchall()
    return {row["job_id"]: row["traceparent"] for row in rows}


def log_lines(conn: Reads, job_id: str) -> list[LogLine]:
    rows = conn.execute(
        "SELECT attempt, line, level, message, logged_at FROM job_logs "
        "WHERE job_id = %s ORDER BY attempt, line",
        (job_id,),
    ).fetchall()
    return [LogLine(**{**row, "logged_at": to_text(row["logged_at"])}) for row in rows]


# Every way a running job leaves `running` through its own worker: the target
# status's columns, plus what the ending attempt does to the counters. Each
# write clears the lease and is fenced on it. A job whose cancel was requested
# goes to cancelled instead of back to the queue, its last partial result kept.
_CANCELLING = "jobs.cancel_requested_at IS NOT NULL"
_TO: dict[Status, str] = {
    Status.SUCCEEDED: "status = %(to)s, result = %(result)s, finished_at = now()",
    Status.FAILED: "status = %(to)s, error = %(error)s, finished_at = now()",
    Status.CANCELLED: "status = %(to)s, finished_at = now()",
    # The partial result of the attempt that ended is not the next one's.
    Status.QUEUED: (
        f"status = CASE WHEN {_CANCELLING} THEN 'cancelled' ELSE 'queued' END, "
        f"finished_at = CASE WHEN {_CANCELLING} THEN now() END, "
        f"result = CASE WHEN {_CANCELLING} THEN jobs.result END, "
        f"run_at = CASE WHEN {_CANCELLING} OR %(delay)s::double precision IS NULL "
        "THEN jobs.run_at ELSE now() + make_interval(secs => %(delay)s::double precision) END"
    ),
}
_ATTEMPT: dict[Attempt, str] = {
    Attempt.SPEND: "interruptions = 0",
    Attempt.REFUND: "attempt = attempt - 1",
}
# A snooze counts on the job (unless a cancel wins), and ends its interruptions in a row.
_SNOOZED = f"snoozes = jobs.snoozes + CASE WHEN {_CANCELLING} THEN 0 ELSE 1 END, interruptions = 0"


def transition(tx: Transaction, change: Transition) -> bool:
    """Move the leased running job to `change.to`; False if the lease is no longer held.

    `to=QUEUED` with `Attempt.SPEND` is a retry, due `delay_seconds` from
    now; with `Attempt.REFUND` the job goes back as if the attempt never
    started; a snooze is such a refund, counted in the job's `snoozes`.
    `delay_seconds` None keeps its `run_at`, and so its place in the queue.
    Each ends the job cancelled instead if a cancel was requested meanwhile.
    """
    check_transition(change.to, change.attempt, change.snoozed)
    delay = change.delay_seconds
    snoozed = f"{_SNOOZED}, " if change.snoozed else ""
    cursor = tx.execute(
        f"UPDATE jobs SET {_TO[change.to]}, {_ATTEMPT[change.attempt]}, {snoozed}{_CLEAR_LEASE} "
        f"WHERE {_FENCE}",
        {
            "to": str(change.to),
            "result": change.result,
            "error": change.error,
            "delay": None if delay is None else float(delay),
            **_fence(change.lease),
        },
    )
    if cursor.rowcount != 1:
        return False
    postgres_transaction(tx).notify_changed((change.lease.job_id,))
    return True


# `transition` for a batch, in one statement: each row of `change` carries its
# target status, whether the attempt is refunded (and whether as a snooze),
# and its result, error and delay; the same columns as `_TO`, `_ATTEMPT` and
# `_SNOOZED` set, chosen per row.
_CHANGE_CANCELLING = "change.status = 'queued' AND jobs.cancel_requested_at IS NOT NULL"
_TRANSITION_MANY = (
    "UPDATE jobs SET "
    f"status = CASE WHEN {_CHANGE_CANCELLING} THEN 'cancelled' ELSE change.status END, "
    "result = CASE change.status WHEN 'succeeded' THEN change.result "
    f"WHEN 'queued' THEN CASE WHEN {_CHANGE_CANCELLING} THEN jobs.result END "
    "ELSE jobs.result END, "
    "error = CASE WHEN change.status = 'failed' THEN change.error ELSE jobs.error END, "
    "finished_at = CASE WHEN change.status <> 'queued' OR jobs.cancel_requested_at IS NOT NULL "
    "THEN now() END, "
    f"run_at = CASE WHEN change.status <> 'queued' OR {_CHANGE_CANCELLING} "
    "OR change.delay IS NULL THEN jobs.run_at "
    "ELSE now() + make_interval(secs => change.delay) END, "
    "interruptions = CASE WHEN change.refund AND NOT change.snoozed "
    "THEN jobs.interruptions ELSE 0 END, "
    "attempt = CASE WHEN change.refund THEN jobs.attempt - 1 ELSE jobs.attempt END, "
    f"snoozes = CASE WHEN change.snoozed AND NOT ({_CHANGE_CANCELLING}) "
    "THEN jobs.snoozes + 1 ELSE jobs.snoozes END, "
    f"{_CLEAR_LEASE} "
    "FROM unnest(%(ids)s::text[], %(owners)s::text[], %(attempts)s::integer[], "
    "%(statuses)s::text[], %(refunds)s::boolean[], %(results)s::text[], %(errors)s::text[], "
    "%(delays)s::double precision[], %(snoozed)s::boolean[]) "
    "AS change(id, owner, attempt, status, refund, result, error, delay, snoozed) "
    "WHERE jobs.id = change.id AND jobs.status = 'running' AND jobs.lease_owner = change.owner "
    "AND jobs.attempt = change.attempt RETURNING jobs.id"
)


def _transition_together(tx: Transaction, transitions: list[Transition]) -> set[str]:
    """The ids of the jobs the transitions (each naming another job) moved."""
    rows = tx.execute(
        _TRANSITION_MANY,
        {
            **_lease_arrays(change.lease for change in transitions),
            "statuses": [str(change.to) for change in transitions],
            "refunds": [change.attempt is Attempt.REFUND for change in transitions],
            "results": [change.result for change in transitions],
            "errors": [change.error for change in transitions],
            "delays": [
                None if change.delay_seconds is None else float(change.delay_seconds)
                for change in transitions
            ],
            "snoozed": [change.snoozed for change in transitions],
        },
    ).fetchall()
    moved = {row["id"] for row in rows}
    postgres_transaction(tx).notify_changed(moved)
    return moved


def transition_many(tx: Transaction, transitions: Sequence[Transition]) -> list[bool]:
    """`transition` for each; whether each lease was still held.

    The completer writes a batch of outcomes at once: the jobs named once
    by one statement (`mealquest.db.outcomes`), one round trip for the
    batch rather than one per job (the fence is each row's own).
    """
    return outcomes.transition_many(tx, transitions, _transition_together, transition)


def renew_leases(
    tx: Transaction, leases: Iterable[Lease], *, lease_seconds: float
) -> set[tuple[str, int]]:
    """Extend the given leases where still held; returns the (id, attempt) renewed.

    Only leases the process names: a job the heartbeat leaves out (its handler
    past its timeout, or its outcome given up on) expires and is rescued.
    """
    arrays = _lease_arrays(leases)
    if not arrays["ids"]:
        return set()
    rows = tx.execute(
        "UPDATE jobs SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s) "
        f"FROM {_LEASES} WHERE {_FENCE_ON_LEASES} RETURNING jobs.id, jobs.attempt",
        {"lease_seconds": float(lease_seconds), **arrays},
    ).fetchall()
    return {(row["id"], row["attempt"]) for row in rows}


def leases_of(tx: Transaction, owner: str) -> list[Lease]:
    """The leases of the running jobs one claim (by its fencing `owner`) holds."""
    rows = tx.execute(
        "SELECT id, lease_owner, attempt FROM jobs WHERE status = 'running' AND lease_owner = %s",
        (owner,),
    ).fetchall()
    return [Lease(row["id"], row["lease_owner"], row["attempt"]) for row in rows]


# Leaves out the queued jobs with a partition of the kinds a claim found none of.
_UNPARTITIONED = " AND (partition_key IS NULL OR kind <> ALL(%(unpartitioned)s::text[]))"


def _any_queued_partitioned(conn: Reads, kinds: list[str]) -> bool:
    """Whether a queued job of `kinds` has a partition (one probe of a small
    partial index: ordered by its key, so that the planner walks the index
    rather than the table, whatever its statistics say)."""
    row = conn.execute(
        "SELECT 1 FROM jobs WHERE status = 'queued' AND partition_key IS NOT NULL "
        "AND kind = ANY(%(kinds)s::text[]) ORDER BY kind LIMIT 1",
        {"kinds": kinds},
    ).fetchone()
    return row is not None


def has_due_job(
    conn: Reads,
    kinds: Collection[str],
    *,
    partitions: Mapping[str, PartitionLimits] | None = None,
) -> bool:
    """Whether a due job of `kinds` is queued that a claim could take: not of
    a paused kind, nor (with `partitions`) of a partition at a limit."""
    if not kinds:
        return False
    limited = flow.limited_kinds(kinds, partitions or {})
    unpartitioned = limited if limited and not _any_queued_partitioned(conn, limited) else []
    if unpartitioned:
        limited = []
    limits = limits_sql.limits(limited, partitions or {}, "now()") if limited else None
    head = f"WITH {limits.ctes.rstrip().rstrip(',')} " if limits is not None else ""
    row = conn.execute(
        f"{head}SELECT EXISTS (SELECT 1 FROM jobs WHERE status = 'queued' AND run_at <= now() "
        "AND kind = ANY(%(kinds)s::text[]) AND kind NOT IN (SELECT kind FROM paused_kinds)"
        f"{_UNPARTITIONED if unpartitioned else ''}"
        f"{limits_sql.BLOCKED_FILTER if limits is not None else ''}) AS due",
        {
            "kinds": list(kinds),
            "unpartitioned": unpartitioned,
            **(limits.params if limits is not None else {}),
        },
    ).fetchone()
    return bool(row["due"])


def queued_of_other_kinds(conn: Reads, kinds: Collection[str]) -> dict[str, int]:
    """Queued jobs by kind, for the kinds not in `kinds` (no handler here)."""
    rows = conn.execute(
        "SELECT kind, count(*) AS waiting FROM jobs WHERE status = 'queued' "
        "AND kind <> ALL(%s::text[]) GROUP BY kind ORDER BY kind",
        (list(kinds),),
    ).fetchall()
    return {row["kind"]: row["waiting"] for row in rows}


# The interruption policy, in SQL so that one statement applies it to any
# number of rows, whatever their kinds (UPDATE's expressions all read the row
# as it was before the statement). A job whose cancel was requested ends
# cancelled, its last partial result kept.
_REQUEUES = (
    f"(jobs.on_interrupt = 'requeue' AND jobs.interruptions + 1 < {MAX_INTERRUPTIONS} "
    f"AND NOT {_CANCELLING})"
)
_INTERRUPT = (
    f"status = CASE WHEN {_CANCELLING} THEN 'cancelled' "
    f"WHEN {_REQUEUES} THEN 'queued' ELSE 'failed' END, "
    f"attempt = CASE WHEN {_REQUEUES} THEN jobs.attempt - 1 ELSE jobs.attempt END, "
    f"result = CASE WHEN {_REQUEUES} THEN NULL ELSE jobs.result END, "
    f"error = CASE WHEN {_REQUEUES} OR {_CANCELLING} THEN NULL ELSE %(interrupted)s END, "
    f"finished_at = CASE WHEN {_REQUEUES} THEN NULL ELSE now() END, "
    f"interruptions = jobs.interruptions + 1, {_CLEAR_LEASE}"
)


def _recovered(tx: Transaction, rows: list[dict[str, Any]]) -> Recovered:
    postgres_transaction(tx).notify_changed(row["id"] for row in rows)
    return Recovered(
        tuple(row["id"] for row in rows if row["status"] == Status.QUEUED),
        tuple(row["id"] for row in rows if row["status"] == Status.FAILED),
        tuple(row["id"] for row in rows if row["status"] == Status.CANCELLED),
    )


def interrupt(tx: Transaction, leases: Iterable[Lease]) -> Recovered:
    """Record jobs a stopping worker cut short (fenced on their leases).

    A re-queued job keeps its run_at, and so its place among the oldest: its
    process stopped, not the job.
    """
    arrays = _lease_arrays(leases)
    if not arrays["ids"]:
        return Recovered()
    rows = tx.execute(
        f"UPDATE jobs SET {_INTERRUPT} FROM {_LEASES} WHERE {_FENCE_ON_LEASES} "
        "RETURNING jobs.id, jobs.status",
        {"interrupted": MESSAGE_INTERRUPTED, **arrays},
    ).fetchall()
    return _recovered(tx, rows)


def running_leases(conn: Reads) -> list[HeldLease]:
    """The lease of every running job, as stored now."""
    rows = conn.execute(
        "SELECT id, lease_owner, attempt, lease_expires_at FROM jobs WHERE status = 'running'"
    ).fetchall()
    return [
        HeldLease(
            Lease(row["id"], row["lease_owner"], row["attempt"]), to_text(row["lease_expires_at"])
        )
        for row in rows
    ]


def rescue_unrenewed(
    tx: Transaction, held: Sequence[HeldLease], *, now: datetime | None = None
) -> Recovered:
    """Interrupt each of `held` whose lease is still as it was read (nobody
    renewed it since) and expired by the database's clock (or `now`)."""
    if not held:
        return Recovered()
    rows = tx.execute(
        f"UPDATE jobs SET {_INTERRUPT} FROM unnest(%(ids)s::text[], %(owners)s::text[], "
        "%(attempts)s::integer[], %(expiries)s::timestamptz[]) "
        f"AS lease(id, owner, attempt, expires_at) WHERE {_FENCE_ON_LEASES} "
        f"AND jobs.lease_expires_at = lease.expires_at AND jobs.lease_expires_at < {_NOW} "
        "RETURNING jobs.id, jobs.status",
        {
            "interrupted": MESSAGE_INTERRUPTED,
            "now": now,
            "expiries": [entry.expires_at for entry in held],
            **_lease_arrays(entry.lease for entry in held),
        },
    ).fetchall()
    return _recovered(tx, rows)


def get_job(conn: Reads, job_id: str, household_id: int | None = None) -> Job | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM jobs WHERE id = %(id)s "
        "AND (%(household_id)s::bigint IS NULL OR household_id = %(household_id)s)",
        {"id": job_id, "household_id": household_id},
    ).fetchone()
    return _job(row) if row else None


def get_job_with_token(
    conn: Reads, job_id: str, token_sha256: str
) -> tuple[Household, Job | None] | None:
    """The household of a live token (by digest) and its job `job_id` (None if
    it has none of that id), in one statement; None if the token is not live."""
    row = conn.execute(
        "SELECT h.id AS token_household_id, h.name AS token_household_name, "
        "h.suspended_at IS NOT NULL AS token_household_suspended, "
        f"{_qualified('j')} FROM api_tokens t JOIN households h ON h.id = t.household_id "
        "LEFT JOIN jobs j ON j.id = %(id)s AND j.household_id = t.household_id "
        "WHERE t.token_sha256 = %(digest)s AND t.revoked_at IS NULL AND h.erased_at IS NULL",
        {"id": job_id, "digest": token_sha256},
    ).fetchone()
    if row is None:
        return None
    values = dict(row)
    household = Household(
        values.pop("token_household_id"),
        values.pop("token_household_name"),
        values.pop("token_household_suspended"),
    )
    return household, _job(values) if values["id"] is not None else None


def list_jobs(
    conn: Reads,
    *,
    household_id: int | None = None,
    status: Status | None = None,
    kind: str | None = None,
    before_seq: int | None = None,
    limit: int = 50,
) -> list[Job]:
    """Jobs newest first, filtered; `before_seq` continues a previous page.
    A household's list goes by an index of its own rows (`listing`)."""
    conditions: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    for column, value in (("household_id", household_id), ("status", status), ("kind", kind)):
        if value is not None:
            conditions.append(f"{column} = %({column})s")
            params[column] = str(value) if column == "status" else value
    if before_seq is not None:
        conditions.append("seq < %(before_seq)s")
        params["before_seq"] = before_seq
    if household_id is not None:
        _index, implied = listing.household_index(status, kind)
        if implied is not None:
            conditions.append(implied)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM jobs {where} ORDER BY seq DESC LIMIT %(limit)s", params
    ).fetchall()
    return [_job(row) for row in rows]


# Transaction advisory locks (class, household) serialising a household's enqueues.
_QUOTA_LOCK_CLASS = int.from_bytes(b"mqqt", "big") - (1 << 31)


def count_pending(tx: Transaction, household_id: int, at_most: int) -> int:
    """The household's queued and running jobs (its quota's use), under a
    transaction advisory lock on the household: concurrent enqueues of one
    household wait for each other's commit, so the count stays true until
    this transaction commits. Read in a statement after the lock, so it sees
    every enqueue that committed before. Queued ones are counted on the
    household's queue row (kept by the queue triggers in the same
    transactions: one probe, however many wait); running ones through their
    partial index, up to `at_most` (the quota)."""
    tx.execute(
        "SELECT pg_advisory_xact_lock(%s, (%s::bigint %% 2147483647)::integer)",
        (_QUOTA_LOCK_CLASS, household_id),
    ).fetchall()
    row = tx.execute(
        "SELECT coalesce((SELECT queued FROM household_queues WHERE household_id = %(h)s), 0) "
        "+ (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE household_id = %(h)s "
        "AND status = 'running' LIMIT %(most)s) AS running) AS pending",
        {"h": household_id, "most": at_most},
    ).fetchone()
    return int(row["pending"])


# How many of a household's latest finished jobs its typical run time is read from.
_RECENT_RUNS = 20


def household_load(conn: Reads, household_id: int) -> tuple[int, float | None]:
    """The household's running jobs, and the mean run time in seconds of its
    latest finished ones (None without any): what a quota's wait is judged by."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobs WHERE household_id = %(h)s AND status = 'running') "
        "AS running, (SELECT avg(extract(epoch FROM finished_at - started_at)) "
        "FROM (SELECT started_at, finished_at FROM jobs WHERE household_id = %(h)s "
        "AND status IN ('succeeded', 'failed') AND started_at IS NOT NULL "
        "ORDER BY seq DESC LIMIT %(recent)s) AS recent) AS seconds",
        {"h": household_id, "recent": _RECENT_RUNS},
    ).fetchone()
    mean = row["seconds"]
    return int(row["running"]), None if mean is None else float(mean)


def changed_jobs(conn: Reads, versions: Mapping[str, int]) -> dict[str, Job | None]:
    """Each job of `versions` whose version is no longer the one given (None:
    it no longer exists): one statement over arrays, a primary-key probe per
    job, and only changed rows come back."""
    if not versions:
        return {}
    rows = conn.execute(
        f"SELECT w.id AS watched, {_qualified('j')} "
        "FROM unnest(%(ids)s::text[], %(versions)s::integer[]) AS w(id, version) "
        "LEFT JOIN jobs AS j ON j.id = w.id WHERE j.id IS NULL OR j.version <> w.version",
        {"ids": list(versions), "versions": list(versions.values())},
    ).fetchall()
    changed: dict[str, Job | None] = {}
    for row in rows:
        values = dict(row)
        job_id = values.pop("watched")
        changed[job_id] = _job(values) if values["id"] is not None else None
    return changed


def queue_standings(conn: Reads, jobs: Sequence[Job], *, at_most: int) -> dict[str, Standing]:
    """Each queued job's place in line (see `mealquest.db.standing`), judged at
    the database's now."""
    if not any(job.status == Status.QUEUED for job in jobs):
        return {}
    now = to_text(conn.execute("SELECT now() AS now").fetchone()["now"])
    return standing.standings(standing_reads, conn, jobs, at_most=at_most, now=now)


# How many of a kind's latest jobs its typical run time is looked for in (its
# newest jobs may be a long queue of waiting ones).
_KIND_JOBS_LOOKED_AT = 1_000


def kind_run_seconds(conn: Reads, kind: str) -> float | None:
    """The mean run time in seconds of the kind's latest finished jobs among its
    newest `_KIND_JOBS_LOOKED_AT` (None without any), through the kind's index."""
    row = conn.execute(
        "SELECT avg(extract(epoch FROM finished_at - started_at)) AS seconds FROM ("
        "SELECT started_at, finished_at FROM (SELECT seq, status, started_at, finished_at "
        "FROM jobs WHERE kind = %(kind)s ORDER BY kind, seq DESC LIMIT %(looked)s) AS newest "
        "WHERE status IN ('succeeded', 'failed') AND started_at IS NOT NULL "
        "ORDER BY seq DESC LIMIT %(recent)s) AS recent",
        {"kind": kind, "looked": _KIND_JOBS_LOOKED_AT, "recent": _RECENT_RUNS},
    ).fetchone()
    return None if row["seconds"] is None else float(row["seconds"])


def running_job_ids(conn: Reads, household_id: int) -> list[str]:
    """The ids of the household's running jobs (through their partial index)."""
    rows = conn.execute(
        "SELECT id FROM jobs WHERE household_id = %s AND status = 'running'", (household_id,)
    ).fetchall()
    return [row["id"] for row in rows]


def delete_household_jobs(tx: Transaction, household_id: int, *, limit: int) -> int:
    """Delete up to `limit` of the household's jobs that are not running (the
    batch chosen once, its rows locked without waiting)."""
    cursor = tx.execute(
        "WITH batch AS MATERIALIZED (SELECT seq FROM jobs WHERE household_id = %s "
        "AND status <> 'running' LIMIT %s FOR UPDATE SKIP LOCKED) "
        "DELETE FROM jobs WHERE seq IN (SELECT seq FROM batch) AND status <> 'running'",
        (household_id, limit),
    )
    return cursor.rowcount
