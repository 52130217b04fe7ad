-- Where a job stands, for the household waiting on it: a version per job,
-- the live processes, and the open event streams.
--
-- version: 1 when the job is inserted, one more at every write that changes
-- what the job's object shows or its place in line (its status, result,
-- error, attempts, times, priority, a cancel request). A lease renewal alone
-- changes none of it and keeps the version: a heartbeat would otherwise make
-- a new version of every running job every few seconds, waking every stream
-- and answering every conditional poll in full for nothing new. The
-- service's own statements set the new version themselves; the trigger makes
-- sure any other write to those columns does too (it fires only when the
-- statement left the version as it was, so the statements that set it pay
-- no second write of the row).
ALTER TABLE jobs ADD COLUMN version INTEGER NOT NULL DEFAULT 1;

CREATE TRIGGER jobs_version AFTER UPDATE OF
    status, result, error, attempt, max_attempts, run_at, started_at, finished_at,
    priority, cancel_requested_at, kind, payload, household_id
ON jobs
WHEN NEW.version = OLD.version
BEGIN
    UPDATE jobs SET version = OLD.version + 1 WHERE seq = NEW.seq;
END;

-- The live processes: each job pool's row, written when it starts, renewed
-- at its heartbeat's rhythm and deleted when it stops. A row not renewed for
-- a lease is a process that died without saying so: readers leave it out.
-- owner is the pool's random boot id (never a pid or host name, which get
-- reused); kinds the JSON array of the kinds it has handlers for; slots the
-- jobs it runs at once, busy how many it ran at its last renewal.
CREATE TABLE processes (
    owner TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL CHECK (pid > 0),
    kinds TEXT NOT NULL,
    slots INTEGER NOT NULL CHECK (slots >= 1),
    busy INTEGER NOT NULL DEFAULT 0 CHECK (busy >= 0),
    started_at TEXT NOT NULL,
    last_seen_at TEXT NOT NULL
);
CREATE INDEX processes_last_seen ON processes (last_seen_at);

-- Households' open event streams, counted against their limit across every
-- process and host. owner is the serving process's random boot id; seen_at
-- is renewed by that process while the stream is open, and a row not renewed
-- for a while is a stream whose process died: it no longer counts, and the
-- next renewal anywhere deletes it.
CREATE TABLE job_streams (
    id TEXT PRIMARY KEY,
    household_id INTEGER NOT NULL REFERENCES households (id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    opened_at TEXT NOT NULL,
    seen_at TEXT NOT NULL
);
CREATE INDEX job_streams_household ON job_streams (household_id, seen_at);
CREATE INDEX job_streams_owner ON job_streams (owner);
CREATE INDEX job_streams_seen ON job_streams (seen_at);
