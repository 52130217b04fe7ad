"""Households held: nothing of theirs any claim could take (migration 0023), on PostgreSQL.

A household whose every due job is of a paused kind, of a kind at its
deployment-wide cap, or waits on a partition at its limit, or a suspended
household, has nothing a claim could take; a claim walking the households
in turn would read each of those jobs to learn it, at every claim. The
sweep here, made by a claim at most once per `claiming.HOLD_SECONDS` in the
whole deployment, marks such households held until then; the claims and
the look for a due job pass over a household held now (`NOT_HELD`) without
reading its jobs. The hold ends sooner when a job joins the household's
queue, when a job of a kind or a partition the sweep found full stops
running, when a kind is resumed or the household lifted from suspension
(the migration's triggers). A kind or a partition that frees while a sweep
is being written may leave its households held until the hold's moment:
never longer than `claiming.HOLD_SECONDS`.

The sweep never waits: the row that says when the last one was made is
taken `SKIP LOCKED` (another claim sweeping, or a job's end starting a
generation, has it), and so are the households' queue rows (a claim or an
enqueue holds them; that household is weighed by the next sweep).

Not a hold: jobs of a kind this process does not run, or has no room for
(its own cap): another process may take them, and this process's claims
still read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mealquest.db import claiming
from mealquest.db.driver import Transaction
from mealquest.db.postgresql import partitions as limits_sql
from mealquest.db.postgresql.job_rows import NOW

# The test on `household_queues AS q` that it is not held now.
NOT_HELD = (
    f"(q.held_until IS NULL OR q.held_until <= {NOW} OR q.held_generation IS DISTINCT FROM "
    "(SELECT generation FROM household_holds WHERE id = 1))"
)

# Whether the last sweep was made `claiming.HOLD_SECONDS` ago or more (an SQL
# expression of `now` and `hold_seconds`).
SWEEP_DUE = (
    "EXISTS (SELECT 1 FROM household_holds WHERE id = 1 "
    f"AND swept_at <= {NOW} - make_interval(secs => %(hold_seconds)s))"
)

# A due job's partition is not at a limit (its kind's limits are `limits_sql`'s).
_OPEN_PARTITION = (
    " AND NOT (j.partition_key IS NOT NULL AND j.kind = ANY(%(limited_kinds)s::text[]) "
    "AND (j.kind, j.partition_key) IN (SELECT kind, partition_key FROM blocked))"
)

_HOLD = f"""
WITH {{ctes}}held AS (
    SELECT q.household_id FROM household_queues AS q
    WHERE q.head_run_at <= {NOW} AND (
        q.household_id IN (SELECT id FROM households WHERE suspended_at IS NOT NULL)
        OR NOT EXISTS (
            SELECT 1 FROM jobs AS j
            WHERE j.household_id = q.household_id AND j.status = 'queued'
            AND j.run_at <= {NOW}
            AND j.kind NOT IN (SELECT kind FROM paused_kinds UNION ALL SELECT kind FROM held_kinds)
            {{open}}
            ORDER BY j.run_at, j.seq OFFSET 0
        )
    )
    ORDER BY q.household_id FOR UPDATE OF q SKIP LOCKED
)
UPDATE household_queues AS q
SET held_until = {NOW} + make_interval(secs => %(hold_seconds)s),
    held_generation = (SELECT generation FROM household_holds WHERE id = 1)
FROM held WHERE q.household_id = held.household_id"""


def sweep(
    tx: Transaction,
    now: object,
    caps: Mapping[str, int],
    limits: limits_sql.Limits | None,
    limited: list[str],
) -> None:
    """Hold the households that have nothing a claim could take at `now` (the
    claim's moment, or None for the server's; see the module): `caps` are
    the deployment-wide caps of kinds, `limits` the partitions' limits of
    the `limited` kinds. Unless a sweep did within `claiming.HOLD_SECONDS`
    (or another claim is making one); the holds of the last sweep end."""
    due = tx.execute(
        "SELECT EXISTS (SELECT 1 FROM paused_kinds) "
        "OR EXISTS (SELECT 1 FROM households WHERE suspended_at IS NOT NULL) AS closing "
        "FROM household_holds WHERE id = 1 "
        f"AND swept_at <= {NOW} - make_interval(secs => %(hold_seconds)s) "
        "FOR UPDATE SKIP LOCKED",
        {"now": now, "hold_seconds": claiming.HOLD_SECONDS},
    ).fetchone()
    if due is None:
        return
    # A new generation ends the last sweep's holds; the new ones are made in it.
    tx.execute(
        f"UPDATE household_holds SET swept_at = {NOW}, generation = generation + 1 WHERE id = 1",
        {"now": now},
    )
    full = _full_kinds(tx, caps)
    tx.execute(
        "WITH gone AS (DELETE FROM held_kinds WHERE kind <> ALL(%(full)s::text[])) "
        "INSERT INTO held_kinds (kind) SELECT unnest(%(full)s::text[]) ON CONFLICT DO NOTHING",
        {"full": full},
    )
    params: dict[str, Any] = {
        **(limits.params if limits is not None else {}),
        "now": now,
        "limited_kinds": list(limited),
        "hold_seconds": claiming.HOLD_SECONDS,
    }
    if limits is None:
        tx.execute(
            "DELETE FROM held_partitions WHERE kind <> ALL(%(limited_kinds)s::text[])", params
        )
        if not full and not due["closing"]:
            return
    else:
        tx.execute(
            f"WITH {limits.ctes.rstrip()}\ngone AS (DELETE FROM held_partitions "
            "WHERE (kind, partition_key) NOT IN (SELECT kind, partition_key FROM blocked)) "
            "INSERT INTO held_partitions (kind, partition_key) "
            "SELECT DISTINCT kind, partition_key FROM blocked ON CONFLICT DO NOTHING",
            params,
        )
    ctes = f"{limits.ctes.rstrip()}\n" if limits is not None else ""
    tx.execute(_HOLD.format(ctes=ctes, open=_OPEN_PARTITION if limits is not None else ""), params)


def _full_kinds(tx: Transaction, caps: Mapping[str, int]) -> list[str]:
    """The kinds with a deployment-wide cap whose running jobs reach it."""
    if not caps:
        return []
    rows = tx.execute(
        "SELECT kind, count(*) AS running FROM jobs WHERE status = 'running' "
        "AND kind = ANY(%(kinds)s::text[]) GROUP BY kind",
        {"kinds": sorted(caps)},
    ).fetchall()
    return [row["kind"] for row in rows if row["running"] >= caps[row["kind"]]]
