-- Operators: the people who watch and steer the queue (the dashboard at
-- /admin/ and GET /metrics). They are not households: a table of their own,
-- so a household's token can never be an operator's, nor the reverse. Each
-- operator has one token, stored only as the hex SHA-256 digest of its text
-- (the clear token is shown once, when the operator is created); revoking
-- the operator revokes the token.
CREATE TABLE operators (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    token_sha256 TEXT NOT NULL UNIQUE CHECK (length(token_sha256) = 64),
    created_at TEXT NOT NULL,
    revoked_at TEXT
);

-- The operator's views of the queue, across households, newest first. By
-- kind: a kind never changes, so this index costs an insert nothing more.
-- By status: failed and cancelled jobs have indexes of their own, written
-- only when a job ends that way; queued and running jobs are read through
-- the claim's and the rescuer's partial indexes, and succeeded ones, most of
-- the table, by walking it newest first. (An index on status would cost
-- every state change of every job another write.)
CREATE INDEX jobs_kind_seq ON jobs (kind, seq);
CREATE INDEX jobs_failed_seq ON jobs (seq) WHERE status = 'failed';
CREATE INDEX jobs_cancelled_seq ON jobs (seq) WHERE status = 'cancelled';

-- Throughput: jobs finished in the last hour.
CREATE INDEX jobs_finished_at ON jobs (finished_at) WHERE finished_at IS NOT NULL;

-- The oldest due job of each kind: queued jobs only, so it stays small.
CREATE INDEX jobs_due_by_kind ON jobs (kind, run_at) WHERE status = 'queued';

-- Jobs by kind and status, kept by triggers in the transaction that changes a
-- job, for the operators' figures (GET /metrics, the dashboard). Counting a
-- million rows takes SQLite hundreds of milliseconds, and a read holds the
-- reading process's event loop for all of that time; these rows cost each
-- insert, state change and delete one small upsert instead (one writer at a
-- time: no contention). A later migration that rebuilds the jobs table must
-- create these triggers again.
CREATE TABLE job_counts (
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    count INTEGER NOT NULL CHECK (count >= 0),
    PRIMARY KEY (kind, status)
) WITHOUT ROWID;

INSERT INTO job_counts (kind, status, count)
SELECT kind, status, count(*) FROM jobs GROUP BY kind, status;

CREATE TRIGGER job_counts_insert AFTER INSERT ON jobs
BEGIN
    INSERT INTO job_counts (kind, status, count) VALUES (NEW.kind, NEW.status, 1)
    ON CONFLICT (kind, status) DO UPDATE SET count = count + 1;
END;

CREATE TRIGGER job_counts_delete AFTER DELETE ON jobs
BEGIN
    UPDATE job_counts SET count = count - 1 WHERE kind = OLD.kind AND status = OLD.status;
END;

CREATE TRIGGER job_counts_update AFTER UPDATE OF kind, status ON jobs
WHEN OLD.kind IS NOT NEW.kind OR OLD.status IS NOT NEW.status
BEGIN
    UPDATE job_counts SET count = count - 1 WHERE kind = OLD.kind AND status = OLD.status;
    INSERT INTO job_counts (kind, status, count) VALUES (NEW.kind, NEW.status, 1)
    ON CONFLICT (kind, status) DO UPDATE SET count = count + 1;
END;
