-- The job lifecycle: a cancelled state, priorities, idempotency keys and
-- cancel requests (the same schema as SQLite's 0006).
--
-- States, and what moves a job out of each:
--   queued    -> running   the pool's claim
--   queued    -> cancelled a cancel (at once)
--   running   -> queued    a retry, the rescuer, or a stopping pool (attempts left),
--                          unless a cancel was requested: then cancelled
--   running   -> succeeded the worker that holds the lease
--   running   -> failed    the worker that holds the lease, the rescuer, or a stopping pool
--   running   -> cancelled the worker that holds the lease, once a cancel was
--                          requested (cancel_requested_at), or the rescuer and a
--                          stopping pool for such a job
-- succeeded, failed and cancelled are final: finished_at is set exactly on
-- them, and error only on failed (a cancelled job keeps its last partial
-- result, never an error).
--
-- priority: lower runs first (as in Oban and River), default 0. The claim
-- takes due jobs by priority, then run_at, then insertion order (seq).
--
-- unique_key: an idempotency key, unique per household while set (the
-- unique index, not a look before the insert, is what keeps two concurrent
-- enqueues from both inserting). unique_digest is the SHA-256 of the kind and
-- canonical payload it was given with, to tell a repeat from another request
-- reusing the key. A key is cleared from its job once its window has passed,
-- when the household uses it again.
--
-- cancel_requested_at: when a cancel reached a running job; the process
-- running it stops its handler and records it cancelled.
ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled'));

ALTER TABLE jobs DROP CONSTRAINT jobs_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_finished_check
    CHECK ((status IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL));

ALTER TABLE jobs DROP CONSTRAINT jobs_check4;
ALTER TABLE jobs ADD CONSTRAINT jobs_started_attempt_check
    CHECK (status IN ('queued', 'cancelled') OR attempt >= 1);

ALTER TABLE jobs
    ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD COLUMN unique_key text
        CHECK (unique_key IS NULL OR char_length(unique_key) BETWEEN 1 AND 255),
    ADD COLUMN unique_digest text
        CHECK (unique_digest IS NULL OR char_length(unique_digest) = 64),
    ADD COLUMN cancel_requested_at timestamptz,
    ADD CONSTRAINT jobs_unique_key_digest_check CHECK ((unique_key IS NULL) = (unique_digest IS NULL)),
    ADD CONSTRAINT jobs_cancel_requested_check
        CHECK (cancel_requested_at IS NULL OR status <> 'queued');

-- The claim: due queued jobs by priority, then run_at, then insertion order.
-- Partial, so finished jobs cost it nothing.
DROP INDEX jobs_claim;
CREATE INDEX jobs_claim ON jobs (priority, run_at, seq) WHERE status = 'queued';

-- Idempotency keys, per household.
CREATE UNIQUE INDEX jobs_unique_key ON jobs (household_id, unique_key)
    WHERE unique_key IS NOT NULL;
