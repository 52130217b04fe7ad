-- Periodic jobs and retention.
--
-- periodic_slots: one row per (kind, scheduled time) for which a job was
-- made, inserted in the same transaction as that job. Its primary key is what
-- makes a slot's job exactly one across every process and host: a second
-- scheduler that reaches the same slot conflicts on it (waiting for the
-- first one's transaction to end) and makes nothing. job_id names the job
-- made (no foreign key: retention deletes old jobs and old slots separately,
-- and a slot must outlive its job for as long as a scheduler could still
-- consider it).
CREATE TABLE periodic_slots (
    kind text NOT NULL CHECK (kind <> ''),
    slot_at timestamptz NOT NULL,
    job_id text,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, slot_at)
);

-- Retention deletes old slots by time.
CREATE INDEX periodic_slots_slot_at ON periodic_slots (slot_at);

-- The system household: periodic jobs (maintenance included) belong to it.
-- It has no tokens, so no household sees its jobs through the API. Id 0 is
-- below every id the identity hands out.
INSERT INTO households (id, name) OVERRIDING SYSTEM VALUE VALUES (0, 'system');

-- Retention: finished jobs oldest first, so each small batch that deletes
-- them finds its rows without scanning the table. Partial: queued and running
-- jobs have no finished_at, and cost this index nothing.
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;

-- When a scheduler first saw each periodic kind. Slots before it never make
-- a job: a kind added to a running deployment starts at its next time, as a
-- line added to a crontab does, instead of running at once for a time
-- nobody was watching.
CREATE TABLE periodic_kinds (
    kind text PRIMARY KEY CHECK (kind <> ''),
    first_seen_at timestamptz NOT NULL
);
