-- A job that waits for its household (`ctx.wait_for`) and durable steps
-- (`ctx.step`). A waiting job is `queued`, due at its wait's timeout, with
-- the signal it waits for in `waiting_signal` (the answer's `queue.signal`);
-- the claim clears it. A step's kept result, and a wait's deadline (a step
-- named `wait:` and the signal), are kept per job in `job_steps`; the
-- household's answers in `job_signals`. Both go with their job, by the
-- foreign key: a prune, a delete, an erasure.
ALTER TABLE jobs ADD COLUMN waiting_signal TEXT;
CREATE INDEX jobs_waiting_household ON jobs (household_id)
    WHERE status = 'queued' AND waiting_signal IS NOT NULL;
CREATE TABLE job_steps (
    job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    result TEXT NOT NULL,
    kept_at TEXT NOT NULL,
    PRIMARY KEY (job_id, name)
) WITHOUT ROWID;
CREATE TABLE job_signals (
    job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    payload TEXT NOT NULL,
    idempotency_key TEXT,
    received_at TEXT NOT NULL,
    PRIMARY KEY (job_id, name)
) WITHOUT ROWID;
