"""The SQL of limits per partition on PostgreSQL: what the claim adds for kinds
whose partitions are limited, and the rate's ledger it writes.

See `mealquest.db.partitions` for what is counted and why. The counts are
exact across processes and hosts because every claim that could take such
a kind first takes the kind's transaction advisory lock (as the
deployment-wide kind caps do, and in one order with theirs): such claims
count and write one after another, each statement reading what the claims
before it committed. Transaction-level locks only, so a pooler in
transaction mode hands the lock out and back with the transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mealquest.clock import from_text, to_text
from mealquest.db import partitions
from mealquest.db.driver import Transaction
from mealquest.model.jobs import Job, PartitionLimits

# The due jobs' condition that leaves out the partitions at a limit (`blocked`).
BLOCKED_FILTER = (
    " AND (partition_key IS NULL OR (kind, partition_key) NOT IN "
    "(SELECT kind, partition_key FROM blocked))"
)


@dataclass(frozen=True)
class Limits:
    """The claim's SQL for the limited kinds: common table expressions to put
    first (`blocked`, the partitions no job may start in now, and what
    counting needs), how much room a picked job's partition has (an
    expression over `picks AS p` and the `joins` that follow it), and their
    parameters (named `pk0`, ...)."""

    ctes: str
    room: str
    joins: str
    params: dict[str, Any]


def _case(kinds: Sequence[str], values: Mapping[str, str], column: str) -> str:
    """`CASE column WHEN pk0 THEN value0 ... END` for the kinds with a value (NULL otherwise)."""
    whens = [
        f"WHEN %(pk{index})s::text THEN {values[kind]}"
        for index, kind in enumerate(kinds)
        if kind in values
    ]
    return f"CASE {column} {' '.join(whens)} END" if whens else "NULL"


def limits(kinds: Sequence[str], limits_of: Mapping[str, PartitionLimits], now: str) -> Limits:
    """The SQL for claims (and looks for a due job) of the limited `kinds`
    at `now` (an SQL expression of the statement's moment); `limits_of` says
    what each partition of a kind may do.

    `blocked` holds the partitions at their running limit (from the running
    jobs that have a partition: as many rows as those) and those at their
    rate (the ledger's rows blocked now); both are few, however many
    partitions have queued jobs."""
    params: dict[str, Any] = {}
    most: dict[str, str] = {}
    count: dict[str, str] = {}
    since: dict[str, str] = {}
    for index, kind in enumerate(kinds):
        params[f"pk{index}"] = kind
        limit = limits_of[kind]
        if limit.max_running is not None:
            params[f"pm{index}"] = limit.max_running
            most[kind] = f"%(pm{index})s::bigint"
        if limit.rate is not None:
            params[f"pc{index}"] = limit.rate.count
            params[f"pp{index}"] = float(limit.rate.per_seconds)
            count[kind] = f"%(pc{index})s::bigint"
            since[kind] = f"{now} - make_interval(secs => %(pp{index})s::double precision)"
    ctes: list[str] = []
    sources: list[str] = []
    room: list[str] = []
    joins = ""
    if most:
        running_kinds = ", ".join(f"%(pk{kinds.index(kind)})s::text" for kind in most)
        ctes.append(
            "part_running AS MATERIALIZED (SELECT kind, partition_key, count(*) AS running "
            "FROM jobs WHERE status = 'running' AND partition_key IS NOT NULL "
            f"AND kind IN ({running_kinds}) GROUP BY kind, partition_key)"
        )
        sources.append(
            "SELECT kind, partition_key FROM part_running "
            f"WHERE running >= {_case(kinds, most, 'kind')}"
        )
        room.append(f"coalesce({_case(kinds, most, 'p.kind')} - coalesce(r.running, 0), %(limit)s)")
        joins += (
            " LEFT JOIN part_running AS r ON r.kind = p.kind AND r.partition_key = p.partition_key"
        )
    if count:
        rated_kinds = ", ".join(f"%(pk{kinds.index(kind)})s::text" for kind in count)
        sources.append(
            "SELECT kind, partition_key FROM partition_rates "
            f"WHERE blocked_until > {now} AND kind IN ({rated_kinds})"
        )
        # A probe of the picked partition's ledger (by its key), however
        # many ledgers there are.
        room.append(
            f"coalesce({_case(kinds, count, 'p.kind')} - (SELECT count(*) "
            "FROM partition_rates AS pr CROSS JOIN LATERAL unnest(pr.starts) AS started "
            "WHERE pr.kind = p.kind AND pr.partition_key = p.partition_key "
            f"AND started > {_case(kinds, since, 'p.kind')}), %(limit)s)"
        )
    ctes.append(f"blocked AS MATERIALIZED ({' UNION ALL '.join(sources)})")
    room_sql = room[0] if len(room) == 1 else f"least({', '.join(room)})"
    return Limits(",\n".join(ctes) + ",\n", room_sql, joins, params)


def record_starts(
    tx: Transaction, claimed: Sequence[Job], limits_of: Mapping[str, PartitionLimits]
) -> None:
    """Write the ledger of each partition with a rate that the claim started
    jobs of (at their `started_at`, the claim's moment), in the claim's
    transaction: one read and one write for all of them."""
    started = partitions.rated_starts(claimed, limits_of)
    if not started:
        return
    moment = from_text(_started_at(claimed))
    kinds = [kind for kind, _ in started]
    keys = [key for _, key in started]
    # Each ledger by its key: `LIMIT 1` (there is one) keeps the planner from
    # making it a join, which read every ledger.
    rows = tx.execute(
        "SELECT pr.kind, pr.partition_key, pr.starts "
        "FROM unnest(%(kinds)s::text[], %(keys)s::text[]) AS k(kind, partition_key) "
        "CROSS JOIN LATERAL (SELECT kind, partition_key, starts FROM partition_rates "
        "WHERE kind = k.kind AND partition_key = k.partition_key LIMIT 1) AS pr",
        {"kinds": kinds, "keys": keys},
    ).fetchall()
    previous = {(row["kind"], row["partition_key"]): row["starts"] for row in rows}
    ledgers: list[str] = []
    blocked: list[str | None] = []
    for partition, count in started.items():
        rate = limits_of[partition[0]].rate
        assert rate is not None
        kept, blocked_until = partitions.kept_starts(
            previous.get(partition, []), moment, count, rate
        )
        ledgers.append("{" + ",".join(f'"{to_text(start)}"' for start in kept) + "}")
        blocked.append(None if blocked_until is None else to_text(blocked_until))
    tx.execute(
        "INSERT INTO partition_rates (kind, partition_key, starts, blocked_until, last_started_at) "
        "SELECT r.kind, r.partition_key, r.starts::timestamptz[], r.blocked_until, "
        "%(moment)s::timestamptz FROM unnest(%(kinds)s::text[], %(keys)s::text[], "
        "%(starts)s::text[], %(blocked)s::timestamptz[]) "
        "AS r(kind, partition_key, starts, blocked_until) "
        "ON CONFLICT (kind, partition_key) DO UPDATE SET starts = excluded.starts, "
        "blocked_until = excluded.blocked_until, last_started_at = excluded.last_started_at",
        {
            "moment": to_text(moment),
            "kinds": kinds,
            "keys": keys,
            "starts": ledgers,
            "blocked": blocked,
        },
    )


def _started_at(claimed: Iterable[Job]) -> str:
    for job in claimed:
        if job.started_at is not None:
            return job.started_at
    raise ValueError("a claimed job without a start")
