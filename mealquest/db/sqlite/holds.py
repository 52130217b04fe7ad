"""Households held by their partitions, on SQLite (migration 0023).

A household whose every due job waits on a partition at its limit has
nothing a claim could take, and a claim walking the households in turn
would read each of those jobs to learn it, at every claim. The sweep here,
made by a claim at most once per `claiming.HOLD_SECONDS`, marks such
households held until then; the claims and the look for a due job pass over
a household held now (`NOT_HELD`) without reading its jobs. The hold ends
sooner when a job joins the household's queue or a job with a partition
stops running in a partition the sweep found at a limit (the migration's
triggers).

Only a partition's limit holds a household: a job of a paused kind, of a
kind this process does not run, or of a suspended household is still read
by each claim, as before (each of those is some claim's to take, or an
operator's choice to hold).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from mealquest.clock import from_text
from mealquest.db import claiming
from mealquest.db.driver import Transaction
from mealquest.db.sqlite import partitions as limits_sql
from mealquest.db.sqlite.job_rows import moment_text

# The test on `household_queues AS q` that it is not held now (`:now`).
NOT_HELD = (
    "(q.held_until IS NULL OR q.held_until <= :now "
    "OR q.held_generation IS NOT (SELECT generation FROM household_holds WHERE id = 1))"
)

_HOLD = """
WITH {ctes}
UPDATE household_queues SET held_until = :held_until, held_generation = (
    SELECT generation FROM household_holds WHERE id = 1)
WHERE household_id IN (
    SELECT q.household_id FROM household_queues AS q
    WHERE q.head_run_at <= :now AND NOT EXISTS (
        SELECT 1 FROM jobs AS j INDEXED BY jobs_household_queued
        WHERE j.household_id = q.household_id AND j.status = 'queued' AND j.run_at <= :now
        AND NOT (j.partition_key IS NOT NULL AND j.kind IN ({kinds})
                 AND (j.kind, j.partition_key) IN (SELECT kind, partition_key FROM blocked))
    )
)"""


def sweep(tx: Transaction, limits: limits_sql.Limits, limited: list[str], moment: datetime) -> None:
    """Hold the households whose every due job waits on a partition of the
    `limited` kinds at its limit (`limits`, at `moment`), unless a sweep
    did within `claiming.HOLD_SECONDS`; the holds of the last sweep end."""
    row = tx.execute("SELECT swept_at FROM household_holds WHERE id = 1", ()).fetchone()
    if row is None or from_text(row["swept_at"]) > moment - timedelta(
        seconds=claiming.HOLD_SECONDS
    ):
        return
    now = moment_text(moment)
    # A new generation ends the last sweep's holds; the new ones are made in it.
    tx.execute(
        "UPDATE household_holds SET swept_at = :now, generation = generation + 1 WHERE id = 1",
        {"now": now},
    )
    kinds = {f"hk{index}": kind for index, kind in enumerate(limited)}
    ctes = limits.ctes.rstrip().rstrip(",")
    params = {
        **limits.params,
        **kinds,
        "now": now,
        "held_until": moment_text(moment + timedelta(seconds=claiming.HOLD_SECONDS)),
    }
    tx.execute(_HOLD.format(ctes=ctes, kinds=", ".join(f":{name}" for name in kinds)), params)
    tx.execute("DELETE FROM held_partitions", ())
    tx.execute(
        f"WITH {ctes} INSERT OR IGNORE INTO held_partitions (kind, partition_key) "
        "SELECT kind, partition_key FROM blocked",
        params,
    )
