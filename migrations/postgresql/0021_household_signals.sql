-- A job that waits for its household (`ctx.wait_for`) and durable steps
-- (`ctx.step`), as SQLite's 0022_household_signals.sql keeps them: a waiting
-- job is `queued`, due at its wait's timeout, with the signal it waits for
-- in `waiting_signal`; steps (a wait's deadline among them) in `job_steps`,
-- the household's answers in `job_signals`, both gone with their job.
ALTER TABLE jobs ADD COLUMN waiting_signal text;
CREATE INDEX jobs_waiting_household ON jobs (household_id)
    WHERE status = 'queued' AND waiting_signal IS NOT NULL;
CREATE TABLE job_steps (
    job_id text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    name text NOT NULL,
    result text NOT NULL,
    kept_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, name)
);
CREATE TABLE job_signals (
    job_id text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    name text NOT NULL,
    payload text NOT NULL,
    idempotency_key text,
    received_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, name)
);
