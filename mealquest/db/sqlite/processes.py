"""The registry of live processes on SQLite: one row per job pool."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from mealquest.clock import to_text, utc_now
from mealquest.db.driver import Reads, Transaction
from mealquest.model.processes import ProcessEntry


def _now(now: datetime | None = None) -> datetime:
    return now if now is not None else utc_now()


def register_process(tx: Transaction, entry: ProcessEntry, *, forget_after_seconds: float) -> None:
    moment = _now()
    now = to_text(moment)
    tx.execute(
        "DELETE FROM processes WHERE last_seen_at < ?",
        (to_text(moment - timedelta(seconds=forget_after_seconds)),),
    )
    tx.execute(
        "INSERT INTO processes (owner, host, pid, kinds, slots, busy, started_at, last_seen_at) "
        "VALUES (:owner, :host, :pid, :kinds, :slots, :busy, :now, :now) "
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
            "now": now,
        },
    )


def renew_process(tx: Transaction, owner: str, *, busy: int) -> bool:
    cursor = tx.execute(
        "UPDATE processes SET busy = ?, last_seen_at = ? WHERE owner = ?",
        (busy, to_text(_now()), owner),
    )
    return cursor.rowcount == 1


def remove_process(tx: Transaction, owner: str) -> None:
    tx.execute("DELETE FROM processes WHERE owner = ?", (owner,))


def _entry(row: Any) -> ProcessEntry:
    return ProcessEntry(
        owner=row["owner"],
        host=row["host"],
        pid=int(row["pid"]),
        kinds=tuple(json.loads(row["kinds"])),
        slots=int(row["slots"]),
        busy=int(row["busy"]),
        started_at=row["started_at"],
        last_seen_at=row["last_seen_at"],
    )


def live_processes(
    conn: Reads, *, stale_after_seconds: float, now: datetime | None = None
) -> list[ProcessEntry]:
    """The processes seen within `stale_after_seconds` of the wall clock (or `now`)."""
    cutoff = to_text(_now(now) - timedelta(seconds=stale_after_seconds))
    rows = conn.execute(
        "SELECT * FROM processes WHERE last_seen_at >= ? ORDER BY started_at, owner", (cutoff,)
    ).fetchall()
    return [_entry(row) for row in rows]
