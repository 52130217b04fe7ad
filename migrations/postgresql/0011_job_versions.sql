-- Where a job stands, for the household waiting on it: a version per job,
-- the live processes, and the open event streams (as SQLite's
-- 0015_job_versions.sql).
--
-- version: 1 when the job is inserted, one more at every write that changes
-- what the job's object shows or its place in line (its status, result,
-- error, attempts, times, priority, a cancel request). A lease renewal alone
-- changes none of it and keeps the version: a heartbeat would otherwise make
-- a new version of every running job every few seconds, waking every stream
-- and answering every conditional poll in full for nothing new. The
-- service's own statements set the new version themselves; the trigger makes
-- sure any other write to those columns does too. It is a BEFORE trigger
-- (the row is written once, with its version) whose WHEN leaves the
-- statements that set the version without a function call.
--
-- Adding a column with a constant default rewrites no row; the trigger takes
-- the table's lock for a moment.
ALTER TABLE jobs ADD COLUMN version integer NOT NULL DEFAULT 1;

CREATE FUNCTION jobs_version_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := OLD.version + 1;
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_version BEFORE UPDATE OF
    status, result, error, attempt, max_attempts, run_at, started_at, finished_at,
    priority, cancel_requested_at, kind, payload, household_id
ON jobs
FOR EACH ROW WHEN (NEW.version = OLD.version) EXECUTE FUNCTION jobs_version_bump();

-- The live processes: each job pool's row, written when it starts, renewed
-- at its heartbeat's rhythm and deleted when it stops. A row not renewed for
-- a lease is a process that died without saying so: readers leave it out.
-- owner is the pool's random boot id (never a pid or host name, which get
-- reused); kinds the JSON array of the kinds it has handlers for; slots the
-- jobs it runs at once, busy how many it ran at its last renewal. Times are
-- the database's clock, as every host's.
CREATE TABLE processes (
    owner text PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL CHECK (pid > 0),
    kinds text NOT NULL,
    slots integer NOT NULL CHECK (slots >= 1),
    busy integer NOT NULL DEFAULT 0 CHECK (busy >= 0),
    started_at timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL
);
CREATE INDEX processes_last_seen ON processes (last_seen_at);

-- Households' open event streams, counted against their limit across every
-- process and host. owner is the serving process's random boot id; seen_at
-- is renewed by that process while the stream is open, and a row not renewed
-- for a while is a stream whose process died: it no longer counts, and the
-- next renewal anywhere deletes it.
CREATE TABLE job_streams (
    id text PRIMARY KEY,
    household_id bigint NOT NULL REFERENCES households (id) ON DELETE CASCADE,
    owner text NOT NULL,
    opened_at timestamptz NOT NULL,
    seen_at timestamptz NOT NULL
);
CREATE INDEX job_streams_household ON job_streams (household_id, seen_at);
CREATE INDEX job_streams_owner ON job_streams (owner);
CREATE INDEX job_streams_seen ON job_streams (seen_at);
