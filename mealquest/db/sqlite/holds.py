"""Households held: nothing of theirs any claim could take (migration 0023), on SQLite.

A household whose every due job is of a paused kind, of a kind at its
deployment-wide cap, or waits on a partition at its limit, or a suspended
household, has nothing a claim could take; a claim walking the households
in turn would read each of those jobs to learn it, at every claim. The
sweep here, made by a claim at most once per `claiming.HOLD_SECONDS`,
marks such households held until then; the claims and the look for a due
job pass over a household held now (`NOT_HELD`) without reading its jobs.
The hold ends sooner when a job joins the household's queue, when a job of
a kind or a partition the sweep found full stops running, when a kind is
resumed or the household lifted from suspension (the migration's
triggers).

Not a hold: jobs of a kind this process does not run, or has no room for
(its own cap): another process may take them, and this process's claims
still read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from mealquest.clock import from_text
from mealquest.db import claiming
from mealquest.db.driver import Transaction
from mealquest.db.sqlite import partitions as limits_sql
from mealquest.db.sqlite.job_rows import RUNNING_JOBS, moment_text

# The test on `household_queues AS q` that it is not held now (`:now`).
NOT_HELD = (
    "(q.held_until IS NULL OR q.held_until <= :now "
    "OR q.held_generation IS NOT (SELECT generation FROM household_holds WHERE id = 1))"
)

_HOLD = """
{ctes}UPDATE household_queues SET held_until = :held_until, held_generation = (
    SELECT generation FROM household_holds WHERE id = 1)
WHERE household_id IN (
    SELECT q.household_id FROM household_queues AS q
    WHERE q.head_run_at <= :now AND (
        q.household_id IN (SELECT id FROM households WHERE suspended_at IS NOT NULL)
        OR NOT EXISTS (
            SELECT 1 FROM jobs AS j INDEXED BY jobs_household_queued
            WHERE j.household_id = q.household_id AND j.status = 'queued'
            AND j.run_at <= :now AND j.kind NOT IN (SELECT kind FROM closed_kinds){open}
        )
    )
)"""

# The kinds of which no job may start now: paused, or at their cap.
_CLOSED_KINDS = (
    "closed_kinds(kind) AS (SELECT kind FROM paused_kinds UNION ALL SELECT kind FROM held_kinds)"
)

# A due job's partition is not at a limit (its kind's limits are `limits_sql`'s).
_OPEN_PARTITION = (
    " AND NOT (j.partition_key IS NOT NULL AND j.kind IN ({kinds}) "
    "AND (j.kind, j.partition_key) IN (SELECT kind, partition_key FROM blocked))"
)


def sweep(
    tx: Transaction,
    moment: datetime,
    caps: Mapping[str, int],
    limits: limits_sql.Limits | None,
    limited: list[str],
) -> None:
    """Hold the households that have nothing a claim could take at `moment`
    (see the module): `caps` are the deployment-wide caps of kinds, `limits`
    the partitions' limits of the `limited` kinds. Unless a sweep did within
    `claiming.HOLD_SECONDS`; the holds of the last sweep end."""
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
    full = _full_kinds(tx, caps)
    tx.execute("DELETE FROM held_kinds", ())
    for kind in full:
        tx.execute("INSERT INTO held_kinds (kind) VALUES (?)", (kind,))
    tx.execute("DELETE FROM held_partitions", ())
    if limits is None and not full and not _any_paused_or_suspended(tx):
        return
    names = {f"hk{index}": kind for index, kind in enumerate(limited)}
    ctes = [_CLOSED_KINDS]
    if limits is not None:
        ctes.append(limits.ctes.rstrip().rstrip(","))
    params = {
        **(limits.params if limits is not None else {}),
        **names,
        "now": now,
        "held_until": moment_text(moment + timedelta(seconds=claiming.HOLD_SECONDS)),
    }
    open_partition = (
        _OPEN_PARTITION.format(kinds=", ".join(f":{name}" for name in names))
        if limits is not None
        else ""
    )
    tx.execute(_HOLD.format(ctes=f"WITH {', '.join(ctes)} ", open=open_partition), params)
    if limits is not None:
        tx.execute(
            f"WITH {limits.ctes.rstrip().rstrip(',')} INSERT OR IGNORE INTO held_partitions "
            "(kind, partition_key) SELECT kind, partition_key FROM blocked",
            params,
        )


def _full_kinds(tx: Transaction, caps: Mapping[str, int]) -> list[str]:
    """The kinds with a deployment-wide cap whose running jobs reach it."""
    if not caps:
        return []
    kinds = sorted(caps)
    rows = tx.execute(
        f"SELECT kind, count(*) AS running FROM {RUNNING_JOBS} WHERE status = 'running' "
        f"AND kind IN ({', '.join('?' * len(kinds))}) GROUP BY kind",
        kinds,
    ).fetchall()
    return [row["kind"] for row in rows if row["running"] >= caps[row["kind"]]]


def _any_paused_or_suspended(tx: Transaction) -> bool:
    row = tx.execute(
        "SELECT EXISTS (SELECT 1 FROM paused_kinds) "
        "OR EXISTS (SELECT 1 FROM households WHERE suspended_at IS NOT NULL) AS any",
        (),
    ).fetchone()
    return bool(row["any"])
