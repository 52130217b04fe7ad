-- Periodic jobs and retention.
--
-- periodic_slots: one row per (kind, scheduled time) for which a job was
-- made, inserted in the same transaction as that job. Its primary key is what
-- makes a slot's job exactly one across every process: a second scheduler
-- that reaches the same slot conflicts on it and makes nothing. job_id names
-- the job made (no foreign key: retention deletes old jobs and old slots
-- separately, and a slot must outlive its job for as long as a scheduler
-- could still consider it).
CREATE TABLE periodic_slots (
    kind TEXT NOT NULL CHECK (kind <> ''),
    slot_at TEXT NOT NULL,
    job_id TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (kind, slot_at)
) WITHOUT ROWID;

-- Retention deletes old slots by time.
CREATE INDEX periodic_slots_slot_at ON periodic_slots (slot_at);

-- The system household: periodic jobs (maintenance included) belong to it.
-- It has no tokens, so no household sees its jobs through the API. Id 0 is
-- below every id a household gets from the table.
INSERT INTO households (id, name, created_at)
VALUES (0, 'system', strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'));

-- Retention: finished jobs oldest first, so each small batch that deletes
-- them finds its rows without scanning the table. Partial: queued and running
-- jobs have no finished_at, and cost this index nothing.
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;

-- When a scheduler first saw each periodic kind. Slots before it never make
-- a job: a kind added to a running deployment starts at its next time, as a
-- line added to a crontab does, instead of running at once for a time
-- nobody was watching.
CREATE TABLE periodic_kinds (
    kind TEXT PRIMARY KEY CHECK (kind <> ''),
    first_seen_at TEXT NOT NULL
) WITHOUT ROWID;
