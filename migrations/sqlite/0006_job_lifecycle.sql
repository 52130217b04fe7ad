-- The job lifecycle: a cancelled state, priorities, idempotency keys and
-- cancel requests (sqlite.org's 12-step table rebuild, since CHECKs change;
-- the migration runner turns foreign keys off around it and runs
-- PRAGMA foreign_key_check before commit).
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
CREATE TABLE jobs_new (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    household_id INTEGER NOT NULL REFERENCES households (id) ON DELETE CASCADE,
    kind TEXT NOT NULL CHECK (kind <> ''),
    payload TEXT NOT NULL,
    status TEXT NOT NULL
        CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    result TEXT,
    error TEXT,
    attempt INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts INTEGER NOT NULL DEFAULT 1 CHECK (max_attempts >= 1),
    run_at TEXT NOT NULL,
    lease_owner TEXT,
    lease_expires_at TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    started_at TEXT,
    finished_at TEXT,
    on_interrupt TEXT NOT NULL DEFAULT 'fail' CHECK (on_interrupt IN ('requeue', 'fail')),
    interruptions INTEGER NOT NULL DEFAULT 0 CHECK (interruptions >= 0),
    priority INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -32768 AND 32767),
    unique_key TEXT CHECK (unique_key IS NULL OR length(unique_key) BETWEEN 1 AND 255),
    unique_digest TEXT CHECK (unique_digest IS NULL OR length(unique_digest) = 64),
    cancel_requested_at TEXT,
    CHECK ((status IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CHECK ((status = 'running') = (lease_owner IS NOT NULL)),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CHECK ((status = 'failed') = (error IS NOT NULL)),
    CHECK (status IN ('queued', 'cancelled') OR attempt >= 1),
    CHECK ((unique_key IS NULL) = (unique_digest IS NULL)),
    CHECK (cancel_requested_at IS NULL OR status <> 'queued')
);

INSERT INTO jobs_new (
    seq, id, household_id, kind, payload, status, result, error, attempt, max_attempts,
    run_at, lease_owner, lease_expires_at, created_at, updated_at, started_at, finished_at,
    on_interrupt, interruptions
)
SELECT
    seq, id, household_id, kind, payload, status, result, error, attempt, max_attempts,
    run_at, lease_owner, lease_expires_at, created_at, updated_at, started_at, finished_at,
    on_interrupt, interruptions
FROM jobs
ORDER BY seq;

DROP TABLE jobs;

ALTER TABLE jobs_new RENAME TO jobs;

-- The claim: due queued jobs by priority, then run_at, then insertion order.
-- Partial, so finished jobs cost it nothing.
CREATE INDEX jobs_claim ON jobs (priority, run_at, seq) WHERE status = 'queued';

-- The rescuer: expired leases.
CREATE INDEX jobs_lease ON jobs (lease_expires_at) WHERE status = 'running';

-- A household's jobs, newest first, optionally by status or kind.
CREATE INDEX jobs_household ON jobs (household_id, seq);
CREATE INDEX jobs_household_status ON jobs (household_id, status, seq);
CREATE INDEX jobs_household_kind ON jobs (household_id, kind, seq);

-- Idempotency keys, per household.
CREATE UNIQUE INDEX jobs_unique_key ON jobs (household_id, unique_key)
    WHERE unique_key IS NOT NULL;
