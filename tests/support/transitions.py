"""An audit of every job status change, recorded by the database itself (a
trigger), so that "one final state, never left" is counted, not inferred
from a job's last state."""

from __future__ import annotations

import sqlite3

from mealquest.db.driver import Store
from tests.support import sql

_SQLITE = """
CREATE TABLE test_transitions (
    seq INTEGER PRIMARY KEY, job_id TEXT NOT NULL, old TEXT, new TEXT NOT NULL,
    attempt INTEGER NOT NULL
);
CREATE TRIGGER test_job_enqueued AFTER INSERT ON jobs BEGIN
    INSERT INTO test_transitions (job_id, old, new, attempt)
    VALUES (NEW.id, NULL, NEW.status, NEW.attempt);
END;
CREATE TRIGGER test_job_transition AFTER UPDATE OF status ON jobs
WHEN NEW.status IS NOT OLD.status BEGIN
    INSERT INTO test_transitions (job_id, old, new, attempt)
    VALUES (NEW.id, OLD.status, NEW.status, NEW.attempt);
END;
"""

_POSTGRESQL = """
CREATE TABLE test_transitions (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id text NOT NULL, old text, new text NOT NULL, attempt integer NOT NULL
);
CREATE FUNCTION test_record_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO test_transitions (job_id, old, new, attempt)
        VALUES (NEW.id, NULL, NEW.status, NEW.attempt);
    ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
        INSERT INTO test_transitions (job_id, old, new, attempt)
        VALUES (NEW.id, OLD.status, NEW.status, NEW.attempt);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_job_transition AFTER INSERT OR UPDATE OF status ON jobs
FOR EACH ROW EXECUTE FUNCTION test_record_transition();
"""

FINAL = ("succeeded", "failed", "cancelled")

Transition = tuple[str | None, str, int]


def install(store: Store, database: dict[str, str]) -> None:
    """Start recording every status change of every job in `database`."""
    if store.name == "postgresql":
        store.write(lambda tx: tx.execute(_POSTGRESQL))
        return
    # A script of several statements with trigger bodies: sqlite3's own runner.
    conn = sqlite3.connect(database["DATABASE"])
    try:
        conn.executescript(_SQLITE)
    finally:
        conn.close()


def history(store: Store) -> dict[str, list[Transition]]:
    """Each job's status changes in order: (old, new, attempt)."""
    by_job: dict[str, list[Transition]] = {}
    rows = sql.rows(store, "SELECT job_id, old, new, attempt FROM test_transitions ORDER BY seq")
    for row in rows:
        by_job.setdefault(row["job_id"], []).append((row["old"], row["new"], row["attempt"]))
    return by_job


def assert_one_final_state_each(store: Store, job_ids: list[str]) -> None:
    """Each job reached exactly one final state and never left it."""
    recorded = history(store)
    for job_id in job_ids:
        states = recorded[job_id]
        finals = [new for _, new, _ in states if new in FINAL]
        assert len(finals) == 1, (job_id, states)
        assert states[-1][1] in FINAL, (job_id, states)
        assert all(old not in FINAL for old, _, _ in states), (job_id, states)
