"""The SQL of limits per partition on SQLite: what the claim adds for kinds
whose partitions are limited, and the rate's ledger it writes.

See `mealquest.db.partitions` for what is counted and why. On SQLite every
count is exact without more: write transactions take turns, so nothing
changes between the claim's count and its commit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

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
    parameters (named `:pk0`, ...)."""

    ctes: str
    room: str
    joins: str
    params: dict[str, object]


def _case(kinds: Sequence[str], values: Mapping[str, str], column: str) -> str:
    """`CASE column WHEN :pk0 THEN value0 ... END` for the kinds with a value (NULL otherwise)."""
    whens = [
        f"WHEN :pk{index} THEN {values[kind]}" for index, kind in enumerate(kinds) if kind in values
    ]
    return f"CASE {column} {' '.join(whens)} END" if whens else "NULL"


def limits(
    kinds: Sequence[str], limits_of: Mapping[str, PartitionLimits], moment: datetime
) -> Limits:
    """The SQL for claims (and looks for a due job) of the limited `kinds`
    at `moment`; `limits_of` says what each partition of a kind may do.

    `blocked` holds the partitions at their running limit (from the running
    jobs that have a partition: as many rows as those) and those at their
    rate (the ledger's rows blocked now); both are few, however many
    partitions have queued jobs."""
    params: dict[str, object] = {"flow_now": to_text(moment)}
    most: dict[str, str] = {}
    count: dict[str, str] = {}
    since: dict[str, str] = {}
    for index, kind in enumerate(kinds):
        params[f"pk{index}"] = kind
        limit = limits_of[kind]
        if limit.max_running is not None:
            params[f"pm{index}"] = limit.max_running
            most[kind] = f":pm{index}"
        if limit.rate is not None:
            params[f"pc{index}"] = limit.rate.count
            params[f"ps{index}"] = to_text(moment - timedelta(seconds=limit.rate.per_seconds))
            count[kind] = f":pc{index}"
            since[kind] = f":ps{index}"
    ctes: list[str] = []
    sources: list[str] = []
    room: list[str] = []
    joins = ""
    if most:
        running_kinds = ", ".join(f":pk{kinds.index(kind)}" for kind in most)
        ctes.append(
            "part_running(kind, partition_key, running) AS MATERIALIZED ("
            "SELECT kind, partition_key, count(*) FROM jobs INDEXED BY jobs_partition_running "
            "WHERE status = 'running' AND partition_key IS NOT NULL "
            f"AND kind IN ({running_kinds}) GROUP BY kind, partition_key)"
        )
        sources.append(
            "SELECT kind, partition_key FROM part_running "
            f"WHERE running >= {_case(kinds, most, 'kind')}"
        )
        room.append(f"coalesce({_case(kinds, most, 'p.kind')} - coalesce(r.running, 0), :limit)")
        joins += (
            " LEFT JOIN part_running AS r ON r.kind = p.kind AND r.partition_key = p.partition_key"
        )
    if count:
        rated_kinds = ", ".join(f":pk{kinds.index(kind)}" for kind in count)
        sources.append(
            "SELECT kind, partition_key FROM partition_rates INDEXED BY partition_rates_blocked "
            f"WHERE blocked_until > :flow_now AND kind IN ({rated_kinds})"
        )
        # A probe of the picked partition's ledger (by its key).
        room.append(
            f"coalesce({_case(kinds, count, 'p.kind')} - (SELECT count(*) "
            "FROM partition_rates AS pr, json_each(pr.starts) "
            "WHERE pr.kind = p.kind AND pr.partition_key = p.partition_key "
            f"AND json_each.value > {_case(kinds, since, 'p.kind')}), :limit)"
        )
    ctes.append(f"blocked(kind, partition_key) AS MATERIALIZED ({' UNION ALL '.join(sources)})")
    room_sql = room[0] if len(room) == 1 else f"min({', '.join(room)})"
    return Limits(",\n".join(ctes) + ",\n", room_sql, joins, params)


def record_starts(
    tx: Transaction,
    claimed: Iterable[Job],
    limits_of: Mapping[str, PartitionLimits],
    moment: datetime,
) -> None:
    """Write the ledger of each partition with a rate that the claim started
    jobs of (at `moment`, the claim's), in the claim's transaction."""
    for (kind, key), started in partitions.rated_starts(claimed, limits_of).items():
        rate = limits_of[kind].rate
        assert rate is not None
        row = tx.execute(
            "SELECT starts FROM partition_rates WHERE kind = ? AND partition_key = ?", (kind, key)
        ).fetchone()
        previous = [from_text(start) for start in json.loads(row["starts"])] if row else []
        kept, blocked_until = partitions.kept_starts(previous, moment, started, rate)
        tx.execute(
            "INSERT INTO partition_rates "
            "(kind, partition_key, starts, blocked_until, last_started_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (kind, partition_key) DO UPDATE SET starts = excluded.starts, "
            "blocked_until = excluded.blocked_until, last_started_at = excluded.last_started_at",
            (
                kind,
                key,
                json.dumps([to_text(start) for start in kept]),
                None if blocked_until is None else to_text(blocked_until),
                to_text(moment),
            ),
        )
