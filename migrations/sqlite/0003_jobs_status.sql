-- Rebuild jobs for the durable runner (sqlite.org's 12-step table rebuild;
-- the migration runner turns foreign keys off around it and runs
-- PRAGMA foreign_key_check before commit).
--
-- States, and what moves a job out of each:
--   queued    -> running   the pool's claim
--   running   -> queued    a retry, the rescuer, or a stopping pool (attempts left)
--   running   -> succeeded the worker that holds the lease
--   running   -> failed    the worker that holds the lease, the rescuer, or a stopping pool
-- Legacy 'pending' becomes 'queued' and 'done' becomes 'succeeded', except a
-- 'done' row that carries an error, which is how the legacy code recorded a
-- failure: it becomes 'failed' with its error kept, since the API promises an
-- error only on failed jobs. A pending row has not run, so any error text on it
-- is dropped.
--
-- seq is the insertion order: it breaks ties in "oldest first" and orders
-- the newest-first listings.
CREATE TABLE jobs_new (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    household_id INTEGER NOT NULL REFERENCES households (id) ON DELETE CASCADE,
    kind TEXT NOT NULL CHECK (kind <> ''),
    payload TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed')),
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
    CHECK ((status IN ('succeeded', 'failed')) = (finished_at IS NOT NULL)),
    CHECK ((status = 'running') = (lease_owner IS NOT NULL)),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CHECK ((status = 'failed') = (error IS NOT NULL)),
    CHECK (status = 'queued' OR attempt >= 1)
);

INSERT INTO jobs_new (
    seq, id, household_id, kind, payload, status, result, error,
    attempt, max_attempts, run_at, created_at, updated_at, started_at, finished_at
)
SELECT
    rowid, id, household_id, kind, payload,
    CASE
        WHEN status = 'pending' THEN 'queued'
        WHEN error IS NOT NULL THEN 'failed'
        ELSE 'succeeded'
    END,
    result,
    CASE status WHEN 'done' THEN error END,
    CASE status WHEN 'pending' THEN 0 ELSE 1 END,
    1,
    created_at,
    created_at,
    updated_at,
    CASE status WHEN 'done' THEN created_at END,
    CASE status WHEN 'done' THEN updated_at END
FROM jobs
ORDER BY rowid;

DROP TABLE jobs;

ALTER TABLE jobs_new RENAME TO jobs;

-- The claim: oldest due queued job first. Partial, so finished jobs cost it nothing.
CREATE INDEX jobs_claim ON jobs (run_at, seq) WHERE status = 'queued';

-- The rescuer: expired leases.
CREATE INDEX jobs_lease ON jobs (lease_expires_at) WHERE status = 'running';

-- A household's jobs, newest first, optionally by status or kind.
CREATE INDEX jobs_household ON jobs (household_id, seq);
CREATE INDEX jobs_household_status ON jobs (household_id, status, seq);
CREATE INDEX jobs_household_kind ON jobs (household_id, kind, seq);
