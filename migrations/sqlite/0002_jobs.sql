-- The legacy jobs table, as the first release shipped it: a job is pending
-- until it is done. 0003 rebuilds it for the durable runner.
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    household_id INTEGER NOT NULL REFERENCES households (id) ON DELETE CASCADE,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'done')),
    result TEXT,
    error TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE INDEX jobs_status ON jobs (status, created_at);
