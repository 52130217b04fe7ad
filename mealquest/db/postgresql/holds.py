"""Households held by their partitions, on PostgreSQL (migration 0023).

A household whose every due job waits on a partition at its limit has
nothing a claim could take, and a claim walking the households in turn
would read each of those jobs to learn it, at every claim. The sweep here,
made by a claim at most once per `claiming.HOLD_SECONDS` in the whole
deployment, marks such households held until then; the claims and the look
for a due job pass over a household held now (`NOT_HELD`) without reading
its jobs. The hold ends sooner when a job joins the household's queue or a
job stops running in a partition the sweep found at a limit (the
migration's triggers). A partition that frees while a sweep is being
written may leave its households held until the hold's moment: never
longer than `claiming.HOLD_SECONDS`.

The sweep never waits: the row that says when the last one was made is
taken `SKIP LOCKED` (another claim sweeping, or a job's end starting a
generation, has it), and so are the households' queue rows (a claim or an
enqueue holds them; that household is weighed by the next sweep).

Only a partition's limit holds a household: a job of a paused kind, of a
kind this process does not run, or of a suspended household is still read
by each claim, as before.
"""

from __future__ import annotations

from mealquest.db import claiming
from mealquest.db.driver import Transaction
from mealquest.db.postgresql import partitions as limits_sql
from mealquest.db.postgresql.job_rows import NOW

# The test on `household_queues AS q` that it is not held now.
NOT_HELD = (
    f"(q.held_until IS NULL OR q.held_until <= {NOW} OR q.held_generation IS DISTINCT FROM "
    "(SELECT generation FROM household_holds WHERE id = 1))"
)

_DUE = f"run_at <= {NOW}"

_HOLD = f"""
WITH {{ctes}},
held AS (
    SELECT q.household_id FROM household_queues AS q
    WHERE q.head_run_at <= {NOW} AND NOT EXISTS (
        SELECT 1 FROM jobs AS j
        WHERE j.household_id = q.household_id AND j.status = 'queued' AND j.{_DUE}
        AND NOT (j.partition_key IS NOT NULL AND j.kind = ANY(%(held_kinds)s::text[])
                 AND (j.kind, j.partition_key) IN (SELECT kind, partition_key FROM blocked))
        ORDER BY j.run_at, j.seq OFFSET 0
    )
    ORDER BY q.household_id FOR UPDATE OF q SKIP LOCKED
),
holding AS (
    UPDATE household_queues AS q
    SET held_until = {NOW} + make_interval(secs => %(hold_seconds)s),
        held_generation = (SELECT generation FROM household_holds WHERE id = 1)
    FROM held WHERE q.household_id = held.household_id
)
INSERT INTO held_partitions (kind, partition_key)
SELECT DISTINCT kind, partition_key FROM blocked
ON CONFLICT DO NOTHING"""


def sweep(tx: Transaction, limits: limits_sql.Limits, limited: list[str], now: object) -> None:
    """Hold the households whose every due job waits on a partition of the
    `limited` kinds at its limit (`limits`, at `now`: the claim's moment or
    None for the server's), unless a sweep did within
    `claiming.HOLD_SECONDS`; the holds of the last sweep end."""
    due = tx.execute(
        "SELECT 1 FROM household_holds WHERE id = 1 "
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
    tx.execute("DELETE FROM held_partitions")
    tx.execute(
        _HOLD.format(ctes=limits.ctes.rstrip().rstrip(",")),
        {
            **limits.params,
            "now": now,
            "held_kinds": list(limited),
            "hold_seconds": claiming.HOLD_SECONDS,
        },
    )
