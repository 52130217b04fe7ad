"""The registry of live processes on PostgreSQL: one row per job pool, its
times the database's clock (every host's)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from mealquest.clock import to_text
from mealquest.db.driver import Reads, Transaction
from mealquest.model.processes import ProcessEntry


def register_process(tx: Transaction, entry: ProcessEntry, *, forget_after_seconds: float) -> None:
    tx.execute(
        "DELETE FROM processes WHERE last_seen_at < now() - make_interval(secs => %s)",
        (float(forget_after_seconds),),
    )
    tx.execute(
        "INSERT INTO processes (owner, host, pid, kinds, slots, busy, started_at, last_seen_at) "
        "VALUES (%(owner)s, %(host)s, %(pid)s, %(kinds)s, %(slots)s, %(busy)s, now(), now()) "
        "ON CONFLICT (owner) DO UPDATE SET host = excluded.host, pid = excluded.pid, "
        "kinds = excluded.kinds, slots = excluded.slots, busy = excluded.busy, "
        "last_seen_at = excluded.last_seen_at",
        {
            "owner": entry.owner,
            "host": entry.host,
            "pid": entry.pid,
            "kinds": json.dumps(sorted(entry.kinds)),
            "slots": entry.slots,
            "busy": entry.busy,
        },
    )


def renew_process(tx: Transaction, owner: str, *, busy: int) -> bool:
    cursor = tx.execute(
        "UPDATE processes SET busy = %s, last_seen_at = now() WHERE owner = %s", (busy, owner)
    )
    return cursor.rowcount == 1


def remove_process(tx: Transaction, owner: str) -> None:
    tx.execute("DELETE FROM processes WHERE owner = %s", (owner,))


def _entry(row: Any) -> ProcessEntry:
    return ProcessEntry(
        owner=row["owner"],
        host=row["host"],
        pid=int(row["pid"]),
        kinds=tuple(json.loads(row["kinds"])),
        slots=int(row["slots"]),
        busy=int(row["busy"]),
        started_at=to_text(row["started_at"]),
        last_seen_at=to_text(row["last_seen_at"]),
    )


def live_processes(
    conn: Reads, *, stale_after_seconds: float, now: datetime | None = None
) -> list[ProcessEntry]:
    """The processes seen within `stale_after_seconds` of the database's clock (or `now`)."""
    rows = conn.execute(
        "SELECT * FROM processes WHERE last_seen_at >= "
        "coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s) "
        "ORDER BY started_at, owner",
        {"now": now, "stale": float(stale_after_seconds)},
    ).fetchall()
    return [_entry(row) for row in rows]
